"""FLOP estimates: one pure function per method, gathered by :func:`compute_estimates`.

* ``seed`` and ``six_nd`` (:mod:`flopmeter.flops.formulas`): the simple formulas, for comparison;
* ``transformer`` (:mod:`flopmeter.flops.transformer`): the model's own layers and attention,
  from a :class:`~flopmeter.flops.profile.ModelProfile` taken at the first training micro-batch;
  the primary figure when the architecture is recognised;
* ``measured`` (:mod:`flopmeter.flops.measured`): dispatch-level counts of sampled
  micro-batches, scaled to the run; the run's own consistency check.
"""

from __future__ import annotations

from collections.abc import Iterable

from flopmeter.census import Census
from flopmeter.flops.architecture import Architecture, bundled_config, read_architecture
from flopmeter.flops.formulas import seed_flops, six_nd_flops
from flopmeter.flops.measured import (
    RATIO_WARNING,
    MeasuredSample,
    MeasuredSampler,
    measured_estimate,
)
from flopmeter.flops.profile import ModelProfile, Profiler, profile_model
from flopmeter.flops.transformer import (
    AttentionConvention,
    attention_flops,
    linear_flops,
    transformer_estimate,
)
from flopmeter.types import Estimate, TokenTotals

__all__ = [
    "Architecture",
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
    "profile_model",
    "read_architecture",
    "seed_flops",
    "six_nd_flops",
    "transformer_estimate",
]

#: The estimate that becomes ``flops_architecture`` when no better one applies.
FALLBACK_PRIMARY = "seed"
#: The estimate that becomes ``flops_architecture`` when the architecture is recognised.
ARCHITECTURE_PRIMARY = "transformer"
#: Primary instead of ``transformer`` when the measured count exceeds it by more than
#: RATIO_WARNING (the cautious choice for a compliance figure).
MEASURED_PRIMARY = "measured"


def compute_estimates(
    census: Census,
    totals: TokenTotals,
    *,
    profile: ModelProfile | None = None,
    profile_reason: str | None = None,
    samples: Iterable[MeasuredSample] = (),
    sampling_reason: str | None = None,
    unknown_ops: Iterable[str] = (),
    attention: AttentionConvention = "full",
) -> tuple[dict[str, Estimate], str]:
    """Every architecture-side estimate for a run, and the name of the primary one.

    Args:
        census: The model's parameter census.
        totals: The run's token statistics.
        profile: The model profile from the first training micro-batch (None: not taken).
        profile_reason: Why there is no profile.
        samples: Complete dispatch-level samples for the ``measured`` estimate.
        sampling_reason: Why there are no samples (or why some were skipped).
        unknown_ops: Compute-like operators the samples had no formula for.
        attention: Attention pair convention of the ``transformer`` estimate.

    Returns:
        ``(estimates, primary)``: estimates by name, and which of them is
        ``flops_architecture``: ``transformer`` when the profile recognises the architecture,
        else ``seed``.
    """
    tokens = totals.tokens_processed
    estimates = {
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
    transformer = transformer_estimate(profile, totals, attention=attention, reason=profile_reason)
    estimates["transformer"] = transformer
    estimates["measured"] = measured_estimate(
        samples,
        totals,
        transformer_flops=transformer.flops,
        reason=sampling_reason,
        unknown_ops=unknown_ops,
    )
    if sampling_reason and estimates["measured"].flops is not None:
        estimates["measured"].notes.append(sampling_reason)
    primary = (
        ARCHITECTURE_PRIMARY
        if profile is not None and profile.recognised and transformer.flops is not None
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
    """``measured / transformer`` when both exist, else None."""
    measured = estimates.get("measured")
    if measured is None:
        return None
    ratio = measured.inputs.get("ratio_to_transformer")
    return float(ratio) if ratio is not None else None


def estimate_notes(
    estimates: dict[str, Estimate],
    primary: str,
    profile: ModelProfile | None = None,
    profile_reason: str | None = None,
) -> list[str]:
    """Report-level notes: why the primary figure is what it is, and the consistency check.

    Args:
        estimates: From :func:`compute_estimates`.
        primary: From :func:`compute_estimates`.
        profile: The profile given to :func:`compute_estimates`.
        profile_reason: Why there is no profile.
    """
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


def n_active(census: Census, profile: ModelProfile | None) -> int | None:
    """Parameters a token passes through: all but the experts it is not routed to.

    None without a profile (whether the model routes is not known then).
    """
    if profile is None:
        return None
    return census.n_total - profile.inactive_expert_params
