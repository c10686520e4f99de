"""Human forms of the report's figures: FLOP and shares with two significant figures.

The AI Office's convention for compute figures is two significant figures (for example
2.3 × 10^25 FLOP; guidelines, section 2.3.2 and the Code of Practice's Model Documentation
Form). These are display forms only: the JSON report keeps every figure at full precision.

A leaf module: it imports nothing of flopmeter, so the command line can use it without torch.
"""

from __future__ import annotations

import math

__all__ = ["human_flops", "percent"]

#: Shares below this, in percent, read as "< 0.01 %" (the report's JSON keeps the exact share).
SMALLEST_PERCENT = 0.01


def _two_significant(value: float) -> tuple[float, int]:
    """``value`` (positive, finite) as a mantissa with one decimal and its power of ten."""
    exponent = math.floor(math.log10(value))
    mantissa = round(value / 10.0**exponent, 1)
    if mantissa >= 10.0:  # 9.96e22 rounds up to 10.0: carry into the exponent
        mantissa, exponent = mantissa / 10.0, exponent + 1
    return mantissa, exponent


def human_flops(value: float | None) -> str:
    """A number of FLOP with two significant figures, ``"2.3 × 10^22 FLOP"``.

    Args:
        value: FLOP, or ``None`` when the figure is not known.

    Returns:
        ``"n/a"`` for ``None`` or NaN, ``"0 FLOP"`` for zero, ``"inf FLOP"`` for infinity,
        otherwise the two-significant-figure form (numbers below 1000 are written plainly,
        ``"560 FLOP"``).
    """
    if value is None or math.isnan(value):
        return "n/a"
    if value == 0:
        return "0 FLOP"
    if math.isinf(value):
        return f"{'-' if value < 0 else ''}inf FLOP"
    sign = "-" if value < 0 else ""
    mantissa, exponent = _two_significant(abs(value))
    if 0 <= exponent < 3:
        return f"{sign}{mantissa * 10.0**exponent:.{max(0, 1 - exponent)}f} FLOP"
    return f"{sign}{mantissa:.1f} × 10^{exponent} FLOP"


def percent(value: float | None) -> str:
    """A share (a fraction: 0.5 is half) as a percentage with two significant figures.

    Args:
        value: The share as a fraction (``ratio_to_threshold``), or ``None``.

    Returns:
        ``"n/a"`` for ``None`` or NaN; ``"0 %"`` for zero; ``"< 0.01 %"`` for a positive share
        below 0.01 % (the JSON keeps the exact share); otherwise two significant figures,
        ``"63 %"``, ``"0.82 %"``, ``"130 %"`` (large shares are not abbreviated).
    """
    if value is None or math.isnan(value):
        return "n/a"
    if math.isinf(value):
        return "inf %"
    pct = value * 100.0
    if pct == 0:
        return "0 %"
    if 0 < pct < SMALLEST_PERCENT:
        return f"< {SMALLEST_PERCENT:g} %"
    sign = "-" if pct < 0 else ""
    mantissa, exponent = _two_significant(abs(pct))
    rounded = mantissa * 10.0**exponent
    decimals = max(0, 1 - exponent)
    return f"{sign}{rounded:.{decimals}f} %"
