"""Run lineage: which runs a compute total counts, the total, and its verdict (pure functions).

One definition serves the three places that need it: a run's ``parent_runs=`` (the parents it
continues), the de-duplicated sum of their earlier runs, and ``flopmeter ledger cumulative``
(a base model's runs, their descendants, and their ancestors).

- **A run** is a :class:`RunNode`: its run id, its own compute (its primary figure, without any
  parent's; ``None`` with the reason when it has none), its own measured cross-check, the run
  ids of its parents, and the earlier runs its report records (``ancestors``: run id -> that
  run's own compute). :func:`node_from_report` is the one place that reads a report's field
  names; :func:`node_from_parent` reads a parent entry of a report.
- **The walk.** A run's ancestors are the union of what its parents count (each parent itself
  and the ancestors it records), each run once by run id (:func:`counted_ancestors`). A run
  descends from a base when a parent or a recorded ancestor is a base run or a descendant, at
  any depth; the line of a base is its runs, their descendants and every ancestor of those, each
  once (:func:`line_of`).
- **The sum** (:func:`sum_compute`) adds each run's own compute once. The measured cross-check
  on the same footing adds each run's measured figure, with a run's primary figure standing in
  where it has none (a parent entry records no measured figure; a run whose primary figure is
  the measured estimate is its own cross-check); there is no cross-check when no run has one.
- **The verdict** (:func:`judge_total`) is :func:`~flopmeter.compliance.verdict.judge`: the
  primary total and its measured cross-check, with the 30% margin, as every report is judged.

- **Resumed runs.** A resumed run's counts hold its earlier sessions' (its report's
  ``lineage.resumed.sessions_flops``): its own compute is its primary figure less theirs, and
  the sessions are earlier runs it records, so each session counts once
  (:func:`resumed_runs` for a report's judged figure, :func:`node_from_report` for the ledger).
- **A run known with two figures** (its own report, and the records of runs that name it)
  counts with the larger one, the cautious reading, and is named in a note
  (:func:`figure_conflicts`, :func:`conflict_notes`): no record can lower or erase a run.

A run that cannot be counted withholds the total (never a silent 0): no compute figure, one
rank's counts, an incomplete chain of its own, or (for a parent a run names) a report that is not
``completed``.

The sum, its verdict and the resumed runs' part live in :mod:`flopmeter.compliance.lineage_totals`
and are exported here too, so this module stays the one place to import lineage from.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from flopmeter.types import ParentRun
from flopmeter.units import human_flops

__all__ = [
    "RunNode",
    "conflict_notes",
    "counted_ancestors",
    "figure_conflicts",
    "line_of",
    "node_from_parent",
    "node_from_report",
    "parent_record",
    "parents_notes",
    "parents_withheld_reason",
    "shared_run_notes",
    "uncounted_reason",
]


@dataclass(frozen=True)
class RunNode:
    """One run, as lineage sees it.

    Attributes:
        run_id: The run's id (``None`` in a report written before run ids).
        label: What to call it in words: the name a user gave (``ref``), else the run id.
        path: The report file a parent entry was read from, when it says.
        model_name: The report's ``model_name``.
        status: The report's status (``completed``, ``failed``, ...).
        own_flops: The run's own compute, FLOP, without its parents'; ``None`` when unknown.
        own_reason: Why ``own_flops`` is ``None``.
        measured_flops: The run's own measured cross-check, FLOP (``None`` when there is none,
            or when the measured estimate is the primary figure itself).
        primary: The name of the run's primary estimate (``measured``: the primary figure is
            the measured count, its own cross-check).
        parent_ids: The run ids of the parents the run names.
        ancestors: Every earlier run the run's cumulative compute counts, each once: run id ->
            that run's own compute, FLOP. Empty without parents; ``None`` when the run has
            parents whose compute it could not count.
        chain_reason: Why ``ancestors`` is ``None``.
        threshold_flops: The threshold the run was judged against, FLOP.
        base_model: The catalogue's base model of the run, when it knew it.
    """

    run_id: str | None
    label: str | None = None
    path: str | None = None
    model_name: str | None = None
    status: str | None = None
    own_flops: float | None = None
    own_reason: str | None = None
    measured_flops: float | None = None
    primary: str | None = None
    parent_ids: tuple[str, ...] = ()
    ancestors: Mapping[str, float] | None = field(default_factory=dict)
    chain_reason: str | None = None
    threshold_flops: float | None = None
    base_model: str | None = None

    @property
    def key(self) -> str:
        """The name the run is counted under: its run id, else its report's path, else its
        label."""
        return self.run_id or self.path or self.label or "?"

    @property
    def name(self) -> str:
        """The run in words: its label, with its run id when the two differ; else ``run ID``."""
        if self.label is None:
            return f"run {self.key}"
        label = self.label
        return label if self.run_id in (None, label) else f"{label} (run {self.run_id})"

    @property
    def cumulative_flops(self) -> float | None:
        """Its own compute plus its ancestors', each once, FLOP; ``None`` when either is
        unknown."""
        if self.own_flops is None or self.ancestors is None:
            return None
        if not self.parent_ids:
            return self.own_flops
        return self.own_flops + sum(self.ancestors.values(), 0.0)


# ----------------------------------------------------------------------- reading reports
def _number(value: object) -> float | None:
    """A JSON number as a float (``None`` for anything else, booleans included)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value)


def _section(report: Mapping[str, Any], name: str) -> Mapping[str, Any]:
    """One section of a schema 2.0 report (empty when missing or null)."""
    return value if isinstance(value := report.get(name), Mapping) else {}


def _cross_check(compute: Mapping[str, Any]) -> float | None:
    """The report's measured estimate, FLOP, when it is not the primary one."""
    estimates = compute.get("estimates") or {}
    measured = estimates.get("measured") if isinstance(estimates, Mapping) else None
    if not isinstance(measured, Mapping) or compute.get("primary_estimate") == "measured":
        return None
    return _number(measured.get("flops"))


def node_from_report(report: Mapping[str, Any]) -> RunNode:
    """A run node from a schema 2.0 report: a dict as read from a report file or a ledger record
    (a 1.x one upgraded first, :func:`flopmeter.report.upgrade.upgrade_report`), or
    ``FlopReport.model_dump()``. The one place that reads a report's field names.

    The run's own compute is its ``compute.primary_flops`` when its counts are every rank's;
    its ancestors are its ``lineage.ancestor_flops``, or, in a report written before that
    field, what its parent entries count.
    """
    run, compute = _section(report, "run"), _section(report, "compute")
    threshold, lineage = _section(report, "threshold"), _section(report, "lineage")
    own = _number(compute.get("primary_flops"))
    reason = None
    if run.get("counts_scope", "all_ranks") != "all_ranks":
        own, reason = None, "its counts are one rank's of a distributed run"
    elif own is None:
        reason = compute.get("withheld_reason") or "its report has no compute figure"
    entries = [p for p in lineage.get("parent_runs") or [] if isinstance(p, Mapping)]
    parents = [node_from_parent(p) for p in entries]
    recorded = lineage.get("ancestor_flops") or {}
    ancestors: Mapping[str, float] | None = {
        str(k): float(v) for k, v in recorded.items() if _number(v) is not None
    }
    if not ancestors and parents:
        ancestors = counted_ancestors(parents)
    resumed = _section(lineage, "resumed")
    sessions = {
        str(k): float(v)
        for k, v in (resumed.get("sessions_flops") or {}).items()
        if _number(v) is not None
    }
    parent_ids = tuple(p.key for p in parents)
    if sessions and ancestors is not None:
        # its counts hold the earlier sessions': its own compute is the rest, and they are
        # earlier runs it records (a session known twice counts with its larger figure)
        own = None if own is None else max(own - sum(sessions.values()), 0.0)
        merged = dict(sessions)
        came_from, beyond = resumed.get("run_id"), _number(resumed.get("beyond_checkpoint_flops"))
        if isinstance(came_from, str) and beyond is not None:
            merged[came_from] = merged.get(came_from, 0.0) + beyond
        for key, flops in ancestors.items():
            merged[key] = max(merged.get(key, flops), flops)
        ancestors = merged
        parent_ids = (*parent_ids, *(k for k in sessions if k not in parent_ids))
    chain_reason = None
    if ancestors is None:
        chain_reason = compute.get("withheld_reason") or "its own parents' compute is not known"
    catalog = threshold.get("catalog")
    return RunNode(
        run_id=run.get("run_id"),
        model_name=_section(report, "model").get("name"),
        status=run.get("status"),
        own_flops=own,
        own_reason=reason,
        measured_flops=_cross_check(compute),
        primary=compute.get("primary_estimate"),
        parent_ids=parent_ids,
        ancestors=ancestors,
        chain_reason=chain_reason,
        threshold_flops=_number(threshold.get("threshold_flops")),
        base_model=catalog.get("base_model") if isinstance(catalog, Mapping) else None,
    )


def node_from_parent(parent: ParentRun | Mapping[str, Any]) -> RunNode:
    """A run node from a parent entry of a report (``ParentRun``, or its JSON object).

    A parent entry records the parent's own compute (``own_flops``) and its ancestors; one
    recorded before ``own_flops`` existed counts its compute (``flops``) as one block.
    """
    entry = parent.model_dump() if isinstance(parent, ParentRun) else dict(parent)
    own, flops = _number(entry.get("own_flops")), _number(entry.get("flops"))
    ancestors: Mapping[str, float] | None = None
    if flops is not None:
        recorded = entry.get("ancestor_flops") or {}
        ancestors = {} if own is None else {str(k): float(v) for k, v in recorded.items()}
        own = flops if own is None else own
    return RunNode(
        run_id=entry.get("run_id"),
        label=entry.get("ref"),
        path=entry.get("path"),
        status=entry.get("status"),
        own_flops=own if flops is not None else None,
        own_reason=entry.get("reason"),
        ancestors=ancestors,
        threshold_flops=_number(entry.get("threshold_flops")),
        base_model=entry.get("base_model"),
    )


def parent_record(ref: str, node: RunNode, path: str | None = None) -> ParentRun:
    """What a run records about a parent it read (``node``: the parent's report as a node).

    Its compute is the parent's cumulative compute (its own when it had no parents); null, with
    the reason, when the parent's own compute or its chain is not known.
    """
    flops = node.cumulative_flops
    reason = node.own_reason if node.own_flops is None else node.chain_reason
    return ParentRun(
        ref=ref,
        path=path,
        run_id=node.run_id,
        flops=flops,
        own_flops=node.own_flops,
        ancestor_flops=dict(node.ancestors or {}) if flops is not None else {},
        status=node.status,
        reason=reason,
        threshold_flops=node.threshold_flops,
        base_model=node.base_model,
    )


# ------------------------------------------------------------------------------ the walk
def uncounted_reason(node: RunNode, *, completed_only: bool = False) -> str | None:
    """Why a run's compute cannot be counted, or ``None`` when it can.

    Args:
        node: The run.
        completed_only: Whether only a completed or interrupted report counts (a stopped run's
            compute was spent: the cautious reading counts it), as for a parent a run names;
            the ledger sums every run a line spent, whatever ended it.
    """
    if node.status == "running" or (completed_only and node.status not in _ENDED):
        return f"{node.name} has status {node.status!r}, so its compute is not final"
    if node.own_flops is None:
        why = f": {node.own_reason}" if node.own_reason else ""
        return f"{node.name} has no compute figure{why}"
    if node.ancestors is None:
        why = node.chain_reason or "its own parents' compute is not known"
        return f"{node.name} has no compute figure: {why}"
    return None


_ENDED = ("completed", "interrupted")  # a parent's statuses that count (docs/compliance.md)


def _runs_of(node: RunNode) -> dict[str, float]:
    """The runs a node's cumulative compute counts (its ancestors, then itself), own FLOP."""
    return {**(node.ancestors or {}), node.key: node.own_flops or 0.0}


def counted_ancestors(parents: Sequence[RunNode]) -> dict[str, float] | None:
    """Every run the parents' compute counts, each once by run id: run id -> its own FLOP.

    ``None`` when any parent cannot be counted (:func:`uncounted_reason`, completed only).
    """
    if any(uncounted_reason(p, completed_only=True) for p in parents):
        return None
    runs: dict[str, float] = {}
    for parent in parents:
        for key, flops in _runs_of(parent).items():
            runs[key] = max(runs.get(key, flops), flops)  # known twice: the larger (cautious)
    return runs


def figure_conflicts(nodes: Sequence[RunNode]) -> dict[str, list[float]]:
    """The runs that ``nodes`` (with the earlier runs they record) give different own figures
    for: run id -> the figures, FLOP, sorted. The sum takes the largest (the cautious
    reading); a report says so."""
    seen: dict[str, set[float]] = {}
    for node in nodes:
        for key, flops in _runs_of(node).items():
            if key == node.key and node.own_flops is None:
                continue
            seen.setdefault(key, set()).add(flops)
    return {k: sorted(v) for k, v in seen.items() if len(v) > 1}


def conflict_notes(conflicts: Mapping[str, Sequence[float]]) -> list[str]:
    """A note for each run known with two or more figures (:func:`figure_conflicts`)."""
    return [
        f"Run {key} is recorded with different compute figures "
        f"({', '.join(human_flops(f) for f in figures)}) by the reports that name it (a "
        "checkpoint saved before the run ended, or a report edited by hand): the largest, "
        f"{human_flops(max(figures))}, is counted (the cautious reading), so no record can "
        "lower or erase a run's compute."
        for key, figures in conflicts.items()
    ]


def line_of(nodes: Mapping[str, RunNode], is_base: Callable[[RunNode], bool]) -> dict[str, str]:
    """The line of a base among ``nodes`` (run id -> node): each run once, with how it belongs.

    Returns:
        Run id -> ``"base"``, ``"descendant of <run id>"`` (a parent or a recorded ancestor is
        in the line, at any depth) or ``"ancestor of <run id>"`` (a parent of a run in the line,
        or an earlier run its report records). An ancestor's id may be missing from ``nodes``
        (a run outside them that a report records, or names as a parent).
    """
    how = {rid: "base" for rid, node in nodes.items() if is_base(node)}
    grew = True
    while grew:  # descendants at any depth
        grew = False
        for rid, node in nodes.items():
            if rid in how:
                continue
            found = next((p for p in (*node.parent_ids, *(node.ancestors or {})) if p in how), None)
            if found is not None:
                how[rid], grew = f"descendant of {found}", True
    todo = list(how)
    while todo:  # every ancestor of the line, each once
        rid = todo.pop(0)
        node = nodes.get(rid)
        if node is None:
            continue
        for earlier in (*node.parent_ids, *(node.ancestors or {})):
            if earlier not in how:
                how[earlier] = f"ancestor of {rid}"
                todo.append(earlier)
    return how


# ----------------------------------------------------------------------------- the notes
def parents_withheld_reason(parents: Sequence[RunNode]) -> str | None:
    """Why the parents' compute cannot be summed, or ``None`` when every parent counts."""
    problems = [r for r in (uncounted_reason(p, completed_only=True) for p in parents) if r]
    if not problems:
        return None
    return (
        "The verdict judges this run's compute plus its parent runs', and "
        + "; ".join(problems)
        + ". A parent is never counted as 0: give a completed (or interrupted) report with a "
        "compute figure."
    )


def shared_run_notes(parents: Sequence[RunNode]) -> list[str]:
    """Notes naming each run that more than one parent's compute includes, counted once."""
    if counted_ancestors(parents) is None:
        return []
    reached: dict[str, list[RunNode]] = {}
    for parent in parents:
        for key in _runs_of(parent):
            reached.setdefault(key, []).append(parent)
    notes = []
    for key, via in reached.items():
        if len(via) < 2:
            continue
        named = next((p for p in via if p.key == key), None)
        others = ", ".join(str(p.label) for p in via if p is not named)
        if named is not None:
            notes.append(
                f"Parent run {named.label} (run {key}) is also an ancestor of parent run(s) "
                f"{others}, whose compute already includes it: it is counted once, through them."
            )
        else:
            notes.append(
                f"Run {key} is an ancestor of more than one parent run ({others}): its compute "
                "is counted once."
            )
    return notes


def parents_notes(
    parents: Sequence[RunNode], threshold_flops: float, base_model: str | None
) -> list[str]:
    """The shared-run notes, and notes when the parents were judged against another threshold
    (FLOP) or name other base models than this run's."""
    notes = shared_run_notes(parents)
    if counted_ancestors(parents) is not None:
        notes.extend(conflict_notes(figure_conflicts(parents)))
    other = [
        p for p in parents if p.threshold_flops is not None and p.threshold_flops != threshold_flops
    ]
    if other:
        listed = ", ".join(f"{p.label} ({human_flops(p.threshold_flops)})" for p in other)
        notes.append(
            f"Parent run(s) were judged against another threshold than this run's "
            f"({human_flops(threshold_flops)}): {listed}. All runs of one modification should use "
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
