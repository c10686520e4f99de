"""FlopMeter: the lifecycle of a metered run, its hooks, and delegation.

The meter owns no arithmetic and no counting: its hooks (:mod:`flopmeter.run.hooks`) feed the
counters, the FLOP model and the budget (:mod:`flopmeter.budget`); the run's compute and its
report come from pure functions (:mod:`flopmeter.run.measure`, :mod:`flopmeter.run.reporting`).
"""

from __future__ import annotations

import contextlib
import logging
import os
import uuid
from collections.abc import Mapping
from types import MappingProxyType
from typing import Any

from torch import nn

from flopmeter import distributed
from flopmeter.budget.controller import budget_controller
from flopmeter.checks import whole_number
from flopmeter.counting.census import Census
from flopmeter.counting.counters import RunCounters
from flopmeter.counting.saved_state import check_state
from flopmeter.errors import BudgetExceeded, ConfigurationError, FlopMeterError
from flopmeter.flops.phases import declared_phase, tallies_from_state, tallies_state
from flopmeter.flops.recorder import FlopModelRecorder
from flopmeter.options import MeterOptions, meter_signature, validate_bool
from flopmeter.report import FlopReport
from flopmeter.report.context import AttachSection
from flopmeter.run import events as meter_events
from flopmeter.run.hooks import TrainingHooks
from flopmeter.run.measure import (
    status_of,
)
from flopmeter.run.parts import assemble, default_model_id, default_model_name
from flopmeter.run.reporter import RunLife, RunReporter, utc_now
from flopmeter.run.resume import checkpoint_state, earlier_session
from flopmeter.run.run_file import RunFile
from flopmeter.safe_text import describe_error
from flopmeter.types import Status

__all__ = [
    "FlopMeter",
]

logger = logging.getLogger("flopmeter")


class FlopMeter:
    """Measures the training compute of a PyTorch model while it trains.

    Use it around any training loop (``with FlopMeter(model, pad_id, output="out/") as
    meter:``), or call :meth:`start` and :meth:`stop`. Only training micro-batches count
    (training mode, gradients enabled; recomputation once), added into a small device tensor:
    no host synchronisation per micro-batch.

    The options are :class:`~flopmeter.options.MeterOptions`' (each documented there), given
    as keywords or as one value (``options=MeterOptions(...)``); given both, the keywords win.
    The parent runs, the ledger and the hardware tracker are made from them once, here.

    Args:
        model: The model being trained (the meter hooks its forward pass).
        pad_id, options, **option_values: The padding token id (the option also given by
            position), the options as one value, any other option by name.

    Raises:
        ConfigurationError: An option, ``PRETRAIN_FLOPS`` or ``FLOPMETER_NVML`` is invalid, a
            parent run cannot be read, or the ledger cannot be opened.
        MissingExtraError: ``nvml=True`` (or ``FLOPMETER_NVML=1``) without ``nvidia-ml-py``.
    """

    def __init__(
        self,
        model: nn.Module,
        pad_id: int | None = None,
        *,
        options: MeterOptions | None = None,
        **option_values: Any,
    ) -> None:
        if not isinstance(model, nn.Module):
            raise ConfigurationError(
                f"FlopMeter needs the torch.nn.Module being trained, got {type(model).__name__}."
            )
        self.options = MeterOptions.of(options, pad_id=pad_id, **option_values)
        self.model = model
        self.model_name = self.options.model_name or default_model_name(model)
        self.model_id = self.options.model_id or default_model_id(model)  # for the catalogue
        parts = assemble(self.options, self.model_id)
        self.original, self.parents = parts.original, parts.parents  # as the report takes them
        self._archive, self._hardware = parts.archive, parts.hardware
        self.counters = RunCounters()
        self.flop_model = FlopModelRecorder(model, measure_every=self.options.measure_every)
        self._budget = budget_controller(
            parts.budget,
            read_compute=lambda: self._reporter.measure(sync=True),
            observations=self.flop_model.observations,
            census=lambda: self._hooks.census,
            on_problem=lambda exc: self._hooks.note_problem("budget", describe_error(exc), exc),
        )
        driven = (self.counters, self.flop_model, self._budget, self.options)  # by the hooks
        self._hooks = TrainingHooks(model, *driven, self._refresh_when_due)
        self._final: FlopReport | None = None
        self._life = RunLife(uuid.uuid4().hex, self.model_name)  # status, times, notes
        self._run_file = RunFile(
            self.options.output, self.options.refresh_seconds, self._interrupted
        )
        self._reporter = RunReporter(
            self._life,
            parts,
            options=self.options,
            hooks=self._hooks,
            budget=self._budget,
            run_file=lambda: self._run_file,
        )
        self.run_id = self._life.run_id  # this run's id, in its report and ledger record

    @property
    def epochs(self) -> float | None:
        """Epochs trained, when an adapter knows them (it sets this; shown in the report)."""
        return self._life.epochs

    @epochs.setter
    def epochs(self, value: float | None) -> None:
        self._life.epochs = value

    @property
    def pad_id(self) -> int | None:
        """The padding token id the meter uses."""
        return self.options.pad_id

    @property
    def output(self) -> os.PathLike[str] | None:
        """The report file (a path), or ``None``."""
        return self.options.output

    @property
    def pretrain_flops(self) -> float | None:
        """The original model's training compute, FLOP, or ``None`` when unknown."""
        return self.original.flops

    @property
    def census(self) -> Census | None:
        """The parameter census, taken at the first training forward; ``None`` before it."""
        return self._hooks.census

    @property
    def problems(self) -> Mapping[str, str]:
        """Problems in the meter's own hooks so far, by hook (each logged once; training went
        on)."""
        return MappingProxyType(self._hooks.problems)

    # ----------------------------------------------------------------- lifecycle
    def __enter__(self) -> FlopMeter:
        self.start()
        return self

    def __exit__(self, exc_type: Any, exc: BaseException | None, tb: Any) -> None:
        try:
            self.stop(exc)
        except Exception:  # the training has finished: the user's script must go on
            logger.exception("flopmeter could not make its final report")

    def start(self) -> FlopMeter:
        """Registers the hooks and starts the clock (what entering ``with`` does); raises
        ``FlopMeterError`` when started before, ``ConfigurationError`` when ``output`` cannot
        be written."""
        return self.begin(claim_file=True)

    def begin(self, *, claim_file: bool = True) -> FlopMeter:
        """:meth:`start`; ``claim_file=False`` (zero-code metering's seam) counts from now but
        leaves the report file unclaimed until :meth:`claim_file` (a meter the script starts
        before then takes over with no trace of this one: :meth:`stand_down`)."""
        if self._life.status == "running":
            raise FlopMeterError("This FlopMeter is already running.")
        if self._life.status is not None:
            raise FlopMeterError(
                "This FlopMeter has finished and cannot be entered again. Create a new one; "
                "to continue its counts, pass meter.state_dict() to the new one's "
                "load_state_dict()."
            )
        meter_events.starting(self)  # zero-code metering gives way to this meter, if it must
        self._life.rank_at_start = distributed.rank()
        self._life.started_at = self._life.started_at or utc_now()
        if claim_file:
            self.claim_file()
        self._budget.start(resumed=self.counters.resumed)
        self._hooks.register(self.options.optimizer)
        self._hardware.start(self.model)  # never raises; reads the energy counters now
        self.counters.start_clock()
        self._life.status = "running"
        self._run_file.wrote()
        meter_events.started(self)
        return self

    def claim_file(self) -> None:
        """Claims the report file (rank 0, once): from now on a SIGTERM leaves an
        ``interrupted`` report there and a kill the last ``running`` one."""
        if self.options.output is None or self._life.rank_at_start != 0 or self._run_file.is_open:
            return
        # From now on the file is this run's: a running report replaces whatever was there.
        kept = self._run_file.open(self._reporter.report(sync=False))
        if kept is not None:  # another run's report, kept aside
            earlier = earlier_session(kept, self.counters.snapshot(sync=False).restored)
            self._life.notes.extend([earlier.note] if earlier.note else [])
            self._life.earlier_report = earlier.report_path
            self._life.beyond_checkpoint_flops = earlier.beyond_checkpoint_flops

    def stand_down(self, reason: str) -> FlopReport | None:
        """Zero-code metering gives way to a meter the script starts (``reason``: why, for the
        attach section). Before its file was claimed: hooks removed, counts dropped, nothing
        written (``None``). After: a final report of this rank's counts (``interrupted``, with
        the reason), written, and the file let go before the other meter claims it."""
        if self._final is not None or self._life.status != "running":
            return self._final
        if self._life.attach is not None:
            self._life.attach = self._life.attach.model_copy(update={"reason": reason})
        if not self._run_file.is_open:
            meter_events.stopped(self)
            self._hardware.stop()
            self._hooks.remove()
            self._hooks.guarded("flop model", self.flop_model.stop)
            self.counters.stop_clock()
            self._life.status, self._life.ended_at = "interrupted", utc_now()
            return None
        return self._end(None, status="interrupted", error=reason, sync=False)

    def stop(self, exc: BaseException | None = None) -> FlopReport:
        """Removes the hooks, makes the final report and writes it (what leaving ``with`` does),
        and returns it. ``exc``, the exception that ended training, makes the status ``failed``
        (``interrupted`` for KeyboardInterrupt); the caller re-raises it."""
        if self._final is not None:
            return self._final
        if self._life.status != "running":
            raise FlopMeterError("This FlopMeter was never started.")
        return self._end(
            exc, status=status_of(exc), sync=exc is None or isinstance(exc, BudgetExceeded)
        )

    def _end(
        self, exc: BaseException | None, *, status: Status, error: str | None = None, sync: bool
    ) -> FlopReport:
        """:meth:`stop` with the status given; ``sync``: sum the counts over ranks (a
        collective every rank joins), else this rank's."""
        meter_events.stopped(self)
        self._hardware.stop()  # first, whatever follows: the sampling thread is joined
        self._hooks.remove()
        self._hooks.guarded("flop model", self.flop_model.stop)
        self.counters.stop_clock()
        self._life.ended_at = utc_now()
        self._life.status = status
        if exc is not None and status != "completed":
            self._life.error = describe_error(exc)
        self._life.error = error or self._life.error
        self._run_file.stopping()
        try:  # a failed rank must not wait in a collective its peers may never join
            self._final = self._reporter.report(sync=sync)
        finally:  # written if made; the lock is let go either way (the last refresh stays)
            self._run_file.close(self._final)
        interrupt, self._archive.interrupt = self._archive.interrupt, None
        if interrupt is not None:  # Ctrl-C in the ledger append: the report is written, now stop
            raise interrupt
        if self._life.rank_at_start == 0:
            for outcome in self._archive.ship(self._final):  # never raises; waits a bounded time
                if not outcome.ok:
                    self._hooks.problems.setdefault(f"sink {outcome.sink}", outcome.detail)
        return self._final

    def refresh(self, *, sync: bool = False) -> FlopReport:
        """Makes a running report and writes it to ``output`` (rank 0): what adapters call at
        their log and save steps, and the meter itself every ``refresh_seconds``. One host read
        of the counts; with ``sync`` under torch.distributed, one small collective (every rank
        must call it then, at the same point)."""
        report = self.report(sync=sync)
        self._run_file.wrote()
        if self._final is None:
            self._run_file.write(report)
        return report

    def _refresh_when_due(self) -> None:
        """At an optimizer step: the report on disk, every ``refresh_seconds``. The step pays
        the counts' snapshot (one host read) and the facts; the report is built and written on
        the report file's writer thread (:meth:`RunReporter.capture`)."""
        if self._run_file.due():
            self._run_file.wrote()
            if self._final is None:
                self._run_file.write_later(self._reporter.capture(self._refresh_failed))

    def _refresh_failed(self, exc: BaseException) -> None:
        """A periodic report could not be built (on the writer thread): noted once, as a
        fault in the refresh step would be; the file keeps the last report."""
        self._hooks.note_problem("refresh", describe_error(exc), exc)

    def _interrupted(self) -> FlopReport:
        """SIGTERM's report: this rank's counts, ``interrupted``, ending now (no collective)."""
        error, ended = "SIGTERM: the process was asked to stop", utc_now()
        return self._reporter.report(sync=False, status="interrupted", error=error, ended_at=ended)

    # ----------------------------------------------------------------- budget (delegated)
    @property
    def should_stop(self) -> bool:
        """Whether the compute budget says to stop: from the optimizer step after which the next
        would cross it, or from the start of a resumed run already within one step of it."""
        return self._budget.should_stop

    @property
    def budget_left(self) -> float | None:
        """The budget less the compute at the guard's last reading, FLOP (``None`` without a
        budget, before a reading, or when the compute is unknown; docs/budget.md)."""
        return self._budget.budget_left

    def plan_budget(self, planned_steps: int | None) -> None:
        """The optimizer steps this session plans (adapters: the trainer's ``max_steps``), for
        the budget guard's forecast."""
        self._budget.plan(planned_steps)

    # ----------------------------------------------------------------- counts and report
    def recount(self) -> Census:
        """Retakes the parameter census now, for runs that change what trains midway; the
        report uses the new census from now on, and the next micro-batch is profiled again."""
        return self._hooks.recount()

    @property
    def attach(self) -> AttachSection | None:
        """How zero-code metering attached this meter (``None``: the script made it)."""
        return self._life.attach

    def note_attach(self, attach: AttachSection) -> None:
        """Records how zero-code metering (:mod:`flopmeter.auto`) attached this meter: the
        report's ``attach`` section (and, when micro-batches ran before it, no verdict)."""
        self._life.attach = attach

    def add_note(self, note: str) -> None:
        """Adds a note (one sentence) to the report (for adapters: what counts cannot show)."""
        self._life.notes.append(str(note))

    def declare_phase(self, name: str, flops: float | None, source: str) -> None:
        """Declares compute of this run that the meter cannot see (generation in a vLLM server,
        reference log-probs or teacher logits computed before the run), FLOP, with where the
        figure comes from; ``flops=None`` names the phase as not seen (under the
        ``modification`` policy the verdict is then withheld until a figure is declared).

        Raises:
            ConfigurationError: an empty name or source, a name the meter uses, or a figure that
                is not a non-negative number.
        """
        self._life.declared_phases.append(declared_phase(name, flops, source))

    def name_model(self, module: nn.Module, name: str) -> None:
        """Names another model of the run (``"reference"``, ``"teacher"``, ``"reward model"``):
        its forward passes while the model trains are its own phase, ``model <name>``, and are
        watched from now on, wherever they run (no discovery needed)."""
        if not isinstance(module, nn.Module) or not isinstance(name, str) or not name.strip():
            raise ConfigurationError("name_model needs an nn.Module and a non-empty name.")
        self.flop_model.forwards.name(module, name.strip())

    def evaluation(self) -> contextlib.AbstractContextManager[None]:
        """``with meter.evaluation():`` marks evaluation explicitly: its forward passes are the
        ``evaluation`` phase (never counted). Once one is marked, only such blocks are
        evaluation; before that, any forward pass while the model is in evaluation mode is."""
        return self.flop_model.forwards.evaluation()

    def evaluation_marked(self) -> None:
        """Says that every evaluation of this run will be marked with :meth:`evaluation` (the
        HF callback marks the Trainer's evaluation loops): from now on the model's mode alone
        never makes a forward pass evaluation."""
        self.flop_model.forwards.explicit_evaluation = True

    def elapsed_seconds(self) -> float:
        """Training time so far on this rank, in seconds, including time before a resume."""
        return self.counters.elapsed_seconds()

    def report(self, *, sync: bool = False) -> FlopReport:
        """The report: final once the meter has stopped, ``running`` before. ``sync``: while
        running under torch.distributed, sum the counts over ranks (every rank must call it);
        without it a running report holds this rank's counts. The final one is always summed."""
        return self._final if self._final is not None else self._reporter.report(sync=sync)

    # ----------------------------------------------------------------- resume
    def state_dict(self) -> dict[str, Any]:
        """The cumulative counts (plain data) for a checkpoint, with the run's compute (its
        figure, estimate and run id: rank 0's, whose report it is) and largest step for a
        resumed run's budget guard; summed over ranks under torch.distributed (two small
        collectives), so every rank calls it. Restore with :meth:`load_state_dict`."""
        snapshot = self.counters.snapshot(sync=True)
        identity = {"started_at": self._life.started_at, "model": self._model_identity()}
        phases = tallies_state(self._reporter.phase_tallies(sync=True))  # every rank's, once
        return {
            "phases": phases,
            **checkpoint_state(
                self.counters.state_dict(identity, snapshot=snapshot),
                snapshot,
                distributed.rank0_text(self.run_id),  # the run id of rank 0's report
                lambda: self._reporter.measure(sync=True, snapshot=snapshot),
                self._budget.saved,
                lambda exc: self._hooks.note_problem("budget", describe_error(exc), exc),
            ),
        }

    def load_state_dict(self, state: Mapping[str, Any], *, allow_other_model: bool = False) -> None:
        """Continues the counts of a run saved with :meth:`state_dict`: added once to what
        this meter counts (not once per rank). The state is checked first
        (:func:`flopmeter.counting.counters.check_state`, a ``ConfigurationError`` naming the field) and
        must come from the same model (name, parameter count) unless ``allow_other_model``."""
        validate_bool(allow_other_model, "allow_other_model")
        checked = check_state(state, self._model_identity(), allow_other_model=allow_other_model)
        self._budget.restore(state)  # checks the saved budget figures before anything is loaded
        phases = tallies_from_state(state.get("phases"))
        self.counters.load_state_dict(state)
        self.flop_model.restored_phases = phases
        self._life.started_at = checked["started_at"] or self._life.started_at

    def resumed_without_counts(self, step: int) -> None:
        """Says that training resumes at optimizer step ``step`` (> 0) from a checkpoint that
        holds no meter counts (adapters: the Trainer's ``global_step`` at a resume with nothing
        to restore): the report then withholds the run's compute and its verdict, with the
        reason and how to fix it, since the steps before ``step`` are in no count.

        Raises:
            ConfigurationError: ``step`` is not a whole number above 0.
        """
        what = "a whole number above 0"
        if whole_number(step, "step", what=what) == 0:
            raise ConfigurationError(f"step must be {what}, got 0.")
        self.counters.uncounted_steps = int(step)

    def _model_identity(self) -> dict[str, Any]:
        """What ties a saved state to its model: the report's name and the parameter count."""
        census = self._hooks.census_now()
        return {"name": self.model_name, "n_total": census.n_total}


FlopMeter.__init__.__signature__ = meter_signature(nn.Module)  # type: ignore[attr-defined]
