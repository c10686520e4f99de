"""Weights used outside their module (TRL's fused LM head, fused linear-cross-entropy), reentrant
activation checkpointing, forced cross-check samples, and the report's primary_reason."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.flop_counter import FlopCounterMode

from flopmeter import FlopMeter, FlopReport
from tests.support.models import tiny_llama, tiny_llama_config

transformers = pytest.importorskip("transformers")
peft = pytest.importorskip("peft")

VOCAB = 96


def llama_config() -> transformers.LlamaConfig:
    # the shared tiny Llama (pad id 0, untied head) with this file's vocabulary and
    # LlamaConfig's default context length
    return tiny_llama_config(vocab_size=VOCAB, max_position_embeddings=2048)


class HeadByWeight(nn.Module):
    """A Llama backbone whose loss multiplies by ``lm_head.weight`` without calling
    ``lm_head`` (as TRL and fused linear-cross-entropy kernels do); ``op`` is the product."""

    def __init__(self, op: str = "matmul", after_forward: bool = False) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.config = llama_config()
        self.model = transformers.LlamaModel(self.config)
        self.model.config._attn_implementation = "eager"
        self.lm_head = nn.Linear(32, VOCAB, bias=False)
        self.op = op
        self.after_forward = after_forward

    def get_output_embeddings(self) -> nn.Module:
        return self.lm_head

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        weight = self.lm_head.weight
        if self.op == "einsum":
            return torch.einsum("btd,vd->btv", hidden, weight)
        return hidden @ weight.T

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        hidden = self.model(input_ids=input_ids).last_hidden_state
        return hidden if self.after_forward else self.loss(hidden, input_ids)

    def loss(self, hidden: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(self.logits(hidden).flatten(0, 1), ids.flatten())


def step(model: nn.Module, ids: torch.Tensor) -> None:
    out = model(ids)
    (model.loss(out, ids) if getattr(model, "after_forward", False) else out).backward()


def dispatch_truth(model: nn.Module, ids: torch.Tensor) -> int:
    with FlopCounterMode(display=False) as counter:
        step(model, ids)
    model.zero_grad()
    return counter.get_total_flops()


def metered(model: nn.Module, batches: list[torch.Tensor], **kwargs: object) -> FlopReport:
    optimizer = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=0.0)
    model.train()
    with FlopMeter(model, pad_id=0, **kwargs) as meter:
        for ids in batches:
            step(model, ids)
            optimizer.step()
            optimizer.zero_grad()
    return meter.report()


IDS = torch.randint(1, VOCAB, (2, 12), generator=torch.Generator().manual_seed(0))


@pytest.mark.slow
@pytest.mark.parametrize("after_forward", [False, True])
def test_head_used_by_its_weight_is_counted(after_forward: bool) -> None:
    model = HeadByWeight(after_forward=after_forward)
    truth = dispatch_truth(model, IDS)
    report = metered(model, [IDS], measure_every=0)
    transformer = report.compute.estimates["transformer"]
    # no dispatch-level sample checks it: not judged, but its figure is kept
    assert report.compute.primary_estimate is None and report.verdict.outcome is None
    assert transformer.flops == pytest.approx(truth, rel=1e-6)
    assert any("lm_head (1 products)" in n for n in transformer.notes)
    assert report.compute.primary_reason == (
        "none: no dispatch-level sample of this run (sampling was turned off (measure_every=0))"
    )
    sampled = metered(model, [IDS])
    assert sampled.compute.primary_estimate == "transformer"
    assert sampled.compute.estimates["transformer"].flops == pytest.approx(truth, rel=1e-6)
    assert (
        sampled.compute.primary_reason == "transformer: architecture recognised, measured within 1%"
    )
    assert "architecture recognised, measured within 1%" in sampled.to_text()


def test_unmodelled_use_of_a_weight_is_noted_and_cross_checked() -> None:
    model = HeadByWeight(op="einsum")
    report = metered(model, [IDS, IDS], measure_every=0)
    notes = report.compute.estimates["transformer"].notes
    assert any(n.startswith("The profile cannot fully model lm_head: ") for n in notes)
    measured = report.compute.estimates["measured"]
    assert measured.flops is not None  # forced although sampling is off
    assert any("cross-check work the model profile could not model" in n for n in measured.notes)
    assert report.compute.primary_reason is not None


def lora_llama() -> nn.Module:
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(llama_config())
    model.config._attn_implementation = "eager"
    config = peft.LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"])
    return peft.get_peft_model(model, config)


class Causal(nn.Module):
    """Runs a causal LM on ids and returns its loss (the meter's model)."""

    def __init__(self, inner: nn.Module) -> None:
        super().__init__()
        self.inner = inner
        self.config = inner.config

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.inner(input_ids=input_ids, labels=input_ids).loss


def test_reentrant_checkpointing_is_charged_as_the_backward_computes() -> None:
    model = lora_llama()
    model.enable_input_require_grads()
    wrapped = Causal(model)
    truth = dispatch_truth(wrapped, IDS)  # no checkpointing: no recomputation to exclude
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": True})
    report = metered(wrapped, [IDS], measure_every=0)
    transformer = report.compute.estimates["transformer"]
    assert transformer.flops == pytest.approx(truth, rel=1e-6)
    assert any("reentrant activation checkpointing" in n for n in transformer.notes)
    # unsampled: the figure is kept, not judged
    assert report.compute.primary_estimate is None and report.verdict.outcome is None
    assert "measure_every=0" in (report.compute.withheld_reason or "")


@pytest.mark.slow
def test_trl_sft_trainer_with_its_defaults(tmp_path) -> None:
    pytest.importorskip("trl")
    from datasets import Dataset

    from flopmeter.integrations.hf import FlopMeterCallback
    from tests.support.batches import WORD_VOCAB
    from tests.support.text import texts, word_tokenizer
    from tests.support.trainers import sft_trainer

    tokenizer = word_tokenizer()
    model = tiny_llama(vocab_size=WORD_VOCAB, eos_token_id=tokenizer.eos_token_id)
    callback = FlopMeterCallback()
    trainer = sft_trainer(
        tmp_path,
        model=model,
        train_dataset=Dataset.from_dict({"text": texts(16, seed=3)}),
        processing_class=tokenizer,
        peft_config=peft.LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"]),
        callbacks=[callback],
        per_device_train_batch_size=4,
        num_train_epochs=1,
        max_length=32,
        save_strategy="no",
    )
    trainer.train()
    report = callback.meter.report()
    ratio = (
        report.compute.estimates["transformer"].flops / report.compute.estimates["measured"].flops
    )
    print("TRL transformer / measured:", ratio, report.compute.primary_reason)
    assert any("lm_head" in n for n in report.compute.estimates["transformer"].notes)
    assert ratio == pytest.approx(1.0, abs=0.01)
    assert report.compute.primary_reason.startswith(
        "transformer: architecture recognised, measured"
    )
