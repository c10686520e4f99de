"""LoRA on mixture-of-experts weights (peft's ParamWrapper): the expert weights' gradients and the
B @ A products built once per micro-batch, in the transformer and measured estimates."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch
from torch import nn
from torch.utils.flop_counter import FlopCounterMode

from flopmeter import FlopMeter, FlopReport
from flopmeter.flops.aten_ops import measured_formulas

transformers = pytest.importorskip("transformers")
peft = pytest.importorskip("peft")

VOCAB = 128
_SIZES = {"vocab_size": VOCAB, "hidden_size": 32, "num_hidden_layers": 2}
_HEADS = {"num_attention_heads": 4, "num_key_value_heads": 2}


def _mixtral() -> object:
    return transformers.MixtralConfig(
        **_SIZES, **_HEADS, intermediate_size=64, num_local_experts=4, num_experts_per_tok=2
    )


def _qwen3_moe() -> object:
    return transformers.Qwen3MoeConfig(
        **_SIZES,
        **_HEADS,
        intermediate_size=64,
        moe_intermediate_size=48,
        num_experts=4,
        num_experts_per_tok=2,
        head_dim=8,
    )


def _olmoe() -> object:
    return transformers.OlmoeConfig(
        **_SIZES, **_HEADS, intermediate_size=40, num_experts=4, num_experts_per_tok=2
    )


CONFIGS: dict[str, Callable[[], object]] = {
    "mixtral": _mixtral,
    "qwen3_moe": _qwen3_moe,
    "olmoe": _olmoe,
}
LORA = {
    "all-linear": {"target_modules": "all-linear"},
    "target_parameters": {
        "target_modules": [],
        "target_parameters": ["experts.gate_up_proj", "experts.down_proj"],
    },
}
#: Runs: micro-batches of (rows, length). The meter samples the first two micro-batches, so in
#: "mixed" the later ones (other lengths and sizes) are scaled from them: per token, per squared
#: length, per micro-batch.
RUNS = {
    "mixed": [(2, 8), (1, 16), (4, 4), (1, 8), (3, 12)],
    "one": [(3, 16)],
}


def lora_moe(arch: str, lora: str) -> nn.Module:
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(CONFIGS[arch]())  # sdpa, grouped_mm
    return peft.get_peft_model(model, peft.LoraConfig(r=4, **LORA[lora]))


def batches(run: str) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    return [torch.randint(1, VOCAB, shape, generator=g) for shape in RUNS[run]]


def dispatch_truth(model: nn.Module, ids: list[torch.Tensor]) -> int:
    """PyTorch's dispatch count of every training step, with flopmeter's formulas for CPU SDPA
    and grouped-mm (which PyTorch counts as 0)."""
    total = 0
    model.train()
    for batch in ids:
        with FlopCounterMode(display=False, custom_mapping=measured_formulas()) as counter:
            model(input_ids=batch, labels=batch).loss.backward()
        total += counter.get_total_flops()
        model.zero_grad()
    return total


def metered(model: nn.Module, ids: list[torch.Tensor]) -> FlopReport:
    model.train()
    with FlopMeter(model) as meter:
        for batch in ids:
            model(input_ids=batch, labels=batch).loss.backward()
            model.zero_grad()
    return meter.report()


@pytest.mark.slow
@pytest.mark.parametrize("run", list(RUNS))
@pytest.mark.parametrize("lora", list(LORA))
@pytest.mark.parametrize("arch", list(CONFIGS))
def test_lora_on_experts_is_counted_exactly(arch: str, lora: str, run: str) -> None:
    model = lora_moe(arch, lora)
    ids = batches(run)
    truth = dispatch_truth(model, ids)
    report = metered(model, ids)
    transformer = report.compute.estimates["transformer"]
    measured = report.compute.estimates["measured"]
    assert report.compute.primary_estimate == "transformer"
    assert transformer.flops == pytest.approx(truth, rel=1e-6)
    assert measured.flops == pytest.approx(truth, rel=1e-6)
    assert transformer.inputs["lora_delta_flops"] > 0
    assert measured.inputs["per_micro_batch_flops"] > 0


class ThreeDWeight(nn.Module):
    """A module applying a 3-D weight flopmeter does not read as experts (no expert count)."""

    def __init__(self) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.randn(3, 8, 8))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.einsum("...i,eio->...o", x, self.w)


def test_a_wrapped_weight_that_cannot_be_modelled_is_named_in_a_note() -> None:
    model = nn.Sequential(nn.Embedding(VOCAB, 8), nn.Linear(8, 8), ThreeDWeight())
    model = peft.get_peft_model(
        model, peft.LoraConfig(r=2, target_modules=[], target_parameters=["2.w"])
    ).train()
    with FlopMeter(model) as meter:
        model(torch.randint(0, VOCAB, (2, 4))).sum().backward()
    report = meter.report()
    assert report.compute.primary_estimate != "transformer"
    notes = " ".join(report.compute.estimates["transformer"].notes)
    assert "LoRA on w" in notes and "cannot read" in notes


def test_dora_on_experts_is_refused_by_peft() -> None:
    # peft 0.21 refuses DoRA on wrapped parameters, so there is no DoRA-on-experts cost to model.
    with pytest.raises(ValueError, match=r"DoRA|use_dora"):
        lora_moe_config = peft.LoraConfig(r=4, target_modules="all-linear", use_dora=True)
        torch.manual_seed(0)
        base = transformers.AutoModelForCausalLM.from_config(_mixtral())
        peft.get_peft_model(base, lora_moe_config)
