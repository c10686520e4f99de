"""Issue 20's "Done when", as tests: every model family of ``tests.support.families``, full
fine-tuning and LoRA, trained under ``FlopMeter`` (a raw loop, default options) and its report
held to PyTorch's own count of the same micro-batches: of each row unpadded (``families.truth``)
for a figure of the non-padding work, of the batches whole as they ran (``families.run_truth``)
for a figure that says it counts the positions computed, padding included (issue 33).

- a verdict only when ``compute.primary_flops`` is within 1% of the truth, else the verdict
  withheld with a reason (and the ``measured`` figure's ratio recorded beside);
- no verdict on a primary figure more than 5% from the truth, in any report (also T5 and BART
  with long targets, the issue's 0.086x);
- the FLOP model (the ``transformer`` estimate) within 1%, or its profile not recognised with a
  reason: never a recognised figure far from the truth;
- the truth's own formula for a convolution's backward checked against hand counts.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch import nn

from tests.support import families as fam

pytest.importorskip("transformers")
pytest.importorskip("peft")
pytest.importorskip("diffusers")

CASES = [(name, mode) for name in fam.FAMILIES for mode in fam.MODES]
#: Reports with a verdict must be on a figure within this of the truth (the issue's bound).
VERDICT_BOUND = 0.05
#: The primary figure's agreement with the truth that a verdict needs.
PRIMARY_TOLERANCE = 0.01

_RUNS: dict[tuple[str, str, str], tuple[dict[str, int], Any]] = {}
#: scripts/test's work units: the tests of one family and mode together (their parameter ids'
#: first two values), so that one worker makes its ``_run`` (tests/support/scheduling.py).
WORK_UNITS_BY_PARAMETERS = 2


def _batches(name: str, variant: str) -> list[dict[str, Any]]:
    if variant == "long_targets":
        return fam.long_target_batches()
    if variant == "padded_captions":
        return fam.clip_padded_batches()
    return fam.FAMILIES[name].batches()  # type: ignore[return-value]


def _run(name: str, mode: str, variant: str = "default") -> tuple[dict[str, int], Any]:
    """(truths, report) of a family in a mode, once per test session: the truths by the
    positions counted (``non_padding``: each row unpadded; ``padded``: the batches whole, as
    they ran), for ``fam.truth_of`` to pick the one the report's primary figure says."""
    key = (name, mode, variant)
    if key not in _RUNS:
        family = fam.FAMILIES[name]
        batches = _batches(name, variant)
        truths = {
            "non_padding": fam.truth(family, mode, batches),  # type: ignore[arg-type]
            "padded": fam.run_truth(family, mode, batches),  # type: ignore[arg-type]
        }
        _RUNS[key] = truths, fam.train_metered(family, mode, batches)  # type: ignore[arg-type]
    return _RUNS[key]


def _judged_run(name: str, mode: str, variant: str = "default") -> tuple[int, Any]:
    """(truth, report): the truth of the positions the report's primary figure counts."""
    truths, report = _run(name, mode, variant)
    return fam.truth_of(report, truths), report


def _ratio(flops: float | None, truth: int) -> float | None:
    return None if flops is None else flops / truth


def _describe(report: Any, truth: int) -> str:
    compute = report.compute
    ratios = {k: _ratio(e.flops, truth) for k, e in compute.estimates.items()}
    shown = {k: None if v is None else round(v, 4) for k, v in ratios.items()}
    return (
        f"truth {truth:.4e}; primary {compute.primary_estimate} = {compute.primary_flops}; "
        f"verdict {report.verdict.outcome}; ratios to the truth {shown}; "
        f"reason: {compute.primary_reason}; withheld: {compute.withheld_reason}"
    )


@pytest.mark.slow
@pytest.mark.parametrize(("name", "mode"), CASES)
def test_a_verdict_only_on_a_primary_figure_within_1pct_of_the_truth(
    name: str, mode: str, record_property: Any
) -> None:
    truth, report = _judged_run(name, mode)
    measured = report.compute.estimates.get("measured")
    record_property("measured_ratio", _ratio(measured.flops if measured else None, truth))
    primary = report.compute.primary_flops
    if report.verdict.outcome is None:
        assert report.compute.withheld_reason, _describe(report, truth)
    else:
        assert primary is not None, _describe(report, truth)
        assert abs(primary / truth - 1) <= PRIMARY_TOLERANCE, _describe(report, truth)


@pytest.mark.slow
@pytest.mark.parametrize(
    ("name", "mode", "variant"),
    [(n, m, "default") for n, m in CASES]
    + [(n, m, "long_targets") for n in ("t5", "bart") for m in fam.MODES],
)
def test_b_no_report_gives_a_verdict_on_a_figure_more_than_5pct_off(
    name: str, mode: str, variant: str
) -> None:
    truth, report = _judged_run(name, mode, variant)
    if report.verdict.outcome is not None:
        judged = report.verdict.judged_flops
        assert judged is not None, _describe(report, truth)
        assert abs(judged / truth - 1) <= VERDICT_BOUND, _describe(report, truth)


@pytest.mark.slow
@pytest.mark.parametrize(("name", "mode"), CASES)
def test_the_flop_model_is_exact_or_says_it_does_not_know(name: str, mode: str) -> None:
    """Within 1% of the truth, or the profile not recognised with a reason. The issue names
    the families it must know exactly (``Family.exact``); for every family, a recognised
    figure far from the truth is the silent error the issue is about. The FLOP model counts
    the non-padding work: its truth is that of each row unpadded."""
    truths, report = _run(name, mode)
    truth = truths["non_padding"]
    transformer = report.compute.estimates["transformer"]
    if transformer.flops is None:
        assert transformer.notes, _describe(report, truth)
        return
    recognised, notes = fam.profile_recognition(fam.FAMILIES[name], mode)  # type: ignore[arg-type]
    if recognised:
        assert abs(transformer.flops / truth - 1) <= PRIMARY_TOLERANCE, _describe(report, truth)
    else:
        assert notes, "not recognised, and no reason given"
        assert report.compute.primary_estimate != "transformer", _describe(report, truth)


# ------------------------------------------------- the truth's convolution formula, by hand


def _conv_count(conv: nn.Module, x: torch.Tensor, mapping: dict | None) -> int:
    from torch.utils.flop_counter import FlopCounterMode

    with FlopCounterMode(display=False, custom_mapping=mapping or {}) as counter:
        conv(x).sum().backward()
    return counter.get_total_flops()


def test_a_depthwise_convolution_backward_is_counted_by_hand() -> None:
    conv = nn.Conv2d(8, 8, 3, padding=1, groups=8)
    x = torch.randn(2, 8, 5, 5, requires_grad=True)
    # forward: 2 (batch) * 8 (channels) * 25 (positions) * 9 (taps) * 2 = 7200;
    # the input gradient and the weight gradient: 7200 each
    assert _conv_count(conv, x, fam.truth_mapping()) == 3 * 7200
    x.requires_grad_(False)  # the weight gradient only
    assert _conv_count(conv, x, fam.truth_mapping()) == 2 * 7200


def test_a_mamba_style_conv1d_is_counted_by_hand() -> None:
    conv = nn.Conv1d(6, 6, 4, padding=3, groups=6, bias=True)
    x = torch.randn(3, 6, 10, requires_grad=True)
    # output length 10 + 2*3 - 4 + 1 = 13: 2 * 3 (batch) * 6 (channels) * 13 * 4 (taps)
    # = 1872 each for the forward, the input gradient and the weight gradient
    assert _conv_count(conv, x, fam.truth_mapping()) == 3 * 1872


@pytest.mark.parametrize("transposed", [False, True])
def test_a_grouped_convolution_is_the_sum_of_its_groups(transposed: bool) -> None:
    """A grouped convolution's count equals that of its groups run as ungrouped convolutions,
    each counted with PyTorch's own formula (right when ``groups == 1``)."""
    kind = nn.ConvTranspose2d if transposed else nn.Conv2d
    torch.manual_seed(0)
    grouped = kind(4, 6, 3, stride=2, padding=1, groups=2)
    x = torch.randn(2, 4, 7, 7, requires_grad=True)
    parts = 0
    for g in range(2):
        part = kind(2, 3, 3, stride=2, padding=1)
        xg = x.detach()[:, 2 * g : 2 * g + 2].clone().requires_grad_(True)
        parts += _conv_count(part, xg, None)
    assert _conv_count(grouped, x, fam.truth_mapping()) == parts


def _unpadded(batches: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The same rows with every position a token: masks all ones, labels the ids."""
    out = []
    for batch in batches:
        batch = dict(batch)
        if "attention_mask" in batch:
            batch["attention_mask"] = torch.ones_like(batch["attention_mask"])
        ids, labels = batch.get("input_ids"), batch.get("labels")
        tensors = isinstance(ids, torch.Tensor) and isinstance(labels, torch.Tensor)
        if tensors and labels.shape == ids.shape:
            batch["labels"] = ids.clone()
        out.append(batch)
    return out


@pytest.mark.slow
@pytest.mark.parametrize(
    ("name", "mode"),
    [
        ("mamba2", "lora"),
        ("falcon_h1", "full"),
        ("qwen3_next", "lora"),
        ("gemma3", "full"),
        ("qwen2_vl", "lora"),
    ],
)
def test_families_the_flop_model_does_not_know_get_a_verdict_on_their_count_without_padding(
    name: str, mode: str
) -> None:
    """Withholding is not the answer where the meter can know: the state-space mixers and the
    vision towers the FLOP model does not read are judged on the dispatch count, scaled per
    shape key, when the batches have no padding (whose work the samples would include)."""
    family = fam.FAMILIES[name]
    batches = _unpadded(family.batches())  # type: ignore[arg-type]
    truth = fam.truth(family, mode, batches)  # type: ignore[arg-type]
    report = fam.train_metered(family, mode, batches)  # type: ignore[arg-type]
    assert report.verdict.outcome is not None, _describe(report, truth)
    assert report.compute.primary_estimate == "measured", _describe(report, truth)
    assert abs(report.compute.primary_flops / truth - 1) <= PRIMARY_TOLERANCE
    measured = report.compute.estimates["measured"]
    assert measured.inputs["padding_convention"] == "non_padding"  # no padding: one convention


@pytest.mark.slow
@pytest.mark.parametrize("mode", fam.MODES)
@pytest.mark.parametrize("name", ["mamba", "jamba"])
def test_selective_scan_families_are_judged_on_the_flop_model(name: str, mode: str) -> None:
    """Mamba's and Jamba's mixers are modelled (``flops/mixers.py``): without padding the
    primary figure is the ``transformer`` estimate, equal to PyTorch's count of the run."""
    family = fam.FAMILIES[name]
    batches = _unpadded(family.batches())  # type: ignore[arg-type]
    truth = fam.truth(family, mode, batches)  # type: ignore[arg-type]
    report = fam.train_metered(family, mode, batches)  # type: ignore[arg-type]
    assert report.verdict.outcome is not None, _describe(report, truth)
    assert report.compute.primary_estimate == "transformer", _describe(report, truth)
    assert report.compute.estimates["transformer"].flops == pytest.approx(truth, rel=1e-9)


#: Issue 33's cases: withheld on padded batches before, for the padding's work in the samples
#: (Qwen3-Next: no sample kept, its gated delta-net's backward past the 2x guard). CLIP's
#: padded case is its captions right-padded (``fam.clip_padded_batches``).
PADDED_CASES = [
    (name, mode, variant)
    for name, variant in (
        ("mamba2", "default"),
        ("falcon_h1", "default"),
        ("jamba", "default"),
        ("qwen2_vl", "default"),
        ("clip", "padded_captions"),
        ("qwen3_next", "default"),
    )
    for mode in fam.MODES
]


@pytest.mark.slow
@pytest.mark.parametrize(("name", "mode", "variant"), PADDED_CASES)
def test_families_judged_on_padded_batches(name: str, mode: str, variant: str) -> None:
    """Padded batches, the normal case: each gets a verdict on a primary figure within 1% of
    PyTorch's count of the run's batches as they ran, padding included, and the figure says
    it counts the positions computed (its ``padding_convention``, the reason and a note)."""
    masks = [b["attention_mask"] for b in _batches(name, variant) if "attention_mask" in b]
    assert any(bool((m == 0).any()) for m in masks), "the batches must have padding"
    truths, report = _run(name, mode, variant)
    compute = report.compute
    assert report.verdict.outcome is not None, _describe(report, truths["padded"])
    primary = compute.estimates[compute.primary_estimate]
    if primary.inputs.get("padding_convention") == "padded":
        truth = truths["padded"]
        assert "padding included" in (compute.primary_reason or ""), _describe(report, truth)
        assert any("padding included" in n for n in report.notes), report.notes
    else:  # a FLOP model that reads the family: the non-padding work, exactly
        truth = truths["non_padding"]
    assert abs(compute.primary_flops / truth - 1) <= PRIMARY_TOLERANCE, _describe(report, truth)
