"""FLOP estimates: one pure function per method, gathered by :func:`compute_estimates`.

* ``seed`` and ``six_nd`` (:mod:`flopmeter.flops.formulas`): the simple formulas, for comparison;
* ``transformer`` (:mod:`flopmeter.flops.transformer`): the model's own layers and attention,
  from a :class:`~flopmeter.flops.profile.ModelProfile` taken at the first training micro-batch;
  the primary figure when the architecture is recognised;
* ``measured`` (:mod:`flopmeter.flops.measured`): dispatch-level counts of sampled
  micro-batches, scaled to the run; the run's own consistency check.

During a run, a :class:`~flopmeter.flops.recorder.FlopModelRecorder` takes the profile and the
samples; its :class:`~flopmeter.flops.recorder.FlopObservations` go to :func:`compute_estimates`.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

from flopmeter.census import Census
from flopmeter.flops.architecture import Architecture, bundled_config, read_architecture
from flopmeter.flops.capture import Profiler, profile_model
from flopmeter.flops.formulas import seed_flops, six_nd_flops
from flopmeter.flops.model_profile import ModelProfile
from flopmeter.flops.recorder import FlopModelRecorder, FlopObservations
from flopmeter.flops.sampler import MeasuredSampler
from flopmeter.flops.scaling import (
    RATIO_WARNING,
    MeasuredSample,
    consistency_ratio,
    measured_estimate,
)
from flopmeter.flops.transformer import (
    AttentionConvention,
    attention_flops,
    linear_flops,
    transformer_estimate,
)
from flopmeter.types import Estimate, EstimateName, TokenTotals

__all__ = [
    "Architecture",
    "FlopModelRecorder",
    "FlopObservations",
    "MeasuredSample",
    "MeasuredSampler",
    "ModelProfile",
    "Profiler",
    "attention_flops",
    "bundled_config",
    "compute_estimates",
    "estimate_notes",
    "linear_flops",
    "measured_estimate",
    "measured_ratio",
    "n_active",
    "primary_reason",
    "profile_model",
    "read_architecture",
    "seed_flops",
    "six_nd_flops",
    "transformer_estimate",
]

#: The estimate that becomes ``compute.primary_flops`` when no better one applies.
FALLBACK_PRIMARY: EstimateName = "seed"
#: The estimate that becomes ``compute.primary_flops`` when the architecture is recognised.
ARCHITECTURE_PRIMARY: EstimateName = "transformer"
#: Primary instead of ``transformer`` when the measured count exceeds it by more than
#: RATIO_WARNING (the cautious choice for a compliance figure).
MEASURED_PRIMARY: EstimateName = "measured"


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
) -> tuple[dict[str, Estimate], EstimateName]:
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
        ``compute.primary_flops``: ``transformer`` when the profile recognises the architecture
        (``measured`` when that exceeds it by more than :data:`RATIO_WARNING`), else ``seed``.

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
    primary = (
        ARCHITECTURE_PRIMARY
        if obs.profile is not None and obs.profile.recognised and transformer.flops is not None
        else FALLBACK_PRIMARY
    )
    ratio = measured_ratio(estimates)
    if primary == ARCHITECTURE_PRIMARY and ratio is not None and ratio > 1.0 + RATIO_WARNING:
        # The dispatch-level count saw more work than the model of the first micro-batch
        # (e.g. layers run without gradients there but differentiated later, as under
        # reentrant activation checkpointing): the larger figure is the cautious one.
        primary = MEASURED_PRIMARY
    return estimates, primary


def measured_ratio(estimates: dict[str, Estimate]) -> float | None:
    """``measured / transformer`` (dimensionless) when both have a figure, else None."""
    measured = estimates.get("measured")
    transformer = estimates.get("transformer")
    if measured is None or transformer is None:
        return None
    return consistency_ratio(measured.flops, transformer.flops)


def estimate_notes(
    estimates: dict[str, Estimate],
    primary: str,
    observations: FlopObservations | ModelProfile | None = None,
    profile_reason: str | None = None,
) -> list[str]:
    """Report-level notes: why the primary figure is what it is, and the consistency check.

    Args:
        estimates: From :func:`compute_estimates`.
        primary: From :func:`compute_estimates`.
        observations: The observations given to :func:`compute_estimates` (or, the older
            form, the profile given to it).
        profile_reason: Why there is no profile (the older form only).
    """
    if isinstance(observations, FlopObservations):
        profile, profile_reason = observations.profile, observations.profile_reason
    else:
        profile = observations
    notes: list[str] = []
    if primary == FALLBACK_PRIMARY:
        if profile is None:
            why = profile_reason or "no model profile was taken"
        else:
            why = " ".join(profile.notes) or "the profile did not cover the model"
        notes.append(
            "The architecture was not recognised, so the primary figure is the seed formula "
            f"(4 * n_total + 2 * n_trainable) * tokens_processed: {why}"
        )
    ratio = measured_ratio(estimates)
    if ratio is not None and abs(ratio - 1.0) > RATIO_WARNING:
        notes.append(
            f"Warning: the measured estimate is {ratio:.3f} x the transformer estimate "
            f"(more than {RATIO_WARNING:.0%} apart); see estimates.measured.notes."
        )
    if primary == MEASURED_PRIMARY:
        notes.append(
            "The primary figure is the measured (dispatch-level) estimate, the larger of the "
            "two, because the transformer estimate of the first micro-batch fell more than "
            f"{RATIO_WARNING:.0%} short of it."
        )
    return notes


def primary_reason(
    estimates: dict[str, Estimate], primary: str, observations: FlopObservations
) -> str:
    """Why the primary estimate is primary, in one line (the report's ``primary_reason``).

    Args:
        estimates: From :func:`compute_estimates`.
        primary: From :func:`compute_estimates`.
        observations: The observations given to :func:`compute_estimates`.
    """
    ratio = measured_ratio(estimates)
    samples = len(observations.samples)
    if primary == MEASURED_PRIMARY and ratio is not None:
        return (
            f"measured: transformer {1 - 1 / ratio:.0%} lower than the dispatch count on "
            f"{samples} sampled micro-batches"
        )
    if primary == ARCHITECTURE_PRIMARY:
        if ratio is None:
            return "transformer: architecture recognised; no measured sample"
        gap = abs(ratio - 1.0)
        if gap <= RATIO_WARNING:
            within = max(1, math.ceil(gap * 100 - 1e-9))  # whole percent, rounded up
            return f"transformer: architecture recognised, measured within {within}%"
        return f"transformer: architecture recognised; measured {gap:.0%} lower"
    profile = observations.profile
    if profile is None:
        why = observations.profile_reason or "no model profile was taken"
    else:
        why = profile.notes[0] if profile.notes else "the profile did not cover the model"
    return f"seed: architecture not recognised ({why})"


def n_active(census: Census, profile: ModelProfile | None) -> int | None:
    """Parameters a token passes through: all but the experts it is not routed to.

    None without a profile (whether the model routes is not known then), or when the model
    has experts and how many a token is routed to is not known.
    """
    if profile is None or profile.inactive_expert_params is None:
        return None
    return census.n_total - profile.inactive_expert_params
