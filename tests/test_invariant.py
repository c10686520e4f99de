"""The invariant: a verdict only on a figure an independent dispatch-level count of the run
agrees with (within AGREEMENT), or on that count itself; and the measured estimate scaled by
the unit the work depends on, saying whether that is sound for the run.

Pure-function tests of the scaling and of the primary rule with samples and totals built by
hand, the sampler's forced samples on a real model, and every branch of the rule through the
real meter on tiny real models (the figures checked against PyTorch's own count).
"""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.utils.flop_counter import FlopCounterMode

from flopmeter import FlopMeter, FlopReport
from flopmeter.counting.census import Census
from flopmeter.counting.work_units import ShapeUnits
from flopmeter.flops.aten_ops import measured_formulas
from flopmeter.flops.estimates import choose_primary, compute_estimates, estimate_notes
from flopmeter.flops.model_profile import AttentionLayerWork, LinearGroup, ModelProfile
from flopmeter.flops.per_item import NON_PADDING, PADDED, per_item_flops
from flopmeter.flops.recorder import FlopModelRecorder, FlopObservations
from flopmeter.flops.sampler import MAX_FORCED_SAMPLES, MeasuredSampler
from flopmeter.flops.scaling import (
    AGREEMENT,
    MeasuredSample,
    measured_estimate,
    text_rule_unsound,
    unsound_reason,
)
from flopmeter.types import InputShapeCount, TokenTotals
from tests.support.models import eager_llama

CENSUS = Census(n_total=2000, n_trainable=1500, n_frozen=500, n_embedding=0)
#: The hand profile's run: 10 tokens in 2 sequences of 5 (25 + 25 = 50 pairs).
TOTALS = TokenTotals(tokens_processed=10, sum_sq_seq_len=50, sequences=2, micro_batches=1)


def hand_profile(recognised: bool = True) -> ModelProfile:
    """Linear work 1000 MACs/token trained (6 FLOP/MAC) + 200 forward only (2): 6400 FLOP per
    token; attention two layers of width 16, one trained (3 + 3 matmuls per pair over 16, then
    2 x (16 + 16)) and one frozen (2 x 16 + 2 x 16): 256 FLOP per pair. Over TOTALS: 64000 +
    12800 = 76800 FLOP."""
    return ModelProfile(
        linear=(
            LinearGroup(
                kind="linear", input_grad=True, weight_grad=True, macs_per_token=1000, modules=1
            ),
            LinearGroup(
                kind="lm_head", input_grad=False, weight_grad=False, macs_per_token=200, modules=1
            ),
        ),
        attention=(
            AttentionLayerWork(query_width=16, window=None, q_grad=True, k_grad=True, v_grad=True),
            AttentionLayerWork(
                query_width=16, window=None, q_grad=False, k_grad=False, v_grad=False
            ),
        ),
        architecture=None,
        recognised=recognised,
        notes=("hand profile",),
        inactive_expert_params=0,
        batch_tokens=10,
    )


def text_sample(scale: float = 1.0, **fields: object) -> MeasuredSample:
    """One sample of the TOTALS batch whose dispatch count is ``scale`` x the hand profile's."""
    base: dict[str, object] = dict(
        linear_flops=round(64000 * scale),
        attention_flops=round(12800 * scale),
        recompute_flops=0,
        tokens=10,
        sum_sq_len=50,
        sequences=2,
    )
    base.update(fields)
    return MeasuredSample(**base)  # type: ignore[arg-type]


def choose(samples: tuple[MeasuredSample, ...], recognised: bool = True, **kwargs: object):
    observations = FlopObservations(profile=hand_profile(recognised), samples=samples, **kwargs)
    estimates, primary = compute_estimates(CENSUS, TOTALS, observations)
    return estimates, primary, choose_primary(estimates, observations), observations


# ----------------------------------------------------------------------------- the scaling
def test_text_rule_is_sound_for_text_samples_of_a_text_run() -> None:
    # no units (the hooks before they pass them) count as text; the figure is the text rule's
    est = measured_estimate([text_sample()], TOTALS)
    assert est.inputs["scaling"] == "text" and est.inputs["scaling_sound"] is True
    assert est.flops == 76800  # 10 * 64000 / 10 + 50 * 12800 / 50
    assert unsound_reason(est) is None
    units = text_sample(keys=("input_ids:5",), items=2, text=True)
    assert measured_estimate([units], TOTALS).inputs["scaling_sound"] is True


def test_a_non_text_micro_batch_in_the_run_makes_the_text_rule_unsound() -> None:
    totals = TOTALS.model_copy(update={"non_text_micro_batches": 1})
    assert "1 of the run's 1 micro-batches" in (text_rule_unsound([text_sample()], totals) or "")
    est = measured_estimate([text_sample()], totals)
    # no units and no shape keys: per-item scaling cannot run either; the text figure is shown
    # for comparison, unsound, with the reason
    assert est.inputs["scaling"] == "text" and est.inputs["scaling_sound"] is False
    assert est.flops == 76800
    assert "the run recorded no input shapes" in (unsound_reason(est) or "")
    mixed = text_sample(text=False)
    assert "1 of the 1 samples" in (text_rule_unsound([mixed], TOTALS) or "")


def test_per_item_rule_by_hand() -> None:
    """Two shape keys (images of two sizes), each sampled once; LoRA B @ A per micro-batch."""
    small = MeasuredSample(
        linear_flops=3000, attention_flops=1000, recompute_flops=0, tokens=0, sum_sq_len=0,
        sequences=0, per_micro_batch_flops=50, micro_batches=1, text=False,
        keys=("pixel_values:3x32x32",), items=4,
    )  # fmt: skip
    large = MeasuredSample(
        linear_flops=9000, attention_flops=7000, recompute_flops=0, tokens=0, sum_sq_len=0,
        sequences=0, per_micro_batch_flops=50, micro_batches=1, text=False,
        keys=("pixel_values:3x64x64",), items=2,
    )  # fmt: skip
    totals = TokenTotals(
        micro_batches=10,
        items=30,
        non_text_micro_batches=10,
        input_shapes=(
            InputShapeCount(key="pixel_values:3x32x32", micro_batches=6, items=24),
            InputShapeCount(key="pixel_values:3x64x64", micro_batches=4, items=6),
        ),
    )
    est = measured_estimate([small, large], totals)
    # 24 items x 4000 / 4 + 6 items x 16000 / 2 + 10 micro-batches x 100 / 2
    assert est.flops == 24 * 1000 + 6 * 8000 + 10 * 50 == 72500
    assert est.inputs["scaling"] == "per_item" and est.inputs["scaling_sound"] is True
    assert [row["key"] for row in est.inputs["per_item"]] == [
        "pixel_values:3x32x32",
        "pixel_values:3x64x64",
    ]
    assert est.inputs["per_item"][1]["sample_flops"] == 16000
    assert unsound_reason(est) is None
    assert "scaled per shape key" in est.notes[0]

    # a key the run saw and no sample covers: per-item is unsound, the key is named as missing
    only_small = measured_estimate([small], totals)
    assert only_small.inputs["scaling_sound"] is False
    assert "1 of the run's 2 shape keys (4 micro-batches) were not sampled" in (
        unsound_reason(only_small) or ""
    )
    # the figure shown is the text rule's, which has no tokens here: none
    assert only_small.flops is None
    # keys beyond the kept ones: unsound too
    dropped = totals.model_copy(update={"input_shapes_dropped": 3})
    assert per_item_flops([small, large], dropped)[0] is None
    assert "3 micro-batches had shape keys beyond" in (
        unsound_reason(measured_estimate([small, large], dropped)) or ""
    )


def test_a_sample_of_two_keys_covers_neither() -> None:
    """A sample spanning forwards of two keys cannot tell its FLOP apart by key."""
    both = MeasuredSample(
        linear_flops=100, attention_flops=0, recompute_flops=0, tokens=0, sum_sq_len=0,
        sequences=0, micro_batches=2, text=False, keys=("a:1", "b:1"), items=2,
    )  # fmt: skip
    assert both.key is None
    totals = TokenTotals(
        micro_batches=2,
        non_text_micro_batches=2,
        input_shapes=(InputShapeCount(key="a:1", micro_batches=1, items=1),),
    )
    flops, _, unsampled = per_item_flops([both], totals)
    assert flops is None and unsampled == ["a:1"]


def test_no_sample_is_no_figure_and_not_sound() -> None:
    est = measured_estimate([], TOTALS, reason="Sampling was turned off (measure_every=0).")
    assert est.flops is None and est.inputs["scaling_sound"] is False
    assert est.notes == ["Sampling was turned off (measure_every=0)."]


# ----------------------------------------------------------------------------- the rule
def test_transformer_is_primary_only_when_the_sound_count_agrees_within_agreement() -> None:
    estimates, primary, choice, observations = choose((text_sample(),))
    assert primary == "transformer" and choice.withheld is None
    assert choice.reason == "transformer: architecture recognised, measured within 1%"
    assert estimate_notes(estimates, primary, observations) == [
        "The primary figure is the transformer estimate: the measured (dispatch-level) estimate "
        "is 1.0000 x it, within the 1% the two must agree within for it to be judged."
    ]
    assert estimates["transformer"].flops == estimates["measured"].flops == 76800
    below = 1 + AGREEMENT * 0.9
    assert choose((text_sample(below),))[1] == "transformer"
    assert choose((text_sample(1 / below),))[1] == "transformer"


@pytest.mark.parametrize(("scale", "side"), [(1.015, "lower"), (0.95, "higher")])
def test_a_disagreeing_count_is_primary_whichever_side(scale: float, side: str) -> None:
    estimates, primary, choice, observations = choose((text_sample(scale),))
    assert primary == "measured"
    assert estimates["measured"].flops == pytest.approx(76800 * scale)
    assert choice.reason.startswith("measured: transformer ")
    assert f"{side} than the dispatch count on 1 sampled micro-batches" in choice.reason
    notes = estimate_notes(estimates, primary, observations)
    assert any(
        f"transformer estimate is {1 / scale:.4f} x it, beyond the 1% the two must agree within"
        in n
        for n in notes
    )


def test_an_unrecognised_architecture_is_judged_on_the_count_never_on_seed() -> None:
    estimates, primary, choice, observations = choose((text_sample(),), recognised=False)
    assert primary == "measured"
    assert choice.reason.startswith("measured: architecture not recognised (hand profile)")
    assert estimates["seed"].flops == (4 * 2000 + 2 * 1500) * 10  # still shown
    note = estimate_notes(estimates, primary, observations)[0]
    assert "primary figure is the measured" in note and "comparison only" in note


def test_a_count_with_unknown_operators_confirms_the_model_but_never_stands_alone() -> None:
    """Operators counted as 0 make the count a lower bound: it may agree with the FLOP model
    (then the model is judged), but a disagreeing or unrecognised run is withheld, naming them."""
    unknown = frozenset({"aten.fancy_scan"})
    assert choose((text_sample(),), unknown_ops=unknown)[1] == "transformer"
    for scale, recognised in ((0.9, True), (1.0, False)):
        estimates, primary, choice, _ = choose(
            (text_sample(scale),), recognised=recognised, unknown_ops=unknown
        )
        assert primary is None
        assert estimates["measured"].flops == pytest.approx(76800 * scale)
        assert "lower bound" in choice.withheld and "aten.fancy_scan" in choice.withheld


def test_no_sample_withholds_with_the_reason_and_keeps_the_figures() -> None:
    why = "Sampling was turned off (measure_every=0)."
    estimates, primary, choice, _ = choose((), sampling_reason=why)
    assert primary is None
    assert choice.reason == (
        "none: no dispatch-level sample of this run (sampling was turned off (measure_every=0))"
    )
    assert choice.withheld is not None and "measure_every=0" in choice.withheld
    assert "the transformer estimate (7.680e+04 FLOP) is not judged" in choice.withheld
    assert estimates["transformer"].flops == 76800 and estimates["seed"].flops == 110000
    # unrecognised and unsampled: withheld too, never seed
    assert choose((), recognised=False)[1] is None


def test_an_unsound_count_withholds_even_when_it_agrees() -> None:
    totals_note = "non_text_micro_batches"
    observations = FlopObservations(profile=hand_profile(), samples=(text_sample(),))
    totals = TOTALS.model_copy(update={totals_note: 1})
    estimates, primary = compute_estimates(CENSUS, totals, observations)
    assert estimates["measured"].flops == estimates["transformer"].flops  # agree, but unsound
    assert primary is None
    choice = choose_primary(estimates, observations)
    assert "scaling is not sound for this run (1 of the run's 1 micro-batches" in choice.reason


def test_the_model_checked_on_each_sample_is_judged_on_padded_batches() -> None:
    """Padded batches: the per-item figure counts the positions computed, padding included
    (sound as that, and named so). The FLOP model of each sampled micro-batch (its own padded
    shapes) equals its dispatch count, so the model's figure over the run's non-padding totals
    is judged; 2% off, the model is not, and the padded dispatch-level figure is, named so."""
    key = "input_ids:5"
    totals = TokenTotals(
        tokens_processed=8,  # 2 of the 10 positions padding
        tokens_seen=10,
        sum_sq_seq_len=32,
        sequences=2,
        micro_batches=1,
        non_text_micro_batches=1,
        items=2,
        input_shapes=(InputShapeCount(key=key, micro_batches=1, items=2),),
    )
    for scale, judged in ((1.0, "transformer"), (1.02, "measured")):
        sample = text_sample(scale, text=False, keys=(key,), items=2)
        observations = FlopObservations(profile=hand_profile(), samples=(sample,))
        estimates, primary = compute_estimates(CENSUS, totals, observations)
        measured = estimates["measured"]
        assert measured.inputs["scaling_sound"] and measured.inputs["padding_convention"] == PADDED
        assert measured.inputs["padding"] == "2 of 10 input positions"
        assert measured.flops == sample.scaled_flops  # the one key's items, padding included
        check = estimates["transformer"].inputs["sample_check"]
        assert check["worst_ratio"] == pytest.approx(scale)
        assert primary == judged
        reason = choose_primary(estimates, observations).reason
        notes = estimate_notes(estimates, primary, observations)
        if judged == "transformer":
            assert "within 1% of the dispatch count of each of 1 sampled" in reason
            assert estimates["transformer"].flops == 6400 * 8 + 256 * 32
        else:
            assert "padding included" in reason
            assert any("padding included" in n and "2 of 10" in n for n in notes)
        # the two conventions differ by the padding: no warning of a model missing work
        assert not any(n.startswith("Warning: the measured estimate") for n in notes)


def test_causal_transformer_against_the_square_makes_the_count_primary_and_says_why() -> None:
    observations = FlopObservations(profile=hand_profile(), samples=(text_sample(),))
    estimates, primary = compute_estimates(CENSUS, TOTALS, observations, attention="causal")
    # causal pairs (50 + 10) / 2 = 30 of the square's 50: 64000 + 30 * 256 = 71680 FLOP
    assert estimates["transformer"].flops == 71680
    assert primary == "measured" and estimates["measured"].flops == 76800
    notes = estimate_notes(estimates, primary, observations)
    assert any("attention='causal'" in n and "cautious upper value" in n for n in notes)


def test_seed_and_six_nd_are_never_primary() -> None:
    for samples in ((), (text_sample(),), (text_sample(1.5),), (text_sample(text=False),)):
        for recognised in (True, False):
            assert choose(samples, recognised)[1] in (None, "transformer", "measured")


# ----------------------------------------------------------------------------- forced samples
def test_the_sampler_forces_one_sample_per_uncovered_non_text_key_up_to_the_limit() -> None:
    sampler = MeasuredSampler(every=0)
    text = ShapeUnits(key="input_ids:8", items=2, text=True)
    assert not sampler.due(5, text) and not sampler.due(5, None)
    image = ShapeUnits(key="pixel_values:3x8x8", items=2, text=False, modality="image")
    assert sampler.due(5, image)
    sampler.sampled_keys.add(image.key)
    assert not sampler.due(6, image)  # covered: not forced again
    sampler.forced_samples = MAX_FORCED_SAMPLES
    other = ShapeUnits(key="pixel_values:3x16x16", items=1, text=False, modality="image")
    assert not sampler.due(7, other)
    assert sampler.unforced == 1
    assert f"at most {MAX_FORCED_SAMPLES} samples are forced" in (sampler.sampling_note() or "")


def _train(recorder: FlopModelRecorder, model: nn.Module, ids: torch.Tensor, n: int, units):
    recorder.on_training_forward(ids, n, units)
    model(input_ids=ids, labels=ids).loss.backward()
    recorder.on_optimizer_step()


@pytest.mark.slow
def test_a_real_run_forces_samples_of_non_text_keys_and_keeps_their_units() -> None:
    """measure_every=0 samples nothing at the rate; micro-batches whose units are not text are
    sampled once per key, and the sample keeps the keys and items for per-item scaling."""
    model = eager_llama().train()
    recorder = FlopModelRecorder(model, measure_every=0)
    wide, narrow = torch.randint(1, 97, (2, 8)), torch.randint(1, 97, (3, 4))
    key_wide = ShapeUnits(key="input_ids:8", items=2, text=False, modality="items")
    key_narrow = ShapeUnits(key="input_ids:4", items=3, text=False, modality="items")
    _train(recorder, model, wide, 1, key_wide)
    _train(recorder, model, wide, 2, key_wide)  # covered: not sampled
    _train(recorder, model, narrow, 3, key_narrow)
    _train(recorder, model, wide, 4, ShapeUnits(key="input_ids:8", items=2, text=True))
    recorder.stop()
    obs = recorder.observations()
    assert [(s.keys, s.items, s.text) for s in obs.samples] == [
        (("input_ids:8",), 2, False),
        (("input_ids:4",), 3, False),
    ]
    assert "2 micro-batch(es) whose inputs are not all text were sampled" in (
        obs.sampling_reason or ""
    )
    # each sample is PyTorch's count of its batch
    with FlopCounterMode(display=False, custom_mapping=measured_formulas()) as counter:
        model(input_ids=narrow, labels=narrow).loss.backward()
    assert obs.samples[1].scaled_flops == counter.get_total_flops()
    # the per-item rule over the run's keys: 2 x 2 items of the wide key + 3 of the narrow
    totals = TokenTotals(
        tokens_processed=4 * 8 + 3 * 4,  # no padding: every position a token
        tokens_seen=4 * 8 + 3 * 4,
        micro_batches=3,
        non_text_micro_batches=3,
        input_shapes=(
            InputShapeCount(key="input_ids:8", micro_batches=2, items=4),
            InputShapeCount(key="input_ids:4", micro_batches=1, items=3),
        ),
    )
    est = measured_estimate(obs.samples, totals)
    assert est.inputs["scaling"] == "per_item" and est.inputs["scaling_sound"]
    assert est.flops == 2 * obs.samples[0].scaled_flops + obs.samples[1].scaled_flops
    assert est.inputs["padding_convention"] == NON_PADDING  # no padding: the two conventions agree
    # the same run with 5 padding positions: the sampled counts include their work, the
    # run's non-padding totals do not: the per-item figure is the positions computed, padding
    # included, sound as that and named so
    padded = totals.model_copy(update={"tokens_processed": 39})
    est = measured_estimate(obs.samples, padded)
    assert est.inputs["scaling"] == "per_item" and est.inputs["scaling_sound"]
    assert est.inputs["padding_convention"] == PADDED
    assert est.inputs["padding"] == "5 of 44 input positions"
    assert est.flops == 2 * obs.samples[0].scaled_flops + obs.samples[1].scaled_flops
    assert unsound_reason(est) is None
    assert any("padding included" in n and "5 of 44" in n for n in est.notes)


# ----------------------------------------------------------------------------- the real meter
def _step(model: nn.Module, ids: torch.Tensor) -> None:
    out = model(input_ids=ids, labels=ids)
    (out if isinstance(out, torch.Tensor) else out.loss).backward()


def _run(model: nn.Module, batches: list[torch.Tensor], **options: object) -> FlopReport:
    with FlopMeter(model, output=None, nvml=False, **options) as meter:  # type: ignore[arg-type]
        for ids in batches:
            _step(model, ids)
    return meter.report()


def _truth(model: nn.Module, batches: list[torch.Tensor]) -> int:
    with FlopCounterMode(display=False, custom_mapping=measured_formulas()) as counter:
        for ids in batches:
            _step(model, ids)
    return counter.get_total_flops()


def assert_invariant(report: FlopReport) -> None:
    """A verdict only on the measured figure, or on one within AGREEMENT of it; never seed."""
    compute = report.compute
    assert compute.primary_estimate not in ("seed", "six_nd")
    if report.verdict.outcome is None:
        return
    measured = compute.estimates["measured"]
    assert measured.flops is not None and measured.inputs["scaling_sound"] is True
    if compute.primary_estimate != "measured":
        assert compute.primary_flops is not None
        assert abs(compute.primary_flops / measured.flops - 1) <= AGREEMENT


BATCHES = [torch.randint(1, 97, (2, 8), generator=torch.Generator().manual_seed(i)) for i in (0, 1)]


@pytest.mark.slow
def test_the_real_meter_judges_the_transformer_estimate_the_count_agrees_with() -> None:
    model = eager_llama().train()
    report = _run(model, BATCHES, measure_every=1)
    assert report.compute.primary_estimate == "transformer"
    assert report.verdict.outcome is not None
    assert report.compute.primary_flops == pytest.approx(_truth(model, BATCHES), rel=AGREEMENT)
    assert report.compute.estimates["measured"].inputs["scaling"] == "text"
    assert_invariant(report)


def test_the_real_meter_withholds_without_a_sample_and_keeps_the_figures() -> None:
    model = eager_llama().train()
    report = _run(model, BATCHES, measure_every=0)
    compute = report.compute
    assert compute.primary_estimate is None and compute.primary_flops is None
    assert report.verdict.outcome is None
    assert compute.withheld_reason is not None
    assert "sampling was turned off (measure_every=0)" in compute.withheld_reason
    assert compute.primary_reason.startswith("none: no dispatch-level sample")
    # the estimates keep their figures: the transformer one is PyTorch's count, unjudged
    assert compute.estimates["transformer"].flops == pytest.approx(_truth(model, BATCHES), 1e-9)
    assert compute.estimates["seed"].flops is not None
    assert report.notes[0].startswith("No compute figure and no verdict: ")
    assert_invariant(report)


def test_every_sample_skipped_withholds_naming_why() -> None:
    """The user's own counting mode is active: the meter does not stack a second one, so no
    sample is taken, and no figure is judged."""
    model = eager_llama().train()
    with FlopCounterMode(display=False):
        report = _run(model, BATCHES, measure_every=1)
    assert report.compute.primary_estimate is None and report.verdict.outcome is None
    assert "another dispatch mode was active" in (report.compute.withheld_reason or "")
    assert report.compute.estimates["transformer"].flops is not None
    assert_invariant(report)


class BufferMatmul(nn.Module):
    """A recognised causal LM (linear layers) that also multiplies by a buffer the profile
    cannot see: the transformer estimate is short of the count by more than AGREEMENT."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.embed = nn.Embedding(97, 32)
        self.proj = nn.Linear(32, 32)
        self.register_buffer("mix", torch.randn(32, 32))
        self.head = nn.Linear(32, 97)

    def forward(self, input_ids: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        logits = self.head(self.proj(self.embed(input_ids)) @ self.mix)
        return nn.functional.cross_entropy(logits.flatten(0, 1), labels.flatten())


def test_the_real_meter_judges_the_count_when_the_transformer_estimate_disagrees() -> None:
    model = BufferMatmul().train()
    report = _run(model, BATCHES, measure_every=1)
    assert report.compute.primary_estimate == "measured"
    assert report.compute.primary_reason.startswith("measured: transformer ")
    assert report.verdict.outcome is not None
    assert report.compute.primary_flops == _truth(model, BATCHES)
    assert_invariant(report)
