"""The end of a zero-code job (:func:`flopmeter.auto.finish.finish_job`), in this process: the
lines naming the job's reports, the report of a job nothing attached to (read back by every
reader), and no report for a job that never imported torch."""

from __future__ import annotations

import io
import json
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from flopmeter.auto import JOB_DIR_ENV, JOB_ID_ENV, LAUNCHER_ENV
from flopmeter.auto.finish import (
    NO_PYTHON_METERED,
    NOTHING_FOUND,
    NOTHING_TRAINED,
    finish_job,
    other_node_line,
    unattached_report,
)
from flopmeter.auto.job import read_records, record
from flopmeter.cli import main
from flopmeter.errors import ReportFileError
from flopmeter.ledger.store import Ledger
from flopmeter.render import render
from flopmeter.report import SCHEMA_VERSION, FlopReport
from flopmeter.report.reading import read_report
from flopmeter.report.sections import RunSection, VerdictSection


@pytest.fixture
def job(tmp_path, monkeypatch):
    folder = tmp_path / "job"
    folder.mkdir()
    monkeypatch.setenv(JOB_DIR_ENV, str(folder))
    monkeypatch.setenv(JOB_ID_ENV, "job-7")
    monkeypatch.setenv(LAUNCHER_ENV, "flopmeter run")
    for name in ("FLOPMETER_OUTPUT", "FLOPS_METER_OUT", "SM_TRAINING_ENV", "TRAINING_JOB_NAME"):
        monkeypatch.delenv(name, raising=False)
    return folder


def _finish(folder: Path, cwd: Path, status: int = 0, **kw) -> tuple[list[Path], str]:
    out = io.StringIO()
    paths = finish_job(folder, exit_status=status, cwd=cwd, stream=out, **kw)
    return paths, out.getvalue()


def test_a_job_whose_metered_pythons_never_imported_torch_gets_a_line_and_no_report(job, tmp_path):
    record("boot", executable=sys.executable)  # metering started in a Python of the job
    paths, said = _finish(job, tmp_path)
    assert paths == []
    assert (
        said.strip()
        == NOTHING_TRAINED
        == (
            "flopmeter: nothing trained: no Python process of the job imported torch, so no "
            "report was written"
        )
    )
    assert not (tmp_path / "flops_meter.json").exists()


def test_a_job_no_python_of_which_was_metered_gets_a_report_saying_so(job, tmp_path):
    """``python -S`` inside a shell script (no site module, so no sitecustomize) leaves no
    record at all: the meter cannot know whether it trained, so the job's report says why it
    measured nothing, never "nothing trained"."""
    paths, said = _finish(job, tmp_path, status=0)
    path = tmp_path / "flops_meter.json"
    assert paths == [path]
    assert said.strip() == (
        f"flopmeter: report: {path} (completed, no verdict: not measured: {NO_PYTHON_METERED})"
    )
    report = read_report(path)
    assert report.attach.reason == NO_PYTHON_METERED and "python -S" in NO_PYTHON_METERED
    assert report.tokens.tokens_processed is None and report.verdict.outcome is None


def test_a_python_that_cannot_import_flopmeter_is_named_in_the_report(job, tmp_path):
    record("boot", executable=sys.executable)
    record("unmetered", executable="/other/env/bin/python3")
    paths, said = _finish(job, tmp_path)
    why = "a Python process of the job (/other/env/bin/python3) cannot import flopmeter"
    assert paths == [tmp_path / "flops_meter.json"] and why in said
    assert why in (read_report(paths[0]).attach.reason or "")


def test_a_python_that_ran_unmetered_beside_a_meter_is_a_warning(job, tmp_path):
    report = unattached_report([], exit_status=0)
    path = tmp_path / "metered.json"
    report.write_json(path)
    record("attached", method="optimizer", report=str(path), run_id=report.run.run_id)
    record("unmetered", executable="/other/env/bin/python3")
    paths, said = _finish(job, tmp_path)
    assert paths == [path]
    lines = said.strip().splitlines()
    assert lines[0].startswith(f"flopmeter: report: {path} ")
    assert lines[1] == (
        "flopmeter: warning: a Python process of the job (/other/env/bin/python3) cannot import "
        "flopmeter, so it ran unmetered: the job's compute in it is in no report above"
    )


def test_a_job_nothing_attached_to_gets_a_report_saying_why(job, tmp_path):
    record("torch", version="x")
    paths, said = _finish(job, tmp_path)
    path = tmp_path / "flops_meter.json"
    assert paths == [path]
    assert said.strip() == f"flopmeter: report: {path} (completed, no verdict: not measured: " \
        f"{NOTHING_FOUND})"  # fmt: skip
    report = read_report(path)  # the strict reader takes it
    assert report.schema_version == SCHEMA_VERSION == "2.2"
    assert report.run.status == "completed" and report.run.error is None
    assert report.attach is not None and report.attach.method is None
    assert report.attach.reason == NOTHING_FOUND
    assert report.attach.launcher == "flopmeter run" and report.attach.job_id == "job-7"
    tokens = report.tokens
    for field in ("tokens_processed", "tokens_seen", "sequences", "sum_sq_seq_len",
                  "micro_batches", "optimizer_steps"):  # fmt: skip
        assert getattr(tokens, field) is None, field  # null, never 0
    assert json.loads(path.read_text())["tokens"]["tokens_processed"] is None
    assert report.run.training_duration_seconds is None  # no meter timed any training: not 0 s
    assert report.compute.primary_flops is None and report.compute.estimates == {}
    assert report.compute.withheld_reason.startswith("not measured")
    assert report.verdict.outcome is None and report.verdict.judged_flops is None


def test_the_reasons_recorded_are_the_reports_reason_and_a_failure_is_failed(job, tmp_path):
    record("torch")
    record("not_attached", reason="the Trainer subclass x.Y builds no callbacks")
    record("problem", where="hf attach", detail="RuntimeError: boom")
    record("not_attached", reason="the Trainer subclass x.Y builds no callbacks")  # once
    _, said = _finish(job, tmp_path, status=3)
    report = read_report(tmp_path / "flops_meter.json")
    assert report.attach.reason == (
        "the Trainer subclass x.Y builds no callbacks; hf attach failed: RuntimeError: boom"
    )
    assert report.run.status == "failed"
    assert report.run.error == "the command exited with status 3"
    assert "(failed, no verdict: not measured: the Trainer subclass" in said


@pytest.mark.parametrize("fmt", ["text", "md", "html"])
def test_every_human_form_says_not_measured_and_why(fmt):
    report = unattached_report([{"event": "torch"}], exit_status=0, environ={})
    shown = render(report, fmt)
    assert "NOT MEASURED" in shown
    assert "no Hugging Face or Lightning Trainer was built" in shown
    assert "not measured: no meter saw this run" in shown
    assert " 0 non-padding" not in shown  # never a zero for what nobody counted
    assert "0.0 s" not in shown  # nor a training time nobody timed


@pytest.mark.parametrize("fmt", ["text", "md", "html", "json", "sagemaker"])
def test_the_report_command_reads_the_unattached_report(job, tmp_path, fmt, capsys):
    record("torch")
    _finish(job, tmp_path)
    for command in ("report", "show"):
        assert main([command, str(tmp_path / "flops_meter.json"), "--format", fmt]) == 0
        out = capsys.readouterr().out
        if fmt == "json":
            assert json.loads(out)["attach"]["method"] is None
        elif fmt == "sagemaker":
            assert json.loads(out)["tokens_processed"] is None
        else:
            assert "NOT MEASURED" in out


def test_the_ledger_records_the_unattached_report(job, tmp_path):
    record("torch")
    _finish(job, tmp_path)
    ledger = Ledger(tmp_path / "ledger.sqlite")
    report = read_report(tmp_path / "flops_meter.json")
    ledger.append(report)
    (kept,) = ledger.records()
    assert kept.run_id == report.run.run_id
    assert ledger.verify().ok


def test_a_schema_2_0_report_reads_as_2_1(tmp_path):
    data = json.loads(FlopReport(run=RunSection(status="running")).to_json())
    data["schema_version"] = "2.0"
    del data["attach"]  # 2.0 had no attach section
    path = tmp_path / "old.json"
    path.write_text(json.dumps(data))
    report = read_report(path)
    assert report.attach is None and report.tokens.tokens_processed == 0


def test_null_counts_are_refused_in_a_metered_report(tmp_path):
    data = json.loads(FlopReport(run=RunSection(status="running")).to_json())
    data["tokens"]["micro_batches"] = None
    path = tmp_path / "r.json"
    path.write_text(json.dumps(data))
    with pytest.raises(ReportFileError, match=r"tokens\.micro_batches.*null, but a meter attached"):
        read_report(path)


def test_a_null_training_time_is_refused_in_a_metered_report(tmp_path):
    data = json.loads(FlopReport(run=RunSection(status="running")).to_json())
    data["run"]["training_duration_seconds"] = None
    path = tmp_path / "r.json"
    path.write_text(json.dumps(data))
    with pytest.raises(ReportFileError, match=r"run\.training_duration_seconds.*null, but a meter"):
        read_report(path)


def _gone_pid() -> int:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


def test_a_running_report_whose_writer_is_gone_is_named_so(job, tmp_path):
    pid = _gone_pid()
    report = FlopReport(run=RunSection(status="running", pid=pid, hostname=socket.gethostname()))
    path = tmp_path / "killed.json"
    report.write_json(path)
    record("torch")
    record("attached", method="optimizer", report=str(path))
    paths, said = _finish(job, tmp_path)
    assert paths == [path]
    assert said.startswith(f"flopmeter: report: {path} (running: its writer, pid {pid}, is gone")
    assert not (tmp_path / "flops_meter.json").exists()  # a meter started: no report of its own


def test_one_line_per_rank_0_report_each_once(job, tmp_path):
    final = FlopReport(
        run=RunSection(status="completed", ended_at="2026-01-01T00:00:00+00:00"),
        verdict=VerdictSection(outcome="below_threshold"),
    )
    path = tmp_path / "r.json"
    final.write_json(path)
    record("torch")
    record("attached", method="hf_trainer", report=str(path))
    record("attached", method="hf_trainer", report=str(path))
    # rank 1's record is not the job's report
    folder_file = job / "999999.jsonl"
    folder_file.write_text(
        json.dumps({"event": "attached", "rank": 1, "time": 1.0, "report": "/elsewhere.json"})
        + "\n"
    )
    assert len(read_records(job)) == 4
    paths, said = _finish(job, tmp_path)
    assert paths == [path]
    assert said.splitlines() == [f"flopmeter: report: {path} (completed, below_threshold)"]


def test_an_explicit_meter_without_a_file_is_said(job, tmp_path):
    record("torch")
    record("explicit", report=None)
    paths, said = _finish(job, tmp_path)
    assert paths == []
    assert "the script's own meter writes no report file" in said
    assert not (tmp_path / "flops_meter.json").exists()


def test_the_output_option_and_a_file_that_is_not_a_report(job, tmp_path, monkeypatch):
    record("torch")
    monkeypatch.setenv("FLOPMETER_OUTPUT", "out/")
    paths, _ = _finish(job, tmp_path)
    assert paths == [tmp_path / "out" / "flops_meter.json"]
    other = tmp_path / "notes.json"
    other.write_text('{"mine": 1}\n')
    monkeypatch.setenv("FLOPMETER_OUTPUT", str(other))
    (path,) = _finish(job, tmp_path)[0]
    assert other.read_text() == '{"mine": 1}\n'  # never replaced
    assert path == tmp_path / f"notes.{read_report(path).run.run_id}.json"


def test_a_report_of_nothing_never_replaces_a_measurement(job, tmp_path):
    """A later process of the switch alone (an evaluation script importing torch) must not
    write its report of nothing over the training run's report."""
    measured = FlopReport(run=RunSection(run_id="train1", status="running"))
    measured.write_json(tmp_path / "flops_meter.json")
    record("torch")
    (path,) = _finish(job, tmp_path)[0]
    assert read_report(tmp_path / "flops_meter.json").run.run_id == "train1"
    assert read_report(path).attach.method is None and path.parent == tmp_path


def test_on_sagemaker_the_copy_is_written_too(job, tmp_path, monkeypatch):
    record("torch")
    copy = tmp_path / "sm" / "flops_meter.json"
    monkeypatch.setenv("FLOPS_METER_OUT", str(copy))
    monkeypatch.setenv("TRAINING_JOB_NAME", "job-x")
    _finish(job, tmp_path)
    keyed = json.loads(copy.read_text())
    assert keyed["tokens_processed"] is None and keyed["Flops_architecture"] is None
    assert keyed["training_job_name"] == "job-x" and keyed["schema_version"] == "2.2"
    full = read_report(copy.with_name("flopmeter_report.json"))
    assert full.attach.method is None


def test_an_earlier_sagemaker_copy_is_left_as_it_is(job, tmp_path, monkeypatch):
    record("torch")
    copy = tmp_path / "sm.json"
    copy.write_text('{"N_total": 5}\n')  # the training process's AWS-keyed copy
    monkeypatch.setenv("FLOPS_METER_OUT", str(copy))
    _, said = _finish(job, tmp_path)
    assert copy.read_text() == '{"N_total": 5}\n'
    assert "is another run's: left as it is" in said


@pytest.mark.slow
def test_upload_stores_the_unattached_report(job, tmp_path, aws, capsys):
    record("torch")
    (path,) = _finish(job, tmp_path)[0]
    run_id = read_report(path).run.run_id
    args = ["upload", str(path), "--s3", f"s3://{aws['name']}/pipe",
            "--dynamodb-table", aws["name"], "--endpoint-url", aws["url"]]  # fmt: skip
    assert main(args) == 0, capsys.readouterr().err
    body = aws["s3"].get_object(Bucket=aws["name"], Key=f"pipe/{run_id}.json")["Body"].read()
    assert json.loads(body)["tokens"]["tokens_processed"] is None
    assert f"stored: dynamodb://{aws['name']} run_id={run_id}" in capsys.readouterr().out


@pytest.mark.parametrize("fmt", ["text", "md", "html"])
def test_an_attached_report_shows_how_it_attached_and_what_it_did_not_see(fmt):
    from flopmeter.report.context import AttachSection

    attach = AttachSection(
        method="optimizer",
        launcher="environment",
        job_id="j1",
        model_class="mypkg.Net",
        found="mypkg.Net: the module whose parameters torch.optim.AdamW steps",
        unseen_micro_batches=True,
    )
    shown = render(FlopReport(attach=attach), fmt)
    assert "Zero-code metering" in shown
    assert "a FlopMeter on the module whose parameters the first optimizer stepped" in shown
    assert "mypkg.Net: the module whose parameters torch.optim.AdamW steps" in shown
    assert "training micro-batches ran before the meter attached" in shown
    assert "NOT MEASURED" not in shown
    assert "Zero-code metering" not in render(FlopReport(), fmt)  # the script's own meter


def test_a_node_without_rank_0_says_where_the_jobs_report_is(job, tmp_path):
    """The second node of a 2 x 2 torchrun job: its ranks 2 and 3 attached, rank 0 writes the
    report on the first node. The node's job end says so, where it said nothing."""
    for rank in (3, 2):
        line = {"event": "attached", "rank": rank, "time": float(rank), "method": "optimizer",
                "report": "/shared/out/flops_meter.json"}  # fmt: skip
        (job / f"{rank}.jsonl").write_text(json.dumps(line) + "\n")
    paths, said = _finish(job, tmp_path)
    assert paths == [] and not (tmp_path / "flops_meter.json").exists()
    assert said.strip() == (
        "flopmeter: no report on this node: its rank(s) 2, 3 fed the job's one report, which "
        "rank 0 writes on its own node; this node's ranks named it /shared/out/flops_meter.json"
    )
    assert other_node_line([1], []) == (
        "flopmeter: no report on this node: its rank(s) 1 fed the job's one report, which rank "
        "0 writes on its own node"
    )


def test_a_process_in_a_temporary_folder_reports_in_the_folder_the_job_started_in(
    tmp_path, monkeypatch
):
    """A Ray Train worker runs in Ray's session folder (under the temporary folder, deleted with
    the session): its zero-code report goes to the root's folder; elsewhere, to its own."""
    import tempfile

    from flopmeter.auto import JOB_CWD_ENV, default_report_folder

    temp, started, elsewhere = (tmp_path / name for name in ("temp", "started", "elsewhere"))
    for folder in (temp / "ray" / "session", started, elsewhere):
        folder.mkdir(parents=True)
    monkeypatch.setattr(tempfile, "tempdir", str(temp))
    env = {JOB_CWD_ENV: str(started)}
    monkeypatch.chdir(temp / "ray" / "session")
    assert default_report_folder(env) == str(started)
    assert default_report_folder({}) == str(temp / "ray" / "session")  # no root: its own
    monkeypatch.chdir(elsewhere)  # a script that chdir'd to its run folder keeps it
    assert default_report_folder(env) == str(elsewhere)
