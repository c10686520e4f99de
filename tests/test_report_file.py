"""read_report: a report file reads back only when it is a whole, consistent flopmeter report.

The valid report is made by hand (tests/support/reports.py) with figures worked out there: 6ND
with N = 1e12 and D = 5e9 is 3e22 FLOP; the threshold with the original compute unknown is
1e23 / 3 FLOP; 3e22 is 0.9 of it, not above it, but 3e22 x 1.3 = 3.9e22 is, so the verdict is
near_threshold.
"""

from __future__ import annotations

import json

import pytest

from flopmeter.errors import ConfigurationError, ReportFileError
from flopmeter.report.reading import FIELDS_ADDED_IN_1_2, read_report
from tests.support.reports import BAD, V1_REPORTS, valid_data, valid_report, write_data

#: The fields schema 1.1 added (the commit that made it 1.1).
ADDED_IN_1_1 = "run_id updated_at pid hostname micro_batches_unread micro_batches_inconsistent"
ADDED_IN_1_1 += " withheld_reason primary_reason"


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


@pytest.mark.slow
def test_a_report_written_by_a_real_meter_reads(tmp_path):
    from flopmeter import FlopMeter
    from tests.support.batches import padded_batch
    from tests.support.models import tiny_llama

    model = tiny_llama()
    with FlopMeter(model, 0, output=tmp_path):
        model(**padded_batch([3, 5], 8)).loss.backward()
    report = read_report(tmp_path)
    assert (report.tokens.tokens_processed, report.tokens.tokens_seen, report.tokens.sequences) == (
        8,
        16,
        2,
    )
    assert report.run.status == "completed"


def test_a_schema_1_0_file_without_the_1_1_fields_reads(tmp_path):
    data = json.loads((V1_REPORTS / "plain.json").read_text())  # written by flopmeter 1.2
    data["schema_version"] = "1.0"
    for key in [*ADDED_IN_1_1.split(), *FIELDS_ADDED_IN_1_2]:  # a 1.0 file has neither
        del data[key]
    report = read_report(write_data(tmp_path, data))
    assert report.schema_version == "2.0"  # upgraded when read, and the note says from what
    assert "Read from a report of schema 1.0" in report.notes[-1]
    assert (report.run.run_id, report.run.pid, report.tokens.micro_batches_unread) == (
        None,
        None,
        0,
    )
    assert report.tokens.tokens_processed == 208


def test_a_1_1_file_with_the_new_fields_null_reads(tmp_path):
    nulls = dict(
        run={"run_id": None, "updated_at": None, "pid": None, "hostname": None},
        compute={"withheld_reason": None},
    )
    report = read_report(write_data(tmp_path, valid_data(**nulls)))
    assert report.run.run_id is None and report.tokens.micro_batches_inconsistent == 0


def test_whole_numbers_for_floats_are_json_numbers_too(tmp_path):
    data = valid_data()
    data["run"]["training_duration_seconds"] = 3600  # JSON has one number type
    data["compute"]["estimates"]["six_nd"]["flops"] = 30000000000000000000000
    data["compute"]["primary_flops"] = 30000000000000000000000
    report = read_report(write_data(tmp_path, data))
    assert report.run.training_duration_seconds == 3600.0
    assert report.compute.primary_flops == 3e22


def test_a_withheld_verdict_and_a_running_report_read(tmp_path):
    withheld = valid_data(
        compute={"primary_flops": None, "withheld_reason": "3 micro-batches could not be read"},
        verdict={"ratio_to_threshold": None, "exceeds_threshold": None, "outcome": None},
        tokens={"micro_batches_unread": 3},
    )
    assert read_report(write_data(tmp_path, withheld)).verdict.outcome is None
    running = valid_data(run={"status": "running", "ended_at": None})
    assert read_report(write_data(tmp_path, running)).run.status == "running"


def test_a_verdict_that_exceeds_is_consistent_when_strictly_above(tmp_path):
    # 4e22 > 1e23 / 3 = 3.33e22: exceeds; 4e22 / 3.33e22 = 1.2
    figures = dict(
        compute={"primary_flops": 4e22},
        verdict={
            "ratio_to_threshold": 1.2,
            "exceeds_threshold": True,
            "outcome": "exceeds_threshold",
        },
    )
    data = valid_data(**figures)
    data["compute"]["estimates"]["six_nd"]["flops"] = 4e22
    assert read_report(write_data(tmp_path, data)).verdict.exceeds_threshold is True
