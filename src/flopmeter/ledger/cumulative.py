"""The total compute of a base model's line of runs in the ledger, against its threshold (pure).

The line and its sum are :mod:`flopmeter.compliance.lineage`'s, the one definition a report's
``parent_runs`` use too, and the verdict is the report's rule (the primary total with its
measured cross-check, :func:`~flopmeter.compliance.verdict.judge`).

Records of schema 1.x and 2.0 are read alike (1.x upgraded to 2.0 first). The matching rule: a
run is **on the base** ``MODEL_ID`` when its report's ``model.name`` is
``MODEL_ID`` (compared without surrounding spaces and without case, as Hugging Face model ids
are); a run is a **descendant** when one of its ``parent_runs`` (by ``run_id``) or one of the
earlier runs its report records (``ancestor_flops``) is a run on the base or another descendant,
at any depth; and every **ancestor** of those runs counts too (their compute is in the
descendants' own cumulative figures). Each run counts once, by run id, with its own compute:
from the last version of its record when it is in the ledger (its ``compute.primary_flops``, never
its ``lineage.cumulative_flops``, which already holds its parents'), else as a later run's report
records it. A run that cannot be counted withholds the total: no compute figure, one rank's
counts, still running, or a parent that is neither in the ledger nor recorded by its child.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from typing import Any

from flopmeter.compliance.lineage import (
    RunNode,
    conflict_notes,
    figure_conflicts,
    line_of,
    node_from_report,
    uncounted_reason,
)
from flopmeter.compliance.lineage_totals import judge_total, measured_figures, sum_compute
from flopmeter.compliance.thresholds import Threshold, determine_threshold
from flopmeter.ledger.chain import LedgerRecord
from flopmeter.report.upgrade import report_value, upgrade_report

__all__ = ["CumulativeCompute", "cumulative_compute", "lineage"]


@dataclass(frozen=True)
class CumulativeCompute:
    """The compute of one base model's runs.

    Attributes:
        base: The base model id asked for.
        runs: ``(run_id, model_name, status, flops, how)`` of each run counted, ``flops`` its
            own compute (its ``flops_architecture``); ``how`` is ``"base"``, ``"descendant of
            <run_id>"`` or ``"ancestor of <run_id>"`` (with ``", recorded in its report"`` when
            the run is not in the ledger).
        total_flops: Their compute summed, FLOP; ``None`` when a run cannot be counted.
        withheld_reason: Why ``total_flops`` is ``None``.
        threshold: The threshold the total is judged against.
        pretrain_flops_source: Where the original compute came from (or ``None``: unknown).
        ratio_to_threshold: ``total_flops / threshold.value``, or ``None``.
        verdict: The verdict of the total, or ``None`` when withheld.
        notes: What else the output should say.
        measured_flops: The measured cross-check of the total, FLOP: each run's measured figure,
            its primary one standing in where it has none; ``None`` when no run has one.
        exceeds_threshold: Whether the total is strictly above the threshold, or ``None``.
        verdict_basis: Which figure decided the verdict, in words, or ``None``.
    """

    base: str
    runs: list[tuple[str, str | None, str | None, float | None, str]]
    total_flops: float | None
    withheld_reason: str | None
    threshold: Threshold
    pretrain_flops_source: str | None
    ratio_to_threshold: float | None = None
    verdict: str | None = None
    notes: list[str] = field(default_factory=list)
    measured_flops: float | None = None
    exceeds_threshold: bool | None = None
    verdict_basis: str | None = None


def _same_model(name: object, base: str) -> bool:
    return isinstance(name, str) and name.strip().casefold() == base.strip().casefold()


def _latest(records: Iterable[LedgerRecord]) -> dict[str, dict[str, Any]]:
    """The last version of each run's report, by run id, in the order runs first appear."""
    latest: dict[str, dict[str, Any]] = {}
    for record in records:
        latest[record.run_id] = upgrade_report(record.report())  # 1.x records read as 2.0
    return latest


def _line(
    latest: dict[str, dict[str, Any]], base: str
) -> tuple[dict[str, RunNode], dict[str, str]]:
    nodes = {rid: node_from_report(rep) for rid, rep in latest.items()}
    how = line_of(nodes, lambda node: _same_model(node.model_name, base))
    inside = {rid: how[rid] for rid in latest if rid in how}  # ledger order, then the others
    return nodes, {**inside, **{rid: h for rid, h in how.items() if rid not in inside}}


def lineage(records: Iterable[LedgerRecord], base: str) -> list[tuple[dict[str, Any], str]]:
    """The last report of each run in the ledger on ``base``, descending from one, or an
    ancestor of one, with how it matched (in ledger order)."""
    latest = _latest(records)
    _, how = _line(latest, base)
    return [(latest[rid], how[rid]) for rid in latest if rid in how]


def _pretrain(
    reports: list[dict[str, Any]], given: float | None, given_source: str | None
) -> tuple[float | None, str | None, list[str]]:
    """The original compute: the one given, else the one every run's report agrees on."""
    if given is not None:
        return given, given_source, []
    values = {
        report_value(r, "threshold.original_flops")
        for r in reports
        if report_value(r, "threshold.original_flops") is not None
    }
    if len(values) == 1:
        return float(values.pop()), "the runs' reports", []
    if len(values) > 1:
        shown = ", ".join(f"{v:.3g}" for v in sorted(values))
        return (
            None,
            None,
            [
                f"the runs' reports disagree on the original compute ({shown}); give "
                "--pretrain-flops to judge the total"
            ],
        )
    return None, None, []


def _recorded(nodes: dict[str, RunNode], rid: str) -> float | None:
    """An earlier run's own compute as the reports in the ledger record it: the largest figure
    any records (the cautious reading), ``None`` when none does."""
    figures = [n.ancestors[rid] for n in nodes.values() if n.ancestors and rid in n.ancestors]
    return max(figures) if figures else None


def _counted(
    nodes: dict[str, RunNode], how: dict[str, str]
) -> tuple[list[tuple[str, str | None, str | None, float | None, str]], list[str]]:
    """Each run of the line with its own compute, and why any cannot be counted."""
    runs, problems = [], []
    for rid, matched in how.items():
        node = nodes.get(rid)
        if node is None:  # outside the ledger: as its child's report records it
            flops = _recorded(nodes, rid)
            runs.append((rid, None, None, flops, f"{matched}, recorded in its report"))
            if flops is None:
                problems.append(
                    f"run {rid} ({matched}) is not in the ledger and no report records its compute"
                )
            continue
        own = node.own_flops
        recorded = _recorded(nodes, rid)
        if own is not None and recorded is not None and recorded > own:
            own = recorded  # a later run records more of it (compute past a checkpoint)
        runs.append((rid, node.model_name, node.status, own, matched))
        why = uncounted_reason(replace(node, ancestors={}))  # its chain is walked here
        if why is not None:
            problems.append(why)
    return runs, problems


def _cross_check_notes(nodes: dict[str, RunNode], stand_ins: tuple[str, ...]) -> list[str]:
    if not stand_ins:
        return []
    outside = [rid for rid in stand_ins if rid not in nodes]
    inside = [rid for rid in stand_ins if rid in nodes]
    parts = []
    if inside:
        parts.append(f"run(s) {', '.join(inside)} have no measured estimate")
    if outside:
        parts.append(f"run(s) {', '.join(outside)} are known only by their primary compute")
    return [
        "The measured cross-check sums each run's measured estimate, but "
        + " and ".join(parts)
        + ": their primary figure stands in for it."
    ]


def cumulative_compute(
    records: Iterable[LedgerRecord],
    base: str,
    *,
    pretrain_flops: float | None = None,
    pretrain_flops_source: str | None = None,
    original_systemic_risk: bool = False,
) -> CumulativeCompute:
    """The total compute of ``base``'s line of runs in the ledger and its verdict (see the
    module).

    Args:
        records: The ledger's records.
        base: The base model id.
        pretrain_flops: The base model's training compute, FLOP; ``None``: the value the runs'
            reports agree on, else unknown.
        pretrain_flops_source: Where ``pretrain_flops`` came from, for the output.
        original_systemic_risk: Whether the base model has systemic risk (fallback threshold).
    """
    latest = _latest(records)
    nodes, how = _line(latest, base)
    reports = [latest[rid] for rid in latest if rid in how]
    flops, source, notes = _pretrain(reports, pretrain_flops, pretrain_flops_source)
    threshold = determine_threshold(flops, original_systemic_risk=original_systemic_risk)
    runs, problems = _counted(nodes, how)
    if not runs:
        return CumulativeCompute(
            base, [], None, f"no run on {base!r} in the ledger", threshold, source, notes=notes
        )
    if problems:
        why = "; ".join(problems) + " (a run is never counted as 0)"
        return CumulativeCompute(base, runs, None, why, threshold, source, notes=notes)
    own = {rid: float(flops) for rid, _, _, flops, _ in runs if flops is not None}
    notes = [*notes, *conflict_notes(figure_conflicts([nodes[r] for r in how if r in nodes]))]
    measured = measured_figures({rid: nodes[rid] for rid in own if rid in nodes})
    total = sum_compute(own, measured=measured)
    judged = judge_total(total, threshold.value, what=f"the cumulative compute of {base}'s runs")
    assert judged is not None  # every run counted: the total is known
    if total.measured_flops is None:
        notes = [*notes, "No run has a measured cross-check: the verdict judges the primary "
                 "figures alone."]  # fmt: skip
    return CumulativeCompute(
        base,
        runs,
        total.flops,
        None,
        threshold,
        source,
        ratio_to_threshold=judged.ratio,
        verdict=judged.verdict,
        notes=[*notes, *_cross_check_notes(nodes, total.stand_ins)],
        measured_flops=total.measured_flops,
        exceeds_threshold=judged.exceeds,
        verdict_basis=judged.basis,
    )
