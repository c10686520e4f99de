"""Reading a report file back, strictly: a file that is not a flopmeter report is an error.

:func:`read_report` accepts exactly what :meth:`FlopReport.write_json` writes: a UTF-8 JSON
object with every field of a known schema version, each of its type, and figures that agree
with each other. Anything else raises :class:`~flopmeter.errors.ReportFileError`, whose message
names the file and the field, so that a wrong file is never shown as a report of nothing.
"""

from __future__ import annotations

import json
import os
from collections.abc import Collection, Mapping
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ValidationError

from flopmeter.errors import ReportFileError
from flopmeter.report import KNOWN_SCHEMA_VERSIONS, SCHEMA_VERSION, FlopReport
from flopmeter.report.checks import check_numbers, check_report
from flopmeter.report.context import (
    AttachSection,
    BudgetSection,
    HardwareSection,
    LineageSection,
    ResumedRun,
)
from flopmeter.report.output_path import DEFAULT_FILENAME
from flopmeter.report.sections import (
    TOKENS_ADDED_IN_2_0,
    ComputeSection,
    ModelSection,
    RunSection,
    ThresholdSection,
    TokenSection,
    VerdictSection,
)
from flopmeter.report.upgrade import V1_FIELDS, UpgradeError, upgrade_report, v1_name
from flopmeter.types import Estimate

__all__ = [
    "FIELDS_ADDED_IN_1_1",
    "FIELDS_ADDED_IN_1_2",
    "MAX_REPORT_BYTES",
    "MAX_REPORT_DEPTH",
    "check_report_object",
    "read_report",
]

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
#: The largest report file the reader reads, bytes (a report is a few kilobytes; one with many
#: parent runs some hundreds): anything larger is refused before it is read.
MAX_REPORT_BYTES = 32 * 1024 * 1024
#: The deepest nesting of lists and objects a report file may have (a report has 5 levels).
MAX_REPORT_DEPTH = 32
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
#: The sections of a 2.0 report, each with its model (``budget`` may be null).
_SECTION_MODELS: dict[str, type[BaseModel]] = {
    "run": RunSection,
    "model": ModelSection,
    "tokens": TokenSection,
    "compute": ComputeSection,
    "threshold": ThresholdSection,
    "verdict": VerdictSection,
    "hardware": HardwareSection,
    "budget": BudgetSection,
    "lineage": LineageSection,
    "attach": AttachSection,
}
#: The sectioned schemas, read alike (2.1 added the attach section and null token counts for a
#: run no meter saw: a 2.0 file reads as 2.1 unchanged, its attach section null).
SCHEMA_2 = ("2.0", "2.1", "2.2")
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

    A schema 1.x file (1.0 to 1.2, flat) is checked against its own schema's field names, then
    upgraded to 2.0 (:func:`~flopmeter.report.upgrade.upgrade_report`, every field mapped) and
    checked as a 2.0 report; its errors name the file's own (1.x) field where it has one.

    Args:
        path: The report file, or a folder holding ``flops_meter.json``.

    Returns:
        The report (schema 2.1).

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
    return check_report_object(_load_object(name, file), name)


def check_report_object(
    data: Mapping[str, Any], name: str = "report", *, figures: bool = True
) -> FlopReport:
    """A report's JSON object (as read from a file, or as a ledger is given it), checked as
    strictly as :func:`read_report` checks a file.

    Args:
        data: The JSON object.
        name: What to call it in an error (a file name, ``"report"``).
        figures: Also check that the figures agree with each other (the primary figure, the
            threshold, the verdict); without it, every field is still checked for its name and
            type, and every number for being finite and not negative.

    Returns:
        The report (schema 2.1).

    Raises:
        ReportFileError: as :func:`read_report`, naming ``name`` and the field.
    """
    version = _schema_version(name, data)
    if version in SCHEMA_2:
        return _read_v2(name, data, version, figures=figures)
    optional = FIELDS_ADDED_IN_1_2 if version in ("1.0", "1.1") else frozenset()
    if version == "1.0":
        optional |= FIELDS_ADDED_IN_1_1
    _check_names(name, data, V1_FIELDS, "", optional, version)
    _check_estimate_names(name, data.get("estimates"), "estimates.", version)
    try:
        upgraded = upgrade_report(data)
    except UpgradeError as exc:
        raise ReportFileError(name, exc.message, exc.field) from None
    try:
        return _read_v2(name, upgraded, version, figures=figures)
    except ReportFileError as exc:
        field = v1_name(exc.field) if exc.field is not None else None
        raise ReportFileError(name, exc.reason, field) from None


def _read_v2(
    name: str, data: Mapping[str, Any], version: str, *, figures: bool = True
) -> FlopReport:
    """A 2.0 or 2.1 report's JSON object (as written, or upgraded from ``version``), checked."""
    if "attach" not in data and version not in ("2.1", "2.2"):
        # the attach section came with 2.1 (zero-code metering): a 2.0 report attached nothing
        data = {**data, "attach": None}
    compute = data.get("compute")
    if version != "2.2" and isinstance(compute, dict) and "phases" not in compute:
        # the phases came with 2.2: an older report's judged figure is its training passes
        data = {**data, "compute": {**compute, "phases": [], "phase_policy": None}}
    own = version if version in SCHEMA_2 else SCHEMA_VERSION
    _check_names(name, data, FlopReport.model_fields, "", frozenset(), own)
    lineage = data["lineage"]
    if isinstance(lineage, dict) and "resumed" not in lineage:
        # lineage.resumed came within 2.0: a report without it resumed from nothing
        data = {**data, "lineage": {**lineage, "resumed": None}}
    tokens = data["tokens"]
    if isinstance(tokens, dict) and any(k not in tokens for k in TOKENS_ADDED_IN_2_0):
        # the tokens' modality and shape counts came within 2.0: null where not recorded
        data = {**data, "tokens": {**dict.fromkeys(TOKENS_ADDED_IN_2_0), **tokens}}
    resumed = data["lineage"].get("resumed") if isinstance(data["lineage"], dict) else None
    if isinstance(resumed, dict):
        _check_names(name, resumed, ResumedRun.model_fields, "lineage.resumed.", frozenset(),
                     version)  # fmt: skip
    for section, model in _SECTION_MODELS.items():
        part = data[section]
        if isinstance(part, dict):
            _check_names(name, part, model.model_fields, f"{section}.", frozenset(), version)
    compute = data["compute"]
    if isinstance(compute, dict):
        _check_estimate_names(name, compute.get("estimates"), "compute.estimates.", version)
    report = _validate(name, data)
    if figures:
        check_report(name, report, version)
    else:
        check_numbers(name, report)
    return report


def _check_estimate_names(name: str, estimates: object, prefix: str, version: str) -> None:
    """Each estimate that is an object has exactly the fields of :class:`Estimate`."""
    if isinstance(estimates, dict):
        for key, est in estimates.items():
            if isinstance(est, dict):
                _check_names(name, est, Estimate.model_fields, f"{prefix}{key}.", frozenset(),
                             version)  # fmt: skip


def _load_object(name: str, file: Path) -> dict[str, Any]:
    """The file's JSON object; every way it can fail to be one is a :class:`ReportFileError`."""
    try:
        with open(file, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            if size > MAX_REPORT_BYTES:
                raise ReportFileError(name, _too_large(size))
            raw = f.read(MAX_REPORT_BYTES + 1)
        if len(raw) > MAX_REPORT_BYTES:  # grew while read, or a file whose size is not known
            raise ReportFileError(name, _too_large(len(raw)))
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
    except RecursionError:
        raise ReportFileError(name, _too_deep()) from None
    except ValueError as exc:  # from the hooks: NaN/Infinity, a key twice; an int too long
        raise ReportFileError(name, f"not valid JSON: {exc}") from None
    if _depth(data) > MAX_REPORT_DEPTH:
        raise ReportFileError(name, _too_deep())
    if not isinstance(data, dict):
        raise ReportFileError(
            name, f"holds a JSON {_json_kind(data)}, not a report (a JSON object)"
        )
    return data


def _too_large(size: int) -> str:
    return (
        f"larger than a report can be ({size} bytes; the reader's cap is {MAX_REPORT_BYTES} "
        "bytes): not a flopmeter report"
    )


def _too_deep() -> str:
    return (
        f"nested more than {MAX_REPORT_DEPTH} levels deep (a report has a handful): not a "
        "flopmeter report"
    )


def _depth(value: object) -> int:
    """How deeply ``value``'s lists and objects nest (a scalar: 0), without recursion."""
    deepest, stack = 0, [(value, 1)]
    while stack:
        item, level = stack.pop()
        children = (
            item.values() if isinstance(item, dict) else item if isinstance(item, list) else ()
        )
        for child in children:
            if isinstance(child, (dict, list)):
                if level + 1 > MAX_REPORT_DEPTH:
                    return level + 1
                stack.append((child, level + 1))
        deepest = max(deepest, level if isinstance(item, (dict, list)) else 0)
    return deepest


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
    fields: Collection[str],
    prefix: str,
    optional: frozenset[str],
    version: str,
) -> None:
    """Every name of ``fields`` is in ``data`` (but ``optional``), and no other key is."""
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
