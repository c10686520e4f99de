"""Runs made once per test session and copied to each test that needs one: the deterministic
baselines (a script run plainly, or edited to meter itself) that several tests compare their
own metered run with. A baseline of one argument set is the same files every time, so the
session makes it once, under the base temp folder the session's xdist workers share, behind a
file lock (two workers asking at once: one makes it, the other waits and copies it), and each
test gets its own copy where it would have made it. Each test still makes, and asserts on, its
own metered run. A run that fails is made again by the next test that asks, and fails there
too, so each such test fails with the run's own message."""

from __future__ import annotations

import hashlib
import os
import shutil
from collections.abc import Callable
from pathlib import Path

from filelock import FileLock


class SharedRuns:
    """The session's made-once runs, in folders under ``root``."""

    def __init__(self, root: Path) -> None:
        self.root = root
        root.mkdir(parents=True, exist_ok=True)

    def folder(self, key: str, make: Callable[[Path], object]) -> Path:
        """The folder ``make(folder)`` filled for ``key``: made on the session's first ask,
        the same folder after it (never written to again: copy it, :meth:`copy`)."""
        name = hashlib.sha256(key.encode()).hexdigest()[:16]
        folder, done = self.root / name, self.root / f"{name}.done"
        with FileLock(str(self.root / f"{name}.lock")):
            if not done.exists():
                shutil.rmtree(folder, ignore_errors=True)  # an earlier failed try's leavings
                folder.mkdir()
                make(folder)
                done.write_text(key, encoding="utf-8")
        return folder

    def copy(self, key: str, dest: Path, make: Callable[[Path], object]) -> Path:
        """``dest`` filled with a copy of :meth:`folder`'s files for ``key``."""
        shutil.copytree(self.folder(key, make), dest, dirs_exist_ok=True)
        return dest


def session_root(base_temp: Path) -> Path:
    """Where a session keeps its made-once runs: beside its xdist workers' base temp folders
    (``.../pytest-N/popen-gwK``: their parent is the run's alone), or under the base temp
    folder itself without xdist."""
    shared = base_temp.parent if os.environ.get("PYTEST_XDIST_WORKER") else base_temp
    return shared / "shared-runs"


def plain_example_run(folder: Path) -> None:
    """examples/raw_loop.py run plainly in ``folder`` (as ``scripts/example`` runs it, no
    zero-code metering): its ``flops_meter.json`` and what it printed (``stdout.txt``)."""
    import subprocess
    import sys

    from tests.support.zero_code import clean_env

    script = Path(__file__).resolve().parents[2] / "examples" / "raw_loop.py"
    cmd = [sys.executable, str(script)]
    proc = subprocess.run(cmd, cwd=folder, env=clean_env(), capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-3000:]
    (folder / "stdout.txt").write_text(proc.stdout, encoding="utf-8")
