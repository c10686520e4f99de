"""The verdict: where a run's compute stands against its threshold, with the 30% margin.

The guidelines (Annex A.2) accept an estimate accurate within an overall error margin of 30%.
A run whose estimate is below the threshold but would cross it if the estimate were 30% low is
reported as ``near_threshold`` rather than as a plain "no".
"""

from __future__ import annotations

from flopmeter.types import Verdict

#: The overall error margin the guidelines accept for a compute estimate (Annex A.2).
UNCERTAINTY_MARGIN = 0.30


def verdict(flops: float, threshold_flops: float, margin: float = UNCERTAINTY_MARGIN) -> Verdict:
    """Classifies an estimate (FLOP) against a threshold (FLOP).

    Returns:
        ``exceeds_threshold`` when ``flops > threshold_flops``; ``near_threshold`` when
        ``flops * (1 + margin) > threshold_flops`` only; ``below_threshold`` otherwise.
    """
    if flops > threshold_flops:
        return "exceeds_threshold"
    if flops * (1.0 + margin) > threshold_flops:
        return "near_threshold"
    return "below_threshold"
