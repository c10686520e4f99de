"""What a resumed run carries over: the checkpoint's state, and an earlier session's report.

Two pure-ish pieces of the meter's resume path, apart from its lifecycle:
:func:`checkpoint_state` (what :meth:`FlopMeter.state_dict` saves: the counts, the run's
compute and the budget's figures) and :func:`earlier_session` (another run's report found at
this run's output and kept aside: when it is the session this run resumed from, the compute it
spent after its checkpoint, counted again here as ``lineage.resumed.beyond_checkpoint_flops``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from flopmeter.counting.counters import CountSnapshot
from flopmeter.counting.saved_state import RestoredCompute
from flopmeter.report.output_path import KeptReport
from flopmeter.run.measure import Measurement, saved_compute

__all__ = ["EarlierSession", "checkpoint_state", "earlier_session"]


@dataclass(frozen=True)
class EarlierSession:
    """What the report says of another run's report kept aside at the start.

    Attributes:
        report_path: Where it was kept.
        beyond_checkpoint_flops: What the session this run resumed from spent after its
            checkpoint, FLOP (``None`` when it is another run's, or not known).
        note: The report's note about it (``None`` when the figure says it all).
    """

    report_path: str
    beyond_checkpoint_flops: float | None = None
    note: str | None = None


def earlier_session(kept: KeptReport, restored: RestoredCompute | None) -> EarlierSession:
    """The kept report of another run, read against what this run restored from its checkpoint.

    Args:
        kept: The report moved aside (:func:`flopmeter.report.output_path.keep_earlier_report`).
        restored: What the loaded checkpoint said of its counts' compute (``None``: no resume).
    """
    path = str(kept.path)
    if restored is None or restored.run_id != kept.run_id:
        note = (
            f"The report of run {kept.run_id} ({kept.status}) was at this run's output; it was "
            f"kept at {kept.path}."
        )
        return EarlierSession(path, note=note)
    at, saved = kept.primary_flops, restored.flops
    if at is not None and saved is not None and (at >= saved or kept.status != "running"):
        return EarlierSession(path, beyond_checkpoint_flops=max(at - saved, 0.0))
    why = "has no compute figure" if at is None else "was last refreshed before it"
    note = (
        f"The report of run {kept.run_id}, the session this run resumed from, was kept at "
        f"{kept.path}, but what it spent after its checkpoint is not known (its report {why}): "
        "compare its report with this one."
    )
    return EarlierSession(path, note=note)


def checkpoint_state(
    counts: dict[str, Any],
    snapshot: CountSnapshot,
    run_id: str,
    measured: Callable[[], Measurement],
    budget_saved: Callable[[float | None, int], Mapping[str, Any]],
    on_problem: Callable[[BaseException], None],
) -> dict[str, Any]:
    """What a checkpoint saves of a run: ``counts`` (the counters' state), the run id a resumed
    run continues, the run's compute (figure, estimate, each session's share) and the budget's
    figures; without the last two when they cannot be made (the resumed guard reads instead).

    Args:
        counts: The counters' state (plain data), from ``snapshot``.
        snapshot: The counts it was made from (summed over ranks).
        run_id: The id of the run's report (rank 0's).
        measured: The run's compute on ``snapshot`` (:func:`flopmeter.run.measure.measure`).
        budget_saved: The budget's figures for a figure, FLOP, and optimizer steps.
        on_problem: Told of an exception, which leaves the compute out of the state.
    """
    state = {**counts, "run_id": run_id}
    try:
        measurement = measured()
        state.update(saved_compute(measurement, run_id))
        state.update(budget_saved(measurement.flops, snapshot.optimizer_steps))
    except Exception as exc:
        on_problem(exc)
    return state
