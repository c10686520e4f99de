"""The run's compute now: one chain from the counts to the judged figure, and the report's notes.

:func:`measure` turns a snapshot of the counts, the parameter census and the FLOP model's
observations into a :class:`Measurement`: every estimate, the primary one, and whether the report
would withhold the figure (and why). The report, the budget guard's readings and the saved state
all take the run's compute from it, so the three cannot disagree. :func:`compose_notes` puts the
notes each part of a run reports (the user's and the adapters', the budget's, the archive's) in
their order for ``RunFacts.notes``. Both are pure functions.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from flopmeter.census import Census
from flopmeter.counters import CountSnapshot
from flopmeter.flops import compute_estimates
from flopmeter.flops.recorder import FlopObservations
from flopmeter.reporting import RunFacts, withheld_reason
from flopmeter.types import Estimate, EstimateName

__all__ = ["Measurement", "compose_notes", "measure"]


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
