"""The run's compute now: one chain from the counts to the judged figure, and the report's notes.

:func:`measure` turns a snapshot of the counts, the parameter census and the FLOP model's
observations into a :class:`Measurement`: every estimate, the primary one, and whether the report
would withhold the figure (and why). The report, the budget guard's readings and the saved state
all take the run's compute from it, so the three cannot disagree. :func:`compose_notes` puts the
notes each part of a run reports (the user's and the adapters', the budget's, the archive's) in
their order for ``RunFacts.notes``. Both are pure functions; :func:`make_report` adds the
hardware fields and builds the report from a measurement.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from flopmeter.census import Census
from flopmeter.counters import CountSnapshot
from flopmeter.errors import BudgetExceeded
from flopmeter.flops import compute_estimates
from flopmeter.flops.recorder import FlopObservations
from flopmeter.hardware.tracker import HardwareTracker
from flopmeter.report import FlopReport
from flopmeter.reporting import (
    RunFacts,
    build_report,
    hardware_notes,
    partial_counts_reason,
    withheld_reason,
)
from flopmeter.types import Estimate, EstimateName, Status

__all__ = ["Measurement", "compose_notes", "make_report", "measure", "status_of"]

logger = logging.getLogger("flopmeter")


@dataclass(frozen=True)
class Measurement:
    """The run's compute at one moment, computed once.

    Attributes:
        census: The parameter census it was computed with.
        snapshot: The counts.
        estimates: Every estimate, by name (``flops.compute_estimates``).
        primary: The estimate the report gives as the run's compute.
        observations: What the FLOP model had seen.
        withheld: Why the report gives no verdict (and, but for partial counts, no compute
            figure); ``None`` when it judges the figure.
    """

    census: Census
    snapshot: CountSnapshot
    estimates: dict[str, Estimate]
    primary: EstimateName
    observations: FlopObservations
    withheld: str | None

    @property
    def estimate_flops(self) -> float | None:
        """The primary estimate's figure, FLOP, withheld or not (``None``: no estimate)."""
        return self.estimates[self.primary].flops

    @property
    def flops(self) -> float | None:
        """The run's compute, FLOP, when the report judges it; ``None`` when it withholds it
        (what the budget guard decides on, and what a checkpoint saves)."""
        return self.estimate_flops if self.withheld is None else None


def measure(
    census: Census, snapshot: CountSnapshot, observations: FlopObservations, facts: RunFacts
) -> Measurement:
    """The run's compute now (a pure function).

    Args:
        census: The parameter census.
        snapshot: The counts (``RunCounters.snapshot``).
        observations: The FLOP model's observations (``FlopModelRecorder.observations``).
        facts: The run's facts (its status decides how partial counts are explained).
    """
    estimates, primary = compute_estimates(census, snapshot.totals, observations)
    why = withheld_reason(facts, snapshot)
    return Measurement(census, snapshot, estimates, primary, observations, why)


def compose_notes(
    added: Iterable[str], budget: Iterable[str] = (), archive: Iterable[str] = ()
) -> tuple[str, ...]:
    """The run's own notes for ``RunFacts.notes``, in order: those added with
    ``FlopMeter.add_note`` (the user, the adapters), then the budget's, then the archive's (a
    ledger record that could not be appended). The report builder puts them after the hook
    problems and before the notes it derives from the counts."""
    return (*added, *budget, *archive)


def make_report(
    facts: RunFacts,
    measurement: Measurement,
    hardware: HardwareTracker,
    *,
    gather: bool,
    prior_seconds: float,
    seal: Callable[[FlopReport], bool] | None = None,
    facts_again: Callable[[], RunFacts] | None = None,
) -> FlopReport:
    """The report of ``measurement``: the hardware fields (``gather``: one collective under
    torch.distributed), then :func:`~flopmeter.reporting.build_report`.

    Args:
        facts: The run's facts.
        measurement: The run's compute (:func:`measure`).
        hardware: The run's hardware tracker.
        gather: Gather the hardware figures over ranks (every rank calls it then).
        prior_seconds: Training time restored from a checkpoint, seconds.
        seal: For a final report: appends it to the ledger, ``False`` when that failed; the
            report is then made again from ``facts_again()`` (which hold the archive's note),
            with no second read of the counts or the hardware.
        facts_again: The run's facts after ``seal``.
    """
    m = measurement
    if m.snapshot.partial and facts.status == "completed":
        why = partial_counts_reason(facts)
        logger.warning("flopmeter: the final report holds this rank's counts only: %s", why)
    fields = hardware.report_fields(
        seconds=m.snapshot.session_seconds,
        primary_flops=m.estimate_flops,
        gather=gather,
        extra_notes=hardware_notes(m.snapshot, prior_seconds),
    )
    parts = (m.snapshot, m.census, m.estimates, m.primary, m.observations, fields)
    report = build_report(facts, *parts)
    if seal is not None and not seal(report) and facts_again is not None:
        report = build_report(facts_again(), *parts)
    return report


def status_of(exc: BaseException | None) -> Status:
    """How a run ended: a clean ``SystemExit`` (code 0 or None), or a stop by the budget
    guard at a step boundary, is a completed run."""
    if exc is None or (isinstance(exc, SystemExit) and exc.code in (0, None)):
        return "completed"
    if isinstance(exc, BudgetExceeded):
        return "completed"
    return "interrupted" if isinstance(exc, KeyboardInterrupt) else "failed"
