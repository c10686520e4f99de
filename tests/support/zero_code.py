"""Running an unmodified script under zero-code metering, as a user would: in a new Python
process, switched on by the environment alone (``FLOPMETER_AUTO=1``, read by the
``flopmeter-auto.pth`` the install put into site-packages) or by ``flopmeter run -- CMD``.

``flopmeter run`` itself runs in the test's process unless asked (``cli_process=True``: the
tests of the command as a process, tests/test_cli_run.py): its ``main`` with the same
arguments, environment and folder, which starts the command as a new process as it always does;
a process of its own would only import torch again (seconds a launch)."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import tempfile
import threading
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path

#: The two ways a user switches zero-code metering on.
LAUNCHERS = ("environment", "flopmeter run")


def clean_env(extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """The test process's environment without flopmeter's variables (a job's, an option's),
    one thread per process, plus ``extra``."""
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith("FLOPMETER_") and k not in ("PRETRAIN_FLOPS", "FLOPS_METER_OUT")
    }
    env.update({"OMP_NUM_THREADS": "1", "FLOPMETER_NVML": "0", "TOKENIZERS_PARALLELISM": "false"})
    env.update(extra or {})
    return env


def launch(
    command: Sequence[str],
    *,
    launcher: str,
    cwd: Path,
    options: Sequence[str] = (),
    env: Mapping[str, str] | None = None,
    timeout: float = 300,
    cli_process: bool = False,
) -> subprocess.CompletedProcess[str]:
    """Runs ``command`` (e.g. ``[sys.executable, "train.py"]``) under zero-code metering.

    Args:
        command: The user's command, unchanged.
        launcher: ``"environment"`` (``FLOPMETER_AUTO=1``; ``options`` must be empty: give
            them as ``FLOPMETER_*`` variables in ``env``) or ``"flopmeter run"``
            (``flopmeter run [options] -- command``).
        cwd: The folder it runs in.
        options: ``flopmeter run``'s meter flags.
        env: Variables added to the cleaned environment.
        timeout: Seconds before the run is killed (the test fails).
        cli_process: ``flopmeter run`` in a process of its own (``python -m flopmeter.cli``),
            not in this one (:func:`cli_here`).
    """
    environ = clean_env(env)
    if launcher == "environment":
        assert not options, "give the options as FLOPMETER_* variables under the environment"
        environ["FLOPMETER_AUTO"] = "1"
        full = list(command)
    elif launcher == "flopmeter run":
        argv = ["run", *options, "--", *command]
        if not cli_process:
            return cli_here(argv, cwd=cwd, env=environ, timeout=timeout)
        full = [sys.executable, "-m", "flopmeter.cli", *argv]
    else:
        raise ValueError(f"unknown launcher {launcher!r}")
    return subprocess.run(
        full, cwd=cwd, env=environ, capture_output=True, text=True, timeout=timeout, check=False
    )


def cli_here(
    argv: Sequence[str], *, cwd: Path, env: Mapping[str, str], timeout: float = 300
) -> subprocess.CompletedProcess[str]:
    """``flopmeter ARGV`` run in this process as ``python -m flopmeter.cli ARGV`` would run
    it in ``cwd`` with exactly the environment ``env``: ``os.environ`` and the working folder
    are its own for the call, its exit status is the returned code (``SystemExit`` included),
    and what it and the processes it starts print is the result's stdout and stderr (file
    descriptors 1 and 2 point at files for the call). A command still running after
    ``timeout`` seconds is killed, and ``subprocess.TimeoutExpired`` raised, as
    ``subprocess.run`` does."""
    from flopmeter.cli import main

    full = [sys.executable, "-m", "flopmeter.cli", *argv]
    with (
        tempfile.TemporaryFile() as out,
        tempfile.TemporaryFile() as err,
        _killed_after(timeout) as fired,
    ):
        with _environment(env, cwd), _output_to(out, err):
            try:
                code = main(list(argv))
            except SystemExit as exc:  # argparse's errors, --help
                code = exc.code if isinstance(exc.code, int) else int(exc.code is not None)
        stdout, stderr = (_text(f) for f in (out, err))
    if fired.is_set():
        raise subprocess.TimeoutExpired(full, timeout, output=stdout, stderr=stderr)
    return subprocess.CompletedProcess(full, code, stdout, stderr)


def _text(file) -> str:
    file.seek(0)
    return file.read().decode("utf-8", errors="replace")


@contextlib.contextmanager
def _environment(env: Mapping[str, str], cwd: Path) -> Iterator[None]:
    saved, here = dict(os.environ), os.getcwd()
    os.environ.clear()
    os.environ.update(env)
    os.chdir(cwd)
    try:
        yield
    finally:
        os.chdir(here)
        os.environ.clear()
        os.environ.update(saved)


@contextlib.contextmanager
def _output_to(out, err) -> Iterator[None]:
    """File descriptors 1 and 2 (the command's, inherited) and ``sys.stdout``/``sys.stderr``
    (the CLI's own lines, line-buffered onto those descriptors, so the two keep their order)
    into ``out`` and ``err``."""
    streams = sys.stdout, sys.stderr
    for stream in streams:
        stream.flush()
    saved = os.dup(1), os.dup(2)
    os.dup2(out.fileno(), 1)
    os.dup2(err.fileno(), 2)
    sys.stdout, sys.stderr = (
        open(fd, "w", encoding="utf-8", errors="replace", buffering=1, closefd=False)  # noqa: SIM115
        for fd in (1, 2)
    )
    try:
        yield
    finally:
        for stream in (sys.stdout, sys.stderr):
            stream.close()  # flushes; closefd=False leaves the descriptor
        sys.stdout, sys.stderr = streams
        for fd, copy in zip((1, 2), saved, strict=True):
            os.dup2(copy, fd)
            os.close(copy)


def _children() -> set[int]:
    """The pids of this process's children (Linux's /proc; none known elsewhere)."""
    found: set[int] = set()
    for task in Path(f"/proc/{os.getpid()}/task").glob("*/children"):
        with contextlib.suppress(OSError, ValueError):
            found.update(int(pid) for pid in task.read_text().split())
    return found


@contextlib.contextmanager
def _killed_after(timeout: float) -> Iterator[threading.Event]:
    """Kills the children this process starts inside the block that still run after
    ``timeout`` seconds (the event yielded is then set)."""
    before, fired = _children(), threading.Event()

    def kill() -> None:
        fired.set()
        for pid in _children() - before:
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)

    timer = threading.Timer(timeout, kill)
    timer.daemon = True
    timer.start()
    try:
        yield fired
    finally:
        timer.cancel()
