"""The meter appends its final report to the ledger: completed, failed or interrupted, once, by
rank 0 only, and a ledger that fails never costs the run or its report file."""

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
import torch.multiprocessing as mp

from flopmeter import FlopMeter
from flopmeter.errors import ConfigurationError
from flopmeter.ledger.store import Ledger
from tests.support.batches import PAD_ID, Truth, padded_batch
from tests.support.dist import gloo_group
from tests.support.models import tiny_llama

# spawns gloo processes: one rerun for gloo's teardown abort alone (tests/conftest.py)
pytestmark = pytest.mark.gloo

ROWS = [[5, 9, 16, 3], [7, 7, 2, 12]]  # non-padding lengths of two micro-batches


def _train(meter_kwargs: dict, fail: BaseException | None = None) -> tuple[FlopMeter, Truth]:
    model = tiny_llama()
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-2)
    truth = Truth()
    meter = FlopMeter(model, PAD_ID, **meter_kwargs)
    try:
        with meter:
            for i, rows in enumerate(ROWS):
                model(**padded_batch(rows, 16, seed=i)).loss.backward()
                optimizer.step()
                optimizer.zero_grad()
                truth.add(rows, 16)
                if fail is not None:
                    raise fail
    except (RuntimeError, KeyboardInterrupt):
        pass
    return meter, truth


@pytest.mark.slow
@pytest.mark.parametrize(
    ("fail", "status"),
    [(None, "completed"), (RuntimeError("boom"), "failed"), (KeyboardInterrupt(), "interrupted")],
)
def test_the_final_report_is_appended_once_whatever_the_end(tmp_path, fail, status):
    path = tmp_path / "ledger.sqlite"
    meter, truth = _train({"ledger": path, "output": tmp_path / "r.json"}, fail)
    records = Ledger(path, create=False).records()
    assert len(records) == 1
    record = records[0]
    assert record.run_id == meter.run_id
    report = record.report()
    assert report["run"]["status"] == status
    assert report["tokens"]["tokens_processed"] == truth.tokens  # counted by the test itself
    # the ledger holds exactly the report the file holds
    assert report == json.loads((tmp_path / "r.json").read_text())
    assert Ledger(path, create=False).verify().ok


@pytest.mark.slow
def test_the_environment_variable_turns_the_ledger_on_and_false_turns_it_off(tmp_path, monkeypatch):
    path = tmp_path / "env.sqlite"
    monkeypatch.setenv("FLOPMETER_LEDGER", str(path))
    meter, _ = _train({})
    assert [r.run_id for r in Ledger(path, create=False).records()] == [meter.run_id]
    _train({"ledger": False})
    assert len(Ledger(path, create=False).records()) == 1


@pytest.mark.slow
def test_ledger_true_uses_the_per_user_ledger(tmp_path, monkeypatch):
    monkeypatch.delenv("FLOPMETER_LEDGER", raising=False)
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "data"))
    meter, _ = _train({"ledger": True})
    records = Ledger(tmp_path / "data" / "flopmeter" / "ledger.sqlite", create=False).records()
    assert [r.run_id for r in records] == [meter.run_id]


def test_a_bad_ledger_fails_when_the_meter_is_made(tmp_path):
    model = tiny_llama()
    not_ledger = tmp_path / "notes.txt"
    not_ledger.write_text("hello")
    with pytest.raises(ConfigurationError, match="not a flopmeter ledger"):
        FlopMeter(model, ledger=not_ledger)
    blocker = tmp_path / "file"
    blocker.write_text("x")
    with pytest.raises(ConfigurationError, match="cannot be made"):
        FlopMeter(model, ledger=blocker / "sub" / "ledger.sqlite")
    with pytest.raises(ConfigurationError, match="ledger must be"):
        FlopMeter(model, ledger=1.5)
    assert not model._forward_pre_hooks  # nothing was started


@pytest.mark.slow
def test_a_ledger_failing_at_the_end_costs_neither_the_run_nor_its_file(tmp_path, caplog):
    path = tmp_path / "ledger.sqlite"
    model = tiny_llama()
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-2)
    with (
        caplog.at_level(logging.WARNING, logger="flopmeter"),
        FlopMeter(model, PAD_ID, ledger=path, output=tmp_path / "r.json") as meter,
    ):
        model(**padded_batch([4, 6], 8)).loss.backward()
        optimizer.step()
        path.unlink()
        path.write_text("replaced by something else")  # the ledger is gone
    report = json.loads((tmp_path / "r.json").read_text())
    assert report["run"]["status"] == "completed" and report["tokens"]["tokens_processed"] == 10
    assert any("ledger record of this run could not be appended" in n for n in report["notes"])
    assert meter.report().notes == report["notes"]
    assert "not appended to the ledger" in caplog.text


# ---------------------------------------------------------------------------- rank 0 only
def _rank_worker(rank: int, world: int, store: str, out_dir: str) -> None:
    with gloo_group(rank, world, store):
        model = tiny_llama()
        optimizer = torch.optim.SGD(model.parameters(), lr=1e-2)
        ledger = Path(out_dir) / "shared.sqlite"  # every rank is told the same ledger
        with FlopMeter(model, PAD_ID, ledger=ledger) as meter:
            model(**padded_batch([3 + rank, 5], 8, seed=rank)).loss.backward()
            optimizer.step()
        Path(out_dir, f"run{rank}.txt").write_text(meter.run_id)


@pytest.mark.slow
def test_only_rank_zero_appends(tmp_path):
    mp.spawn(_rank_worker, args=(2, str(tmp_path / "store"), str(tmp_path)), nprocs=2, join=True)
    records = Ledger(tmp_path / "shared.sqlite", create=False).records()
    assert len(records) == 1
    assert records[0].run_id == (tmp_path / "run0.txt").read_text()
    report = records[0].report()
    assert report["run"]["world_size"] == 2
    assert report["tokens"]["tokens_processed"] == (3 + 5) + (
        4 + 5
    )  # both ranks' rows, summed once


# ---------------------------------------------------------------------------- SIGTERM
def _child(output: Path, mode: str, ledger: Path) -> subprocess.Popen:
    """tests/scripts/metered_loop.py with the ledger turned on by the environment variable."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path), "FLOPMETER_LEDGER": str(ledger)}
    loop = Path(__file__).parent / "scripts" / "metered_loop.py"
    return subprocess.Popen(
        [sys.executable, str(loop), str(output), mode],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
    )  # fmt: skip


def _wait_until_running(output: Path, child: subprocess.Popen) -> None:
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        try:
            if json.loads(output.read_text())["tokens"]["tokens_processed"] > 0:
                return
        except (OSError, ValueError, KeyError):
            pass
        assert child.poll() is None, child.communicate()
        time.sleep(0.05)
    child.kill()
    raise AssertionError("the child never refreshed its report")


@pytest.mark.slow
def test_sigterm_appends_the_interrupted_report(tmp_path):
    out, ledger = tmp_path / "r.json", tmp_path / "ledger.sqlite"
    child = _child(out, "default", ledger)
    _wait_until_running(out, child)
    child.send_signal(signal.SIGTERM)
    child.communicate(timeout=60)
    assert child.returncode == -signal.SIGTERM
    records = Ledger(ledger, create=False).records()
    assert [r.report()["run"]["status"] for r in records] == ["interrupted"]
    assert records[0].report() == json.loads(out.read_text())


@pytest.mark.slow
def test_a_run_that_goes_on_after_sigterm_appends_its_final_report_as_version_2(tmp_path):
    out, ledger = tmp_path / "r.json", tmp_path / "ledger.sqlite"
    child = _child(out, "handler", ledger)  # the user's handler ends the loop cleanly
    _wait_until_running(out, child)
    child.send_signal(signal.SIGTERM)
    child.communicate(timeout=60)
    assert child.returncode == 0
    store = Ledger(ledger, create=False)
    records = store.records()
    assert [(r.version, r.report()["run"]["status"]) for r in records] == [
        (1, "interrupted"),
        (2, "completed"),
    ]
    assert len({r.run_id for r in records}) == 1
    assert records[1].report() == json.loads(out.read_text())
    assert store.verify().ok
