"""A modification made in several runs is judged on their total: the parent runs' side.

Thin wrappers over :mod:`flopmeter.compliance.lineage`, which holds the one definition (the
walk, the de-duplicated sum, the verdict rule), for the parent entries (``ParentRun``) a
report records. The guidelines do not say whether successive modifications by the same actor
add up; summing them is the cautious reading (docs/compliance.md, "Parent runs"). A parent
whose compute is not known, or not final, withholds the verdict: it is never counted as 0.

Each earlier run counts once. A parent's compute includes its own parents' (its cumulative
figure), so a run that names two parents of one chain (``C`` continuing ``B`` and ``A``, where
``B`` continued ``A``) would count ``A`` twice if the parents' figures were simply added. Every
report therefore records the runs its cumulative figure counts (``ancestor_flops``: run id ->
that run's own compute), and the sum is over the union of those runs, each once.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from flopmeter.compliance import lineage, lineage_totals
from flopmeter.types import ParentRun

__all__ = [
    "counted_runs",
    "judged_figures",
    "judges_cumulative",
    "parent_flops",
    "parent_key",
    "parent_notes",
    "parents_withheld_reason",
    "shared_run_notes",
]


def _nodes(parents: Sequence[ParentRun]) -> list[lineage.RunNode]:
    return [lineage.node_from_parent(p) for p in parents]


def parents_withheld_reason(parents: Sequence[ParentRun]) -> str | None:
    """Why the parents' compute cannot be summed, or ``None`` when every parent counts.

    A parent counts when its report is ``completed`` and has a compute figure.
    """
    return lineage.parents_withheld_reason(_nodes(parents))


def parent_key(parent: ParentRun) -> str:
    """The name a run is counted under: its run id, else its report's path as named."""
    return lineage.node_from_parent(parent).key


def counted_runs(parents: Sequence[ParentRun]) -> dict[str, float] | None:
    """Every run the parents' compute counts, each once: run id -> its own compute, FLOP.

    ``None`` when any parent cannot be counted (:func:`parents_withheld_reason`).
    """
    return lineage.counted_ancestors(_nodes(parents))


def parent_flops(parents: Sequence[ParentRun]) -> float | None:
    """The parents' compute summed, each earlier run once, FLOP; ``None`` when any parent cannot
    be counted."""
    runs = counted_runs(parents)
    return None if runs is None else lineage_totals.sum_compute(runs).flops


def judges_cumulative(parents: Sequence[object], beyond_checkpoint_flops: float | None) -> bool:
    """Whether the verdict judges the cumulative compute (``lineage.cumulative_flops``) rather
    than this run's own: with parent runs, or with compute that the session this run resumed
    from spent beyond its checkpoint (FLOP; ``None`` when there was none). The one rule, for
    the report's builder and its reader's checks."""
    return bool(parents) or beyond_checkpoint_flops is not None


def judged_figures(
    flops: float | None,
    measured_flops: float | None,
    parents: Sequence[ParentRun],
    *,
    sessions: Mapping[str, float] | None = None,
    resumed_from: str | None = None,
    beyond: float | None = None,
) -> tuple[float | None, float | None]:
    """The figure the verdict judges and the measured cross-check on the same footing, FLOP.

    Args:
        flops: This run's primary figure (``None`` when withheld).
        measured_flops: This run's measured cross-check (``None`` when there is none).
        parents: The parent runs this run continues.
        sessions: For a resumed run, the earlier sessions' compute its counts already hold
            (run id -> FLOP): a parent that is one of them adds only what it spent beyond.
        resumed_from: The session it resumed from.
        beyond: That session's compute after its checkpoint, FLOP, added (the cautious
            reading) when known.

    Returns:
        ``(flops, measured_flops)`` without parents; with parents, the one sum
        (:func:`flopmeter.compliance.lineage_totals.sum_compute`) of this run and every earlier run
        once: the cumulative compute, and the cross-check (this run's measured figure plus the
        parents' compute, which records no measured figure); ``(None, None)`` when ``flops`` is
        ``None`` or a parent cannot be counted.
    """
    if not parents and beyond is None:
        return flops, measured_flops
    runs = counted_runs(parents)
    if flops is None or runs is None:
        return None, None
    runs = lineage_totals.resumed_runs(runs, sessions or {}, resumed_from, beyond)
    total = lineage_totals.sum_compute(runs, head=flops, head_measured=measured_flops)
    return total.flops, total.measured_flops


def shared_run_notes(parents: Sequence[ParentRun]) -> list[str]:
    """Notes naming each run that more than one parent's compute includes, counted once."""
    return lineage.shared_run_notes(_nodes(parents))


def parent_notes(
    parents: Sequence[ParentRun], threshold_flops: float, base_model: str | None
) -> list[str]:
    """Notes when the parents were judged against another threshold, or name other base models.

    Mixed parents are a note, not an error: the sum is still the cautious figure, but the user
    should check that every run modifies the same original model and that this run's threshold
    is that model's (``pretrain_flops=``).
    """
    return lineage.parents_notes(_nodes(parents), threshold_flops, base_model)
