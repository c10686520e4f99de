"""FLOP estimates: one pure function per method, gathered by :func:`compute_estimates`."""

from __future__ import annotations

from flopmeter.census import Census
from flopmeter.flops.formulas import seed_flops, six_nd_flops
from flopmeter.report import Estimate, TokenTotals

__all__ = ["compute_estimates", "seed_flops", "six_nd_flops"]

#: The estimate that becomes ``flops_architecture`` when no better one applies.
FALLBACK_PRIMARY = "seed"


def compute_estimates(census: Census, totals: TokenTotals) -> tuple[dict[str, Estimate], str]:
    """Every architecture-side estimate for a run, and the name of the primary one.

    Args:
        census: The model's parameter census.
        totals: The run's token statistics.

    Returns:
        ``(estimates, primary)``: estimates by name, and which of them is ``flops_architecture``.
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
    return estimates, FALLBACK_PRIMARY
