"""The verdict: where a run's compute stands against its threshold, with the 30% margin.

The guidelines (Annex A.2) accept an estimate accurate within an overall error margin of 30%.
A run whose estimate is below the threshold but would pass it with 30% added (``flops × 1.3 >
threshold``: from 1/1.3 ≈ 77% of the threshold, not from 70%) is reported as ``near_threshold``
rather than as a plain "no".

:func:`judge` (and :func:`verdict`, the public ``flopmeter.verdict``, which returns its
verdict) adds the run's measured cross-check: the verdict is ``near_threshold`` when the
primary figure *or* the measured one would pass the threshold with the margin added.
``exceeds_threshold`` is judged on the primary figure alone (it is the figure the meter trusts most). When the measured figure
is itself above the threshold and the primary one is not, the verdict is ``near_threshold`` (the
cautious choice short of a claim the primary figure does not support), and ``verdict.basis``
says that the measured figure is above.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from flopmeter.types import Estimate, Verdict
from flopmeter.units import human_flops, percent

__all__ = [
    "UNCERTAINTY_MARGIN",
    "Judgement",
    "cross_check_flops",
    "judge",
    "near_rule",
    "near_threshold_flops",
    "primary_verdict",
    "verdict",
]

#: The overall error margin the guidelines accept for a compute estimate (Annex A.2).
UNCERTAINTY_MARGIN = 0.30


def near_threshold_flops(threshold_flops: float, margin: float = UNCERTAINTY_MARGIN) -> float:
    """Where ``near_threshold`` starts, FLOP: above ``threshold / (1 + margin)`` (77% of it)."""
    return threshold_flops / (1.0 + margin)


def near_rule(margin: float = UNCERTAINTY_MARGIN) -> str:
    """The near-threshold rule in words, with the share of the threshold where it starts."""
    return (
        f"A run is near the threshold when its compute is not above it but would be with "
        f"{margin:.0%} added, that is from {percent(1.0 / (1.0 + margin))} of the threshold "
        f"(1/{1.0 + margin:g}): {margin:.0%} is the overall error margin the Commission's "
        "guidelines (Annex A.2) accept for an estimate."
    )


def primary_verdict(
    flops: float, threshold_flops: float, margin: float = UNCERTAINTY_MARGIN
) -> Verdict:
    """Classifies one figure (FLOP) against a threshold (FLOP), without a cross-check: the rule
    :func:`judge` applies to each figure.

    Returns:
        ``exceeds_threshold`` when ``flops > threshold_flops``; ``near_threshold`` when
        ``flops * (1 + margin) > threshold_flops`` only; ``below_threshold`` otherwise.
    """
    if flops > threshold_flops:
        return "exceeds_threshold"
    if flops * (1.0 + margin) > threshold_flops:
        return "near_threshold"
    return "below_threshold"


def verdict(
    flops: float,
    threshold_flops: float,
    *,
    measured_flops: float | None = None,
    margin: float = UNCERTAINTY_MARGIN,
) -> Verdict:
    """The verdict a report gives: its primary figure with its measured cross-check (FLOP).

    This is the rule every report applies (:func:`judge`, whose ``verdict`` it returns), so a
    report's ``verdict.outcome`` is reproduced from its own fields::

        verdict(report.judged_flops, report.threshold.threshold_flops, measured_flops=cross)

    where ``report.judged_flops`` is ``compute.primary_flops``, or
    ``lineage.cumulative_flops`` when the run has parent runs, and ``cross`` is
    ``compute.estimates["measured"].flops`` (``None`` when the measured estimate is the primary
    one, or there is none), plus ``sum(lineage.ancestor_flops.values())`` when the run has
    parent runs.

    Args:
        flops: The figure judged (the primary estimate, or the cumulative compute), FLOP.
        threshold_flops: The threshold, FLOP; exceeded when strictly above.
        measured_flops: The measured cross-check on the same footing as ``flops``, FLOP; it can
            make the verdict ``near_threshold``, never ``exceeds_threshold``.
        margin: The uncertainty margin (0.30: Annex A.2).

    Returns:
        ``exceeds_threshold`` when ``flops`` is strictly above the threshold; else
        ``near_threshold`` when ``flops`` or ``measured_flops`` would pass it with the margin
        added (from 1/1.3 ≈ 77% of it) or ``measured_flops`` is above it; else
        ``below_threshold``.
    """
    return judge(flops, threshold_flops, measured_flops=measured_flops, margin=margin).verdict


def cross_check_flops(estimates: Mapping[str, Estimate], primary: str | None) -> float | None:
    """The measured estimate's FLOP, the cross-check :func:`judge` weighs beside the primary
    figure; ``None`` when there is no measured estimate, or when it is the primary one itself."""
    measured = estimates.get("measured")
    return None if measured is None or primary == "measured" else measured.flops


@dataclass(frozen=True)
class Judgement:
    """A run's verdict with the figures behind it.

    Attributes:
        verdict: ``below_threshold``, ``near_threshold`` or ``exceeds_threshold``.
        exceeds: Whether the primary figure is strictly above the threshold.
        ratio: Primary figure / threshold.
        basis: Which figure decided the verdict, in words.
    """

    verdict: Verdict
    exceeds: bool
    ratio: float
    basis: str


def _measured_clause(measured: float, threshold_flops: float, margin: float) -> tuple[str, bool]:
    """What the measured cross-check says, and whether it alone makes the run near."""
    alone = primary_verdict(measured, threshold_flops, margin)
    shown = (
        f"the measured cross-check ({human_flops(measured)}, {percent(measured / threshold_flops)})"
    )
    if alone == "exceeds_threshold":
        return (
            f"{shown} is above the threshold: near_threshold, the cautious reading, since "
            "exceeds_threshold is judged on the primary figure; find out why the two differ",
            True,
        )
    if alone == "near_threshold":
        return f"{shown} would pass it with {margin:.0%} added", True
    return f"so is {shown}", False


def judge(
    flops: float,
    threshold_flops: float,
    *,
    measured_flops: float | None = None,
    margin: float = UNCERTAINTY_MARGIN,
    what: str = "the primary estimate",
) -> Judgement:
    """The verdict on a primary figure, with the measured cross-check (all in FLOP).

    Args:
        flops: The figure judged (the primary estimate, or the cumulative compute).
        threshold_flops: The threshold; exceeded when strictly above.
        measured_flops: The measured cross-check on the same footing as ``flops`` (``None``
            when there is none, or when the measured estimate is the primary one).
        margin: The uncertainty margin (0.30: Annex A.2).
        what: What ``flops`` is, in words, for ``basis``.

    Returns:
        ``exceeds_threshold`` when ``flops`` is strictly above the threshold; else
        ``near_threshold`` when ``flops`` or ``measured_flops`` would pass the threshold with the
        margin added (or the measured one is above); else ``below_threshold``.
    """
    primary = primary_verdict(flops, threshold_flops, margin)
    ratio = flops / threshold_flops
    head = (
        f"{what[:1].upper()}{what[1:]} ({human_flops(flops)}) is {percent(ratio)} of the threshold "
        f"({human_flops(threshold_flops)})"
    )
    if primary == "exceeds_threshold":
        return Judgement(primary, True, ratio, f"{head}: strictly above it.")
    if primary == "near_threshold":
        basis = (
            f"{head}: not above it, but above it with {margin:.0%} added (the error margin of "
            f"Annex A.2; near from {percent(1.0 / (1.0 + margin))} of the threshold)"
        )
        if measured_flops is not None and measured_flops > threshold_flops:
            basis += "; " + _measured_clause(measured_flops, threshold_flops, margin)[0]
        return Judgement(primary, False, ratio, basis + ".")
    if measured_flops is None:
        return Judgement(primary, False, ratio, f"{head}: below it even with {margin:.0%} added.")
    clause, near = _measured_clause(measured_flops, threshold_flops, margin)
    if near:
        return Judgement(
            "near_threshold",
            False,
            ratio,
            f"{head}, below it even with {margin:.0%} added, but {clause}.",
        )
    return Judgement(
        primary, False, ratio, f"{head}: below it even with {margin:.0%} added, and {clause}."
    )
