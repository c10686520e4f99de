"""Counts as people write them: ``1e9``, ``3.2B``, ``24M``, ``1_000_000`` (pure functions)."""

from __future__ import annotations

import math
from decimal import Decimal, InvalidOperation

__all__ = ["SUFFIXES", "parse_count"]

#: Suffix to multiplier (case-insensitive): thousand, million, billion, trillion.
SUFFIXES = {"k": 10**3, "m": 10**6, "b": 10**9, "t": 10**12}


def parse_count(text: str | int, what: str = "a count") -> int:
    """A whole, non-negative count from ``text``.

    Accepts plain integers, scientific notation (``1e9``) and the suffixes K, M, B, T
    (``3.2B`` is 3,200,000,000). Read as a decimal, so ``12345678901234567891`` stays exact.

    Args:
        text: What the user wrote (or an int).
        what: What the count is, for the error message.

    Raises:
        ValueError: ``text`` is not a number, is negative, not finite, or not whole (one line
            that quotes ``text``).
    """
    if isinstance(text, bool):
        raise ValueError(f"{what} must be a whole number, not {text!r}")
    if isinstance(text, int):
        number = Decimal(text)
    else:
        raw = str(text).strip().replace("_", "")
        scale = SUFFIXES.get(raw[-1:].lower(), 1) if raw else 1
        body = raw[:-1] if scale != 1 else raw
        try:
            number = Decimal(body) * scale
        except InvalidOperation:
            raise ValueError(f"not {what}: {text!r}") from None
    if not number.is_finite() or (isinstance(text, str) and not math.isfinite(float(number))):
        raise ValueError(f"{what} must be finite: {text!r}")
    if number < 0:
        raise ValueError(f"{what} must not be negative: {text!r}")
    if number != number.to_integral_value():
        raise ValueError(f"{what} must be a whole number: {text!r}")
    return int(number)
