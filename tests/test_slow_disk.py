"""No training step waits for the file system (issue 22): a real metered training loop whose
report writes are held in ``os.fsync`` (on the report's folder) until the test lets each go, up
to 30 s. Steps that end while a write is held did not wait for it: a test of behaviour that no
load on the machine can pass or fail by timing (a step that waited would end only with the
write, which the test lets go only after its steps)."""

from __future__ import annotations

import json
import os
import tempfile
import threading
import time
from pathlib import Path

import pytest
import torch

import flopmeter.run.reporter
from flopmeter import FlopMeter
from flopmeter.report.reading import read_report
from flopmeter.report.writing import ReportFile
from tests.support.batches import PAD_ID, padded_batch
from tests.support.models import tiny_llama

pytestmark = pytest.mark.slow

BATCH = padded_batch([4, 2], 6)  # 6 real tokens per micro-batch
TOKENS_PER_STEP = int(BATCH["attention_mask"].sum())
HANG = 30.0  # seconds a held write waits for the test at most (then it goes on)


class HeldWrites:
    """``os.fsync`` on files in ``folder`` that holds each write until the test lets it go
    (:meth:`let_go`; :attr:`open` lets every write through), ``HANG`` s at most; records which
    thread wrote, how many writes began and ended, and whether one ever waited ``HANG`` s."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, folder: Path) -> None:
        self.folder = str(folder)
        self.open = threading.Event()
        self._tickets = threading.Semaphore(0)
        self._changed = threading.Condition()
        self.threads: list[threading.Thread] = []
        self.begun = self.ended = 0
        self.timed_out = False
        self._real = os.fsync
        monkeypatch.setattr(os, "fsync", self._fsync)

    def _fsync(self, fd: int) -> None:
        if os.readlink(f"/proc/self/fd/{fd}").startswith(self.folder):
            with self._changed:
                self.threads.append(threading.current_thread())
                self.begun += 1
                self._changed.notify_all()
            if not self.open.is_set() and not self._tickets.acquire(timeout=HANG):
                self.timed_out = True
            with self._changed:
                self.ended += 1
                self._changed.notify_all()
        self._real(fd)

    def let_go(self, n: int = 1) -> None:
        """Lets the next ``n`` held writes go on."""
        self._tickets.release(n)

    def wait(self, what, timeout: float = 60) -> None:
        """Waits until ``what()`` (of this object) is true."""
        with self._changed:
            assert self._changed.wait_for(lambda: what(self), timeout), "the writes never came"


def _step(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> None:
    model(**BATCH).loss.backward()
    optimizer.step()  # the meter's step hook: the refresh, when due
    optimizer.zero_grad()


def _built_where(monkeypatch: pytest.MonkeyPatch) -> list[threading.Thread]:
    """The thread each running report of the periodic refresh is built on."""
    threads: list[threading.Thread] = []
    real = flopmeter.run.reporter.make_report

    def make_report(facts, *args, **kwargs):
        threads.append(threading.current_thread())
        return real(facts, *args, **kwargs)

    monkeypatch.setattr(flopmeter.run.reporter, "make_report", make_report)
    return threads


def test_no_training_step_waits_for_a_slow_report_write(tmp_path, monkeypatch):
    out = tmp_path / "out" / "r.json"
    model = tiny_llama()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    meter = FlopMeter(model, PAD_ID, output=out, refresh_seconds=0.05, nvml=False).start()
    writes = HeldWrites(monkeypatch, out.parent)  # after the start: its first write is its own
    built_on = _built_where(monkeypatch)
    trained = 0
    for round_ in range(3):  # three refreshes, each held in its write while the loop trains
        while writes.begun <= round_:
            _step(model, optimizer)
            trained += 1
        before = out.read_bytes()
        for _ in range(10):  # a step that waited for the write would wait until it was let go
            _step(model, optimizer)
        trained += 10
        assert writes.ended == round_ and out.read_bytes() == before  # still held
        writes.let_go()
        writes.wait(lambda w, n=round_ + 1: w.ended == n)
        landed = _landed(out, before)  # the refresh reached the file, with the counts it took
        assert landed.run.status == "running" and 0 < landed.tokens.optimizer_steps < trained
        assert landed.tokens.tokens_processed == TOKENS_PER_STEP * landed.tokens.optimizer_steps
    assert not writes.timed_out
    main = threading.main_thread()
    assert all(thread is not main for thread in writes.threads)  # every write the writer's
    assert built_on and all(thread is not main for thread in built_on)  # every build too

    writes.open.set()
    writes.let_go(100)
    report = meter.stop()
    final = read_report(out)
    assert final.run.status == "completed" and final.run.run_id == report.run.run_id
    assert final.tokens.optimizer_steps == trained
    assert final.tokens.tokens_processed == TOKENS_PER_STEP * trained


def _landed(out: Path, before: bytes):
    """The report at ``out`` once it is no longer ``before`` (the rename follows the fsync)."""
    deadline = time.monotonic() + 30
    while out.read_bytes() == before:
        assert time.monotonic() < deadline, "the write ended but the file never changed"
        time.sleep(0.01)
    return read_report(out)


def test_a_file_system_that_hangs_mid_run_holds_no_step_and_stop_keeps_the_report(
    tmp_path, monkeypatch, caplog
):
    fallback = tmp_path / "fallback"
    fallback.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(fallback))
    monkeypatch.setattr(ReportFile, "final_wait_seconds", 1.0)
    out = tmp_path / "out" / "r.json"
    model = tiny_llama()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    meter = FlopMeter(model, PAD_ID, output=out, refresh_seconds=0.05, nvml=False).start()
    writes = HeldWrites(monkeypatch, out.parent)  # from now on the mount does not answer
    trained = 0
    while writes.begun == 0:
        _step(model, optimizer)
        trained += 1
    for _ in range(20):  # a step that waited for the write would wait the whole hang
        _step(model, optimizer)
    trained += 20
    assert writes.ended == 0  # the refresh is still stuck in its write
    try:
        with caplog.at_level("ERROR", logger="flopmeter"):
            begun = time.monotonic()
            report = meter.stop()
            took = time.monotonic() - begun
        assert writes.ended == 0  # stop() returned with the write still stuck
        assert ReportFile.final_wait_seconds <= took < HANG / 2  # its bound, not the hang's
        assert report.run.status == "completed" and report.tokens.optimizer_steps == trained
        (copy,) = fallback.iterdir()  # the final report is not lost: its copy, and the log
        assert json.loads(copy.read_text()) == json.loads(report.to_json())
        assert str(out) in caplog.text and str(copy) in caplog.text
    finally:
        writes.open.set()
        writes.let_go(100)
    deadline = time.monotonic() + 20  # the mount answers again: the final report lands
    while json.loads(out.read_text())["run"]["status"] != "completed":
        assert time.monotonic() < deadline, "the final report never reached the file"
        time.sleep(0.02)
    assert read_report(out).tokens.tokens_processed == TOKENS_PER_STEP * trained
    assert not writes.timed_out
