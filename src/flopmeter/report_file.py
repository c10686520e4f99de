"""Reading a report file back, strictly: a file that is not a flopmeter report is an error.

:func:`read_report` accepts exactly what :meth:`FlopReport.write_json` writes: a UTF-8 JSON
object with every field of a known schema version, each of its type, and figures that agree
with each other. Anything else raises :class:`~flopmeter.errors.ReportFileError`, whose message
names the file and the field, so that a wrong file is never shown as a report of nothing.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ValidationError

from flopmeter.compliance import determine_threshold, judge
from flopmeter.compliance.parents import judged_figures
from flopmeter.compliance.verdict import cross_check_flops
from flopmeter.errors import ReportFileError
from flopmeter.output import DEFAULT_FILENAME
from flopmeter.report import KNOWN_SCHEMA_VERSIONS, Estimate, FlopReport

__all__ = ["FIELDS_ADDED_IN_1_1", "FIELDS_ADDED_IN_1_2", "read_report"]

#: The fields schema 1.1 added; a 1.0 file has none of them.
FIELDS_ADDED_IN_1_1 = frozenset(
    {
        "run_id",
        "updated_at",
        "pid",
        "hostname",
        "micro_batches_unread",
        "micro_batches_inconsistent",
        "withheld_reason",
        "primary_reason",
    }
)
#: The fields schema 1.2 added; 1.0 and 1.1 files have none of them.
FIELDS_ADDED_IN_1_2 = frozenset(
    {
        "catalog",
        "parent_runs",
        "cumulative_flops",
        "ancestor_flops",
        "uncertainty_margin",
        "verdict_basis",
        "obligations",
    }
)
#: Keys of the AWS FlopsMeterCallback's ``flops_meter.json`` that no flopmeter report has.
_AWS_KEYS = (
    "N_total",
    "N_trainable",
    "Flops_architecture",
    "Flops_hardware",
    "Flops_original",
    "pct_of_pretrain",
    "exceeds_30pct",
    "num_epochs",
)
#: Final statuses: the run has ended, so the report says when.
_FINAL = ("completed", "failed", "interrupted")
#: Relative tolerance of the comparisons between floats the report derives from each other.
_REL_TOL = 1e-9
#: What a pydantic error type expects, in words.
_EXPECTED = {
    "int_type": "an integer",
    "float_type": "a number",
    "string_type": "a string",
    "bool_type": "true or false",
    "list_type": "a list",
    "dict_type": "an object",
    "model_type": "an object",
}


def read_report(path: str | os.PathLike[str]) -> FlopReport:
    """Reads a report written by :class:`~flopmeter.FlopMeter`, checking it strictly.

    Args:
        path: The report file, or a folder holding ``flops_meter.json``.

    Returns:
        The report.

    Raises:
        ReportFileError: The file is missing or unreadable, is not UTF-8 JSON holding an object,
            is the AWS meter's file, has an unknown or no ``schema_version``, lacks a field, has
            one it should not, has a value of the wrong type, or has figures that disagree (see
            docs/compliance.md, "Reading a report"). The message names the file and field.
    """
    file = Path(os.fspath(path)).expanduser()
    if file.is_dir():
        folder, file = file, file / DEFAULT_FILENAME
        if not file.exists():
            raise ReportFileError(str(file), f"there is no such file: {folder} holds no report")
    name = str(file)
    data = _load_object(name, file)
    version = _schema_version(name, data)
    optional = frozenset()
    if version in ("1.0", "1.1"):
        optional = FIELDS_ADDED_IN_1_2 | (FIELDS_ADDED_IN_1_1 if version == "1.0" else frozenset())
    _check_names(name, data, FlopReport, "", optional, version)
    estimates = data["estimates"]
    if isinstance(estimates, dict):
        for key, est in estimates.items():
            if isinstance(est, dict):
                _check_names(name, est, Estimate, f"estimates.{key}.", frozenset(), version)
    report = _validate(name, data)
    _check_numbers(name, report)
    _check_figures(name, report)
    return report


def _load_object(name: str, file: Path) -> dict[str, Any]:
    """The file's JSON object; every way it can fail to be one is a :class:`ReportFileError`."""
    try:
        raw = file.read_bytes()
    except FileNotFoundError:
        where = "there is no such file" if file.parent.is_dir() else "its folder does not exist"
        raise ReportFileError(name, f"{where} (a flopmeter report was expected)") from None
    except OSError as exc:
        raise ReportFileError(name, f"cannot be read: {exc.strerror or exc}") from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ReportFileError(name, f"not UTF-8 text (byte {exc.start})") from None
    try:
        data = json.loads(text, parse_constant=_no_constant, object_pairs_hook=_unique_keys)
    except json.JSONDecodeError as exc:
        cut = " (the file is empty or cut short)" if exc.pos >= len(text.rstrip()) else ""
        raise ReportFileError(
            name, f"not valid JSON: {exc.msg} at line {exc.lineno}, column {exc.colno}{cut}"
        ) from None
    except ValueError as exc:  # from the hooks: NaN/Infinity, a key twice
        raise ReportFileError(name, f"not valid JSON: {exc}") from None
    if not isinstance(data, dict):
        raise ReportFileError(
            name, f"holds a JSON {_json_kind(data)}, not a report (a JSON object)"
        )
    return data


def _no_constant(token: str) -> float:
    """``json.loads`` hook: NaN and Infinity are not JSON, and a report never holds them."""
    raise ValueError(f"{token} is not a JSON number")


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """``json.loads`` hook: an object that names a key twice is ambiguous, so an error."""
    obj: dict[str, Any] = {}
    for key, value in pairs:
        if key in obj:
            raise ValueError(f"the key {key!r} appears twice in one object")
        obj[key] = value
    return obj


def _json_kind(value: object) -> str:
    """The JSON name of a parsed value's type."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, (int, float)):
        return "number"
    return {str: "string", list: "array"}.get(type(value), "object")


def _shown(value: object) -> str:
    """A value as JSON, cut to a readable length."""
    text = json.dumps(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _schema_version(name: str, data: Mapping[str, Any]) -> str:
    """The file's schema version, when it is one this flopmeter reads; the AWS file is named."""
    aws = [key for key in _AWS_KEYS if key in data]
    if aws:
        raise ReportFileError(
            name,
            "this looks like the AWS FlopsMeterCallback's file (or flopmeter's "
            f"--format sagemaker output: keys {', '.join(aws)}), not a flopmeter report; "
            "show the flops_meter.json that FlopMeter writes",
        )
    if "schema_version" not in data:
        raise ReportFileError(
            name, "missing: not a flopmeter report (FlopMeter writes it first)", "schema_version"
        )
    version = data["schema_version"]
    if not isinstance(version, str):
        raise ReportFileError(name, f"expected a string, got {_shown(version)}", "schema_version")
    if version not in KNOWN_SCHEMA_VERSIONS:
        known = ", ".join(KNOWN_SCHEMA_VERSIONS)
        raise ReportFileError(
            name,
            f"unknown version {_shown(version)} (this flopmeter reads {known}; a newer "
            "flopmeter may read it)",
            "schema_version",
        )
    return version


def _check_names(
    name: str,
    data: Mapping[str, Any],
    model: type[BaseModel],
    prefix: str,
    optional: frozenset[str],
    version: str,
) -> None:
    """Every field of ``model`` is in ``data`` (but ``optional``), and no other key is."""
    fields = model.model_fields
    for field in fields:
        if field not in data and field not in optional:
            raise ReportFileError(
                name, "missing (a report written by FlopMeter has every field)", prefix + field
            )
    for key in data:
        if key not in fields or key in optional:
            raise ReportFileError(
                name, f"unknown: not a field of report schema {version}", prefix + key
            )


def _validate(name: str, data: Mapping[str, Any]) -> FlopReport:
    """The report, validated strictly (no "1" for an int, no bool for a number, no stray null)."""
    try:
        return FlopReport.model_validate(data, strict=True)
    except ValidationError as exc:
        err = exc.errors()[0]
        field = ".".join(str(part) for part in err["loc"])
        expected = _EXPECTED.get(err["type"])
        if err["type"] == "literal_error":
            expected = f"one of {err['ctx']['expected']}"
        if expected is None:
            message = err["msg"][:1].lower() + err["msg"][1:]
        else:
            message = f"expected {expected}, got {_shown(err['input'])}"
        raise ReportFileError(name, message, field) from None


def _numbers(report: FlopReport) -> Iterable[tuple[str, float]]:
    """Every number of the report (not the estimates' free-form inputs), by field name."""
    for field, value in report:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            yield field, value
    for key, est in report.estimates.items():
        if est.flops is not None:
            yield f"estimates.{key}.flops", est.flops


def _check_numbers(name: str, report: FlopReport) -> None:
    """Counts and figures are finite and not negative; a run has at least one rank."""
    for field, value in _numbers(report):
        if not math.isfinite(value):
            raise ReportFileError(name, f"must be finite, got {value}", field)
        if value < 0:
            raise ReportFileError(name, f"must not be negative, got {value}", field)
    if report.world_size < 1:
        raise ReportFileError(name, f"must be at least 1, got {report.world_size}", "world_size")


def _close(a: float, b: float) -> bool:
    """Whether two derived floats agree within :data:`_REL_TOL`."""
    return math.isclose(a, b, rel_tol=_REL_TOL, abs_tol=0.0)


def _check_figures(name: str, report: FlopReport) -> None:
    """Figures agree with each other: tokens, estimates, threshold, verdict, end time."""
    if report.tokens_processed > report.tokens_seen:
        raise ReportFileError(
            name,
            f"{report.tokens_processed} non-padding tokens is more than tokens_seen "
            f"({report.tokens_seen}), the tokens with padding",
            "tokens_processed",
        )
    if report.status in _FINAL and report.ended_at is None:
        raise ReportFileError(
            name,
            f"null while status is {report.status!r} (a final report says when training ended)",
            "ended_at",
        )
    _check_estimates(name, report)
    _check_threshold(name, report)
    _check_verdict(name, report)


def _check_estimates(name: str, report: FlopReport) -> None:
    """Each estimate is under its own name; ``flops_architecture`` is the primary one's."""
    for key, est in report.estimates.items():
        if est.method != key:
            raise ReportFileError(
                name,
                f"{_shown(est.method)} is not the estimate's key {key!r}",
                f"estimates.{key}.method",
            )
    primary = report.primary_estimate
    if primary is None:
        if report.flops_architecture is not None:
            raise ReportFileError(name, "set while primary_estimate is null", "flops_architecture")
        return
    if primary not in report.estimates:
        raise ReportFileError(name, f"{primary!r} is not in estimates", "primary_estimate")
    own = report.estimates[primary].flops
    flops = report.flops_architecture
    if flops is not None and own is not None and not _close(flops, own):
        raise ReportFileError(
            name, f"{flops!r} is not estimates.{primary}.flops ({own!r})", "flops_architecture"
        )


def _all_set(name: str, report: FlopReport, fields: tuple[str, ...], others: str) -> bool:
    """Whether the report's ``fields`` are all set: ``False`` when all are null, an error when
    only some are."""
    values = {field: getattr(report, field) for field in fields}
    if all(value is None for value in values.values()):
        return False
    for field, value in values.items():
        if value is None:
            raise ReportFileError(name, f"null while the other {others}", field)
    return True


def _check_threshold(name: str, report: FlopReport) -> None:
    """The threshold is the one the rules give for ``pretrain_flops`` and ``threshold_type``."""
    parts = ("threshold_value", "threshold_type", "threshold_source")
    if not _all_set(name, report, parts, "threshold fields are set"):
        return
    rule = determine_threshold(
        report.pretrain_flops,
        original_systemic_risk=report.threshold_type == "default_systemic_risk",
    )
    if rule.kind != report.threshold_type or not _close(rule.value, report.threshold_value or 0):
        raise ReportFileError(
            name,
            f"{report.threshold_value!r} ({report.threshold_type}) is not the threshold the "
            f"rules give for pretrain_flops {_shown(report.pretrain_flops)}: {rule.value!r} "
            f"({rule.kind})",
            "threshold_value",
        )


def _judged_figures(report: FlopReport) -> tuple[float | None, float | None]:
    """The figure the verdict judges (the cumulative compute when there are parents) and the
    measured cross-check on the same footing, as :func:`~flopmeter.reporting.build_report`
    judges them (schema 1.2; before it, the primary figure alone)."""
    if report.schema_version in ("1.0", "1.1"):
        return report.flops_architecture, None
    measured = cross_check_flops(report.estimates, report.primary_estimate)
    return judged_figures(report.flops_architecture, measured, report.parent_runs)


def _check_verdict(name: str, report: FlopReport) -> None:
    """Ratio, exceeded and verdict are all null (withheld) or all follow from the figures."""
    judged = ("ratio_to_threshold", "exceeds_threshold", "verdict")
    if not _all_set(name, report, judged, "verdict fields are set (they are withheld together)"):
        return
    flops, measured = _judged_figures(report)
    value = report.threshold_value
    figure = "cumulative_flops" if report.parent_runs else "flops_architecture"
    if flops is None or value is None:
        missing = "threshold_value" if value is None else figure
        raise ReportFileError(name, f"set while {missing} is null", "verdict")
    if report.parent_runs and (
        report.cumulative_flops is None or not _close(report.cumulative_flops, flops)
    ):
        raise ReportFileError(
            name,
            f"{report.cumulative_flops!r} is not flops_architecture plus the parent runs' "
            f"compute ({flops!r})",
            "cumulative_flops",
        )
    judged = judge(flops, value, measured_flops=measured)
    exceeded = judged.exceeds
    if report.exceeds_threshold != exceeded:
        raise ReportFileError(
            name,
            f"{_shown(report.exceeds_threshold)} but {figure} {flops!r} is "
            f"{'above' if exceeded else 'not above'} threshold_value {value!r}",
            "exceeds_threshold",
        )
    if report.verdict != judged.verdict:
        raise ReportFileError(
            name, f"{report.verdict!r} but the figures give {judged.verdict!r}", "verdict"
        )
    ratio = report.ratio_to_threshold or 0.0
    if not _close(ratio, judged.ratio):
        raise ReportFileError(
            name,
            f"{ratio!r} is not {figure} / threshold_value ({judged.ratio!r})",
            "ratio_to_threshold",
        )
