"""The one rule for the numbers a user gives flopmeter (options, budgets, peaks), and the one
precedence rule between an argument and its environment variable (:func:`by_precedence`).

A number is a real number: a Python ``int`` or ``float``, or anything registered as
:class:`numbers.Real` (NumPy scalars such as ``np.float32`` and ``np.int64`` included). A bool is
not a number (``True`` is refused, not read as 1), nor is text (``"1e20"``), and it must be
finite (NaN and infinities are refused). A whole number (a count, a token id) is, in addition,
integral: ``np.int64(3)`` is one, ``3.0`` is not. Each option then adds its bound (positive, or
not negative).

Every check raises :class:`~flopmeter.errors.ConfigurationError` naming the option, so bad input
fails before training.
"""

from __future__ import annotations

import math
import numbers
import operator
from collections.abc import Mapping
from typing import Any

from flopmeter.errors import ConfigurationError

__all__ = ["by_precedence", "is_number", "real_number", "whole_number"]


def _is_bool(value: object) -> bool:
    """``bool`` and NumPy's ``bool_`` (which is not a subclass of ``bool``)."""
    return isinstance(value, bool) or type(value).__name__ in ("bool_", "bool")


def is_number(value: object) -> bool:
    """Whether ``value`` is a number under the rule: real, not a bool (finite or not)."""
    return isinstance(value, numbers.Real) and not _is_bool(value)


def real_number(
    value: object, name: str, *, what: str = "a number", positive: bool = False
) -> float:
    """``value`` as a float, checked by the rule: a finite real number, not a bool; positive
    (``> 0``) when ``positive``, else not negative (``>= 0``).

    Args:
        value: What the user gave.
        name: The option's name, for the message.
        what: What the option is, for the message (``"a number of FLOP"``).
        positive: Zero is refused too.

    Raises:
        ConfigurationError: anything else; the message names ``name``.
    """
    if not is_number(value):
        raise ConfigurationError(f"{name} must be {what}, got {value!r}.")
    try:
        number = float(value)  # type: ignore[arg-type]
    except OverflowError:  # an int beyond a float (10**400): not a finite number either
        number = math.inf
    if not math.isfinite(number):
        raise ConfigurationError(f"{name} must be finite, got {value!r}.")
    if positive and number <= 0:
        raise ConfigurationError(f"{name} must be positive ({what}), got {value!r}.")
    if number < 0:
        raise ConfigurationError(f"{name} must not be negative ({what}), got {value!r}.")
    return number


def whole_number(value: object, name: str, *, what: str = "a non-negative integer") -> int:
    """``value`` as an int, checked by the rule: an integral real number, not a bool, not
    negative.

    Raises:
        ConfigurationError: anything else (a float such as ``3.0`` included); the message
            names ``name``.
    """
    if not is_number(value) or not isinstance(value, numbers.Integral):
        raise ConfigurationError(f"{name} must be {what}, got {value!r} ({type(value).__name__}).")
    number = operator.index(value)
    if number < 0:
        raise ConfigurationError(f"{name} must be {what}, got {number}.")
    return number


def by_precedence(
    given: Mapping[str, Any], name: str, environ: Mapping[str, str], variable: str
) -> tuple[Any, str | None]:
    """The one precedence rule: the argument when given, else the environment variable when
    set (its text), else ``None`` (the default).

    Returns:
        The value and where it came from (``"argument"``, the variable's name, or ``None``).
    """
    if name in given:
        return given[name], "argument"
    raw = environ.get(variable, "").strip()
    return (raw, variable) if raw else (None, None)
