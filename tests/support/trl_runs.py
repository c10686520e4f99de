"""TRL's post-training trainers on the tiny causal LM, as the phase and plan tests run them:
each builder returns ``(trainer, callbacks)``, metered by the Hugging Face callback when
``meter`` is true (the same run, unmetered, gives the truth)."""

from __future__ import annotations

import pytest
import torch

from tests.support.batches import WORD_VOCAB
from tests.support.models import tiny_llama_config
from tests.support.phase_truth import count_by_model
from tests.support.text import word_tokenizer

QUIET = dict(
    report_to=[],
    use_cpu=True,
    disable_tqdm=True,
    save_strategy="no",
    seed=0,
    logging_steps=1,
    gradient_checkpointing=False,
)


def texts(n: int, words: int, seed: int) -> list[str]:
    """``n`` texts of exactly ``words`` words each (one token per word)."""
    return [" ".join(f"w{3 + (seed * 31 + i * 7 + j * 13) % (WORD_VOCAB - 3)}" for j in range(words))
            for i in range(n)]  # fmt: skip


def load(path):
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    return AutoModelForCausalLM.from_pretrained(path, attn_implementation="eager")


def callbacks(meter: bool, **options):
    if not meter:
        return []
    from flopmeter.integrations.hf import FlopMeterCallback

    return [FlopMeterCallback(ledger=False, **options)]


def grpo(path, out, meter, *, beta=0.04, reward_model=None, lora=False, trainer="grpo", **options):
    """TRL's ``GRPOTrainer`` (or, ``trainer="rloo"``, its ``RLOOTrainer``, which takes the
    same arguments) on the tiny model."""
    from datasets import Dataset
    from trl import GRPOConfig, GRPOTrainer, RLOOConfig, RLOOTrainer

    if trainer == "rloo":
        GRPOConfig, GRPOTrainer = RLOOConfig, RLOOTrainer

    tok = word_tokenizer()
    kwargs = {}
    if reward_model is not None:
        funcs = [reward_model]
        kwargs["reward_processing_classes"] = [tok]
    else:
        funcs = lambda completions, **kw: [float(len(c)) for c in completions]  # noqa: E731
    if lora:
        from peft import LoraConfig

        kwargs["peft_config"] = LoraConfig(
            r=4, target_modules=["q_proj", "v_proj"], task_type="CAUSAL_LM"
        )
    args = GRPOConfig(
        output_dir=str(out),
        per_device_train_batch_size=4,
        num_generations=4,
        max_completion_length=6,
        generation_kwargs={"min_new_tokens": 6},  # full-length completions: no padding
        max_steps=2,
        beta=beta,
        **QUIET,
    )
    cbs = callbacks(meter, **options)
    trainer = GRPOTrainer(
        model=load(path),
        reward_funcs=funcs,
        args=args,
        train_dataset=Dataset.from_dict({"prompt": texts(8, 5, 1)}),
        processing_class=tok,
        callbacks=cbs,
        **kwargs,
    )
    return trainer, cbs


def reward_model(tmp_path):
    from transformers import LlamaForSequenceClassification

    torch.manual_seed(1)
    config = tiny_llama_config(
        vocab_size=WORD_VOCAB, num_labels=1, attn_implementation="eager", pad_token_id=0
    )
    return LlamaForSequenceClassification(config)


def models(trainer) -> dict[str, torch.nn.Module]:
    models = {"policy": trainer.model}
    if getattr(trainer, "ref_model", None) is not None:
        models["reference"] = trainer.ref_model
    for i, f in enumerate(getattr(trainer, "reward_funcs", None) or []):
        if isinstance(f, torch.nn.Module):
            models[f"reward{i}"] = f
    return models


def run(make):
    """The truth of one run (a first trainer, unmetered) and the report of an identical one."""
    trainer, _ = make(False)
    truth = count_by_model(trainer.train, models(trainer))
    trainer, cbs = make(True)
    trainer.train()
    return truth, cbs[0].meter.report()


def dpo(path, out, meter, *, precompute=False, **options):
    from datasets import Dataset
    from trl import DPOConfig, DPOTrainer

    data = {"prompt": texts(8, 4, 2), "chosen": texts(8, 5, 3), "rejected": texts(8, 5, 4)}
    args = DPOConfig(
        output_dir=str(out),
        per_device_train_batch_size=4,
        max_steps=2,
        precompute_ref_log_probs=precompute,
        **QUIET,
    )
    cbs = callbacks(meter, **options)
    trainer = DPOTrainer(
        model=load(path),
        ref_model=load(path),
        args=args,
        train_dataset=Dataset.from_dict(data),
        processing_class=word_tokenizer(),
        callbacks=cbs,
    )
    return trainer, cbs


def gkd(saved, teacher_saved, tmp_path, meter):
    """TRL's GKDTrainer on-policy at every step (``lmbda=1``), completions of full length."""
    gkd = pytest.importorskip("trl.experimental.gkd")
    from datasets import Dataset

    tok = word_tokenizer()
    tok.chat_template = "{% for m in messages %}{{ m['content'] }} {% endfor %}"
    pairs = zip(texts(8, 5, 6), texts(8, 5, 7), strict=True)
    messages = [
        [{"role": "user", "content": a}, {"role": "assistant", "content": b}] for a, b in pairs
    ]
    args = gkd.GKDConfig(
        output_dir=str(tmp_path / str(meter)),
        per_device_train_batch_size=4,
        max_steps=2,
        max_new_tokens=6,
        lmbda=1.0,  # on-policy at every step
        **QUIET,
    )
    cbs = callbacks(meter)
    trainer = gkd.GKDTrainer(
        model=load(saved),
        teacher_model=load(teacher_saved),
        args=args,
        train_dataset=Dataset.from_dict({"messages": messages}),
        processing_class=tok,
        callbacks=cbs,
    )
    trainer.generation_config.min_new_tokens = 6  # full-length completions: no padding
    return trainer, cbs


def distillation(saved, teacher_saved, out, meter):
    """TRL's DistillationTrainer (on-policy: the student generates every completion), 2 steps
    of 4 prompts of 5 tokens, completions of full length (6 tokens)."""
    from datasets import Dataset
    from trl import DistillationConfig, DistillationTrainer

    tok = word_tokenizer()
    tok.chat_template = "{% for m in messages %}{{ m['content'] }} {% endfor %}"
    prompts = [[{"role": "user", "content": t}] for t in texts(8, 5, 5)]
    args = DistillationConfig(
        output_dir=str(out),
        per_device_train_batch_size=4,
        max_steps=2,
        max_completion_length=6,
        generation_kwargs={"min_new_tokens": 6},  # full-length completions: no padding
        **QUIET,
    )
    cbs = callbacks(meter)
    trainer = DistillationTrainer(
        model=load(saved),
        teacher_model=load(teacher_saved),
        args=args,
        train_dataset=Dataset.from_dict({"prompt": prompts}),
        processing_class=tok,
        callbacks=cbs,
    )
    return trainer, cbs
