"""DeepSpeed runs of one tiny Llama on the same data, each metered, for tests/integrations/
test_deepspeed.py (run with the python of ``.venv-deepspeed``, DeepSpeed's CPU accelerator and
gloo).

``python deepspeed_runs.py OUT CASE...``: each case a line of JSON in OUT (the report's counts,
the engine's own step count, the budget's stop). Cases: ``plain`` (a torch AdamW loop with the
accumulation DeepSpeed does, no engine), ``zero0`` to ``zero3``, ``zero3-offload`` (parameters
and optimizer states on the CPU), ``explicit`` (``optimizer=`` the ZeRO-2 optimizer object),
``budget-zero1`` to ``budget-zero3`` (a budget of 2.5 optimizer steps' compute, raise),
``hf-zero1`` to ``hf-zero3`` (the Hugging Face Trainer with its ``deepspeed`` config and the
callback), ``hf-budget-zero3`` (the same with the budget: the Trainer is told to stop). Under ``torchrun`` every rank takes its own half of the micro-batches (``RANK``);
rank 0 writes OUT.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
from pathlib import Path

os.environ.setdefault("DS_ACCELERATOR", "cpu")
os.environ.setdefault("CUDA_VISIBLE_DEVICES", "")

import deepspeed
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from flopmeter import BudgetExceeded, FlopMeter

MICRO_BATCHES, ACCUMULATION, BATCH, LENGTH = 8, 2, 2, 16
RANK, WORLD = int(os.environ.get("RANK", "0")), int(os.environ.get("WORLD_SIZE", "1"))


def model() -> LlamaForCausalLM:
    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=128, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, pad_token_id=0,
    )  # fmt: skip
    return LlamaForCausalLM(config)


def batches(*, every_rank: bool = False) -> list[torch.Tensor]:
    """This rank's micro-batches: every ``WORLD``-th of the job's (``every_rank``: all of them,
    for a Trainer that shards them itself); pad id 0 never drawn."""
    g = torch.Generator().manual_seed(1)
    job = [torch.randint(1, 128, (BATCH, LENGTH), generator=g) for _ in range(MICRO_BATCHES)]
    return job if every_rank else job[RANK::WORLD]


def ds_config(stage: int, offload: bool = False) -> dict:
    zero: dict = {"stage": stage}
    if offload:
        zero["offload_param"] = {"device": "cpu"}
        zero["offload_optimizer"] = {"device": "cpu"}
    return {
        "train_micro_batch_size_per_gpu": BATCH,
        "gradient_accumulation_steps": ACCUMULATION,
        "optimizer": {"type": "AdamW", "params": {"lr": 1e-3, "torch_adam": True}},
        "zero_optimization": zero,
    }


def counts(meter: FlopMeter) -> dict:
    r = meter.report()
    budget = r.budget.model_dump() if r.budget is not None else None
    return {
        "optimizer_steps": r.tokens.optimizer_steps, "micro_batches": r.tokens.micro_batches,
        "tokens": r.tokens.tokens_processed, "n_total": r.model.n_total,
        "n_trainable": r.model.n_trainable, "primary_flops": r.compute.primary_flops,
        "withheld": r.compute.withheld_reason, "outcome": r.verdict.outcome,
        "stopped_by_budget": budget and budget["stopped_by_budget"],
    }  # fmt: skip


def plain() -> dict:
    net = model()
    opt = torch.optim.AdamW(net.parameters(), lr=1e-3)
    with FlopMeter(net, 0) as meter:
        for i, ids in enumerate(batches()):
            net(input_ids=ids, labels=ids).loss.div(ACCUMULATION).backward()
            if i % ACCUMULATION == ACCUMULATION - 1:
                opt.step()
                opt.zero_grad()
    return {**counts(meter), "numel": sum(p.numel() for p in net.parameters())}


def engine_run(stage: int, *, offload: bool = False, explicit: bool = False,
               budget: float | None = None) -> dict:  # fmt: skip
    net = model()
    engine, *_ = deepspeed.initialize(
        model=net, model_parameters=net.parameters(), config=ds_config(stage, offload)
    )
    options: dict = {"optimizer": engine.optimizer} if explicit else {}
    if budget is not None:
        options.update(budget=budget, budget_action="raise")
    stopped = None
    try:
        with FlopMeter(net, 0, **options) as meter:
            for ids in batches():
                engine.backward(engine(input_ids=ids, labels=ids).loss)
                engine.step()
    except BudgetExceeded as exc:
        stopped = str(exc)
    return {**counts(meter), "engine_steps": engine.global_steps, "raised": stopped}


def hf_run(stage: int, budget: float | None = None) -> dict:
    from transformers import Trainer, TrainingArguments

    from flopmeter.integrations.hf import FlopMeterCallback

    data = [{"input_ids": row, "labels": row} for row in torch.cat(batches(every_rank=True))]
    callback = FlopMeterCallback(pad_id=0, **({"budget": budget} if budget else {}))
    config = {**ds_config(stage), "train_micro_batch_size_per_gpu": "auto",
              "gradient_accumulation_steps": "auto", "optimizer": None}  # fmt: skip
    config = {k: v for k, v in config.items() if v is not None}
    args = TrainingArguments(
        tempfile.mkdtemp(), use_cpu=True, per_device_train_batch_size=BATCH,
        gradient_accumulation_steps=ACCUMULATION, num_train_epochs=1, learning_rate=1e-3,
        report_to=[], save_strategy="no", logging_steps=1000, deepspeed=config,
        dataloader_drop_last=True,
    )  # fmt: skip
    trainer = Trainer(model=model(), args=args, train_dataset=data, callbacks=[callback])
    trainer.train()
    return {**counts(callback.meter), "engine_steps": trainer.state.global_step}


def hf_resume(stage: int) -> dict:
    """Two steps with a checkpoint (DeepSpeed's, the Trainer's), then a new Trainer resumed from
    it to the end: the report's counts continue from the checkpoint's."""
    from transformers import Trainer, TrainingArguments

    from flopmeter.integrations.hf import FlopMeterCallback

    data = [{"input_ids": row, "labels": row} for row in torch.cat(batches(every_rank=True))]
    out = tempfile.mkdtemp()
    config = {k: v for k, v in ds_config(stage).items() if k != "optimizer"}
    config.update(train_micro_batch_size_per_gpu="auto", gradient_accumulation_steps="auto")

    def trainer(max_steps: int) -> tuple[Trainer, FlopMeterCallback]:
        callback = FlopMeterCallback(pad_id=0)
        args = TrainingArguments(
            out, use_cpu=True, per_device_train_batch_size=BATCH,
            gradient_accumulation_steps=ACCUMULATION, max_steps=max_steps, learning_rate=1e-3,
            report_to=[], save_strategy="steps", save_steps=2, logging_steps=1000,
            deepspeed=config, dataloader_drop_last=True,
        )  # fmt: skip
        return Trainer(model=model(), args=args, train_dataset=data, callbacks=[callback]), callback

    first, _ = trainer(2)
    first.train()
    second, callback = trainer(STEPS_PER_EPOCH)
    second.train(resume_from_checkpoint=str(Path(out) / "checkpoint-2"))
    report = callback.meter.report()
    resumed = report.lineage.resumed if report.lineage is not None else None
    sessions = resumed.sessions_flops if resumed is not None else {}
    return {**counts(callback.meter), "engine_steps": second.state.global_step,
            "sessions_flops": sorted(sessions.values())}  # fmt: skip


#: The Trainer's optimizer steps over the data on one rank.
STEPS_PER_EPOCH = MICRO_BATCHES // ACCUMULATION


def run(case: str) -> dict:
    if case == "plain":
        return plain()
    if case.startswith("hf-zero"):
        return hf_run(int(case[-1]))
    if case.startswith("hf-resume-zero"):
        return hf_resume(int(case[-1]))
    if case.startswith("hf-budget-zero"):
        return hf_run(int(case[-1]), budget=BUDGET)
    if case == "explicit":
        return engine_run(2, explicit=True)
    if case.startswith("budget-zero"):
        return engine_run(int(case[-1]), budget=BUDGET)
    if case == "zero3-offload":
        return engine_run(3, offload=True)
    return engine_run(int(case.removeprefix("zero")))


#: The budget of the budget cases: 2.5 optimizer steps of the plain run's compute (set below).
BUDGET = 0.0


def main() -> None:
    global BUDGET
    out, cases = Path(sys.argv[1]), sys.argv[2:]
    deepspeed.init_distributed(dist_backend="gloo")
    results = {}
    for case in cases:
        if "budget" in case and not BUDGET:
            first = results.get("plain") or plain()
            BUDGET = 2.5 * first["primary_flops"] / first["optimizer_steps"]
        results[case] = run(case)
    if RANK == 0:
        out.write_text(json.dumps({"budget": BUDGET, **results}))


if __name__ == "__main__":
    main()
