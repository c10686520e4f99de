"""The simple formulas: the AWS meter's seed formula and the guidelines' 6ND rule of thumb.

Both are pure functions of parameter counts and token counts; both return FLOP.
"""

from __future__ import annotations


def seed_flops(n_total: int, n_trainable: int, tokens: int) -> float:
    """The AWS FlopsMeterCallback's formula: ``(4 * n_total + 2 * n_trainable) * tokens``.

    2 FLOP per parameter per token forward, 2 for the activation gradient through every
    layer, and 2 for the weight gradient of trainable parameters. Kept for comparison: it counts
    embedding lookups as matmuls and ignores attention (see docs/methodology.md).

    Args:
        n_total: Parameters (elements).
        n_trainable: Trainable parameters (elements).
        tokens: Non-padding training tokens.

    Returns:
        FLOP.
    """
    return float((4 * n_total + 2 * n_trainable) * tokens)


def six_nd_flops(n_params: int, tokens: int) -> float:
    """The guidelines' rule of thumb for dense LLM training: ``6 * N * D`` (Annex A.2).

    Args:
        n_params: Parameters (elements).
        tokens: Non-padding training tokens.

    Returns:
        FLOP.
    """
    return float(6 * n_params * tokens)
