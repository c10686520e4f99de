"""The total compute of a base model's line of runs in the ledger, against its threshold (pure).

The matching rule: a run is **on the base** ``MODEL_ID`` when its report's ``model.name`` is
``MODEL_ID`` (compared without surrounding spaces and without case, as Hugging Face model ids
are); a run is a **descendant** when one of its ``lineage.parent_runs`` names (by ``run_id``) a run on
the base or another descendant, at any depth. Each run counts once, with the last version of its
record and its own ``compute.primary_flops`` (never its ``lineage.cumulative_flops``, which already
holds its parents'). A parent outside the ledger is not counted. Records of schema 1.x and 2.0
are read alike (1.x upgraded to 2.0).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from flopmeter.compliance import Threshold, determine_threshold, verdict
from flopmeter.ledger.chain import LedgerRecord
from flopmeter.report.upgrade import report_value, upgrade_report

__all__ = ["CumulativeCompute", "cumulative_compute", "lineage"]


@dataclass(frozen=True)
class CumulativeCompute:
    """The compute of one base model's runs.

    Attributes:
        base: The base model id asked for.
        runs: ``(run_id, model_name, status, flops_architecture, how)`` of each run counted;
            ``how`` is ``"base"`` or ``"descendant of <run_id>"``.
        total_flops: Their compute summed, FLOP; ``None`` when a run has no compute figure.
        withheld_reason: Why ``total_flops`` is ``None``.
        threshold: The threshold the total is judged against.
        pretrain_flops_source: Where the original compute came from (or ``None``: unknown).
        ratio_to_threshold: ``total_flops / threshold.value``, or ``None``.
        verdict: The verdict of the total, or ``None`` when withheld.
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


def _same_model(name: object, base: str) -> bool:
    return isinstance(name, str) and name.strip().casefold() == base.strip().casefold()


def lineage(records: Iterable[LedgerRecord], base: str) -> list[tuple[dict[str, Any], str]]:
    """The last report of each run on ``base`` or descending from one (as schema 2.0: a 1.x
    record is read through :func:`~flopmeter.report.upgrade.upgrade_report`), with how it
    matched."""
    latest: dict[str, dict[str, Any]] = {}
    for record in records:
        latest[record.run_id] = upgrade_report(record.report())
    how = {
        rid: "base"
        for rid, rep in latest.items()
        if _same_model(report_value(rep, "model.name"), base)
    }
    grew = True
    while grew:  # descendants at any depth
        grew = False
        for rid, rep in latest.items():
            if rid in how:
                continue
            listed = report_value(rep, "lineage.parent_runs") or []
            parents = [p.get("run_id") for p in listed if isinstance(p, dict)]
            found = next((p for p in parents if p in how), None)
            if found is not None:
                how[rid], grew = f"descendant of {found}", True
    return [(latest[rid], how[rid]) for rid in latest if rid in how]


def _pretrain(
    reports: list[dict[str, Any]], given: float | None, given_source: str | None
) -> tuple[float | None, str | None, list[str]]:
    """The original compute: the one given, else the one every run's report agrees on."""
    if given is not None:
        return given, given_source, []
    figures = [report_value(r, "threshold.original_flops") for r in reports]
    values = {v for v in figures if v is not None}
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


def cumulative_compute(
    records: Iterable[LedgerRecord],
    base: str,
    *,
    pretrain_flops: float | None = None,
    pretrain_flops_source: str | None = None,
    original_systemic_risk: bool = False,
) -> CumulativeCompute:
    """The total compute of ``base``'s runs in the ledger and its verdict (see the module).

    Args:
        records: The ledger's records.
        base: The base model id.
        pretrain_flops: The base model's training compute, FLOP; ``None``: the value the runs'
            reports agree on, else unknown.
        pretrain_flops_source: Where ``pretrain_flops`` came from, for the output.
        original_systemic_risk: Whether the base model has systemic risk (fallback threshold).
    """
    matched = lineage(records, base)
    reports = [rep for rep, _ in matched]
    flops, source, notes = _pretrain(reports, pretrain_flops, pretrain_flops_source)
    threshold = determine_threshold(flops, original_systemic_risk=original_systemic_risk)
    runs = [
        (
            report_value(rep, "run.run_id"),
            report_value(rep, "model.name"),
            report_value(rep, "run.status"),
            report_value(rep, "compute.primary_flops"),
            how,
        )
        for rep, how in matched
    ]
    unknown = [r[0] for r in runs if not isinstance(r[3], (int, float)) or isinstance(r[3], bool)]
    if not runs:
        return CumulativeCompute(
            base, [], None, f"no run on {base!r} in the ledger", threshold, source, notes=notes
        )
    if unknown:
        why = f"run(s) {', '.join(unknown)} have no compute figure (withheld in their reports)"
        return CumulativeCompute(base, runs, None, why, threshold, source, notes=notes)
    total = float(sum(r[3] for r in runs))
    return CumulativeCompute(
        base,
        runs,
        total,
        None,
        threshold,
        source,
        ratio_to_threshold=total / threshold.value,
        verdict=verdict(total, threshold.value),
        notes=notes,
    )
