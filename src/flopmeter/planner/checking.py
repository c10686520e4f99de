"""The plan's check of the FLOP model against PyTorch's dispatch count of one sequence on
meta: the transformer estimate stands for a method only where the two agree."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from flopmeter.planner.build import MetaCost
from flopmeter.planner.dispatch import SequenceShape
from flopmeter.planner.tokens import totals_for_tokens
from flopmeter.types import TokenTotals

__all__ = ["CHECK_TOKENS", "CHECK_TOLERANCE", "check_length", "checker", "counts"]

#: Tokens of the one sequence on which the transformer estimate is checked against the
#: dispatch count (short: a state-space model's reference scan steps through every token).
CHECK_TOKENS = 128
#: Relative difference above which the dispatch count replaces the transformer estimate.
CHECK_TOLERANCE = 1e-6


def check_length(ctx: dict[str, Any]) -> int:
    """Tokens of the one sequence the transformer estimate is checked on."""
    totals: TokenTotals = ctx["totals"]
    return max(1, min(CHECK_TOKENS, ctx["seq_len"], totals.tokens_processed))


def counts(ctx: dict[str, Any]) -> Callable[[MetaCost, int], tuple[float | None, int]]:
    """``counts(cost, length)``: the transformer estimate of one sequence of ``length`` tokens
    and PyTorch's dispatch count of it on the same meta model, FLOP."""
    from flopmeter.flops.transformer import transformer_estimate
    from flopmeter.planner.dispatch import dispatch_flops

    def counts(cost: MetaCost, length: int) -> tuple[float | None, int]:
        modelled = transformer_estimate(cost.profile, totals_for_tokens(length, length)).flops
        return modelled, dispatch_flops(cost.model, ctx["family"], SequenceShape(length))

    return counts


def checker(ctx: dict[str, Any]) -> Callable[[MetaCost, int], str | None]:
    """``check(cost, length)``: ``None`` when the transformer estimate of one sequence of
    ``length`` tokens equals PyTorch's dispatch count of it on the same meta model (within
    :data:`CHECK_TOLERANCE`), else why not, in words."""
    count = counts(ctx)

    def check(cost: MetaCost, length: int) -> str | None:
        modelled, counted = count(cost, length)
        if modelled is not None and abs(modelled - counted) <= CHECK_TOLERANCE * counted:
            return None
        return (
            f"the transformer estimate of one sequence of {length} tokens is "
            f"{'none' if modelled is None else f'{modelled / counted:.4f} x'} the dispatch count"
        )

    return check
