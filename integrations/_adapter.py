"""What the framework adapters share: one meter per training run, options passed through.

:class:`MeterAdapter` is held by each framework callback. It validates the user's meter options
when the callback is made (before any training), fills in what the framework knows (the pad id,
the output folder, the training precision) for the options the user did not give, and makes,
resumes, logs and stops the :class:`~flopmeter.FlopMeter` of each run. It holds no counting
logic: the callbacks translate framework events into these calls.

A callback that zero-code metering (:mod:`flopmeter.auto`) added to a trainer carries a
:class:`ZeroCode` in its adapter: its meters get the report's attach section, it stands down
when the script runs a meter of its own, it records ``attached`` in the job folder when its
meter starts, and a failure in its events is recorded and swallowed (:func:`guard_events`).
"""

from __future__ import annotations

import functools
import logging
import os
import sys
import weakref
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import torch
from torch import nn

from flopmeter.auto.attaching import attach_section, explicit_meters, guarded, qualified_name
from flopmeter.auto.job import record
from flopmeter.errors import BudgetExceeded, ConfigurationError
from flopmeter.meter import FlopMeter
from flopmeter.options import MeterOptions, validate_pad_id
from flopmeter.report import FlopReport

__all__ = [
    "AdapterCallback",
    "MeterAdapter",
    "ZeroCode",
    "fp32_matmul_dtype",
    "guard_events",
    "log_values",
    "pad_id_of",
]

logger = logging.getLogger("flopmeter")

#: The three running figures the adapters log: compute (FLOP), non-padding tokens, and the
#: compute as a fraction of the threshold.
LOG_FIELDS = ("flops", "tokens", "ratio_to_threshold")


def log_values(report: FlopReport, prefix: str) -> dict[str, float]:
    """The running figures of ``report`` keyed ``prefix + field``; unknown ones left out."""
    values = {
        "flops": report.compute.primary_flops,
        "tokens": report.tokens.tokens_processed,
        "ratio_to_threshold": report.verdict.ratio_to_threshold,
    }
    return {prefix + k: float(v) for k, v in values.items() if v is not None}


def fp32_matmul_dtype() -> str:
    """``"tf32"`` when torch runs float32 matmuls on TF32 tensor cores, else ``"fp32"``."""
    if torch.get_float32_matmul_precision() != "highest":
        return "tf32"
    return "tf32" if torch.backends.cuda.matmul.allow_tf32 else "fp32"


def pad_id_of(processing_class: Any, model: Any) -> int | None:
    """The pad id of a tokenizer (or a processor's ``tokenizer``), else the model config's;
    ``None`` when none has a usable one."""
    config = getattr(model, "config", None)
    for source in (processing_class, getattr(processing_class, "tokenizer", None), config):
        try:
            pad = validate_pad_id(getattr(source, "pad_token_id", None))
        except ConfigurationError:
            continue  # not a usable id: look further
        if pad is not None:
            return pad
    return None


class ZeroCode:
    """How zero-code metering attached a callback to a trainer: the attach section's parts.

    Args:
        method: ``hf_trainer`` or ``lightning_trainer``.
        trainer: The trainer the callback was added to (held weakly).
        what: The start of the ``found`` sentence; the metered module's class name follows
            (e.g. ``"the model trl...SFTTrainer trains (after any PEFT wrapping)"``).
        rival: Whether the script's own callback is on the trainer too (asked at the start of
            each run; ``None``: never).
        shown: The module the report names, from the one the meter hooks (``None``: that one).
    """

    def __init__(
        self,
        method: str,
        trainer: Any,
        what: str,
        rival: Callable[[Any], bool] | None = None,
        shown: Callable[[Any], Any] | None = None,
    ) -> None:
        self.method = method
        self.trainer_class: type = type(trainer)
        self.what = what
        self._trainer = weakref.ref(trainer)
        self._rival = rival
        self.shown = shown or (lambda model: model)
        #: An event of the callback failed: it does nothing more (the job goes on).
        self.failed = False

    def trainer(self) -> Any:
        """The trainer the callback was added to (``None`` once it is gone)."""
        return self._trainer()

    def explicit(self) -> str | None:
        """Why this run's meter is the script's own and not this one (``None``: it is this
        one): a running :class:`~flopmeter.FlopMeter` the script made, or its own callback."""
        if explicit_meters():
            return "a FlopMeter the script made itself is running"
        trainer = self.trainer()
        if self._rival is not None and trainer is not None and self._rival(trainer):
            return "the script's own FlopMeterCallback is on the trainer"
        return None


class MeterAdapter:
    """One :class:`FlopMeter` per training run, for a framework callback.

    Args:
        options: The user's meter options as one value (``MeterOptions``), or ``None``.
        **option_values: Any :class:`~flopmeter.options.MeterOptions` option by name; given
            with ``options``, they win over its options. Validated now, once.

    Raises:
        ConfigurationError: an option (or ``PRETRAIN_FLOPS``, ``FLOPMETER_NVML``) is invalid.
    """

    def __init__(self, options: MeterOptions | None = None, **option_values: Any) -> None:
        self.options = MeterOptions.of(options, **option_values)
        self.meter: FlopMeter | None = None
        self.running = False
        #: Set when zero-code metering added the callback (``None``: the script did).
        self.zero_code: ZeroCode | None = None

    def stands_down(self) -> bool:
        """Whether a zero-code callback leaves this run to a meter the script made itself (then
        ``explicit`` is recorded in the job folder and there is no meter); ``False`` for the
        script's own callback."""
        zero = self.zero_code
        if zero is None or self.running:
            return False
        reason = zero.explicit()
        if reason is None:
            return False
        own = [m.output for m in explicit_meters() if m.output is not None]
        record(
            "explicit",
            report=os.path.abspath(own[0]) if own else None,
            trainer_class=qualified_name(zero.trainer_class),
            reason=f"zero-code metering stood down: {reason}",
        )
        self.meter = None
        return True

    def begin(self, model: nn.Module, **defaults: Any) -> FlopMeter:
        """Makes the meter of a new run (not started); ``defaults`` fill the options the user
        did not give. A run still open is stopped first, as failed."""
        if self.meter is not None and self.running:
            self.running = False
            self.meter.stop(RuntimeError("a new training run began before this one ended"))
        self.meter = FlopMeter(model, options=self.options.with_defaults(**defaults))
        zero = self.zero_code
        if zero is not None:
            shown = zero.shown(model)
            self.meter.note_attach(
                attach_section(
                    zero.method,  # type: ignore[arg-type]
                    f"{zero.what}: {type(shown).__name__}",
                    trainer=zero.trainer_class,
                    model=shown,
                )
            )
        return self.meter

    def json_options(self) -> dict[str, Any]:
        """The options the user gave that JSON can hold (paths as text), to make the callback
        again from a checkpoint; the others are left out."""
        values = {k: _json_value(v) for k, v in self.options.given_values().items()}
        return {k: v for k, v in values.items() if v is not None}

    def start(self) -> None:
        """Starts the meter made by :meth:`begin`."""
        assert self.meter is not None
        self.meter.start()
        self.running = True
        zero = self.zero_code
        if zero is not None:
            attach = self.meter.attach
            record(
                "attached",
                method=zero.method,
                report=None if self.meter.output is None else os.path.abspath(self.meter.output),
                run_id=self.meter.run_id,  # the job's end finds this run's report by it
                trainer_class=qualified_name(zero.trainer_class),
                model_class=None if attach is None else attach.model_class,
            )

    def resume(self, saved: Mapping[str, Any] | None, step: int) -> None:
        """Continues a checkpoint's counts, or notes that the checkpoint at ``step`` had none."""
        assert self.meter is not None
        if saved:
            self.meter.load_state_dict(saved)
            return
        logger.warning(
            "flopmeter: training resumes at step %d from a checkpoint without flopmeter counts; "
            "the report withholds the run's compute and verdict (the steps before are in no "
            "count)",
            step,
        )
        self.meter.resumed_without_counts(step)  # the report withholds, saying why

    def end(self, epochs: float | None, exc: BaseException | None = None) -> FlopReport | None:
        """Stops the meter of the run (idempotent): the final report, or ``None`` if none ran."""
        if self.meter is None or not self.running:
            return None
        self.running = False
        self.meter.epochs = epochs
        report = self.meter.stop(exc)
        _say_where(self.meter)
        return report


def _say_where(meter: FlopMeter) -> None:
    """One line on stderr at the end of a framework's run (rank 0), as ``flopmeter run`` prints
    it: where the report is, its status and outcome. Not in a zero-code job, whose end says it
    once for every report of the job; never raises."""
    from flopmeter import distributed
    from flopmeter.auto import SWITCH_ENV

    if meter.output is None or distributed.rank() != 0 or os.environ.get(SWITCH_ENV):
        return
    try:
        from flopmeter.auto.job_reports import report_line

        print(report_line(meter.output), file=sys.stderr, flush=True)
    except Exception:  # a closed stderr: the report is on disk all the same
        logger.debug("flopmeter: could not say where the report is", exc_info=True)


class AdapterCallback:
    """What both framework callbacks expose of their :class:`MeterAdapter` (``self._adapter``)."""

    _adapter: MeterAdapter

    @property
    def meter(self) -> FlopMeter | None:
        """The meter of the current (or last) run; ``None`` before training."""
        return self._adapter.meter

    @property
    def _running(self) -> bool:
        return self._adapter.running


def guard_events(
    callback: AdapterCallback,
    names: Iterable[str],
    *,
    begin: str,
    on_stand_down: Callable[..., None] | None = None,
) -> None:
    """Makes the events ``names`` of a zero-code callback safe for the job.

    At ``begin`` (the event that makes a run's meter) the callback stands down when the script
    runs a meter of its own (:meth:`MeterAdapter.stands_down`; then ``on_stand_down`` is called
    with the event's arguments). An exception in any event (``BudgetExceeded`` aside: the
    user's budget stops training as asked) is logged, recorded (``problem``) and ends the meter
    as failed with it; the callback then does nothing more. The guards are instance
    attributes, so the callback's class (by whose name checkpoints store its state) stays the
    same.
    """
    adapter = callback._adapter
    zero = adapter.zero_code
    assert zero is not None
    where = qualified_name(callback)

    def guard(name: str, event: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(event)
        def guarded_event(*args: Any, **kwargs: Any) -> Any:
            if zero.failed:
                return None
            try:
                if name == begin and adapter.stands_down():
                    if on_stand_down is not None:
                        on_stand_down(*args, **kwargs)
                    return None
                return event(*args, **kwargs)
            except BudgetExceeded:
                raise
            except Exception as exc:
                zero.failed = True
                with guarded(f"{where}.{name}"):
                    raise exc
                with guarded(f"{where}.{name}: ending its meter"):
                    adapter.end(None, exc)
                return None

        return guarded_event

    for name in names:
        callback.__dict__[name] = guard(name, getattr(callback, name))


def _json_value(value: Any) -> Any:
    """``value`` if JSON can hold it (a path as text, a list of them), else ``None``."""
    if isinstance(value, os.PathLike):
        return os.fspath(value)
    if isinstance(value, list):
        items = [_json_value(v) for v in value]
        return None if None in items else items
    return value if isinstance(value, (str, int, float, bool)) else None
