"""The FLOP model of Mamba's and Jamba's selective-scan mixers, against PyTorch's dispatch count.

Truth: :class:`torch.utils.flop_counter.FlopCounterMode` with flopmeter's registry
(``measured_formulas()``, whose convolution backward keeps ``groups``) over one training step of
each sequence on its own, unpadded (the text convention: the work on the non-padding tokens),
summed. The models are the real transformers classes from tiny configs (no downloads), eager
attention and experts, in full fine-tuning and with peft LoRA (Mamba: ``in_proj`` and
``x_proj``, as peft refuses its ``out_proj``; Jamba: ``all-linear``). The profile is taken on a
right-padded batch of the same sequences, as a run's first micro-batch would be: the
convolution and the scan run over its padding, which the figure does not count.

Also: Mamba2's chunked scan is not modelled, and the reason says so; the ``transformer``
estimate of a metered run of padded micro-batches is the non-padding count.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.utils.flop_counter import FlopCounterMode

from flopmeter.flops.aten_ops import measured_formulas
from flopmeter.flops.capture import profile_model
from flopmeter.flops.transformer import transformer_estimate
from flopmeter.types import TokenTotals
from tests.support.models import tiny_jamba_config, tiny_mamba2_config, tiny_mamba_config

transformers = pytest.importorskip("transformers")
peft = pytest.importorskip("peft")

pytestmark = pytest.mark.slow

VOCAB, PAD = 64, 0
LENGTHS = (13, 7, 10)  # right-padded to 13 in the profiled batch


def _config(family: str):
    if family == "mamba":
        return tiny_mamba_config(vocab_size=VOCAB, pad_token_id=PAD)
    if family == "mamba2":
        return tiny_mamba2_config(vocab_size=VOCAB, pad_token_id=PAD)
    return tiny_jamba_config(vocab_size=VOCAB, mamba_d_conv=3, pad_token_id=PAD)


LORA = {"mamba": ["in_proj", "x_proj"], "mamba2": ["in_proj"], "jamba": "all-linear"}


def _model(family: str, mode: str) -> nn.Module:
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(
        _config(family), attn_implementation="eager", experts_implementation="eager"
    )
    if mode == "lora":
        model = peft.get_peft_model(model, peft.LoraConfig(r=4, target_modules=LORA[family]))
    return model.train()


def _padded() -> dict[str, torch.Tensor]:
    width = max(LENGTHS)
    ids = torch.full((len(LENGTHS), width), PAD, dtype=torch.long)
    mask = torch.zeros_like(ids)
    g = torch.Generator().manual_seed(1)
    for row, n in enumerate(LENGTHS):
        ids[row, :n] = torch.randint(1, VOCAB, (n,), generator=g)
        mask[row, :n] = 1
    labels = ids.masked_fill(mask == 0, -100)
    return {"input_ids": ids, "attention_mask": mask, "labels": labels}


def _non_padding_truth(
    model: nn.Module, batch: dict[str, torch.Tensor], lengths: tuple[int, ...] = LENGTHS
) -> int:
    """PyTorch's count of each sequence alone (``lengths``: the rows'), unpadded, summed."""
    total = 0
    for row, n in enumerate(lengths):
        ids = batch["input_ids"][row : row + 1, :n]
        with FlopCounterMode(display=False, custom_mapping=measured_formulas()) as counter:
            model(input_ids=ids, labels=ids).loss.backward()
        model.zero_grad(set_to_none=True)
        total += counter.get_total_flops()
    return total


TOTALS = TokenTotals(
    tokens_processed=sum(LENGTHS),
    tokens_seen=sum(LENGTHS),
    sequences=len(LENGTHS),
    sum_sq_seq_len=sum(n * n for n in LENGTHS),
    micro_batches=1,
)


@pytest.mark.parametrize("mode", ["full", "lora"])
@pytest.mark.parametrize("family", ["mamba", "jamba"])
def test_selective_scan_mixers_are_counted_exactly(family: str, mode: str) -> None:
    model = _model(family, mode)
    batch = _padded()
    profile = profile_model(model, **batch)
    assert profile.recognised, profile.notes
    assert profile.mixers == ()
    layers = sum(type(m).__name__.endswith("MambaMixer") for m in model.modules())
    assert len(profile.scan_mixers) == layers > 0
    estimate = transformer_estimate(profile, TOTALS)
    assert estimate.inputs["mixer_flops"] > 0
    assert estimate.flops == pytest.approx(_non_padding_truth(model, batch), rel=1e-9)


def test_a_frozen_mixer_bills_no_weight_gradient() -> None:
    """LoRA on Mamba: the convolution's weight is frozen (one gradient: its input's), the scan
    still computes both of its gradients (the state and C need them for the adapters below)."""
    profile = profile_model(_model("mamba", "lora"), **_padded())
    assert {(m.conv_grads, m.scan_grads) for m in profile.scan_mixers} == {(1, 2)}
    full = profile_model(_model("mamba", "full"), **_padded())
    assert {(m.conv_grads, m.scan_grads) for m in full.scan_mixers} == {(2, 2)}


def test_chunked_scans_are_not_modelled_and_say_why() -> None:
    model = _model("mamba2", "full")
    profile = profile_model(model, **_padded())
    assert not profile.recognised
    assert profile.scan_mixers == ()
    assert len(profile.mixers) == 2
    estimate = transformer_estimate(profile, TOTALS)
    assert estimate.flops is None
    assert any("Mamba2Mixer" in n and "no transformer estimate" in n for n in estimate.notes)


def test_a_metered_run_of_padded_batches_has_the_non_padding_figure() -> None:
    """Through the meter: two padded micro-batches of Jamba with LoRA; the report's
    ``transformer`` figure is PyTorch's count of their sequences, each alone and unpadded."""
    from flopmeter import FlopMeter

    model = _model("jamba", "lora")
    batches = [_padded(), {k: v[1:] for k, v in _padded().items()}]
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.SGD(params, lr=0.0)
    with FlopMeter(model, optimizer=optimizer, nvml=False) as meter:
        for batch in batches:
            model(**batch).loss.backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
    estimates = meter.report().compute.estimates
    truth = _non_padding_truth(model, batches[0])
    truth += _non_padding_truth(model, batches[1], LENGTHS[1:])  # the last two sequences
    assert estimates["transformer"].flops == pytest.approx(truth, rel=1e-9)


@pytest.mark.parametrize("length", [2, 16])
def test_the_budget_bound_of_a_mamba_micro_batch_holds_its_mixers(length: int) -> None:
    """The budget guard's step bound from the profile's rates (no sample yet) is at least
    PyTorch's count of a micro-batch (3 rows of ``length``): the mixers' convolution and scan
    are in the per-token rate, at their most per token (each token a sequence of its own)."""
    from flopmeter.budget.rates import step_rates
    from flopmeter.counting.census import Census
    from flopmeter.flops.recorder import FlopObservations

    model = _model("mamba", "full")
    profile = profile_model(model, **_padded())
    census = Census(n_total=1, n_trainable=1, n_frozen=0, n_embedding=0)
    rates = step_rates(FlopObservations(profile=profile, samples=()), census)
    ids = torch.randint(1, VOCAB, (3, length), generator=torch.Generator().manual_seed(2))
    with FlopCounterMode(display=False, custom_mapping=measured_formulas()) as counter:
        model(input_ids=ids, labels=ids).loss.backward()
    truth = counter.get_total_flops()
    bound = rates.bound_flops(3 * length, 3 * length * length, 1)
    assert truth <= bound
    without = rates.bound_flops(3 * length, 3 * length * length, 1) - sum(
        m.flops(3 * length, 3 * length) for m in profile.scan_mixers
    )
    assert without < truth  # the mixers' term is what makes it a bound
