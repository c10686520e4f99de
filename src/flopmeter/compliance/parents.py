"""A modification made in several runs is judged on their total (pure functions).

The guidelines do not say whether successive modifications by the same actor add up; summing
them is the cautious reading (docs/compliance.md, "Parent runs"). A parent whose compute is not
known, or not final, withholds the verdict: it is never counted as 0.
"""

from __future__ import annotations

from collections.abc import Sequence

from flopmeter.types import ParentRun

__all__ = ["parent_flops", "parent_notes", "parents_withheld_reason"]


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


def parent_flops(parents: Sequence[ParentRun]) -> float | None:
    """The parents' compute summed, FLOP; ``None`` when any parent cannot be counted."""
    if parents_withheld_reason(parents) is not None:
        return None
    return sum((p.flops for p in parents if p.flops is not None), 0.0)  # every one is set


def parent_notes(
    parents: Sequence[ParentRun], threshold_value: float, base_model: str | None
) -> list[str]:
    """Notes when the parents were judged against another threshold, or name other base models.

    Mixed parents are a note, not an error: the sum is still the cautious figure, but the user
    should check that every run modifies the same original model and that this run's threshold
    is that model's (``pretrain_flops=``).
    """
    notes = []
    other = [
        p for p in parents if p.threshold_value is not None and p.threshold_value != threshold_value
    ]
    if other:
        listed = ", ".join(f"{p.ref} ({p.threshold_value:.3g} FLOP)" for p in other)
        notes.append(
            f"Parent run(s) were judged against another threshold than this run's "
            f"({threshold_value:.3g} FLOP): {listed}. All runs of one modification should use "
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
