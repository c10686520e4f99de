"""A SIGTERM to a job's process group while a DataLoader's workers run: the workers' deaths
make PyTorch's SIGCHLD handler raise in the main thread, which used to land in the middle of the
meter's interrupted report (the file left ``running``, or written with no ledger record: 4 of 8
runs on the 2-core VM). Other signals' handlers are now held while a final report is written."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from flopmeter.ledger.store import Ledger
from flopmeter.run.signals import held_signals
from tests.support.zero_code import clean_env

SCRIPT = Path(__file__).parent / "scripts" / "dataloader_sigterm.py"


def test_a_signal_during_the_held_section_is_handled_after_it():
    seen: list[str] = []

    def raising(signum, frame):
        seen.append("handler")
        raise RuntimeError("a worker died")

    previous = signal.signal(signal.SIGUSR1, raising)
    try:
        with pytest.raises(RuntimeError, match="a worker died"), held_signals():
            os.kill(os.getpid(), signal.SIGUSR1)
            time.sleep(0.01)  # the handler would run here, between bytecodes
            seen.append("body done")
        assert seen == ["body done", "handler"]
        assert signal.getsignal(signal.SIGUSR1) is raising  # put back
    finally:
        signal.signal(signal.SIGUSR1, previous)


def _killed_run(folder: Path) -> tuple[dict, list[str]]:
    proc = subprocess.Popen(
        [sys.executable, str(SCRIPT), str(folder)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=clean_env(),
    )
    try:
        assert proc.stdout.readline().strip() == "ready", proc.stderr.read()[-3000:]
        os.killpg(proc.pid, signal.SIGTERM)  # the main process and its workers
        proc.wait(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    report = json.loads((folder / "r.json").read_text())
    ledger = [r.report()["run"]["status"] for r in Ledger(folder / "l.db").records()]
    return report, ledger


@pytest.mark.slow
def test_a_group_sigterm_with_dataloader_workers_leaves_file_and_ledger_agreeing(tmp_path):
    for n in range(8):
        folder = tmp_path / f"run{n}"
        folder.mkdir()
        report, ledger = _killed_run(folder)
        status = report["run"]["status"]
        assert (status, ledger) == ("interrupted", ["interrupted"]), (n, report["notes"])
        assert report["tokens"]["micro_batches"] >= 6
