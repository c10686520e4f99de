"""A meter's options: one validated, frozen value, made once and doing no I/O.

:class:`MeterOptions` is what :class:`~flopmeter.FlopMeter` is configured with and what the
framework adapters hand on as it is, so a new option reaches Trainer and Lightning users without
touching either adapter. Its fields are the one list of the options (:data:`OPTION_NAMES`).

Two rules apply to every option:

* **Numbers** follow :mod:`flopmeter.checks`: a real number (``int``, ``float``, NumPy scalars),
  never a bool, finite; counts and token ids integral; each option adds its bound.
* **Precedence**, for the options an environment variable can also set (``pretrain_flops`` and
  ``PRETRAIN_FLOPS``, ``sinks`` and ``FLOPMETER_SINKS``, ``ledger`` and ``FLOPMETER_LEDGER``,
  ``nvml`` and ``FLOPMETER_NVML``): **an explicit argument beats the environment variable, which
  beats the default.**

Making the options reads the environment and nothing else: the ledger file, the parent runs'
reports and the hardware tracker are made from them by the meter (:mod:`flopmeter.run.parts`).
"""

from __future__ import annotations

import inspect
import os
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import torch
from pydantic import BaseModel, ConfigDict

from flopmeter.budget.resolve import validate_budget, validate_budget_action
from flopmeter.checks import by_precedence, real_number, whole_number
from flopmeter.compliance.original import ENV_SOURCE, OriginalCompute, resolve_original_compute
from flopmeter.compliance.thresholds import (
    CATALOG,
    PRETRAIN_FLOPS_ENV,
    PretrainSetting,
    pretrain_flops_from_env,
    validate_pretrain_setting,
)
from flopmeter.errors import ConfigurationError
from flopmeter.flops.phases import DEFAULT_PHASE_POLICY, PHASE_POLICIES
from flopmeter.hardware.options import (
    DEFAULT_INTERVAL_SECONDS,
    nvml_setting,
    validate_interval_seconds,
    validate_peak_flops,
)
from flopmeter.hardware.peaks import normalise_dtype
from flopmeter.ledger.location import resolve_ledger
from flopmeter.ledger.sinks import DEFAULT_SINK_TIMEOUT_SECONDS, SINKS_ENV, parse_sinks
from flopmeter.report.output_path import resolve_output
from flopmeter.report.parent_runs import validate_parent_refs

__all__ = [
    "DEFAULT_MEASURE_EVERY",
    "DEFAULT_REFRESH_SECONDS",
    "OPTION_NAMES",
    "MeterOptions",
    "meter_signature",
    "validate_bool",
    "validate_pad_id",
]

#: How often a running report on disk is refreshed, seconds, by default.
DEFAULT_REFRESH_SECONDS = 120.0
#: Sample one training micro-batch in this many (after the first two), by default.
DEFAULT_MEASURE_EVERY = 1024


def validate_pad_id(pad_id: object) -> int | None:
    """Checks a padding token id: ``None`` or a non-negative integer (the number rule).

    Raises:
        ConfigurationError: anything else (the message names ``pad_id``).
    """
    if pad_id is None:
        return None
    return whole_number(pad_id, "pad_id", what="a non-negative integer token id or None")


def validate_bool(value: object, name: str) -> bool:
    """A yes/no option: ``True`` or ``False`` and nothing else (not ``"false"``, not 0).

    Raises:
        ConfigurationError: anything else (the message names the option).
    """
    if not isinstance(value, bool):
        raise ConfigurationError(f"{name} must be True or False, got {value!r}.")
    return value


def _seconds(name: str) -> Callable[[object], float]:
    return lambda value: real_number(
        value, name, what="a positive number of seconds", positive=True
    )


def _token_inputs(value: object) -> Any:
    if value is None or callable(value) or (isinstance(value, str) and value):
        return value
    raise ConfigurationError(
        "token_inputs must be the name of the forward argument holding the token ids, or a "
        f"function of a forward call's (args, kwargs) returning them; got {value!r}."
    )


def _optimizer(value: object) -> Any:
    """A ``torch.optim.Optimizer``; a DeepSpeed ZeRO optimizer stands for the torch optimizer
    it wraps (its steps are the engine's, once per accumulation boundary)."""
    from flopmeter.run.engines import engine_optimizer

    value = engine_optimizer(value) if value is not None else None
    if value is not None and not isinstance(value, torch.optim.Optimizer):
        raise ConfigurationError(
            "optimizer must be a torch.optim.Optimizer (or a DeepSpeed ZeRO optimizer, which "
            f"wraps one), got {type(value).__name__}."
        )
    return value


def _model_id(value: object) -> str | None:
    """``model_id``: ``None`` or a non-empty string (a Hugging Face id such as ``org/name``)."""
    if value is None:
        return None
    if not isinstance(value, str) or not value.strip():
        raise ConfigurationError(
            f"model_id must be a Hugging Face model id such as 'meta-llama/Llama-3.2-3B', got "
            f"{value!r}."
        )
    return value.strip()


#: How each option given as an argument is checked (and normalised). Options read with the
#: environment (``pretrain_flops``, ``nvml``, ``ledger``, ``sinks``) are in :func:`_validated`.
_CHECKS: dict[str, Callable[[Any], Any]] = {
    "pad_id": validate_pad_id,
    "model_name": str,
    "model_id": _model_id,
    "parent_runs": validate_parent_refs,
    "original_systemic_risk": lambda v: validate_bool(v, "original_systemic_risk"),
    "output": resolve_output,
    "optimizer": _optimizer,
    "peak_flops": validate_peak_flops,
    "dtype": normalise_dtype,
    "nvml_interval_seconds": validate_interval_seconds,
    "measure_every": lambda v: whole_number(
        v, "measure_every", what="a non-negative integer (0 turns sampling off)"
    ),
    "token_inputs": _token_inputs,
    "refresh_seconds": _seconds("refresh_seconds"),
    "budget": validate_budget,
    "budget_action": validate_budget_action,
    "sink_timeout_seconds": _seconds("sink_timeout_seconds"),
}

#: Options that have no ``None`` value: given as ``None`` they fail, not fall back.
_NEVER_NONE = frozenset(
    {"dtype", "nvml_interval_seconds", "measure_every", "refresh_seconds", "sink_timeout_seconds"}
)

#: Fields derived from the options, not given.
_DERIVED = ("pretrain_flops_source", "pretrain_flops_catalog", "given")


class MeterOptions(BaseModel):
    """Everything a :class:`~flopmeter.FlopMeter` is told, validated; frozen.

    ``MeterOptions(**options)`` checks every option (an unknown name is an error) and applies
    the environment variables; an option given as ``None`` counts as not given (except those
    without a ``None`` value: ``dtype``, ``nvml_interval_seconds``, ``measure_every``,
    ``refresh_seconds``, ``sink_timeout_seconds``). It does no I/O beyond reading the
    environment (and looking whether ``output`` is a folder).

    Attributes:
        pad_id: The padding token id; used when a batch has no ``attention_mask``. ``None``
            with no mask counts every token. In a packed batch a pad-id token that continues a
            document (an EOS that is also the pad id) still counts; see :mod:`flopmeter.tokens.stats`.
            The meter refuses one outside the model's vocabulary, when that is known.
        model_name: Name for the report; ``None``: the model config's ``name_or_path``.
        pretrain_flops: The original model's training compute, FLOP, when given as a number
            (the argument, else ``PRETRAIN_FLOPS``); ``None`` when unknown or when the bundled
            catalogue was asked for (``pretrain_flops="catalog"`` or ``PRETRAIN_FLOPS=catalog``,
            looked up for ``model_id``). The report's ``pretrain_flops_source`` says which
            applied (docs/compliance.md).
        model_id: The Hugging Face id of the model being modified, looked up in the catalogue;
            ``None``: the model config's ``name_or_path``.
        parent_runs: The reports of earlier runs this run continues, as named (report paths,
            or run ids of reports in the folder of ``output``), read when the meter is made:
            the verdict judges this run's compute plus theirs.
        original_systemic_risk: Whether the original model is a GPAI model with systemic risk
            (chooses the fallback threshold when ``pretrain_flops`` is unknown).
        output: The report file (a folder gets ``flops_meter.json``: an existing one, a path
            ending in ``/``, or a path that does not exist and has no suffix), written by rank 0,
            atomically: a ``running`` report at once when the meter starts (the file is this
            run's from then on; a file that is not a flopmeter report, a special file, or a file
            another live run is writing is refused), refreshed while training runs, and the
            final report at the end (also on SIGTERM, as ``interrupted``). ``None``: no file.
        optimizer: Count only this optimizer's steps; ``None``: any optimizer stepping the
            model's parameters.
        nvml: GPU readings through NVML (energy, utilisation, the hardware bound): ``None``
            (default) when NVML initialises, unless ``FLOPMETER_NVML`` says otherwise; ``True``
            to require the ``nvml`` extra, ``False`` for none. See docs/hardware.md.
        peak_flops: Dense peak per GPU in FLOP/s (not TFLOP/s), for GPUs the peak table does
            not know or to replace its figure.
        dtype: Data type of the training's matrix multiplications (``"bf16"``, ``"fp16"``,
            ``"tf32"``, ``"fp32"``, ``"fp8"``), which selects the peak.
        nvml_interval_seconds: Sampling interval of the utilisation thread, seconds.
        measure_every: The ``measured`` estimate counts the FLOP of training micro-batches 1, 2
            and every ``measure_every``-th after at the dispatch level; ``0`` turns it off.
        phases: Which of the run's phases enter the judged figure (the argument, else
            ``FLOPMETER_PHASES``): ``"modification"`` (default: every phase that fed this run's
            updates: the training passes, the trained model's forward passes without
            gradients while it trains, other models' forward passes while it trains, declared
            phases) or ``"updates"`` (the trained model's training passes only). Evaluation
            enters under neither; every phase is in the report either way. See
            docs/compliance.md, "Which phases count".
        token_inputs: Where the model's forward calls carry the token ids, for models the meter
            cannot read by itself: the keyword name (``"tokens"`` for ``model(tokens=...)``), or
            a function of a forward call's ``(args, kwargs)`` returning the ids tensor (or a
            mapping with ``input_ids`` and ``attention_mask``). See :mod:`flopmeter.counting.inputs`.
        refresh_seconds: How often the running report on disk is refreshed, seconds (at the
            first optimizer step after the interval; adapters also refresh at their log and
            save steps).
        budget: A compute budget the run must not cross: FLOP, ``"threshold"`` (the run's
            threshold / 1.3, less the compute of the runs it continues), or ``None``. The meter
            then stops at the last optimizer step whose total stays within it
            (``FlopMeter.should_stop``, or :class:`~flopmeter.budget.BudgetExceeded`); see
            docs/budget.md.
        budget_action: ``"stop"`` (default) or ``"raise"``.
        ledger: The ledger file the final report is appended to (rank 0, once), or ``None``;
            given as ``True`` (``FLOPMETER_LEDGER`` or the per-user ledger), a path, or
            ``False``; by default ``FLOPMETER_LEDGER`` when set. See docs/audit-trail.md.
        sinks: Where the final report is copied: S3 and DynamoDB sinks, given as
            ``"s3://bucket/prefix"``, ``"dynamodb://table"``, a list of them, or sink objects;
            by default ``FLOPMETER_SINKS``. Needs the ``aws`` extra.
        sink_timeout_seconds: How long the end of the run waits for the sinks, seconds (the
            report file is written first).
        pretrain_flops_source: Where ``pretrain_flops`` came from (``"argument"`` or the
            environment variable), ``None`` when unknown. Derived.
        pretrain_flops_catalog: Who opted in to the bundled catalogue (``"argument"`` or the
            environment variable), ``None`` when nobody. Derived.
        given: The names of the options the user gave (adapters fill the others). Derived.
    """

    model_config = ConfigDict(frozen=True, arbitrary_types_allowed=True, extra="forbid")

    pad_id: int | None = None
    model_name: str | None = None
    pretrain_flops: float | None = None
    model_id: str | None = None
    parent_runs: tuple[str, ...] = ()
    original_systemic_risk: bool = False
    output: Path | None = None
    optimizer: Any = None
    nvml: bool | None = None
    peak_flops: float | None = None
    dtype: str = "bf16"
    nvml_interval_seconds: float = DEFAULT_INTERVAL_SECONDS
    measure_every: int = DEFAULT_MEASURE_EVERY
    phases: str = DEFAULT_PHASE_POLICY
    token_inputs: Any = None
    refresh_seconds: float = DEFAULT_REFRESH_SECONDS
    budget: float | str | None = None
    budget_action: str = "stop"
    ledger: Path | None = None
    sinks: tuple[Any, ...] = ()
    sink_timeout_seconds: float = DEFAULT_SINK_TIMEOUT_SECONDS
    pretrain_flops_source: str | None = None
    pretrain_flops_catalog: str | None = None
    given: frozenset[str] = frozenset()

    def __init__(self, *, environ: Mapping[str, str] | None = None, **options: Any) -> None:
        """Validates ``options`` (the names of :data:`OPTION_NAMES`).

        Args:
            environ: The environment to read (default ``os.environ``).
            **options: The options given.

        Raises:
            ConfigurationError: an unknown name, or an invalid value or environment variable;
                the message names the option.
            MissingExtraError: ``nvml=True`` (or ``FLOPMETER_NVML=1``) without ``nvidia-ml-py``.
        """
        super().__init__(**_validated(options, os.environ if environ is None else environ))

    @classmethod
    def of(cls, options: MeterOptions | None = None, **values: Any) -> MeterOptions:
        """``options`` with ``values`` given on top (they win), or options from ``values``
        alone: the two forms of ``FlopMeter`` and the adapters.

        Raises:
            ConfigurationError: ``options`` is not a :class:`MeterOptions`, or a value is bad.
        """
        if options is None:
            return cls(**values)
        if not isinstance(options, MeterOptions):
            raise ConfigurationError(f"options must be MeterOptions, got {type(options).__name__}.")
        return options.with_values(**values)

    def given_values(self) -> dict[str, Any]:
        """The options the user gave, in a form they can be given again (``"catalog"`` for a
        catalogue opt-in by argument, the parent runs as a list)."""
        values = {name: getattr(self, name) for name in OPTION_NAMES if name in self.given}
        if "pretrain_flops" in values and self.pretrain_flops_catalog == "argument":
            values["pretrain_flops"] = CATALOG
        if "parent_runs" in values:
            values["parent_runs"] = list(self.parent_runs)
        return values

    def with_defaults(self, **defaults: Any) -> MeterOptions:
        """These options, with ``defaults`` filling the options the user did not give.

        Adapters use it for what they know about the run (the tokenizer's pad id, the trainer's
        output folder and precision). Defaults are validated like given options (without the
        environment, which the user's options have read already).
        """
        fill = {k: v for k, v in defaults.items() if k not in self.given and v is not None}
        return self._merged(fill, self.given)

    def with_values(self, **values: Any) -> MeterOptions:
        """These options with ``values`` given on top (they win; ``None`` is not given)."""
        given = {k: v for k, v in values.items() if v is not None or k in _NEVER_NONE}
        return self._merged(given, self.given | set(given))

    def _merged(self, values: Mapping[str, Any], given: frozenset[str] | set[str]) -> MeterOptions:
        if not values:
            return self
        checked = MeterOptions(environ={}, **values)
        update = {k: getattr(checked, k) for k in values}
        if "pretrain_flops" in values:
            update["pretrain_flops_source"] = checked.pretrain_flops_source
            update["pretrain_flops_catalog"] = checked.pretrain_flops_catalog
        update["given"] = frozenset(given)
        made = self.model_copy(update=update)
        _check_budget_action(made.budget, made.budget_action)
        return made

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


#: The options a user may give: the fields, less the derived ones (the one list).
OPTION_NAMES: tuple[str, ...] = tuple(n for n in MeterOptions.model_fields if n not in _DERIVED)


def _validated(options: Mapping[str, Any], environ: Mapping[str, str]) -> dict[str, Any]:
    """The fields of :class:`MeterOptions` from the options given, each checked."""
    unknown = sorted(set(options) - set(OPTION_NAMES))
    if unknown:
        raise ConfigurationError(
            f"Unknown FlopMeter option(s): {', '.join(unknown)}. "
            f"The options are: {', '.join(OPTION_NAMES)}."
        )
    # None means "not given", except for options that have no None value: kept, to fail.
    given = {k: v for k, v in options.items() if v is not None or k in _NEVER_NONE}
    values = {name: check(given[name]) for name, check in _CHECKS.items() if name in given}
    values["given"] = frozenset(given)
    values.update(_pretrain_flops(given, environ))
    if nvml_setting(given.get("nvml"), environ).mode == "required":
        from flopmeter.hardware.nvml import import_pynvml

        import_pynvml()  # a missing extra is a configuration error, raised now
    if "nvml" in given:
        values["nvml"] = given["nvml"]
    values["ledger"] = resolve_ledger(given.get("ledger"), environ)  # its own precedence
    sinks, _ = by_precedence(given, "sinks", environ, SINKS_ENV)
    values["sinks"] = tuple(parse_sinks(sinks))
    policy, source = by_precedence(given, "phases", environ, PHASES_ENV)
    values["phases"] = phase_policy(policy, "phases" if source == "argument" else PHASES_ENV)
    _check_budget_action(values.get("budget"), values.get("budget_action", "stop"))
    return values


#: The environment variable of the phase policy (``MeterOptions.phases``).
PHASES_ENV = "FLOPMETER_PHASES"


def phase_policy(value: object, name: str = "phases") -> str:
    """The phase policy checked: one of :data:`~flopmeter.flops.phases.PHASE_POLICIES`
    (``None``: the default)."""
    if value is None:
        return DEFAULT_PHASE_POLICY
    text = value.strip().lower() if isinstance(value, str) else value
    if text not in PHASE_POLICIES:
        raise ConfigurationError(
            f"{name} must be one of {', '.join(map(repr, PHASE_POLICIES))}, got {value!r}."
        )
    return str(text)


def _check_budget_action(budget: object, action: str) -> None:
    if action != "stop" and budget is None:
        raise ConfigurationError(f"budget_action={action!r} needs a budget.")


def _pretrain_flops(given: Mapping[str, Any], environ: Mapping[str, str]) -> dict[str, Any]:
    """``pretrain_flops`` and its source, by the precedence rule; either may be ``"catalog"``,
    which opts in to the catalogue instead of giving a number."""
    value, source = by_precedence(given, "pretrain_flops", environ, PRETRAIN_FLOPS_ENV)
    if source is None:
        return {}
    if source == "argument":
        setting = validate_pretrain_setting(value)
    else:
        setting, source = pretrain_flops_from_env({PRETRAIN_FLOPS_ENV: value}), ENV_SOURCE
    if setting == CATALOG:
        return {"pretrain_flops": None, "pretrain_flops_catalog": source}
    return {"pretrain_flops": setting, "pretrain_flops_source": source}


def meter_signature(model_type: type) -> inspect.Signature:
    """``FlopMeter``'s signature as help() and editors show it: ``model``, ``pad_id``,
    ``options``, then every option by name, from the one list (:data:`OPTION_NAMES`)."""
    positional, keyword = inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY
    params = [
        inspect.Parameter("self", positional),
        inspect.Parameter("model", positional, annotation=model_type),
        inspect.Parameter("pad_id", positional, default=None),
        inspect.Parameter("options", keyword, default=None, annotation=MeterOptions | None),
    ]
    for name in OPTION_NAMES:
        if name != "pad_id":
            field = MeterOptions.model_fields[name]
            params.append(inspect.Parameter(name, keyword, default=field.default))
    return inspect.Signature(params, return_annotation=None)
