"""A meter's options, validated once, with one precedence rule for environment variables.

:class:`MeterOptions` is what :class:`~flopmeter.FlopMeter` is configured with and what the
framework adapters pass through unchanged, so a new option reaches Trainer and Lightning users
without touching either adapter.

The rule, for every option that an environment variable can also set (``pretrain_flops`` and
``PRETRAIN_FLOPS``, ``nvml`` and ``FLOPMETER_NVML``): **an explicit argument beats the
environment variable, which beats the default.**
"""

from __future__ import annotations

import dataclasses
import operator
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from flopmeter.budget import Budget, resolve_budget, validate_budget, validate_budget_action
from flopmeter.compliance import (
    CATALOG,
    PretrainSetting,
    determine_threshold,
    pretrain_flops_from_env,
    validate_pretrain_setting,
)
from flopmeter.compliance.original import ENV_SOURCE, OriginalCompute, resolve_original_compute
from flopmeter.compliance.parents import parent_flops
from flopmeter.errors import ConfigurationError
from flopmeter.flops.sampler import DEFAULT_MEASURE_EVERY
from flopmeter.hardware.options import DEFAULT_INTERVAL_SECONDS
from flopmeter.hardware.tracker import HardwareTracker
from flopmeter.inputs import TokenLocator
from flopmeter.ledger.archive import RunArchive
from flopmeter.ledger.sinks import DEFAULT_SINK_TIMEOUT_SECONDS, SINKS_ENV, Sink, parse_sinks
from flopmeter.ledger.store import Ledger, resolve_ledger
from flopmeter.output import resolve_output
from flopmeter.parent_runs import read_parent_runs, validate_parent_refs
from flopmeter.types import ParentRun

__all__ = [
    "DEFAULT_MEASURE_EVERY",
    "DEFAULT_REFRESH_SECONDS",
    "MeterOptions",
    "validate_bool",
    "validate_pad_id",
]


def validate_pad_id(pad_id: object) -> int | None:
    """Checks a padding token id: ``None`` or a non-negative integer.

    Raises:
        ConfigurationError: anything else (the message names ``pad_id``).
    """
    if pad_id is None:
        return None
    if isinstance(pad_id, bool):
        raise ConfigurationError(f"pad_id must be a non-negative integer or None, got {pad_id!r}.")
    try:
        value = operator.index(pad_id)  # type: ignore[arg-type]
    except TypeError:
        raise ConfigurationError(
            f"pad_id must be a non-negative integer token id or None, got {pad_id!r} "
            f"({type(pad_id).__name__})."
        ) from None
    if value < 0:
        raise ConfigurationError(f"pad_id must be a non-negative token id, got {value}.")
    return value


def validate_bool(value: object, name: str) -> bool:
    """A yes/no option: ``True`` or ``False`` and nothing else (not ``"false"``, not 0).

    Raises:
        ConfigurationError: anything else (the message names the option).
    """
    if not isinstance(value, bool):
        raise ConfigurationError(f"{name} must be True or False, got {value!r}.")
    return value


def _validate_token_inputs(value: object) -> TokenLocator | None:
    if value is None or callable(value) or (isinstance(value, str) and value):
        return value  # type: ignore[return-value]
    raise ConfigurationError(
        "token_inputs must be the name of the forward argument holding the token ids, or a "
        f"function of a forward call's (args, kwargs) returning them; got {value!r}."
    )


def _validate_seconds(value: object, name: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
        raise ConfigurationError(f"{name} must be a positive number of seconds, got {value!r}.")
    if value == float("inf"):
        raise ConfigurationError(f"{name} must be finite, got {value!r}.")
    return float(value)


def _validate_measure_every(value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ConfigurationError(
            f"measure_every must be a non-negative integer (0 turns sampling off), got {value!r}."
        )
    return value


def _validate_optimizer(value: object) -> torch.optim.Optimizer | None:
    if value is not None and not isinstance(value, torch.optim.Optimizer):
        raise ConfigurationError(
            f"optimizer must be a torch.optim.Optimizer, got {type(value).__name__}."
        )
    return value


#: How often a running report on disk is refreshed, seconds, by default.
DEFAULT_REFRESH_SECONDS = 120.0

_NEVER_NONE = frozenset(
    {"dtype", "nvml_interval_seconds", "measure_every", "refresh_seconds", "sink_timeout_seconds"}
)


@dataclass(frozen=True)
class MeterOptions:
    """Everything a :class:`~flopmeter.FlopMeter` is told, validated (see its arguments).

    Make one with :meth:`create`, which validates and applies the environment variables; the
    constructor takes the fields as they are.

    Attributes:
        pad_id: Padding token id, or ``None``.
        model_name: Name for the report; ``None``: the model config's ``name_or_path``.
        pretrain_flops: The original model's training compute given as a number, FLOP;
            ``None``: not given as a number (unknown, or the catalogue was asked for).
        pretrain_flops_source: Where ``pretrain_flops`` came from (``"argument"`` or the
            environment variable), ``None`` when unknown.
        pretrain_flops_catalog: Who opted in to the bundled catalogue (``"argument"`` for
            ``pretrain_flops="catalog"``, or the environment variable), ``None`` when nobody.
        model_id: The Hugging Face id of the model being modified, for the catalogue; ``None``:
            the model config's ``name_or_path``.
        parent_runs: The parent runs as named (report paths or run ids).
        parents: The parent runs as read, when the options were made.
        original_systemic_risk: Whether the original model is a GPAI model with systemic risk.
        output: The report file, or ``None`` for no file.
        optimizer: Count only this optimizer's steps; ``None``: any optimizer of the model.
        nvml: NVML monitoring: ``True`` required, ``False`` off, ``None`` when it initialises.
        peak_flops: Dense peak per GPU, FLOP/s, replacing the table's.
        dtype: Data type of the training's matrix multiplications (selects the peak).
        nvml_interval_seconds: Sampling interval of the utilisation thread, seconds.
        measure_every: Dispatch-level sampling period, micro-batches (``0``: off).
        token_inputs: Where the model's forward calls carry the token ids, for models the
            meter cannot read by itself (see :mod:`flopmeter.inputs`).
        refresh_seconds: How often the running report on disk is refreshed, seconds.
        budget: The compute budget as given: FLOP, ``"threshold"``, or ``None`` for none.
        budget_action: ``"stop"`` or ``"raise"`` when the budget is reached.
        ledger: The ledger file the final report is appended to, or ``None`` (see
            :func:`flopmeter.ledger.resolve_ledger`; ``FLOPMETER_LEDGER``).
        sinks: Where the final report is copied (S3, DynamoDB; ``FLOPMETER_SINKS``).
        sink_timeout_seconds: How long the end of the run waits for the sinks, seconds.
        given: The names of the options the user gave explicitly (adapters fill the others).
    """

    pad_id: int | None = None
    model_name: str | None = None
    pretrain_flops: float | None = None
    pretrain_flops_source: str | None = None
    pretrain_flops_catalog: str | None = None
    model_id: str | None = None
    parent_runs: tuple[str, ...] = ()
    parents: tuple[ParentRun, ...] = ()
    original_systemic_risk: bool = False
    output: Path | None = None
    optimizer: torch.optim.Optimizer | None = None
    nvml: bool | None = None
    peak_flops: float | None = None
    dtype: str = "bf16"
    nvml_interval_seconds: float = DEFAULT_INTERVAL_SECONDS
    measure_every: int = DEFAULT_MEASURE_EVERY
    token_inputs: TokenLocator | None = None
    refresh_seconds: float = DEFAULT_REFRESH_SECONDS
    budget: float | str | None = None
    budget_action: str = "stop"
    ledger: Path | None = None
    sinks: tuple[Sink, ...] = ()
    sink_timeout_seconds: float = DEFAULT_SINK_TIMEOUT_SECONDS
    given: frozenset[str] = field(default=frozenset(), compare=False)

    #: The options a user may give (the fields, less the derived ones).
    NAMES = (
        "pad_id",
        "model_name",
        "pretrain_flops",
        "model_id",
        "parent_runs",
        "original_systemic_risk",
        "output",
        "optimizer",
        "nvml",
        "peak_flops",
        "dtype",
        "nvml_interval_seconds",
        "measure_every",
        "token_inputs",
        "refresh_seconds",
        "budget",
        "budget_action",
        "ledger",
        "sinks",
        "sink_timeout_seconds",
    )

    @classmethod
    def create(cls, environ: Mapping[str, str] | None = None, **options: Any) -> MeterOptions:
        """Validated options from keyword arguments (the names of :data:`NAMES`).

        Args:
            environ: The environment to read (default ``os.environ``).
            **options: The options given; an option given as ``None`` counts as not given
                (except ``dtype``, ``nvml_interval_seconds`` and ``measure_every``, which
                have no ``None`` value).

        Raises:
            ConfigurationError: an unknown name, or an invalid value or environment variable;
                the message names the option.
            MissingExtraError: ``nvml=True`` (or ``FLOPMETER_NVML=1``) without ``nvidia-ml-py``.
        """
        unknown = sorted(set(options) - set(cls.NAMES))
        if unknown:
            raise ConfigurationError(
                f"Unknown FlopMeter option(s): {', '.join(unknown)}. "
                f"The options are: {', '.join(cls.NAMES)}."
            )
        # None means "not given", except for options that have no None value: kept, to fail.
        given = {k: v for k, v in options.items() if v is not None or k in _NEVER_NONE}
        values = {**given, "given": frozenset(given)}
        env = os.environ if environ is None else environ
        values["pad_id"] = validate_pad_id(given.get("pad_id"))
        if "model_name" in given:
            values["model_name"] = str(given["model_name"])
        values.update(_pretrain_flops(given.get("pretrain_flops"), env))
        values["original_systemic_risk"] = validate_bool(
            given.get("original_systemic_risk", False), "original_systemic_risk"
        )
        values["token_inputs"] = _validate_token_inputs(given.get("token_inputs"))
        values["refresh_seconds"] = _validate_seconds(
            given.get("refresh_seconds", DEFAULT_REFRESH_SECONDS), "refresh_seconds"
        )
        values["output"] = resolve_output(given.get("output"))
        values["model_id"] = _validate_model_id(given.get("model_id"))
        values["parent_runs"] = validate_parent_refs(given.get("parent_runs"))
        values["parents"] = read_parent_runs(values["parent_runs"], values["output"])
        values["optimizer"] = _validate_optimizer(given.get("optimizer"))
        values["measure_every"] = _validate_measure_every(
            given.get("measure_every", DEFAULT_MEASURE_EVERY)
        )
        values.update(_budget(given))
        values.update(_archive_options(given, env))
        made = cls(**values)
        made.hardware_tracker(environ)  # validates the hardware options (no NVML call yet)
        return made

    def with_defaults(self, **defaults: Any) -> MeterOptions:
        """These options, with ``defaults`` filling the options the user did not give.

        Adapters use it for what they know about the run (the tokenizer's pad id, the trainer's
        output folder and precision). Defaults are validated like given options.
        """
        fill = {k: v for k, v in defaults.items() if k not in self.given and v is not None}
        if not fill:
            return self
        checked = MeterOptions.create(**fill)
        made = dataclasses.replace(self, **{k: getattr(checked, k) for k in fill})
        if "output" in fill and self.parent_runs:  # run ids and the own-file check use output
            made = dataclasses.replace(
                made, parents=read_parent_runs(self.parent_runs, made.output)
            )
        return made

    def as_kwargs(self) -> dict[str, Any]:
        """The options as :class:`~flopmeter.FlopMeter` keyword arguments."""
        kwargs = {name: getattr(self, name) for name in self.NAMES}
        if self.pretrain_flops_catalog == "argument":
            kwargs["pretrain_flops"] = CATALOG
        elif self.pretrain_flops_source != "argument":
            kwargs["pretrain_flops"] = None  # read from the environment again, as given
        kwargs["parent_runs"] = list(self.parent_runs) or None
        kwargs["ledger"] = self.ledger or False  # resolved already: None means none
        return kwargs

    def archive(self) -> RunArchive:
        """Where the final report goes besides the report file (ledger, sinks)."""
        return RunArchive(self.ledger, self.sinks, self.sink_timeout_seconds)

    def original_compute(self, model_id: str | None) -> OriginalCompute:
        """The original model's compute for ``model_id``, from the first source set (the
        argument, ``PRETRAIN_FLOPS``, the catalogue when opted in), with the catalogue's figure
        whenever it knows the model (see :mod:`flopmeter.compliance.original`)."""
        argument: PretrainSetting = None
        environment: PretrainSetting = None
        if self.pretrain_flops_catalog == "argument":
            argument = CATALOG
        elif self.pretrain_flops_source == "argument":
            argument = self.pretrain_flops
        if self.pretrain_flops_catalog == ENV_SOURCE:
            environment = CATALOG
        elif self.pretrain_flops_source == ENV_SOURCE:
            environment = self.pretrain_flops
        return resolve_original_compute(
            argument,
            environment,
            model_id,
            original_systemic_risk=self.original_systemic_risk,
        )

    def budget_for(self, original: OriginalCompute) -> Budget | None:
        """The compute budget resolved (``None`` without one): for ``budget="threshold"``, the
        threshold and the parents' compute as the report takes them (``determine_threshold`` of
        the original compute, ``parent_flops`` of the parents; see ``reporting._judgement``).

        Raises:
            ConfigurationError: ``"threshold"`` when the parents' compute is unknown, or when
                they have used the budget up (see :func:`flopmeter.budget.resolve_budget`).
        """
        threshold = rule = None
        if self.budget == "threshold":
            chosen = determine_threshold(
                original.flops, original_systemic_risk=self.original_systemic_risk
            )
            threshold, rule = chosen.value, chosen.kind
        return resolve_budget(
            self.budget,
            self.budget_action,
            threshold_flops=threshold,
            parents_flops=parent_flops(self.parents),
            threshold_rule=rule,
        )

    def hardware_tracker(self, environ: Mapping[str, str] | None = None) -> HardwareTracker:
        """A new hardware tracker configured by these options.

        Raises:
            ConfigurationError: a hardware option or ``FLOPMETER_NVML`` is invalid.
            MissingExtraError: NVML is required and ``nvidia-ml-py`` is not installed.
        """
        return HardwareTracker(
            nvml=self.nvml,
            peak_flops=self.peak_flops,
            dtype=self.dtype,
            interval_seconds=self.nvml_interval_seconds,
            environ=environ,
        )


def _archive_options(given: Mapping[str, Any], env: Mapping[str, str]) -> dict[str, Any]:
    """``ledger`` (resolved and opened for writing, so a bad one fails now), ``sinks`` (the
    argument, else ``FLOPMETER_SINKS``) and ``sink_timeout_seconds``, validated."""
    ledger = resolve_ledger(given.get("ledger"), env)
    if ledger is not None:
        Ledger(ledger)  # makes it (and its folder), or raises LedgerError naming the file
    sinks = given["sinks"] if "sinks" in given else env.get(SINKS_ENV)
    return {
        "ledger": ledger,
        "sinks": tuple(parse_sinks(sinks)),
        "sink_timeout_seconds": _validate_seconds(
            given.get("sink_timeout_seconds", DEFAULT_SINK_TIMEOUT_SECONDS), "sink_timeout_seconds"
        ),
    }


def _pretrain_flops(value: object, environ: Mapping[str, str]) -> dict[str, Any]:
    """``pretrain_flops`` and its source: the argument, else ``PRETRAIN_FLOPS``, else unknown;
    either may be ``"catalog"``, which opts in to the catalogue instead of giving a number."""
    setting = validate_pretrain_setting(value)
    if setting == CATALOG:
        return {
            "pretrain_flops": None,
            "pretrain_flops_source": None,
            "pretrain_flops_catalog": "argument",
        }
    if setting is not None:
        return {"pretrain_flops": setting, "pretrain_flops_source": "argument"}
    env = pretrain_flops_from_env(dict(environ))
    if env == CATALOG:
        return {
            "pretrain_flops": None,
            "pretrain_flops_source": None,
            "pretrain_flops_catalog": ENV_SOURCE,
        }
    source = ENV_SOURCE if env is not None else None
    return {"pretrain_flops": env, "pretrain_flops_source": source}


def _validate_model_id(value: object) -> str | None:
    """``model_id``: ``None`` or a non-empty string (a Hugging Face id such as ``org/name``)."""
    if value is None:
        return None
    if not isinstance(value, str) or not value.strip():
        raise ConfigurationError(
            f"model_id must be a Hugging Face model id such as 'meta-llama/Llama-3.2-3B', got "
            f"{value!r}."
        )
    return value.strip()


def _budget(given: Mapping[str, Any]) -> dict[str, Any]:
    """``budget`` and ``budget_action`` checked for their form (``"threshold"`` is resolved by
    :meth:`MeterOptions.budget_for`, once the original compute is known)."""
    action = validate_budget_action(given.get("budget_action", "stop"))
    budget = validate_budget(given.get("budget"))
    if action != "stop" and budget is None:
        raise ConfigurationError(f"budget_action={action!r} needs a budget.")
    return {"budget": budget, "budget_action": action}
