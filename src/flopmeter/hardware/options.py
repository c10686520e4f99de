"""The hardware options that the environment can set, and the rule between the two.

The rule is the project's one precedence rule (:func:`flopmeter.checks.by_precedence`): an
explicit argument beats the environment variable, which beats the default.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

from flopmeter.checks import by_precedence, real_number
from flopmeter.errors import ConfigurationError

#: Environment variable that turns the monitor off (``0``) or requires it (``1``) when the
#: ``nvml`` argument is not given.
NVML_ENV = "FLOPMETER_NVML"
#: Default sampling interval of the utilisation thread, seconds.
DEFAULT_INTERVAL_SECONDS = 1.0

_OFF = {"0", "false", "no", "off"}
_ON = {"1", "true", "yes", "on"}


def nvml_from_env(environ: Mapping[str, str] | None = None) -> bool | None:
    """Reads :data:`NVML_ENV`: ``False`` for 0/false/no/off, ``True`` for 1/true/yes/on.

    Returns:
        ``None`` when the variable is unset or empty.

    Raises:
        ConfigurationError: any other value.
    """
    env = os.environ if environ is None else environ
    raw = env.get(NVML_ENV, "").strip().lower()
    if not raw:
        return None
    if raw in _OFF:
        return False
    if raw in _ON:
        return True
    raise ConfigurationError(
        f"{NVML_ENV}={env.get(NVML_ENV)!r} is not understood: use 0 to turn GPU monitoring off "
        "or 1 to require it."
    )


@dataclass(frozen=True)
class NvmlSetting:
    """Whether GPU monitoring runs, and what decided it.

    Attributes:
        mode: ``"off"`` (no NVML call at all), ``"auto"`` (monitor when NVML initialises) or
            ``"required"`` (the ``nvml`` extra must be installed).
        source: What decided an ``"off"`` or ``"required"`` mode, in the report's words
            (``"nvml=False"``, ``"FLOPMETER_NVML=0"``); ``None`` for the default.
    """

    mode: Literal["off", "auto", "required"]
    source: str | None = None


def nvml_setting(argument: bool | None, environ: Mapping[str, str] | None = None) -> NvmlSetting:
    """Decides the monitor's mode: ``argument``, else :data:`NVML_ENV`, else ``"auto"``.

    The variable is validated even when the argument decides, so a bad value is always a
    configuration error.

    Args:
        argument: The ``nvml`` argument: ``True``, ``False`` or ``None`` (not given).
        environ: Environment to read (default ``os.environ``).

    Raises:
        ConfigurationError: ``argument`` is not a bool or ``None``, or :data:`NVML_ENV` is invalid.
    """
    if argument is not None and not isinstance(argument, bool):
        raise ConfigurationError(f"nvml must be True, False or None, got {argument!r}.")
    env = os.environ if environ is None else environ
    from_env = nvml_from_env(env)  # checked even when the argument decides
    given = {} if argument is None else {"nvml": argument}
    _, where = by_precedence(given, "nvml", env, NVML_ENV)
    if where is None:
        return NvmlSetting("auto")
    chosen = argument if where == "argument" else from_env
    source = f"nvml={argument}" if where == "argument" else f"{NVML_ENV}={int(bool(chosen))}"
    return NvmlSetting("required" if chosen else "off", source)


def validate_peak_flops(peak_flops: object) -> float | None:
    """``peak_flops`` as a float: a positive, finite FLOP/s figure per GPU, or ``None``.

    Raises:
        ConfigurationError: not a positive finite number.
    """
    if peak_flops is None:
        return None
    value = real_number(
        peak_flops, "peak_flops", what="a number of FLOP/s per GPU (e.g. 989.4e12)", positive=True
    )
    if value < 1e9:
        raise ConfigurationError(
            f"peak_flops={peak_flops!r} is below 1 GFLOP/s: give FLOP/s, not TFLOP/s "
            f"(e.g. {value:g}e12 for {value:g} TFLOP/s)."
        )
    return value


def validate_interval_seconds(value: object) -> float:
    """``nvml_interval_seconds``: a positive, finite number of seconds (the one number rule).

    Raises:
        ConfigurationError: anything else.
    """
    return real_number(
        value, "nvml_interval_seconds", what="a positive number of seconds", positive=True
    )
