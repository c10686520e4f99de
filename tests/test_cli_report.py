"""flopmeter report / show / schema: formats, -o, the alias, and the schema's copy in docs/."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from flopmeter.cli import main
from flopmeter.report import FlopReport
from tests.support.reports import valid_data, write_data

SCHEMA_COPY = Path(__file__).resolve().parents[1] / "docs" / "report-schema.json"


@pytest.fixture
def report_path(tmp_path):
    return write_data(tmp_path, valid_data())


@pytest.mark.parametrize("fmt", ["text", "md", "html", "json", "sagemaker"])
def test_show_is_an_alias_of_report(report_path, capsys, fmt):
    assert main(["report", str(report_path), "--format", fmt]) == 0
    via_report = capsys.readouterr()
    assert main(["show", str(report_path), "--format", fmt]) == 0
    assert capsys.readouterr() == via_report
    assert via_report.out.strip()


@pytest.mark.parametrize("fmt", ["text", "md", "html", "json"])
def test_o_writes_the_same_text_to_a_file(report_path, tmp_path, capsys, fmt):
    assert main(["report", str(report_path), "--format", fmt]) == 0
    printed = capsys.readouterr().out
    out = tmp_path / "sub" / f"report.{fmt}"
    assert main(["report", str(report_path), "--format", fmt, "-o", str(out)]) == 0
    stdout, err = capsys.readouterr()
    assert stdout == "" and str(out) in err
    assert out.read_text(encoding="utf-8") == printed
    assert not list(out.parent.glob(".*.tmp"))  # the atomic write left no temporary file
    if fmt == "json":
        assert json.loads(out.read_text()) == json.loads(report_path.read_text())


def test_o_replaces_an_existing_output(report_path, tmp_path, capsys):
    out = tmp_path / "r.md"
    out.write_text("old")
    assert main(["report", str(report_path), "--format", "md", "-o", str(out)]) == 0
    assert out.read_text().startswith("# flopmeter report")


def test_o_refuses_to_overwrite_the_report_it_reads(report_path, tmp_path, capsys):
    before = report_path.read_bytes()
    for target in (report_path, tmp_path / "." / "flops_meter.json"):
        assert main(["report", str(report_path), "--format", "text", "-o", str(target)]) == 2
        err = capsys.readouterr().err
        assert "the report being read" in err and str(target) in err
    # the folder form of the report argument names the same file
    assert main(["report", str(tmp_path), "-o", str(report_path)]) == 2
    assert "the report being read" in capsys.readouterr().err
    assert report_path.read_bytes() == before


def test_o_into_a_folder_is_a_clear_error(report_path, tmp_path, capsys):
    assert main(["report", str(report_path), "-o", str(tmp_path)]) == 2
    assert "is a folder" in capsys.readouterr().err


def test_schema_command_prints_the_model_schema(capsys):
    assert main(["schema"]) == 0
    assert json.loads(capsys.readouterr().out) == FlopReport.model_json_schema()


def test_the_schema_copy_in_docs_is_the_models():
    copy = json.loads(SCHEMA_COPY.read_text(encoding="utf-8"))
    assert copy == FlopReport.model_json_schema(), (
        "docs/report-schema.json is out of date: regenerate it with "
        "`flopmeter schema > docs/report-schema.json`"
    )


def test_a_running_report_written_with_o_keeps_its_banner_and_warns_on_stderr(tmp_path, capsys):
    path = write_data(
        tmp_path, valid_data(run={"status": "running", "ended_at": None, "pid": None})
    )
    out = tmp_path / "running.txt"
    assert main(["report", str(path), "-o", str(out)]) == 0
    stdout, err = capsys.readouterr()
    assert stdout == ""
    assert err.startswith("flopmeter: warning: this report is not final")
    assert "NOT FINAL" in out.read_text().splitlines()[1]
