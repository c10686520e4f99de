"""The worked example of docs/budget.md: a LoRA run on Llama 3.2 3B planned past its threshold.

Part 1 (the plan, nothing allocated): the bundled Llama 3.2 3B config built on the ``meta``
device with LoRA (peft, r=16, ``target_modules="all-linear"``); a ``FlopMeter`` around one
training step of one 2048-token sequence gives the ``transformer`` estimate of that sequence.
A step of the planned run is ``SEQUENCES_PER_STEP`` such sequences. The budget is
``budget="threshold"`` with the Llama 3.2 3B pretraining compute of
/work/shared/docs/pretrain-compute.md (1.7e23 FLOP, 6ND), and the guard's own decision code
(:class:`flopmeter.budget.BudgetGuard`) is run over the planned steps: where it stops, what the
total is then, and how many times it read the counts.

Part 2 (a real run, CPU): a tiny Llama with LoRA, trained in a raw loop with a budget of
``REAL_BUDGET_STEPS`` steps' worth of compute, planned for 40 steps: where the meter stopped it
and what its report says.

Run: ``python benchmarks/budget_example.py`` (about a minute on a 2-core CPU).
"""

from __future__ import annotations

import logging

import torch

from flopmeter import FlopMeter
from flopmeter.budget.guard import BudgetGuard
from flopmeter.budget.rates import StepRates
from flopmeter.budget.resolve import resolve_budget
from flopmeter.compliance.thresholds import determine_threshold
from flopmeter.flops.architecture import bundled_config

PRETRAIN_FLOPS = 1.7e23  # Llama 3.2 3B, 6ND (docs: pretrain-compute.md)
SEQUENCE_TOKENS = 2048
SEQUENCES_PER_STEP = 256  # 524,288 tokens an optimizer step
PLANNED_STEPS = 8_000_000  # about 4.2e12 tokens
REAL_BUDGET_STEPS = 12.5


def lora_3b_on_meta() -> torch.nn.Module:
    import peft
    import transformers

    config = transformers.AutoConfig.for_model(**bundled_config("llama-3.2-3b"))
    with torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(config)
    lora = peft.LoraConfig(r=16, target_modules="all-linear")
    return peft.get_peft_model(model, lora).train()


def one_step_flops(model: torch.nn.Module, ids: torch.Tensor) -> float:
    """The meter's ``transformer`` estimate of one training step on ``ids``, FLOP."""
    optimizer = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=0.0)
    with FlopMeter(model, optimizer=optimizer, nvml=False) as meter:
        model(input_ids=ids, labels=ids).loss.backward()
        optimizer.step()
    flops = meter.report().compute.estimates["transformer"].flops
    assert flops is not None
    return flops


def plan() -> None:
    sequence_flops = one_step_flops(
        lora_3b_on_meta(), torch.zeros((1, SEQUENCE_TOKENS), dtype=torch.long, device="meta")
    )
    step_flops = SEQUENCES_PER_STEP * sequence_flops
    chosen = determine_threshold(PRETRAIN_FLOPS)  # as flopmeter.run.parts.budget_of takes it
    threshold = chosen.value
    budget = resolve_budget("threshold", threshold_flops=threshold, threshold_rule=chosen.kind)
    assert budget is not None
    guard = BudgetGuard(budget)
    guard.start()
    guard.plan(PLANNED_STEPS)
    # the rates: the sequence's FLOP per token, so that a step's shape bound is its compute
    guard.use_rates(StepRates(token_flops=sequence_flops / SEQUENCE_TOKENS))
    reads, said = 0, []
    for step in range(1, PLANNED_STEPS + 1):
        guard.add_shape(SEQUENCES_PER_STEP, SEQUENCE_TOKENS)  # what the forward hook adds
        guard.close_step()
        if guard.needs_reading(step):
            reads += 1
            decision = guard.on_reading(step, step * step_flops)
            said += [message for _, message in decision.messages]
            if decision.stop:
                break
    stop = guard.stop_step
    print("Part 1: LoRA r=16 all-linear on Llama 3.2 3B (meta device), the guard's decisions")
    print(f"  transformer estimate, one {SEQUENCE_TOKENS}-token sequence: {sequence_flops:.4e}")
    print(f"  one step ({SEQUENCES_PER_STEP} sequences): {step_flops:.4e} FLOP")
    print(f"  planned: {PLANNED_STEPS:,} steps = {PLANNED_STEPS * step_flops:.4e} FLOP")
    print(f"  threshold {threshold:.4e}; budget {budget.flops:.4e} ({budget.source})")
    print(f"  stopped after step {stop:,}: {guard.flops_at_stop:.4e} FLOP")
    print(f"  = {guard.flops_at_stop / threshold:.4f} of the threshold; readings: {reads}")
    for message in said:
        print(f"  log: {message}")


def real_run() -> None:
    import peft
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=97,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
        pad_token_id=0,
    )
    model = peft.get_peft_model(
        LlamaForCausalLM(config), peft.LoraConfig(r=4, target_modules="all-linear")
    )
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-3)
    ids = torch.randint(1, 97, (4, 32), generator=torch.Generator().manual_seed(0))
    step_flops = one_step_flops(model, ids)  # a meter of its own, to set the budget
    budget = REAL_BUDGET_STEPS * step_flops
    with FlopMeter(model, pad_id=0, budget=budget, nvml=False) as meter:
        meter.plan_budget(40)
        stopped_at = None
        for step in range(1, 41):
            model(input_ids=ids, labels=ids).loss.backward()
            optimizer.step()
            optimizer.zero_grad()
            if meter.should_stop:
                stopped_at = step
                break
    report = meter.report()
    print("Part 2: tiny Llama with LoRA on the CPU, a raw loop planned for 40 steps")
    print(f"  one step {step_flops:.4e} FLOP; budget {budget:.4e} FLOP")
    print(
        f"  the loop stopped after step {stopped_at}: optimizer_steps={report.tokens.optimizer_steps}"
    )
    print(f"  primary_flops={report.compute.primary_flops:.4e} flops_at_stop=")
    print(
        f"    {report.budget.flops_at_stop:.4e} stopped_by_budget={report.budget.stopped_by_budget}"
    )
    print(f"  budget_left={meter.budget_left:.4e}")


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO, format="  log: %(message)s")
    logging.getLogger("flopmeter").setLevel(logging.INFO)
    plan()
    real_run()
