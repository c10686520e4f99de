"""read_report: a report file reads back only when it is a whole, consistent flopmeter report.

The valid report is made by hand with figures worked out here: 6ND with N = 1e12 and D = 5e9 is
3e22 FLOP; the threshold with the original compute unknown is 1e23 / 3 FLOP; 3e22 is 0.9 of it,
not above it, but 3e22 x 1.3 = 3.9e22 is, so the verdict is near_threshold.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from flopmeter.errors import ConfigurationError, ReportFileError
from flopmeter.report import Estimate, FlopReport
from flopmeter.report_file import FIELDS_ADDED_IN_1_2, read_report

#: The fields schema 1.1 added (the commit that made it 1.1).
ADDED_IN_1_1 = "run_id updated_at pid hostname micro_batches_unread micro_batches_inconsistent"
ADDED_IN_1_1 += " withheld_reason primary_reason"


def valid_report(**overrides: Any) -> FlopReport:
    """A completed report whose figures agree (see the module docstring)."""
    fields: dict[str, Any] = dict(
        model_name="hand-made",
        run_id="run-1",
        status="completed",
        started_at="2026-01-01T00:00:00+00:00",
        ended_at="2026-01-01T01:00:00+00:00",
        updated_at="2026-01-01T01:00:00+00:00",
        pid=4242,
        hostname="trainer-7",
        training_duration_seconds=3600.0,
        n_total=1_000_000_000_000,
        n_trainable=10_000_000_000,
        n_frozen=990_000_000_000,
        n_embedding=1_000_000,
        n_active=1_000_000_000_000,
        tokens_processed=5_000_000_000,
        tokens_seen=6_000_000_000,
        sequences=2_000_000,
        sum_sq_seq_len=15_000_000_000_000,
        micro_batches=250_000,
        optimizer_steps=31_250,
        flops_architecture=3.0e22,
        primary_estimate="six_nd",
        estimates={
            "six_nd": Estimate(flops=3.0e22, method="six_nd", formula="6 * n_total * D"),
            "seed": Estimate(flops=2.01e22, method="seed", formula="(4N + 2N_trainable) * D"),
        },
        threshold_value=1e23 / 3,
        threshold_type="default_gpai",
        threshold_source="Commission Guidelines C(2025) 5045, section 3.2",
        ratio_to_threshold=0.9,
        exceeds_threshold=False,
        verdict="near_threshold",
        world_size=8,
    )
    fields.update(overrides)
    return FlopReport(**fields)


def valid_data(**overrides: Any) -> dict[str, Any]:
    """The valid report as the JSON object its file holds."""
    return json.loads(valid_report(**overrides).to_json())


def write_data(folder: Path, data: object) -> Path:
    """Writes ``data`` as JSON to ``folder``/flops_meter.json."""
    path = folder / "flops_meter.json"
    path.write_text(json.dumps(data, indent=2), encoding="utf-8")
    return path


@dataclass(frozen=True)
class Bad:
    """A file that is not a flopmeter report, and what the error must name."""

    id: str
    make: Callable[[Path], Path]  # writes the file under a folder, returns the path to read
    field: str | None  # the field the message names (None: the file as a whole)
    says: str  # a fragment of the message


def _edited(edit: Callable[[dict[str, Any]], None]) -> Callable[[Path], Path]:
    def make(folder: Path) -> Path:
        data = valid_data()
        edit(data)
        return write_data(folder, data)

    return make


def _set(**changes: Any) -> Callable[[Path], Path]:
    return _edited(lambda data: data.update(changes))


def _drop(key: str) -> Callable[[Path], Path]:
    return _edited(lambda data: data.pop(key))


def _raw(content: bytes) -> Callable[[Path], Path]:
    def make(folder: Path) -> Path:
        path = folder / "flops_meter.json"
        path.write_bytes(content)
        return path

    return make


def _huge_duration(folder: Path) -> Path:
    """A number too large for a float (1e400 parses as infinity)."""
    text = json.dumps(valid_data(training_duration_seconds=1.0)).replace(
        '"training_duration_seconds": 1.0', '"training_duration_seconds": 1e400'
    )
    return _raw(text.encode())(folder)


def _aws_file(folder: Path) -> Path:
    return write_data(
        folder,
        {
            "N_total": 24800,
            "N_trainable": 24800,
            "tokens_processed": " 8",
            "Flops_architecture": " 1190400",
            "threshold_type": "default_3.3e22",
            "pct_of_pretrain": 3.6e-17,
            "exceeds_30pct": False,
        },
    )


def _estimate_edit(key: str, value: Any) -> Callable[[Path], Path]:
    return _edited(lambda data: data["estimates"]["seed"].update({key: value}))


def _estimate_drop(key: str) -> Callable[[Path], Path]:
    return _edited(lambda data: data["estimates"]["seed"].pop(key))


VALID_TEXT = valid_report().to_json().encode()

BAD = [
    # the file itself
    Bad("missing file", lambda d: d / "nothing.json", None, "no such file"),
    Bad("folder without a report", lambda d: d, None, "no such file"),
    Bad("truncated JSON", _raw(VALID_TEXT[: len(VALID_TEXT) // 2]), None, "not valid JSON"),
    Bad("empty file", _raw(b""), None, "not valid JSON"),
    Bad("not UTF-8", _raw(b'{"model_name": "\xff"}'), None, "not UTF-8"),
    Bad("JSON array", _raw(b"[1, 2]"), None, "JSON array, not a report"),
    Bad("JSON string", _raw(b'"flops"'), None, "JSON string, not a report"),
    Bad("NaN", _raw(b'{"schema_version": NaN}'), None, "NaN is not a JSON number"),
    Bad("key twice", _raw(b'{"a": 1, "a": 2}'), None, "'a' appears twice"),
    Bad("empty object", _raw(b"{}"), "schema_version", "missing"),
    Bad("AWS meter file", _aws_file, None, "AWS FlopsMeterCallback's file"),
    Bad("unknown schema", _set(schema_version="2.0"), "schema_version", 'unknown version "2.0"'),
    Bad("schema as number", _set(schema_version=1.1), "schema_version", "expected a string"),
    # fields
    Bad("missing field", _drop("tokens_seen"), "tokens_seen", "missing"),
    Bad("unknown field", _set(flops_total=1.0), "flops_total", "unknown"),
    Bad("1.1 field in 1.0", _set(schema_version="1.0"), "run_id", "not a field of report schema 1.0"),
    Bad("estimate field missing", _estimate_drop("formula"), "estimates.seed.formula", "missing"),
    Bad("estimate field unknown", _estimate_edit("unit", "FLOP"), "estimates.seed.unit", "unknown"),
    # types
    Bad("int as string", _set(tokens_processed="12"), "tokens_processed", 'an integer, got "12"'),
    Bad("int as float", _set(micro_batches=12.0), "micro_batches", "an integer, got 12.0"),
    Bad("int as bool", _set(optimizer_steps=True), "optimizer_steps", "an integer, got true"),
    Bad("float as bool", _set(training_duration_seconds=True), "training_duration_seconds", "a number, got true"),
    Bad("float as string", _set(threshold_value="3e22"), "threshold_value", "a number"),
    Bad("null not allowed", _set(tokens_seen=None), "tokens_seen", "an integer, got null"),
    Bad("string as number", _set(model_name=5), "model_name", "a string, got 5"),
    Bad("bool as number", _set(exceeds_threshold=0), "exceeds_threshold", "true or false, got 0"),
    Bad("unknown status", _set(status="done"), "status", "one of 'running'"),
    Bad("list of numbers", _set(notes=[1]), "notes.0", "a string, got 1"),
    Bad("estimate not object", _set(estimates={"seed": 3}), "estimates.seed", "an object, got 3"),
    Bad("estimate flops string", _estimate_edit("flops", "2e22"), "estimates.seed.flops", "a number"),
    # figures
    Bad("negative count", _set(sequences=-1), "sequences", "must not be negative"),
    Bad("negative figure", _set(energy_joules=-5.0), "energy_joules", "must not be negative"),
    Bad("infinite figure", _huge_duration, "training_duration_seconds", "must be finite"),
    Bad("no rank", _set(world_size=0), "world_size", "at least 1"),
    Bad("more tokens than seen", _set(tokens_processed=7_000_000_000), "tokens_processed", "more than tokens_seen"),
    Bad("final without end", _set(ended_at=None), "ended_at", "null while status is 'completed'"),
    Bad("interrupted without end", _set(status="interrupted", ended_at=None), "ended_at", "'interrupted'"),
    Bad("primary differs", _set(flops_architecture=2.9e22), "flops_architecture", "is not estimates.six_nd.flops"),
    Bad("primary missing", _set(primary_estimate="transformer"), "primary_estimate", "not in estimates"),
    Bad("flops without primary", _set(primary_estimate=None), "flops_architecture", "primary_estimate is null"),
    Bad("estimate under another name", _estimate_edit("method", "six_nd"), "estimates.seed.method", "not the estimate's key"),
    Bad("threshold not the rule's", _set(threshold_value=1e22), "threshold_value", "rules give for pretrain_flops null"),
    Bad("threshold kind not the rule's", _set(pretrain_flops=6e24), "threshold_value", "one_third_of_original"),
    Bad("threshold half null", _set(threshold_type=None), "threshold_type", "null while"),
    Bad("exceeds wrong", _set(exceeds_threshold=True), "exceeds_threshold", "not above"),
    Bad("verdict wrong", _set(verdict="below_threshold"), "verdict", "the figures give 'near_threshold'"),
    Bad("ratio wrong", _set(ratio_to_threshold=0.8), "ratio_to_threshold", "flops_architecture / threshold_value"),
    Bad("verdict half null", _set(verdict=None), "verdict", "null while"),
    Bad("verdict without compute", _set(flops_architecture=None, primary_estimate=None), "verdict", "flops_architecture is null"),
]  # fmt: skip


@pytest.mark.parametrize("bad", BAD, ids=lambda b: b.id)
def test_a_bad_file_is_one_error_naming_the_file_and_field(tmp_path, bad):
    path = bad.make(tmp_path)
    with pytest.raises(ReportFileError) as info:
        read_report(path)
    message = str(info.value)
    shown = path / "flops_meter.json" if path.is_dir() else path
    assert message.startswith(f"{shown}: "), message
    assert info.value.field == bad.field
    if bad.field is not None:
        assert f"field '{bad.field}': " in message, message
    assert bad.says in message, message
    assert "\n" not in message
    assert isinstance(info.value, ConfigurationError)  # the CLI's exit status 2


def test_the_hand_made_report_reads_back_equal(tmp_path):
    report = valid_report()
    report.write_json(tmp_path / "flops_meter.json")
    assert read_report(tmp_path / "flops_meter.json") == report
    assert read_report(tmp_path) == report  # a folder means its flops_meter.json


def test_a_report_written_by_a_real_meter_reads(tmp_path):
    from flopmeter import FlopMeter
    from tests.conftest import padded_batch, tiny_llama

    model = tiny_llama()
    with FlopMeter(model, 0, output=tmp_path):
        model(**padded_batch([3, 5], 8)).loss.backward()
    report = read_report(tmp_path)
    assert (report.tokens_processed, report.tokens_seen, report.sequences) == (8, 16, 2)
    assert report.status == "completed"


def test_a_schema_1_0_file_without_the_1_1_fields_reads(tmp_path):
    data = valid_data(schema_version="1.0")
    for key in [*ADDED_IN_1_1.split(), *FIELDS_ADDED_IN_1_2]:  # a 1.0 file has neither
        del data[key]
    report = read_report(write_data(tmp_path, data))
    assert report.schema_version == "1.0"
    assert (report.run_id, report.pid, report.micro_batches_unread) == (None, None, 0)
    assert report.tokens_processed == 5_000_000_000


def test_a_1_1_file_with_the_new_fields_null_reads(tmp_path):
    nulls = dict(run_id=None, updated_at=None, pid=None, hostname=None, withheld_reason=None)
    report = read_report(write_data(tmp_path, valid_data(**nulls)))
    assert report.run_id is None and report.micro_batches_inconsistent == 0


def test_whole_numbers_for_floats_are_json_numbers_too(tmp_path):
    data = valid_data()
    data["training_duration_seconds"] = 3600  # JSON has one number type
    data["estimates"]["six_nd"]["flops"] = 30000000000000000000000
    data["flops_architecture"] = 30000000000000000000000
    report = read_report(write_data(tmp_path, data))
    assert report.training_duration_seconds == 3600.0
    assert report.flops_architecture == 3e22


def test_a_withheld_verdict_and_a_running_report_read(tmp_path):
    withheld = valid_data(
        flops_architecture=None,
        ratio_to_threshold=None,
        exceeds_threshold=None,
        verdict=None,
        micro_batches_unread=3,
        withheld_reason="3 micro-batches could not be read",
    )
    assert read_report(write_data(tmp_path, withheld)).verdict is None
    running = valid_data(status="running", ended_at=None)
    assert read_report(write_data(tmp_path, running)).status == "running"


def test_a_verdict_that_exceeds_is_consistent_when_strictly_above(tmp_path):
    # 4e22 > 1e23 / 3 = 3.33e22: exceeds; 4e22 / 3.33e22 = 1.2
    figures = dict(flops_architecture=4e22, ratio_to_threshold=1.2, exceeds_threshold=True)
    data = valid_data(verdict="exceeds_threshold", **figures)
    data["estimates"]["six_nd"]["flops"] = 4e22
    assert read_report(write_data(tmp_path, data)).exceeds_threshold is True
