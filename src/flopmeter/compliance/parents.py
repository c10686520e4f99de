"""A modification made in several runs is judged on their total (pure functions).

The guidelines do not say whether successive modifications by the same actor add up; summing
them is the cautious reading (docs/compliance.md, "Parent runs"). A parent whose compute is not
known, or not final, withholds the verdict: it is never counted as 0.

Each earlier run counts once. A parent's compute includes its own parents' (its cumulative
figure), so a run that names two parents of one chain (``C`` continuing ``B`` and ``A``, where
``B`` continued ``A``) would count ``A`` twice if the parents' figures were simply added. Every
report therefore records the runs its cumulative figure counts (``ancestor_flops``: run id ->
that run's own compute), and the sum here is over the union of those runs, each once.
"""

from __future__ import annotations

from collections.abc import Sequence

from flopmeter.types import ParentRun
from flopmeter.units import human_flops

__all__ = [
    "counted_runs",
    "judged_figures",
    "parent_flops",
    "parent_key",
    "parent_notes",
    "parents_withheld_reason",
    "shared_run_notes",
]


def parents_withheld_reason(parents: Sequence[ParentRun]) -> str | None:
    """Why the parents' compute cannot be summed, or ``None`` when every parent counts.

    A parent counts when its report is ``completed`` and has a compute figure.
    """
    problems = []
    for parent in parents:
        name = parent.ref if parent.run_id is None else f"{parent.ref} (run {parent.run_id})"
        if parent.status != "completed":
            problems.append(f"{name} has status {parent.status!r}, so its compute is not final")
        elif parent.flops is None:
            why = f": {parent.reason}" if parent.reason else ""
            problems.append(f"{name} has no compute figure{why}")
    if not problems:
        return None
    return (
        "The verdict judges this run's compute plus its parent runs', and "
        + "; ".join(problems)
        + ". A parent is never counted as 0: give a completed report with a compute figure."
    )


def parent_key(parent: ParentRun) -> str:
    """The name a run is counted under: its run id, else its report's path as named."""
    return parent.run_id or parent.path or parent.ref


def _runs_of(parent: ParentRun) -> dict[str, float]:
    """The runs a parent's compute counts (itself and its ancestors), each with its own FLOP."""
    if parent.own_flops is None:  # recorded before own_flops existed: its figure as one block
        return {parent_key(parent): parent.flops or 0.0}  # flops is set: checked by the caller
    return {**parent.ancestor_flops, parent_key(parent): parent.own_flops}


def counted_runs(parents: Sequence[ParentRun]) -> dict[str, float] | None:
    """Every run the parents' compute counts, each once: run id -> its own compute, FLOP.

    ``None`` when any parent cannot be counted (:func:`parents_withheld_reason`).
    """
    if parents_withheld_reason(parents) is not None:
        return None
    runs: dict[str, float] = {}
    for parent in parents:
        for key, flops in _runs_of(parent).items():
            runs.setdefault(key, flops)
    return runs


def parent_flops(parents: Sequence[ParentRun]) -> float | None:
    """The parents' compute summed, each earlier run once, FLOP; ``None`` when any parent cannot
    be counted."""
    runs = counted_runs(parents)
    return None if runs is None else sum(runs.values(), 0.0)


def judged_figures(
    flops: float | None, measured_flops: float | None, parents: Sequence[ParentRun]
) -> tuple[float | None, float | None]:
    """The figure the verdict judges and the measured cross-check on the same footing, FLOP.

    Args:
        flops: This run's primary figure (``None`` when withheld).
        measured_flops: This run's measured cross-check (``None`` when there is none).
        parents: The parent runs this run continues.

    Returns:
        ``(flops, measured_flops)`` without parents; with parents, each plus the parents'
        compute (:func:`parent_flops`, each earlier run once), the first being the cumulative
        compute; ``(None, None)`` when ``flops`` is ``None`` or a parent cannot be counted.
    """
    if not parents:
        return flops, measured_flops
    extra = parent_flops(parents)
    if flops is None or extra is None:
        return None, None
    return flops + extra, None if measured_flops is None else measured_flops + extra


def shared_run_notes(parents: Sequence[ParentRun]) -> list[str]:
    """Notes naming each run that more than one parent's compute includes, counted once."""
    if parents_withheld_reason(parents) is not None:
        return []
    reached: dict[str, list[ParentRun]] = {}
    for parent in parents:
        for key in _runs_of(parent):
            reached.setdefault(key, []).append(parent)
    notes = []
    for key, via in reached.items():
        if len(via) < 2:
            continue
        named = next((p for p in via if parent_key(p) == key), None)
        others = ", ".join(p.ref for p in via if p is not named)
        if named is not None:
            notes.append(
                f"Parent run {named.ref} (run {key}) is also an ancestor of parent run(s) "
                f"{others}, whose compute already includes it: it is counted once, through them."
            )
        else:
            notes.append(
                f"Run {key} is an ancestor of more than one parent run ({others}): its compute "
                "is counted once."
            )
    return notes


def parent_notes(
    parents: Sequence[ParentRun], threshold_value: float, base_model: str | None
) -> list[str]:
    """Notes when the parents were judged against another threshold, or name other base models.

    Mixed parents are a note, not an error: the sum is still the cautious figure, but the user
    should check that every run modifies the same original model and that this run's threshold
    is that model's (``pretrain_flops=``).
    """
    notes = shared_run_notes(parents)
    other = [
        p for p in parents if p.threshold_value is not None and p.threshold_value != threshold_value
    ]
    if other:
        listed = ", ".join(f"{p.ref} ({human_flops(p.threshold_value)})" for p in other)
        notes.append(
            f"Parent run(s) were judged against another threshold than this run's "
            f"({human_flops(threshold_value)}): {listed}. All runs of one modification should use "
            "the original model's compute; check pretrain_flops."
        )
    bases = {p.base_model for p in parents if p.base_model} | (
        {base_model} if base_model else set()
    )
    if len(bases) > 1:
        notes.append(
            f"The parent runs and this run name different base models in the catalogue "
            f"({', '.join(sorted(bases))}); their compute is summed all the same (the cautious "
            "reading), but a modification has one original model: check the parents."
        )
    return notes
