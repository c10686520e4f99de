"""The report of a run at any moment, from the parts a meter holds (apart from its lifecycle).

:class:`RunLife` is the run's identity and lifecycle as the meter records them (its only
mutable state besides the counters). :class:`RunReporter` turns that and the meter's parts (the
counters, the FLOP model, the hooks' census and problems, the budget, the ledger archive, the
hardware tracker, the report file) into the run's compute now (:func:`flopmeter.run.measure.measure`)
and its report (:func:`flopmeter.run.reporting.make_report`): one place for both, used by the report,
the budget's readings, SIGTERM and the saved state. :meth:`RunReporter.capture` splits a
running report in two for the periodic refresh: what training changes is read on the training
thread (the counts' snapshot, the facts), and the report is built from that alone later, on the
report file's writer thread.
"""

from __future__ import annotations

import dataclasses
import os
import socket
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import TYPE_CHECKING

from flopmeter import distributed
from flopmeter._version import __version__
from flopmeter.counting.counters import CountSnapshot
from flopmeter.flops.phases import DeclaredPhase, PhaseTally
from flopmeter.report import FlopReport
from flopmeter.report.context import AttachSection
from flopmeter.run.facts import RunFacts
from flopmeter.run.measure import Measurement, compose_notes, measure
from flopmeter.run.reporting import make_report
from flopmeter.types import Status

if TYPE_CHECKING:
    from flopmeter.budget.controller import RunBudget
    from flopmeter.options import MeterOptions
    from flopmeter.run.hooks import TrainingHooks
    from flopmeter.run.parts import RunParts
    from flopmeter.run.run_file import RunFile

__all__ = ["RunLife", "RunReporter", "utc_now"]


def utc_now() -> str:
    """Now, ISO 8601 (UTC), to the second."""
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


@dataclass
class RunLife:
    """A run's identity and lifecycle (times ISO 8601, UTC).

    Attributes:
        run_id: This run's id, in its report and ledger record.
        model_name: The report's name of the model.
        status: ``None`` before the start, ``"running"``, then how the run ended.
        error: The exception that ended it (redacted), when one did.
        started_at: When it started (kept from a resumed run's checkpoint).
        ended_at: When it ended.
        epochs: Epochs trained, when an adapter knows them.
        notes: Notes added by adapters, the user and the meter.
        beyond_checkpoint_flops: What the session this run resumed from spent after its
            checkpoint, FLOP (its report was found at this run's output).
        earlier_report: Where another run's report found at this run's output was kept.
        rank_at_start: The process's rank when the run started (rank 0 writes and seals).
        pid_at_start: The process that started the run (a child it forks inherits the meter
            but never writes, seals or ships its report: :meth:`writes`).
        attach: How a zero-code run attached the meter (``None``: the script made it).
        declared_phases: Compute of the run the meter could not see, declared with its source
            (``FlopMeter.declare_phase``).
        uncounted: Compute of the run known to be in no count (``FlopMeter.uncounted``).
    """

    run_id: str
    model_name: str
    status: Status | None = None
    error: str | None = None
    started_at: str | None = None
    ended_at: str | None = None
    epochs: float | None = None
    notes: list[str] = field(default_factory=list)
    beyond_checkpoint_flops: float | None = None
    earlier_report: str | None = None
    rank_at_start: int = 0
    pid_at_start: int | None = None
    attach: AttachSection | None = None
    declared_phases: list[DeclaredPhase] = field(default_factory=list)
    uncounted: list[str] = field(default_factory=list)

    def writes(self) -> bool:
        """Whether this process writes the run's report, ledger record and copies: rank 0,
        and the process that started the run (not a child it forked, whose counts are stale
        and whose record would go under the parent's run id)."""
        return self.rank_at_start == 0 and self.pid_at_start in (None, os.getpid())


class RunReporter:
    """The run's compute and report now, from the meter's parts.

    Args:
        life: The run's lifecycle (read at each report; the meter updates it).
        parts: What the options made (the original compute, the parent runs, the ledger
            archive, the hardware tracker).
        options: The run's options.
        hooks: The meter's hooks (with the counters and the FLOP model they feed, their census,
            problems and the trainable-set check).
        budget: The budget controller (or the null budget).
        run_file: Gives the run's report file now (it is made at the start), which the final
            report goes to before the ledger.
    """

    def __init__(
        self,
        life: RunLife,
        parts: RunParts,
        *,
        options: MeterOptions,
        hooks: TrainingHooks,
        budget: RunBudget,
        run_file: Callable[[], RunFile],
    ) -> None:
        self.life, self._options, self._hooks, self._budget = life, options, hooks, budget
        self._original, self._parents = parts.original, parts.parents
        self._archive, self._hardware = parts.archive, parts.hardware
        self._counters, self._flop_model = hooks.counters, hooks.flop_model
        self._run_file = run_file

    def measure(
        self, *, sync: bool, snapshot: CountSnapshot | None = None, facts: RunFacts | None = None
    ) -> Measurement:
        """The run's compute now (a host read; a collective when ``sync`` and distributed)."""
        census = self._hooks.census_now()
        snapshot = snapshot or self._counters.snapshot(sync=sync)
        observations = self._flop_model.observations()
        if sync and distributed.is_distributed():
            observations = dataclasses.replace(observations, phases=self.phase_tallies(sync=True))
        return measure(census, snapshot, observations, facts or self.facts())

    def phase_tallies(self, *, sync: bool) -> dict[str, PhaseTally]:
        """The run's other phases: every rank's (one gather, when ``sync`` and distributed) or
        this rank's, with what a checkpoint restored."""
        if sync and distributed.is_distributed():
            copy = self._counters.peer_copy  # a tensor-parallel peer's: the first peer's
            ranks = distributed.all_gather_objects(
                {} if copy else self._flop_model.forwards.tallies
            )
            return self._flop_model.phases(live=ranks)  # type: ignore[arg-type]
        return self._flop_model.phases()

    def report(
        self,
        *,
        sync: bool,
        status: Status | None = None,
        error: str | None = None,
        ended_at: str | None = None,
    ) -> FlopReport:
        """A report of the run now; a final one (and SIGTERM's) sealed into the ledger on rank 0
        first, and made again with the archive's note when that fails."""
        facts = self.facts(status, error, ended_at)
        ending = status is not None or self.life.status not in (None, "running")
        return make_report(
            facts,
            self.measure(sync=sync, facts=facts),
            self._hardware,
            gather=sync and distributed.is_distributed(),
            prior_seconds=self._counters.prior_seconds,
            seal=self._seal if ending and self.life.writes() else None,
            facts_again=lambda: self.facts(status, error, ended_at),
        )

    def capture(
        self, on_problem: Callable[[BaseException], None]
    ) -> Callable[[], FlopReport | None]:
        """A running report of this rank's counts now, to be built later on another thread.

        Read here, on the training thread at a step boundary (what training changes; no
        collective): the counts' snapshot (one host read), the run's facts (with the
        trainable-set check, a walk over the parameters: mid-step, FSDP swaps them), the FLOP
        model's observations and the census (frozen values). Left to the returned function,
        which reads nothing else that training changes: the estimates, the hardware fields
        (the NVML sampler's readings, made for other threads to read) and the report itself,
        milliseconds of work on a model with many layers.

        Args:
            on_problem: Called with the exception when the build fails (it then gives
                ``None``); never raised.
        """
        facts = self.facts()
        snapshot = self._counters.snapshot(sync=False)
        observations = self._flop_model.observations()
        census = self._hooks.census_now()
        prior_seconds = self._counters.prior_seconds
        hardware = self._hardware

        def build() -> FlopReport | None:
            try:
                measured = measure(census, snapshot, observations, facts)
                return make_report(
                    facts, measured, hardware, gather=False, prior_seconds=prior_seconds
                )
            except Exception as exc:  # the file keeps the last report; training goes on
                on_problem(exc)
                return None

        return build

    def _seal(self, report: FlopReport) -> bool:
        """A final report: on disk first (an append may wait up to a ledger's timeout for its
        lock, and a SIGTERM or a kill in that wait must find the final counts in the file, not
        the last refresh), then into the ledger."""
        self._run_file().write(report)
        return self._archive.seal(report)

    def facts(
        self, status: Status | None = None, error: str | None = None, ended_at: str | None = None
    ) -> RunFacts:
        """What the report says about the run besides its counts, now."""
        import torch

        life, original, hooks = self.life, self._original, self._hooks
        return RunFacts(
            run_id=life.run_id,
            model_name=life.model_name,
            status=status or life.status or "running",
            error=error or life.error,
            started_at=life.started_at,
            ended_at=ended_at or life.ended_at,
            epochs=life.epochs,
            pretrain_flops=original.flops,
            pretrain_flops_source=original.source,
            catalog=original.catalog,
            threshold_notes=original.notes,
            parent_runs=self._parents,
            original_systemic_risk=self._options.original_systemic_risk,
            world_size=max(distributed.world_size(), self._counters.world_at_first_batch or 1),
            census_at_report=hooks.census is None,
            process_group_alive=distributed.is_distributed(),
            hook_problems=dict(hooks.problems),
            notes=compose_notes(life.notes, self._budget.notes(), self._archive.notes()),
            torch_version=torch.__version__,
            flopmeter_version=__version__,
            updated_at=utc_now(),
            pid=os.getpid(),
            hostname=socket.gethostname(),
            trainable_changed=hooks.trainable_changed(),
            model_parallel=hooks.model_parallel.text if hooks.model_parallel else None,
            beyond_checkpoint_flops=life.beyond_checkpoint_flops,
            earlier_report=life.earlier_report,
            attach=life.attach,
            phase_policy=self._options.phases,
            declared_phases=tuple(life.declared_phases),
            uncounted=tuple(life.uncounted),
            **self._budget.facts(),
        )
