"""Every estimate of a run and which one is primary: :func:`compute_estimates` and
:func:`choose_primary` (the invariant), with the notes and reasons the report prints."""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass

from flopmeter.counting.census import Census
from flopmeter.flops.agreement import sample_check
from flopmeter.flops.formulas import seed_flops, six_nd_flops
from flopmeter.flops.model_profile import ModelProfile
from flopmeter.flops.per_item import PADDED
from flopmeter.flops.recorder import FlopObservations
from flopmeter.flops.scaling import (
    AGREEMENT,
    RATIO_WARNING,
    MeasuredSample,
    consistency_ratio,
    measured_estimate,
    unsound_reason,
)
from flopmeter.flops.transformer import AttentionConvention, transformer_estimate
from flopmeter.types import Estimate, EstimateName, TokenTotals

__all__ = [
    "PrimaryChoice",
    "choose_primary",
    "compute_estimates",
    "estimate_notes",
    "measured_ratio",
    "measured_sound",
    "n_active",
    "primary_reason",
]

#: The estimate that is ``compute.primary_flops`` when the architecture is recognised and the
#: measured (dispatch-level) estimate agrees with it within :data:`AGREEMENT`.
ARCHITECTURE_PRIMARY: EstimateName = "transformer"
#: The estimate that is ``compute.primary_flops`` when it is sound and the ``transformer``
#: estimate is not recognised or disagrees with it.
MEASURED_PRIMARY: EstimateName = "measured"
#: Never primary: the simple formulas are shown for comparison only.
NEVER_PRIMARY: tuple[EstimateName, ...] = ("seed", "six_nd")


@dataclass(frozen=True)
class PrimaryChoice:
    """Which estimate is the run's compute, and why (the invariant, in one place).

    Attributes:
        estimate: ``transformer``, ``measured``, or None: no figure is judged.
        reason: Why, in one line (the report's ``compute.primary_reason``), with the ratio.
        withheld: Why no figure is judged (None when one is): the report's
            ``compute.withheld_reason``; the estimates keep their figures.
    """

    estimate: EstimateName | None
    reason: str
    withheld: str | None = None


def measured_sound(estimates: dict[str, Estimate]) -> bool:
    """Whether the ``measured`` estimate has a figure whose scaling is sound for this run
    (``inputs.scaling_sound``, :mod:`flopmeter.flops.scaling`)."""
    measured = estimates.get("measured")
    return (
        measured is not None
        and measured.flops is not None
        and measured.inputs.get("scaling_sound") is True
    )


def _padded(measured: Estimate | None) -> bool:
    """Whether the ``measured`` figure counts the positions computed, padding included
    (``inputs.padding_convention``, :data:`~flopmeter.flops.per_item.PADDED`)."""
    return measured is not None and measured.inputs.get("padding_convention") == PADDED


def _not_recognised(observations: FlopObservations, *, every_note: bool = False) -> str:
    """Why the profile does not recognise the architecture: its first note (or all)."""
    profile = observations.profile
    if profile is None:
        return observations.profile_reason or "no model profile was taken"
    if not profile.notes:
        return "the profile did not cover the model"
    return " ".join(profile.notes) if every_note else profile.notes[0]


def _lower(text: str) -> str:
    text = text.strip().rstrip(".")
    return text[:1].lower() + text[1:]


def _within(ratio: float) -> int:
    """``|ratio - 1|`` in whole percent, rounded up (at least 1): the reason's "within N%"."""
    return max(1, math.ceil(abs(ratio - 1.0) * 100 - 1e-9))


def choose_primary(estimates: dict[str, Estimate], observations: FlopObservations) -> PrimaryChoice:
    """The primary estimate of a run (a pure function): the rule the report states.

    ``transformer`` iff the profile recognises the architecture, the ``measured`` estimate is
    sound (:func:`measured_sound`) and ``|measured / transformer - 1| <= AGREEMENT``; else
    ``measured`` iff it is sound and its samples met no operator without a FLOP formula (such
    operators count as 0, so the count is then a lower bound that can confirm the FLOP model
    but not replace it); else none (no figure, no verdict, the reason said). ``seed`` and
    ``six_nd`` are never primary.

    Args:
        estimates: The estimates (FLOP) by name (:func:`compute_estimates`).
        observations: What the recorder saw (the profile, the samples, why none).
    """
    transformer = estimates.get("transformer")
    profile = observations.profile
    recognised = (
        profile is not None
        and profile.recognised
        and transformer is not None
        and transformer.flops is not None
    )
    ratio = measured_ratio(estimates)
    sound = measured_sound(estimates)
    samples = len(observations.samples)
    on = f"the dispatch count on {samples} sampled micro-batches"
    if recognised and sound and ratio is not None and abs(ratio - 1.0) <= AGREEMENT:
        return PrimaryChoice(
            ARCHITECTURE_PRIMARY,
            f"transformer: architecture recognised, measured within {_within(ratio)}%",
        )
    checked = transformer.inputs.get("sample_check") if recognised and transformer else None
    if checked and abs(checked["worst_ratio"] - 1.0) <= AGREEMENT and not observations.unknown_ops:
        # The measured figure's scaling does not hold for this run (padding, several streams),
        # but the FLOP model agrees with the dispatch count of each sampled micro-batch itself.
        return PrimaryChoice(
            ARCHITECTURE_PRIMARY,
            f"transformer: architecture recognised, within {_within(checked['worst_ratio'])}% of "
            "the dispatch count of "
            f"each of {checked['samples']} sampled micro-batches",
        )
    unknown = sorted(observations.unknown_ops)
    if sound and unknown:
        # Operators counted as 0 make the dispatch count a lower bound: it can confirm the
        # FLOP model (above), never stand alone as the figure judged.
        sound = False
        lower_bound = (
            "the dispatch count is a lower bound: operators without a FLOP formula were counted "
            "as 0 (" + ", ".join(unknown) + ")"
        )
    else:
        lower_bound = ""
    if sound:
        if recognised and ratio is not None:
            side = "lower" if ratio > 1 else "higher"
            why = f"transformer {abs(1 - 1 / ratio):.1%} {side} than {on}"
        else:
            why = f"architecture not recognised ({_not_recognised(observations)}); {on}"
        if _padded(estimates.get("measured")):
            why += ", scaled per shape key: the positions computed, padding included"
        return PrimaryChoice(MEASURED_PRIMARY, f"measured: {why}")
    return _withheld(estimates, observations, lower_bound, transformer if recognised else None)


def _withheld(
    estimates: dict[str, Estimate],
    observations: FlopObservations,
    lower_bound: str,
    recognised: Estimate | None,
) -> PrimaryChoice:
    """The choice when no figure is judged: why (no sample, a lower bound, a scaling not sound
    for the run) in the reason and in the report's withheld text.

    Args:
        estimates: The estimates (FLOP) by name.
        observations: What the recorder saw.
        lower_bound: Why the dispatch count is a lower bound (operators without a FLOP
            formula), or ``""``.
        recognised: The ``transformer`` estimate when the profile recognises the
            architecture (its figure, FLOP, is named as not judged), else None.
    """
    measured = estimates.get("measured")
    if len(observations.samples) == 0:
        why = _lower(observations.sampling_reason or "no training micro-batch was sampled")
        why = f"no dispatch-level sample of this run ({why})"
    elif lower_bound:
        why = lower_bound
    else:
        unsound = unsound_reason(measured) if measured is not None else None
        why = "the measured estimate's scaling is not sound for this run"
        if unsound:
            why += f" ({unsound})"
    shown = ""
    if recognised is not None:
        shown = (
            f"; the transformer estimate ({recognised.flops:.3e} FLOP) is not judged without a "
            "dispatch-level count that agrees with it"
        )
    withheld = (
        f"The run's compute could not be checked against a dispatch-level count of its own "
        f"batches: {why}{shown}. The seed and 6ND formulas are never judged; the estimates keep "
        "their figures. Sample the run (measure_every > 0, the default) to get a verdict."
    )
    return PrimaryChoice(None, f"none: {why}", withheld)


def _simple_estimates(census: Census, tokens: int) -> dict[str, Estimate]:
    """The ``seed`` and ``six_nd`` estimates (FLOP) over ``tokens`` training tokens."""
    return {
        "seed": Estimate(
            flops=seed_flops(census.n_total, census.n_trainable, tokens),
            method="seed",
            formula="(4 * n_total + 2 * n_trainable) * tokens_processed",
            inputs={
                "n_total": census.n_total,
                "n_trainable": census.n_trainable,
                "tokens_processed": tokens,
            },
            notes=[
                "The AWS FlopsMeterCallback formula, kept for comparison: embedding lookups "
                "counted as matmuls, attention ignored."
            ],
        ),
        "six_nd": Estimate(
            flops=six_nd_flops(census.n_total, tokens),
            method="six_nd",
            formula="6 * n_total * tokens_processed",
            inputs={"n_total": census.n_total, "tokens_processed": tokens},
            notes=[
                "Commission Guidelines Annex A.2 rule of thumb for dense LLM training; "
                "assumes every parameter trains."
            ],
        ),
    }


def compute_estimates(
    census: Census,
    totals: TokenTotals,
    observations: FlopObservations | None = None,
    *,
    profile: ModelProfile | None = None,
    profile_reason: str | None = None,
    samples: Iterable[MeasuredSample] = (),
    sampling_reason: str | None = None,
    unknown_ops: Iterable[str] = (),
    attention: AttentionConvention = "full",
) -> tuple[dict[str, Estimate], EstimateName | None]:
    """Every architecture-side estimate for a run, and the name of the primary one.

    Pass the recorder's ``observations``, or (the older form) their fields as keywords.

    Args:
        census: The model's parameter census.
        totals: The run's token statistics.
        observations: What a :class:`FlopModelRecorder` saw; when given, the keywords from
            ``profile`` to ``unknown_ops`` must be left out.
        profile: The model profile from the first training micro-batch (None: not taken).
        profile_reason: Why there is no profile.
        samples: Complete dispatch-level samples for the ``measured`` estimate.
        sampling_reason: Why there are no samples (or why some were skipped).
        unknown_ops: Compute-like operators the samples had no formula for.
        attention: Attention pair convention of the ``transformer`` estimate.

    Returns:
        ``(estimates, primary)``: estimates (FLOP) by name, and which of them is
        ``compute.primary_flops`` (:func:`choose_primary`): ``transformer`` when the profile
        recognises the architecture and the sound ``measured`` estimate agrees with it within
        :data:`AGREEMENT`, else ``measured`` when it is sound, else None (no figure judged).

    Raises:
        TypeError: ``observations`` and any of its fields were both given.
    """
    samples = tuple(samples)
    unknown = frozenset(unknown_ops)
    if observations is None:
        observations = FlopObservations(profile, profile_reason, samples, sampling_reason, unknown)
    elif any((profile, profile_reason, samples, sampling_reason, unknown)):
        raise TypeError("compute_estimates takes observations or their fields, not both")
    obs = observations
    estimates = _simple_estimates(census, totals.tokens_processed)
    transformer = transformer_estimate(
        obs.profile, totals, attention=attention, reason=obs.profile_reason
    )
    check = sample_check(obs.profile, obs.samples, attention)
    if check is not None and not (totals.non_text_micro_batches and not check.non_text_samples):
        # (a check of text samples only says nothing of a run's non-text micro-batches)
        transformer.inputs["sample_check"] = check.to_dict()
    estimates["transformer"] = transformer
    estimates["measured"] = measured_estimate(
        obs.samples,
        totals,
        transformer_flops=transformer.flops,
        reason=obs.sampling_reason,
        unknown_ops=obs.unknown_ops,
    )
    if obs.sampling_reason and estimates["measured"].flops is not None:
        estimates["measured"].notes.append(obs.sampling_reason)
    return estimates, choose_primary(estimates, obs).estimate


def measured_ratio(estimates: dict[str, Estimate]) -> float | None:
    """``measured / transformer`` (dimensionless) when both have a figure, else None."""
    measured = estimates.get("measured")
    transformer = estimates.get("transformer")
    if measured is None or transformer is None:
        return None
    return consistency_ratio(measured.flops, transformer.flops)


def estimate_notes(
    estimates: dict[str, Estimate],
    primary: str | None,
    observations: FlopObservations | ModelProfile | None = None,
    profile_reason: str | None = None,
) -> list[str]:
    """Report-level notes: why the primary figure is what it is, and the consistency check.

    Args:
        estimates: From :func:`compute_estimates`.
        primary: From :func:`compute_estimates` (None: no figure is judged).
        observations: The observations given to :func:`compute_estimates` (or, the older
            form, the profile given to it).
        profile_reason: Why there is no profile (the older form only).
    """
    if isinstance(observations, FlopObservations):
        obs = observations
    else:
        obs = FlopObservations(profile=observations, profile_reason=profile_reason)
    profile = obs.profile
    notes: list[str] = []
    if profile is None or not profile.recognised:
        what = (
            "the primary figure is the measured (dispatch-level) estimate"
            if primary == MEASURED_PRIMARY
            else "no figure is judged without a sound measured (dispatch-level) estimate"
        )
        notes.append(
            f"The architecture was not recognised, so {what}; the seed and 6ND formulas are "
            f"shown for comparison only: {_not_recognised(obs, every_note=True)}"
        )
    ratio = measured_ratio(estimates)
    padded = _padded(estimates.get("measured"))
    if ratio is not None and abs(ratio - 1.0) > RATIO_WARNING and not padded:
        notes.append(
            f"Warning: the measured estimate is {ratio:.3f} x the transformer estimate "
            f"(more than {RATIO_WARNING:.0%} apart); see estimates.measured.notes."
        )
    recognised = profile is not None and profile.recognised
    if primary == MEASURED_PRIMARY and padded:
        measured = estimates["measured"]
        notes.append(
            "The primary figure counts the positions computed, padding included (the run's "
            f"batches have padding: {measured.inputs.get('padding')}): the work the kernels "
            "computed over the run's batches as they ran, above the work on the non-padding "
            'tokens alone (docs/methodology.md, "Conventions").'
        )
    if primary == ARCHITECTURE_PRIMARY and ratio is not None:
        notes.append(
            f"The primary figure is the transformer estimate: the measured (dispatch-level) "
            f"estimate is {ratio:.4f} x it, within the {AGREEMENT:.0%} the two must agree "
            "within for it to be judged."
        )
    if primary == MEASURED_PRIMARY and recognised and ratio is not None:
        notes.append(
            "The primary figure is the measured (dispatch-level) estimate: the transformer "
            f"estimate is {1 / ratio:.4f} x it, beyond the {AGREEMENT:.0%} the two must agree "
            "within for the transformer estimate to be judged."
        )
        transformer = estimates.get("transformer")
        convention = transformer.inputs.get("attention_convention") if transformer else None
        if convention == "causal":
            notes.append(
                "With attention='causal' the transformer estimate counts half the attention "
                "square while the dispatch count counts the square the kernels dispatched "
                "compute: the measured figure, the kernel-independent cautious upper value, "
                "is primary unless the two agree."
            )
    return notes


def primary_reason(
    estimates: dict[str, Estimate], primary: str | None, observations: FlopObservations
) -> str:
    """Why the primary estimate is primary, in one line (the report's ``primary_reason``).

    Args:
        estimates: From :func:`compute_estimates`.
        primary: From :func:`compute_estimates`, or the estimate a resumed run kept.
        observations: The observations given to :func:`compute_estimates`.
    """
    choice = choose_primary(estimates, observations)
    if primary is not None and primary != choice.estimate:
        # a resumed session that trained nothing keeps the figure its checkpoint saved
        return f"{primary}: the figure the checkpoint resumed from saved, under that estimate"
    return choice.reason


def n_active(census: Census, profile: ModelProfile | None) -> int | None:
    """Parameters a token passes through: all but the experts it is not routed to.

    None without a profile (whether the model routes is not known then), or when the model
    has experts and how many a token is routed to is not known.
    """
    if profile is None or profile.inactive_expert_params is None:
        return None
    return census.n_total - profile.inactive_expert_params
