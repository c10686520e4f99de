"""Never a lost or stale report (issue 10): the report's life on disk, with real processes.

A child process trains under FlopMeter (tests/scripts/metered_loop.py: 10 real tokens per
optimizer step); the test signals or kills it and reads what is on disk.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from flopmeter import FlopMeter
from flopmeter.cli import main
from flopmeter.errors import ConfigurationError
from tests.support.batches import PAD_ID, padded_batch
from tests.support.models import tiny_llama

pytestmark = pytest.mark.slow

LOOP = Path(__file__).parent / "scripts" / "metered_loop.py"
TOKENS_PER_STEP = 10


def _start(output: Path, mode: str) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, str(LOOP), str(output), mode],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
    )


def _read(path: Path) -> dict | None:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def _wait_for_counts(path: Path, child: subprocess.Popen, timeout: float = 120.0) -> dict:
    """The running report once it shows trained tokens (a refresh happened)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        report = _read(path)
        if (
            report
            and report["run"]["status"] == "running"
            and report["tokens"]["tokens_processed"] > 0
        ):
            return report
        if child.poll() is not None:
            raise AssertionError(f"the child ended early: {child.communicate()}")
        time.sleep(0.05)
    child.kill()
    raise AssertionError("no refreshed running report appeared")


def test_sigterm_writes_an_interrupted_report_then_dies_as_before(tmp_path):
    out = tmp_path / "flops_meter.json"
    child = _start(out, "default")
    running = _wait_for_counts(out, child)
    assert running["run"]["pid"] == child.pid and running["run"]["ended_at"] is None
    child.send_signal(signal.SIGTERM)
    stdout, stderr = child.communicate(timeout=60)
    assert child.returncode == -signal.SIGTERM  # killed by SIGTERM, as without the meter
    final = json.loads(out.read_text())
    steps = stdout.count("step ")
    assert final["run"]["status"] == "interrupted"
    assert "SIGTERM" in final["run"]["error"]
    assert final["run"]["run_id"] == running["run"]["run_id"]
    # the counts of the steps it made (the signal may land inside a step: at most one more)
    assert final["tokens"]["tokens_processed"] in (
        steps * TOKENS_PER_STEP,
        (steps + 1) * TOKENS_PER_STEP,
    )
    assert "Traceback" not in stderr


def test_sigterm_during_a_refresh_write_still_ends_with_an_interrupted_report(tmp_path):
    out = tmp_path / "flops_meter.json"
    child = _start(out, "signal_in_write")
    _, stderr = child.communicate(timeout=120)  # before the fix: a deadlock, no exit
    assert child.returncode == -signal.SIGTERM, stderr
    final = json.loads(out.read_text())
    assert final["run"]["status"] == "interrupted" and final["tokens"]["optimizer_steps"] >= 3


def test_sigterm_runs_the_handler_that_was_there_and_the_run_ends_cleanly(tmp_path):
    out = tmp_path / "flops_meter.json"
    child = _start(out, "handler")
    _wait_for_counts(out, child)
    child.send_signal(signal.SIGTERM)
    stdout, _ = child.communicate(timeout=60)
    assert child.returncode == 0
    assert "handler ran" in stdout and "clean exit" in stdout
    final = json.loads(out.read_text())
    # the user's handler stopped the loop cleanly: the final report replaced the interrupted one
    assert final["run"]["status"] == "completed"
    assert final["tokens"]["tokens_processed"] == stdout.count("step ") * TOKENS_PER_STEP


def test_after_sigkill_the_last_refresh_is_on_disk_and_says_running(tmp_path, capsys):
    out = tmp_path / "flops_meter.json"
    child = _start(out, "forever")
    _wait_for_counts(out, child)
    time.sleep(0.3)  # a few more refreshes
    child.kill()
    stdout, _ = child.communicate(timeout=60)
    last = json.loads(out.read_text())
    assert last["run"]["status"] == "running" and last["run"]["pid"] == child.pid
    assert 0 < last["tokens"]["tokens_processed"] <= stdout.count("step ") * TOKENS_PER_STEP
    with pytest.raises(ProcessLookupError):
        os.kill(last["run"]["pid"], 0)
    # the command line tells a reader that this report is incomplete, and why (the command
    # in this process: the reader's process is not what is checked here)
    capsys.readouterr()
    status = main(["show", str(out)])
    shown = capsys.readouterr()
    assert status == 0 and "Traceback" not in shown.err
    assert f"pid {child.pid} on this host) is gone" in shown.out


def test_a_second_writer_is_told_at_start(tmp_path):
    out = tmp_path / "flops_meter.json"
    child = _start(out, "forever")
    _wait_for_counts(out, child)
    model = tiny_llama()
    with pytest.raises(ConfigurationError, match="output"):
        FlopMeter(model, PAD_ID, output=out).start()
    assert json.loads(out.read_text())["run"]["pid"] == child.pid  # the first run's file, untouched
    child.kill()
    child.communicate(timeout=60)
    with FlopMeter(model, PAD_ID, output=out) as meter:  # the lock died with the process
        model(**padded_batch([3], 4)).loss.backward()
    assert json.loads(out.read_text())["run"]["run_id"] == meter.run_id


def test_an_earlier_runs_report_is_replaced_at_start(tmp_path):
    out = tmp_path / "flops_meter.json"
    model = tiny_llama()
    with FlopMeter(model, PAD_ID, output=out) as first:
        model(**padded_batch([3, 4], 6)).loss.backward()
    assert json.loads(out.read_text())["run"]["status"] == "completed"
    second = FlopMeter(model, PAD_ID, output=out).start()
    on_disk = json.loads(out.read_text())
    assert on_disk["run"]["status"] == "running" and on_disk["run"]["run_id"] == second.run_id
    assert on_disk["run"]["started_at"] is not None and on_disk["run"]["ended_at"] is None
    assert on_disk["run"]["run_id"] != first.run_id
    second.stop(RuntimeError("crash"))
    assert json.loads(out.read_text())["run"]["status"] == "failed"


def test_the_running_report_is_refreshed_while_training_runs(tmp_path):
    out = tmp_path / "flops_meter.json"
    model = tiny_llama()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    with FlopMeter(model, PAD_ID, output=out, refresh_seconds=0.01) as meter:
        for i in range(3):
            model(**padded_batch([2, 3], 4, seed=i)).loss.backward()
            optimizer.step()  # a refresh is due: the writer thread builds and writes it
            deadline = time.monotonic() + 30
            while (on_disk := json.loads(out.read_text()))["tokens"]["optimizer_steps"] <= i:
                assert time.monotonic() < deadline, "the refresh never reached the file"
                time.sleep(0.01)
            assert on_disk["run"]["status"] == "running"
            assert on_disk["tokens"]["tokens_processed"] == 5 * (i + 1)
            assert on_disk["tokens"]["optimizer_steps"] == i + 1
    assert meter.report().run.status == "completed"


def test_a_failed_final_write_is_an_error_with_the_numbers_and_no_stale_file(
    tmp_path, monkeypatch, caplog
):
    out = tmp_path / "flops_meter.json"
    model = tiny_llama()

    def disk_full(*args, **kwargs):
        raise OSError(28, "No space left on device")

    with (
        caplog.at_level(logging.ERROR, logger="flopmeter"),
        FlopMeter(model, PAD_ID, output=out) as meter,
    ):
        model(**padded_batch([3, 4], 6)).loss.backward()
        monkeypatch.setattr(os, "replace", disk_full)
    monkeypatch.undo()
    on_disk = json.loads(out.read_text())
    assert (
        on_disk["run"]["run_id"] == meter.run_id and on_disk["run"]["status"] == "running"
    )  # this run's
    errors = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert errors and '"tokens_processed": 7' in "\n".join(r.getMessage() for r in errors)


def test_a_refresh_that_cannot_be_built_is_a_noted_problem_and_the_file_keeps_its_report(
    tmp_path, monkeypatch
):
    import flopmeter.run.reporter

    def broken(*args, **kwargs):
        raise RuntimeError("no report today")

    out = tmp_path / "flops_meter.json"
    model = tiny_llama()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    with FlopMeter(model, PAD_ID, output=out, refresh_seconds=0.01, nvml=False) as meter:
        first = out.read_bytes()
        monkeypatch.setattr(flopmeter.run.reporter, "make_report", broken)  # the writer's build
        deadline = time.monotonic() + 30
        while "refresh" not in meter.problems:  # noted from the writer thread
            assert time.monotonic() < deadline, "the failed build was never noted"
            model(**padded_batch([2, 3], 4)).loss.backward()
            optimizer.step()
            time.sleep(0.01)
        assert "no report today" in meter.problems["refresh"]
        assert out.read_bytes() == first  # the last report written stays
        monkeypatch.undo()
    final = json.loads(out.read_text())
    assert final["run"]["status"] == "completed"
    assert any("refresh hook: RuntimeError: no report today" in n for n in final["notes"])
