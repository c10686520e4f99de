"""A metered run's machinery: its parts wired together, and its life from start to final report.

:class:`MeteredRun` holds what a :class:`~flopmeter.meter.FlopMeter` is made of besides its
options, counters and FLOP model (the budget, the hooks, the lifecycle, the report file, the
reporter, the archive and the hardware tracker) and runs the sequences that touch several of
them: the start (claiming the file), standing down for another meter, the end (the final
report: file, ledger, sinks), the periodic refresh, SIGTERM's report, and the checkpoint's
state. The meter is the public face that delegates here.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Mapping
from typing import Any, Protocol

from torch import nn

from flopmeter import distributed
from flopmeter.auto import output_chosen
from flopmeter.budget.controller import budget_controller
from flopmeter.counting.counters import RunCounters
from flopmeter.counting.saved_state import check_state
from flopmeter.errors import FlopMeterError
from flopmeter.flops.phases import tallies_from_state, tallies_state
from flopmeter.flops.recorder import FlopModelRecorder
from flopmeter.options import MeterOptions
from flopmeter.report import FlopReport
from flopmeter.run import events as meter_events
from flopmeter.run.hooks import TrainingHooks
from flopmeter.run.parts import RunParts
from flopmeter.run.reporter import RunLife, RunReporter, utc_now
from flopmeter.run.resume import checkpoint_state, earlier_session
from flopmeter.run.run_file import RunFile
from flopmeter.run.signals import held_signals
from flopmeter.safe_text import describe_error
from flopmeter.types import Status

__all__ = ["MeterFace", "MeteredRun"]


class MeterFace(Protocol):
    """What the machinery reads of the meter it runs for (``FlopMeter``)."""

    options: MeterOptions
    model: nn.Module
    model_name: str
    counters: RunCounters
    flop_model: FlopModelRecorder


class MeteredRun:
    """The parts of one meter, wired, and the sequences of its life.

    Args:
        meter: The meter it runs for (its options, model, counters and FLOP model; the
            listeners of :mod:`flopmeter.run.events` are told of the meter itself).
        parts: What the meter's options made (:func:`flopmeter.run.parts.assemble`).
    """

    def __init__(self, meter: MeterFace, parts: RunParts) -> None:
        self.meter, options = meter, meter.options
        self.counters, self.flop_model = meter.counters, meter.flop_model
        self.archive, self.hardware = parts.archive, parts.hardware
        self.budget = budget_controller(
            parts.budget,
            read_compute=lambda: self.reporter.measure(sync=True),
            observations=self.flop_model.observations,
            census=lambda: self.hooks.census,
            on_problem=self._budget_problem,
        )
        driven = (self.counters, self.flop_model, self.budget, options)  # by the hooks
        self.hooks = TrainingHooks(meter.model, *driven, self._refresh_when_due)
        self.final: FlopReport | None = None
        self.life = RunLife(uuid.uuid4().hex, meter.model_name)  # status, times, notes
        self.run_file = RunFile(options.output, options.refresh_seconds, self._interrupted)
        self.hooks.refresh_clock = self.run_file  # quiet steps end when a refresh is due
        self.reporter = RunReporter(
            self.life,
            parts,
            options=options,
            hooks=self.hooks,
            budget=self.budget,
            run_file=lambda: self.run_file,
        )

    def _budget_problem(self, exc: BaseException) -> None:
        self.hooks.note_problem("budget", describe_error(exc), exc)

    # ----------------------------------------------------------------- start and end
    def begin(self, *, claim_file: bool) -> None:
        """Registers the hooks and starts the clock; ``claim_file``: claims the report file now.

        Raises:
            FlopMeterError: The meter is running, or has finished.
        """
        if self.life.status == "running":
            raise FlopMeterError("This FlopMeter is already running.")
        if self.life.status is not None:
            raise FlopMeterError(
                "This FlopMeter has finished and cannot be entered again. Create a new one; "
                "to continue its counts, pass meter.state_dict() to the new one's "
                "load_state_dict()."
            )
        meter_events.starting(self.meter)  # zero-code metering gives way to this one, if it must
        self.life.rank_at_start, self.life.pid_at_start = distributed.rank(), os.getpid()
        self.life.started_at = self.life.started_at or utc_now()
        if claim_file:
            self.claim_file()
        self.budget.start(resumed=self.counters.resumed)
        self.hooks.register(self.meter.options.optimizer)
        self.hardware.start(self.meter.model)  # never raises; reads the energy counters now
        self.counters.start_clock()
        self.life.status = "running"
        self.run_file.wrote()
        meter_events.started(self.meter)

    def claim_file(self) -> None:
        """Claims the report file (rank 0, once), writing a running report there; another
        run's report found there is kept aside, and read as the session resumed from."""
        if self.meter.options.output is None or not self.life.writes():
            return
        if self.run_file.is_open:
            return
        # From now on the file is this run's: a running report replaces whatever was there.
        # A zero-code run whose default file another live run holds writes its own beside it.
        beside = self.life.attach is not None and not output_chosen()
        kept = self.run_file.open(self.reporter.report(sync=False), beside_when_held=beside)
        if self.run_file.held is not None:
            asked, holder = self.run_file.held
            self.life.notes.append(
                f"Another live run (process {holder}) was writing {asked}, the default report "
                f"file, so this run's report is its own file beside it: {self.run_file.output}."
            )
        if kept is not None:  # another run's report, kept aside
            earlier = earlier_session(kept, self.counters.snapshot(sync=False).restored)
            self.life.notes.extend([earlier.note] if earlier.note else [])
            self.life.earlier_report = earlier.report_path
            self.life.beyond_checkpoint_flops = earlier.beyond_checkpoint_flops
            self.life.notes.extend(self.archive.recover(kept))  # a kill before its ledger record

    def _detach(self, status: Status) -> None:
        """Out of the training: the listeners told, the hardware sampling joined (first,
        whatever follows), the hooks removed, the FLOP model stopped, the clock stopped."""
        meter_events.stopped(self.meter)
        self.hardware.stop()
        self.hooks.remove()
        self.hooks.guarded("flop model", self.flop_model.stop)
        self.counters.stop_clock()
        self.life.status, self.life.ended_at = status, utc_now()

    def stand_down(self, reason: str) -> FlopReport | None:
        """Gives way to a meter the script starts (``FlopMeter.stand_down``)."""
        if self.final is not None or self.life.status != "running":
            return self.final
        if self.life.attach is not None:
            self.life.attach = self.life.attach.model_copy(update={"reason": reason})
        if not self.run_file.is_open:
            self._detach("interrupted")
            return None
        return self.end(None, status="interrupted", error=reason, sync=False)

    def end(
        self, exc: BaseException | None, *, status: Status, error: str | None = None, sync: bool
    ) -> FlopReport:
        """The final report: made, written (rank 0: the file, then the ledger, then the sinks)
        and kept. ``sync``: the counts summed over ranks (a collective every rank joins), else
        this rank's (always in a child the process forked: its parent's group is not its own,
        and it writes nothing: :meth:`RunLife.writes`)."""
        sync = sync and self.life.pid_at_start in (None, os.getpid())
        self._detach(status)
        if exc is not None and status != "completed":
            self.life.error = describe_error(exc)
        self.life.error = error or self.life.error
        self.run_file.stopping()
        with held_signals():  # a DataLoader worker's SIGCHLD error is raised after, not mid-write
            return self._final(sync)

    def _final(self, sync: bool) -> FlopReport:
        try:  # a failed rank must not wait in a collective its peers may never join
            self.final = self.reporter.report(sync=sync)
        finally:  # written if made; the lock is let go either way (the last refresh stays)
            self.run_file.close(self.final)
        interrupt, self.archive.interrupt = self.archive.interrupt, None
        if interrupt is not None:  # Ctrl-C in the ledger append: the report is written, now stop
            raise interrupt
        if self.life.writes():
            for outcome in self.archive.ship(self.final):  # never raises; waits a bounded time
                if not outcome.ok:
                    self.hooks.problems.setdefault(f"sink {outcome.sink}", outcome.detail)
        return self.final

    # ----------------------------------------------------------------- reports on the way
    def refresh(self, *, sync: bool) -> FlopReport:
        """A running report, written to the file (rank 0) unless the run has ended."""
        report = self.final if self.final is not None else self.reporter.report(sync=sync)
        self.run_file.wrote()
        if self.final is None:
            self.run_file.write(report)
        return report

    def _refresh_when_due(self) -> None:
        """At an optimizer step: the report on disk, every ``refresh_seconds``. The step pays
        the counts' snapshot (one host read) and the facts; the report is built and written on
        the report file's writer thread (:meth:`RunReporter.capture`)."""
        if self.run_file.due():
            self.run_file.wrote()
            if self.final is None:
                self.run_file.write_later(self.reporter.capture(self._refresh_failed))

    def _refresh_failed(self, exc: BaseException) -> None:
        """A periodic report could not be built (on the writer thread): noted once, as a
        fault in the refresh step would be; the file keeps the last report."""
        self.hooks.note_problem("refresh", describe_error(exc), exc)

    def _interrupted(self) -> FlopReport:
        """SIGTERM's report: this rank's counts, ``interrupted``, ending now (no collective)."""
        error, ended = "SIGTERM: the process was asked to stop", utc_now()
        return self.reporter.report(sync=False, status="interrupted", error=error, ended_at=ended)

    # ----------------------------------------------------------------- resume
    def state_dict(self) -> dict[str, Any]:
        """What a checkpoint saves (``FlopMeter.state_dict``; collectives on every rank)."""
        snapshot = self.counters.snapshot(sync=True)
        identity = {"started_at": self.life.started_at, "model": self.model_identity()}
        phases = tallies_state(self.reporter.phase_tallies(sync=True))  # every rank's, once
        return {
            "phases": phases,
            **checkpoint_state(
                self.counters.state_dict(identity, snapshot=snapshot),
                snapshot,
                distributed.rank0_text(self.life.run_id),  # the run id of rank 0's report
                lambda: self.reporter.measure(sync=True, snapshot=snapshot),
                self.budget.saved,
                self._budget_problem,
            ),
        }

    def load_state_dict(self, state: Mapping[str, Any], *, allow_other_model: bool) -> None:
        """Continues the counts of a saved run (``FlopMeter.load_state_dict``), checked first."""
        checked = check_state(state, self.model_identity(), allow_other_model=allow_other_model)
        self.budget.restore(state)  # checks the saved budget figures before anything is loaded
        phases = tallies_from_state(state.get("phases"))
        self.counters.load_state_dict(state)
        self.flop_model.restored_phases = phases
        self.life.started_at = checked["started_at"] or self.life.started_at

    def model_identity(self) -> dict[str, Any]:
        """What ties a saved state to its model: the report's name and the parameter count."""
        return {"name": self.meter.model_name, "n_total": self.hooks.census_now().n_total}
