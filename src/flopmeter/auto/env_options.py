"""The meter's options as environment variables and as ``flopmeter run``'s flags: one table.

Every option of :data:`flopmeter.options.OPTION_NAMES` a string can hold is a variable
``FLOPMETER_<NAME>`` (``pretrain_flops`` keeps ``PRETRAIN_FLOPS``) and a flag ``--<name>``
(underscores as dashes). ``optimizer`` cannot be given this way (it is an object), nor a
function as ``token_inputs`` (only the forward argument's name).

Four options are read from the environment by :class:`~flopmeter.options.MeterOptions` itself
(``PRETRAIN_FLOPS``, ``FLOPMETER_NVML``, ``FLOPMETER_LEDGER``, ``FLOPMETER_SINKS``):
:func:`options_from_env` leaves them out, so they keep their precedence (an argument beats the
variable) and are never read twice. The others are parsed here from their text, with an error
naming the variable; their ranges are checked by ``MeterOptions``
(:func:`meter_options_from_env` names the variable in that error too).

Several values (``FLOPMETER_PARENT_RUNS``) are separated by ``os.pathsep`` (``:`` on Linux and
macOS, ``;`` on Windows), as in ``PATH``: a report path may hold a comma. The sinks keep their
commas (``FLOPMETER_SINKS``, as before).

Only the standard library is imported at module level (the command line's parser is built
from this table without torch).
"""

from __future__ import annotations

import argparse
import math
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from flopmeter.errors import ConfigurationError

__all__ = [
    "ENV_OPTIONS",
    "EnvOption",
    "add_option_flags",
    "env_from_flags",
    "meter_options_from_env",
    "options_from_env",
]

_TRUE = frozenset({"1", "true", "yes", "on"})
_FALSE = frozenset({"0", "false", "no", "off"})


def _integer(text: str) -> int:
    value = int(text.strip())  # ValueError: not an integer
    return value


def _number(text: str) -> float:
    value = float(text.strip())
    if not math.isfinite(value):
        raise ValueError(text)
    return value


def _boolean(text: str) -> bool:
    low = text.strip().lower()
    if low in _TRUE:
        return True
    if low in _FALSE:
        return False
    raise ValueError(text)


def _text(text: str) -> str:
    if not text.strip():
        raise ValueError(text)
    return text.strip()


def _budget(text: str) -> float | str:
    return "threshold" if text.strip().lower() == "threshold" else _number(text)


def _many(text: str) -> list[str]:
    return [part.strip() for part in text.split(os.pathsep) if part.strip()]


@dataclass(frozen=True)
class EnvOption:
    """One meter option as a variable and a flag.

    Attributes:
        name: The option's name (:data:`flopmeter.options.OPTION_NAMES`).
        env: Its environment variable.
        parse: Text to the option's value (``None`` for the options ``MeterOptions`` reads from
            the environment itself).
        what: What the text must be, for the error and the flag's help.
        metavar: The flag's value in ``--help``.
        many: The flag may be given several times (joined with ``os.pathsep``, or commas for
            the sinks).
    """

    name: str
    env: str
    parse: Callable[[str], Any] | None
    what: str
    metavar: str
    many: bool = False

    @property
    def flag(self) -> str:
        """``--<name>``, underscores as dashes."""
        return "--" + self.name.replace("_", "-")


def _opt(
    name: str, parse: Callable[[str], Any] | None, what: str, metavar: str, **kw: Any
) -> EnvOption:
    env = "PRETRAIN_FLOPS" if name == "pretrain_flops" else f"FLOPMETER_{name.upper()}"
    return EnvOption(name, env, parse, what, metavar, **kw)


#: The table: every option a string can hold, in ``OPTION_NAMES``' order.
ENV_OPTIONS: tuple[EnvOption, ...] = (
    _opt("pad_id", _integer, "a non-negative integer token id", "ID"),
    _opt("model_name", _text, "the model's name for the report", "NAME"),
    _opt("pretrain_flops", None, "the original model's compute, FLOP, or 'catalog'", "FLOPS"),
    _opt("model_id", _text, "a Hugging Face model id such as 'org/name'", "ID"),
    _opt(
        "parent_runs",
        _many,
        f"report paths or run ids, separated by {os.pathsep!r}",
        "REF",
        many=True,
    ),
    _opt("original_systemic_risk", _boolean, "1/true/yes/on or 0/false/no/off", "BOOL"),
    _opt("output", _text, "the report file or folder", "PATH"),
    _opt("nvml", None, "1 to require GPU readings, 0 for none", "BOOL"),
    _opt("peak_flops", _number, "a dense peak per GPU, FLOP/s", "FLOPS"),
    _opt("dtype", _text, "bf16, fp16, tf32, fp32 or fp8", "DTYPE"),
    _opt("nvml_interval_seconds", _number, "a positive number of seconds", "SECONDS"),
    _opt("measure_every", _integer, "a non-negative integer (0 turns sampling off)", "N"),
    _opt("phases", None, "the phase policy: 'modification' or 'updates'", "POLICY"),
    _opt("token_inputs", _text, "the forward argument's name holding the token ids", "NAME"),
    _opt("refresh_seconds", _number, "a positive number of seconds", "SECONDS"),
    _opt("budget", _budget, "a number of FLOP or 'threshold'", "FLOPS"),
    _opt("budget_action", _text, "'stop' or 'raise'", "ACTION"),
    _opt("ledger", None, "the ledger file's path", "PATH"),
    _opt("sinks", None, "s3://bucket/prefix or dynamodb://table", "SINK", many=True),
    _opt("sink_timeout_seconds", _number, "a positive number of seconds", "SECONDS"),
)

_BY_NAME = {o.name: o for o in ENV_OPTIONS}


def options_from_env(environ: Mapping[str, str] | None = None) -> dict[str, Any]:
    """The meter options the environment gives, by option name: the keyword arguments for
    ``FlopMeter`` or ``FlopMeterCallback`` (parsed from their text; their ranges are checked
    by ``MeterOptions``). An empty variable counts as unset.

    Raises:
        ConfigurationError: a value that is not of the option's type, naming the variable
            (``"FLOPMETER_PAD_ID must be a non-negative integer token id, got 'x'."``).
    """
    env = os.environ if environ is None else environ
    out: dict[str, Any] = {}
    for option in ENV_OPTIONS:
        raw = env.get(option.env)
        if option.parse is None or raw is None or not raw.strip():
            continue
        try:
            out[option.name] = option.parse(raw)
        except ValueError:
            raise ConfigurationError(f"{option.env} must be {option.what}, got {raw!r}.") from None
    return out


def meter_options_from_env(environ: Mapping[str, str] | None = None) -> Any:
    """The :class:`~flopmeter.options.MeterOptions` the environment gives, every value checked
    (imports torch, as ``MeterOptions`` does).

    Raises:
        ConfigurationError: a bad value, the message starting with its variable's name.
    """
    from flopmeter.options import MeterOptions

    env = dict(os.environ if environ is None else environ)
    given = options_from_env(env)
    try:
        return MeterOptions(environ=env, **given)
    except ConfigurationError as exc:
        raise ConfigurationError(f"{_culprit(given, env)}: {exc}") from None


def _culprit(given: Mapping[str, Any], env: Mapping[str, str]) -> str:
    """The variable(s) whose value ``MeterOptions`` refused (each option tried alone)."""
    from flopmeter.options import MeterOptions

    names = []
    for name, value in given.items():
        try:
            MeterOptions(environ={}, **{name: value})
        except ConfigurationError:
            names.append(_BY_NAME[name].env)
    for option in ENV_OPTIONS:
        if option.parse is None and option.env in env:
            try:
                MeterOptions(environ={option.env: env[option.env]})
            except ConfigurationError:
                names.append(option.env)
    return ", ".join(names) or "the meter's options"


def add_option_flags(parser: argparse.ArgumentParser) -> None:
    """Adds one flag per option of the table (``--output``, ``--pad-id``, ...); each is kept
    as text under ``args.<name>`` (a list for the ones given several times): the variables
    carry it, and the check is ``MeterOptions``'."""
    group = parser.add_argument_group("meter options (each also an environment variable)")
    for option in ENV_OPTIONS:
        group.add_argument(
            option.flag,
            dest=option.name,
            metavar=option.metavar,
            action="append" if option.many else "store",
            default=None,
            help=f"{option.what} (${option.env}" + (", may be repeated)" if option.many else ")"),
        )


def env_from_flags(args: argparse.Namespace | Mapping[str, Any]) -> dict[str, str]:
    """The environment variables the flags given set (``{"FLOPMETER_PAD_ID": "0"}``): what
    ``flopmeter run`` adds to its command's environment.

    Args:
        args: The parsed flags (:func:`add_option_flags`), or a mapping by option name whose
            values are text (a list of texts for the repeated ones).
    """
    values = vars(args) if isinstance(args, argparse.Namespace) else dict(args)
    out: dict[str, str] = {}
    for option in ENV_OPTIONS:
        value = values.get(option.name)
        if value is None:
            continue
        if isinstance(value, Sequence) and not isinstance(value, str):
            sep = "," if option.name == "sinks" else os.pathsep
            out[option.env] = sep.join(str(v) for v in value)
        else:
            out[option.env] = str(value)
    return out
