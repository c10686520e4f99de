"""The figures of a report agree with each other: the strict reader's checks after the types.

:func:`check_report` is what :func:`flopmeter.report.reading.read_report` asks of a report whose
fields all have their types: counts and figures finite and not negative, the primary figure the
primary estimate's, the threshold the one the rules give, the judged figure and the verdict the
ones the figures give. Every failure is a :class:`~flopmeter.errors.ReportFileError` naming the
file and the field (its 2.0 path).
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable
from datetime import datetime, timezone

from pydantic import BaseModel

from flopmeter.compliance.parents import judged_figures, judges_cumulative
from flopmeter.compliance.thresholds import determine_threshold
from flopmeter.compliance.verdict import cross_check_flops, judge
from flopmeter.errors import ReportFileError
from flopmeter.report import FlopReport
from flopmeter.report.upgrade import SECTIONS
from flopmeter.safe_text import run_id_problem

__all__ = ["check_numbers", "check_report"]

#: Final statuses: the run has ended, so the report says when.
_FINAL = ("completed", "failed", "interrupted")
#: Relative tolerance of the comparisons between floats the report derives from each other.
_REL_TOL = 1e-9


def check_report(name: str, report: FlopReport, version: str) -> None:
    """Checks that a typed report's figures agree (see the module).

    Args:
        name: The file, for the error.
        report: The report, validated.
        version: The schema version of the file it was read from (1.0 and 1.1 reports were
            judged without the measured cross-check).

    Raises:
        ReportFileError: a figure that is negative, not finite, or disagrees with another.
    """
    check_numbers(name, report)
    _check_run(name, report)
    _check_attach(name, report)
    _check_figures(name, report, version)


def _check_attach(name: str, report: FlopReport) -> None:
    """A run the meter did not measure (``attach.method`` null), or measured only from a
    point after training began (``attach.unseen_micro_batches``), has no verdict."""
    attach = report.attach
    if attach is None or report.verdict.outcome is None:
        return
    if attach.method is None or attach.unseen_micro_batches:
        what = "was not measured" if attach.method is None else "was measured in part only"
        raise ReportFileError(
            name,
            f"{report.verdict.outcome!r}, but the run {what} (the attach section): such a "
            "report has no verdict",
            "verdict.outcome",
        )


def _time(name: str, field: str, value: str | None) -> datetime | None:
    """A report's time: ISO 8601 (a time without a zone is read as UTC), else an error."""
    if value is None:
        return None
    try:
        when = datetime.fromisoformat(value)
    except ValueError:
        raise ReportFileError(
            name, f"{_shown(value)} is not an ISO 8601 time (2026-01-31T12:00:00+00:00)", field
        ) from None
    return when if when.tzinfo is not None else when.replace(tzinfo=timezone.utc)


def _check_run(name: str, report: FlopReport) -> None:
    """The run id has the form of one (:func:`~flopmeter.safe_text.run_id_problem`: it names one
    file and one object key); its times are ISO 8601 and it does not end before it started."""
    run = report.run
    if run.run_id is not None:
        problem = run_id_problem(run.run_id)
        if problem is not None:
            raise ReportFileError(name, problem, "run.run_id")
    started = _time(name, "run.started_at", run.started_at)
    ended = _time(name, "run.ended_at", run.ended_at)
    updated = _time(name, "run.updated_at", run.updated_at)
    for field, when in (("run.ended_at", ended), ("run.updated_at", updated)):
        if started is not None and when is not None and when < started:
            raise ReportFileError(
                name, f"{when.isoformat()} is before run.started_at ({started.isoformat()})", field
            )


def _shown(value: object) -> str:
    """A value as JSON, cut to a readable length."""
    text = json.dumps(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _numbers(report: FlopReport) -> Iterable[tuple[str, float]]:
    """Every number of the report's sections (not the estimates' free-form inputs, the
    catalogue's or the parents' figures), by field path."""
    for section in SECTIONS:
        part = getattr(report, section)
        if part is None:
            continue
        for field, value in part:
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                yield f"{section}.{field}", value
    for key, est in report.compute.estimates.items():
        if est.flops is not None:
            yield f"compute.estimates.{key}.flops", est.flops
    resumed = report.lineage.resumed
    if resumed is not None:
        for key, flops in resumed.sessions_flops.items():
            yield f"lineage.resumed.sessions_flops.{key}", flops
        if resumed.beyond_checkpoint_flops is not None:
            yield "lineage.resumed.beyond_checkpoint_flops", resumed.beyond_checkpoint_flops


def check_numbers(name: str, report: FlopReport) -> None:
    """Counts and figures are finite and not negative; a run has at least one rank.

    Raises:
        ReportFileError: naming ``name`` and the field.
    """
    for field, value in _numbers(report):
        if isinstance(value, int) and value.bit_length() > 63:  # before any float() of it
            raise ReportFileError(
                name,
                f"must be at most 2^63 - 1 (a 64-bit count), got a {value.bit_length()}-bit "
                "integer",
                field,
            )
        if not math.isfinite(value):
            raise ReportFileError(name, f"must be finite, got {value}", field)
        if value < 0:
            raise ReportFileError(name, f"must not be negative, got {value}", field)
    if report.run.world_size < 1:
        raise ReportFileError(
            name, f"must be at least 1, got {report.run.world_size}", "run.world_size"
        )


def _close(a: float, b: float) -> bool:
    """Whether two derived floats agree within :data:`_REL_TOL`."""
    return math.isclose(a, b, rel_tol=_REL_TOL, abs_tol=0.0)


def _check_figures(name: str, report: FlopReport, version: str) -> None:
    """Figures agree with each other: tokens, estimates, threshold, verdict, end time."""
    tokens, run = report.tokens, report.run
    _check_null_counts(name, report)
    if (
        tokens.tokens_processed is not None
        and tokens.tokens_seen is not None
        and tokens.tokens_processed > tokens.tokens_seen
    ):
        raise ReportFileError(
            name,
            f"{tokens.tokens_processed} non-padding tokens is more than tokens_seen "
            f"({tokens.tokens_seen}), the tokens with padding",
            "tokens.tokens_processed",
        )
    if run.status in _FINAL and run.ended_at is None:
        raise ReportFileError(
            name,
            f"null while status is {run.status!r} (a final report says when training ended)",
            "run.ended_at",
        )
    _check_estimates(name, report)
    _check_threshold(name, report)
    _check_phases(name, report)
    _check_judged(name, report)
    _check_verdict(name, report, version)


#: The token counts that are null (never 0) in the report of a run no meter saw (schema 2.1).
NULLABLE_COUNTS = (
    "tokens_processed",
    "tokens_seen",
    "sequences",
    "sum_sq_seq_len",
    "micro_batches",
    "optimizer_steps",
)


def _check_null_counts(name: str, report: FlopReport) -> None:
    """Null token counts and training time only in the report of a zero-code job nothing attached to
    (``attach.method`` null): a metered run counts, from 0."""
    unattached = report.attach is not None and report.attach.method is None
    if unattached:
        return
    nulls = [f"tokens.{f}" for f in NULLABLE_COUNTS if getattr(report.tokens, f) is None]
    if report.run.training_duration_seconds is None:
        nulls.append("run.training_duration_seconds")
    if nulls:
        raise ReportFileError(
            name,
            "null, but a meter attached to this run (null is only for a run no meter saw: "
            "attach.method null)",
            nulls[0],
        )


def _check_estimates(name: str, report: FlopReport) -> None:
    """Each estimate is under its own name; ``compute.primary_flops`` is the primary one's."""
    compute = report.compute
    for key, est in compute.estimates.items():
        if est.method != key:
            raise ReportFileError(
                name,
                f"{_shown(est.method)} is not the estimate's key {key!r}",
                f"compute.estimates.{key}.method",
            )
    primary = compute.primary_estimate
    if primary is None:
        if compute.primary_flops is not None:
            raise ReportFileError(
                name, "set while primary_estimate is null", "compute.primary_flops"
            )
        return
    if primary not in compute.estimates:
        raise ReportFileError(name, f"{primary!r} is not in estimates", "compute.primary_estimate")
    own = compute.estimates[primary].flops
    flops = compute.primary_flops
    if flops is not None and own is not None and not _close(flops, own):
        raise ReportFileError(
            name,
            f"{flops!r} is not estimates.{primary}.flops ({own!r})",
            "compute.primary_flops",
        )


def _all_set(
    name: str, section: str, part: BaseModel, fields: tuple[str, ...], others: str
) -> bool:
    """Whether the section's ``fields`` are all set: ``False`` when all are null, an error
    when only some are."""
    values = {field: getattr(part, field) for field in fields}
    if all(value is None for value in values.values()):
        return False
    for field, value in values.items():
        if value is None:
            raise ReportFileError(name, f"null while the other {others}", f"{section}.{field}")
    return True


def _check_threshold(name: str, report: FlopReport) -> None:
    """The threshold is the one the rules give for ``original_flops`` and ``kind``."""
    threshold = report.threshold
    parts = ("threshold_flops", "kind", "source")
    if not _all_set(name, "threshold", threshold, parts, "threshold fields are set"):
        return
    rule = determine_threshold(
        threshold.original_flops,
        original_systemic_risk=threshold.kind == "default_systemic_risk",
    )
    if rule.kind != threshold.kind or not _close(rule.value, threshold.threshold_flops or 0):
        raise ReportFileError(
            name,
            f"{threshold.threshold_flops!r} ({threshold.kind}) is not the threshold the "
            f"rules give for original_flops {_shown(threshold.original_flops)}: "
            f"{rule.value!r} ({rule.kind})",
            "threshold.threshold_flops",
        )


def _cumulative(report: FlopReport) -> bool:
    """Whether the verdict judges ``lineage.cumulative_flops`` (``judges_cumulative``)."""
    lineage = report.lineage
    beyond = lineage.resumed.beyond_checkpoint_flops if lineage.resumed is not None else None
    return judges_cumulative(lineage.parent_runs, beyond)


def other_phases_flops(report: FlopReport) -> tuple[float, bool]:
    """The FLOP of the phases besides the training passes that the report counts (schema 2.2),
    and whether they are all known (a counted phase with a null figure withholds the verdict)."""
    total, known = 0.0, True
    for phase in report.compute.phases:
        if phase.counted and phase.name != "training":
            if phase.flops is None:
                known = False
            else:
                total += phase.flops
    return total, known


def _check_phases(name: str, report: FlopReport) -> None:
    """The training phase is ``compute.primary_flops``; evaluation is never counted; a counted
    phase without a figure leaves no verdict."""
    compute = report.compute
    for i, phase in enumerate(compute.phases):
        where = f"compute.phases.{i}"
        if phase.name == "training" and not _same(phase.flops, compute.primary_flops):
            raise ReportFileError(
                name,
                f"{_shown(phase.flops)} is not compute.primary_flops "
                f"({_shown(compute.primary_flops)})",
                f"{where}.flops",
            )
        if phase.name == "evaluation" and phase.counted:
            raise ReportFileError(name, "evaluation is never counted", f"{where}.counted")
        if phase.counted and phase.flops is None and report.verdict.outcome is not None:
            raise ReportFileError(
                name,
                f"null in a counted phase ({phase.name!r}) while the verdict is given",
                f"{where}.flops",
            )


def _same(a: float | None, b: float | None) -> bool:
    return (a is None) == (b is None) and (a is None or b is None or _close(a, b))


def _check_judged(name: str, report: FlopReport) -> None:
    """``verdict.judged_flops`` is the cumulative compute with parent runs (or a resumed
    session's lost steps), else the primary with the other phases the report counts."""
    lineage = report.lineage
    cumulative = _cumulative(report)
    others, known = other_phases_flops(report)
    primary = report.compute.primary_flops
    if not known and report.verdict.judged_flops is None:
        return
    expected = lineage.cumulative_flops if cumulative else primary
    if not cumulative and primary is not None:
        expected = primary + others
    what = "lineage.cumulative_flops" if cumulative else "compute.primary_flops"
    if others and not cumulative:
        what = "compute.primary_flops plus the counted phases"
    judged = report.verdict.judged_flops
    if (judged is None) != (expected is None) or (
        judged is not None and expected is not None and not _close(judged, expected)
    ):
        raise ReportFileError(
            name, f"{_shown(judged)} is not {what} ({_shown(expected)})", "verdict.judged_flops"
        )


def _judged_figures(report: FlopReport, version: str) -> tuple[float | None, float | None]:
    """The figure the verdict judges (the cumulative compute when there are parents) and the
    measured cross-check on the same footing, as :func:`~flopmeter.run.reporting.build_report`
    judges them (since schema 1.2; before it, the primary figure alone)."""
    primary = report.compute.primary_flops
    if version in ("1.0", "1.1"):
        return primary, None
    measured = cross_check_flops(report.compute.estimates, report.compute.primary_estimate)
    others, _ = other_phases_flops(report)
    if others:
        primary = None if primary is None else primary + others
        measured = None if measured is None else measured + others
    resumed = report.lineage.resumed
    if resumed is None:
        return judged_figures(primary, measured, report.lineage.parent_runs)
    return judged_figures(
        primary,
        measured,
        report.lineage.parent_runs,
        sessions=resumed.sessions_flops,
        resumed_from=resumed.run_id,
        beyond=resumed.beyond_checkpoint_flops,
    )


def _check_verdict(name: str, report: FlopReport, version: str) -> None:
    """Ratio, exceeded and outcome are all null (withheld) or all follow from the figures."""
    verdict, lineage = report.verdict, report.lineage
    judged_fields = ("ratio_to_threshold", "exceeds_threshold", "outcome")
    others = "verdict fields are set (they are withheld together)"
    if not _all_set(name, "verdict", verdict, judged_fields, others):
        return
    flops, measured = _judged_figures(report, version)
    value = report.threshold.threshold_flops
    figure = "lineage.cumulative_flops" if _cumulative(report) else "compute.primary_flops"
    if flops is None or value is None:
        missing = "threshold.threshold_flops" if value is None else figure
        raise ReportFileError(name, f"set while {missing} is null", "verdict.outcome")
    if _cumulative(report) and (
        lineage.cumulative_flops is None or not _close(lineage.cumulative_flops, flops)
    ):
        raise ReportFileError(
            name,
            f"{lineage.cumulative_flops!r} is not compute.primary_flops plus the parent runs' "
            f"compute ({flops!r})",
            "lineage.cumulative_flops",
        )
    judged = judge(flops, value, measured_flops=measured)
    if verdict.exceeds_threshold != judged.exceeds:
        raise ReportFileError(
            name,
            f"{_shown(verdict.exceeds_threshold)} but {figure} {flops!r} is "
            f"{'above' if judged.exceeds else 'not above'} threshold.threshold_flops {value!r}",
            "verdict.exceeds_threshold",
        )
    if verdict.outcome != judged.verdict:
        raise ReportFileError(
            name,
            f"{verdict.outcome!r} but the figures give {judged.verdict!r}",
            "verdict.outcome",
        )
    ratio = verdict.ratio_to_threshold or 0.0
    if not _close(ratio, judged.ratio):
        raise ReportFileError(
            name,
            f"{ratio!r} is not {figure} / threshold.threshold_flops ({judged.ratio!r})",
            "verdict.ratio_to_threshold",
        )
