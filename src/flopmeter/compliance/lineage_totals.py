"""The sum of a lineage and its verdict (pure functions): each run's own compute added once.

The totals side of :mod:`flopmeter.compliance.lineage` (which re-exports every name here):

- **The sum** (:func:`sum_compute`) adds each run's own compute once. The measured cross-check
  on the same footing adds each run's measured figure, with a run's primary figure standing in
  where it has none (:func:`measured_figures`); there is no cross-check when no run has one.
- **The verdict** (:func:`judge_total`) is :func:`~flopmeter.compliance.verdict.judge`: the
  primary total and its measured cross-check, with the 30% margin, as every report is judged.
- **Resumed runs** (:func:`resumed_runs`): the earlier runs a resumed run's figure adds, each
  session's part in its restored counts taken off, so each session counts once.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

from flopmeter.compliance.verdict import Judgement, judge

if TYPE_CHECKING:
    from flopmeter.compliance.lineage import RunNode

__all__ = ["LineageTotal", "judge_total", "measured_figures", "resumed_runs", "sum_compute"]


def resumed_runs(
    earlier: Mapping[str, float],
    sessions: Mapping[str, float],
    resumed_from: str | None,
    beyond: float | None,
) -> dict[str, float]:
    """The earlier runs to add to a resumed run's own figure (which already holds what its
    restored counts hold), each once, FLOP (a pure function).

    Args:
        earlier: Run id -> own compute of the runs its parents count (:func:`~flopmeter.compliance.lineage.counted_ancestors`).
        sessions: Run id -> the compute each earlier session put in the restored counts.
        resumed_from: The session resumed from.
        beyond: That session's compute after its checkpoint, FLOP (``None``: not known).

    Returns:
        ``earlier`` with each session's part in the restored counts taken off (a parent that is
        also a session adds only what it spent beyond them), and the compute beyond the
        checkpoint of the session resumed from (the larger of the two readings of it).
    """
    runs = dict(earlier)
    for key, share in sessions.items():
        if key in runs:
            runs[key] = max(runs[key] - share, 0.0)
    if beyond is not None and resumed_from is not None:
        runs[resumed_from] = max(runs.get(resumed_from, 0.0), beyond)
    return runs


@dataclass(frozen=True)
class LineageTotal:
    """A compute total and its measured cross-check, FLOP.

    Attributes:
        flops: Each run's own compute summed, each run once; ``None`` when withheld.
        measured_flops: The measured cross-check on the same footing (``None`` when no run has
            one, or when withheld).
        withheld_reason: Why ``flops`` is ``None``.
        stand_ins: The runs whose primary figure stands in for a measured one in
            ``measured_flops`` (empty when every run has one, or there is no cross-check).
    """

    flops: float | None
    measured_flops: float | None = None
    withheld_reason: str | None = None
    stand_ins: tuple[str, ...] = ()


def sum_compute(
    earlier: Mapping[str, float],
    *,
    head: float | None = None,
    head_measured: float | None = None,
    measured: Mapping[str, float | None] | None = None,
) -> LineageTotal:
    """The one sum: ``head`` (a run's own figure, when judging one run) plus each earlier run's.

    Args:
        earlier: Run id -> that run's own compute, FLOP, each run once.
        head: The run judged, FLOP, when there is one (``None``: the total of ``earlier``).
        head_measured: Its measured cross-check, FLOP.
        measured: Run id -> that run's measured cross-check, FLOP (missing or ``None``: the
            run has none, and its primary figure stands in).

    Returns:
        The totals; the cross-check is ``None`` when no run has a measured figure.
    """
    measured = measured or {}
    rest = sum(earlier.values(), 0.0)
    flops = rest if head is None else head + rest
    have = [k for k in earlier if measured.get(k) is not None]
    if head_measured is None and not have:
        return LineageTotal(flops)
    stand_ins = tuple(k for k in earlier if measured.get(k) is None)
    m_rest = sum((f if measured.get(k) is None else measured[k] for k, f in earlier.items()), 0.0)
    if head is not None:
        m_rest = (head if head_measured is None else head_measured) + m_rest
    return LineageTotal(flops, m_rest, stand_ins=stand_ins)


def measured_figures(nodes: Mapping[str, RunNode]) -> dict[str, float | None]:
    """Each run's measured figure for :func:`sum_compute`: its cross-check, or its primary figure
    when that is the measured count; ``None`` where it has neither (its primary figure then
    stands in). Empty when no run has a cross-check: there is then none to add up."""
    if all(node.measured_flops is None for node in nodes.values()):
        return {}
    return {
        rid: node.own_flops
        if node.measured_flops is None and node.primary == "measured"
        else node.measured_flops
        for rid, node in nodes.items()
    }


def judge_total(
    total: LineageTotal, threshold_flops: float, *, what: str = "the cumulative compute"
) -> Judgement | None:
    """The verdict on a total: :func:`~flopmeter.compliance.verdict.judge` of its primary figure
    with its measured cross-check, as every report is judged; ``None`` when withheld."""
    if total.flops is None:
        return None
    return judge(total.flops, threshold_flops, measured_flops=total.measured_flops, what=what)
