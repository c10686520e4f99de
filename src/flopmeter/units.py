"""Numbers as people read them: FLOP with two significant figures, shares as percentages.

A leaf module (it imports nothing of flopmeter): the report's human forms (text, Markdown,
HTML) and the commands use it; the JSON keeps every figure at full precision.
"""

from __future__ import annotations

import math

__all__ = ["human_flops", "percent"]

_UNKNOWN = "n/a"


def _known(value: float | None) -> bool:
    return value is not None and not (isinstance(value, float) and math.isnan(value))


def _two_figures(value: float) -> tuple[float, int]:
    """``value`` as mantissa and exponent of ten, the mantissa rounded to two figures."""
    mantissa, exponent = f"{value:.1e}".split("e")
    return float(mantissa), int(exponent)


def human_flops(value: float | None) -> str:
    """A FLOP count with two significant figures, as the AI Office writes them.

    Args:
        value: FLOP; ``None`` (or NaN) when unknown.

    Returns:
        ``"2.3 × 10^22 FLOP"``; a value below 1000 without a power of ten (``"0 FLOP"``,
        ``"12 FLOP"``); ``"inf FLOP"`` for infinity; ``"n/a"`` when unknown.
    """
    if not _known(value):
        return _UNKNOWN
    assert value is not None
    if math.isinf(value):
        return f"{'-' if value < 0 else ''}inf FLOP"
    if abs(value) < 1000:
        return f"{float(f'{value:.2g}'):g} FLOP"
    mantissa, exponent = _two_figures(value)
    return f"{mantissa:.1f} × 10^{exponent} FLOP"


def percent(value: float | None) -> str:
    """A share of the threshold as a percentage with two significant figures.

    Args:
        value: The share as a fraction (``ratio_to_threshold``: 0.5 is half the threshold);
            ``None`` (or NaN) when unknown.

    Returns:
        ``"50%"``, ``"130%"``, ``"8.2 × 10^-11 %"`` for a share too small to write plainly
        (below 0.001%), ``"0%"`` for zero, ``"n/a"`` when unknown.
    """
    if not _known(value):
        return _UNKNOWN
    assert value is not None
    pct = value * 100.0
    if pct == 0:
        return "0%"
    if math.isinf(pct):
        return f"{'-' if pct < 0 else ''}inf%"
    if abs(pct) < 1e-3:
        mantissa, exponent = _two_figures(pct)
        return f"{mantissa:.1f} × 10^{exponent} %"
    return f"{float(f'{pct:.2g}'):.15g}%"
