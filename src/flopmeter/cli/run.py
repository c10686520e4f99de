"""``flopmeter run [meter options] -- CMD ARGS...``: a command metered with no change to it.

It checks the options first (a bad one exits 2 naming it, before the command starts), makes the
job folder, checks that zero-code metering starts in the command's Python
(:mod:`flopmeter.cli.command_python`: not ``python -S``, not a Python without flopmeter), and runs the command as a child process with zero-code metering switched on in every
Python process it starts (``FLOPMETER_AUTO=1`` and this package's ``sitecustomize`` folder first
on ``PYTHONPATH``) and the options as environment variables. It forwards SIGINT and SIGTERM to
the command, waits, ends the job (:func:`flopmeter.auto.finish.finish_job`: prints where the
report is, writes one when nothing attached) and exits with the command's status (128 + N for
a command killed by signal N; 127 for a command not found, 126 for one that cannot be run, as a
shell does). Its own failure never changes the command's status.

Run inside a job (a ``flopmeter run`` in a ``flopmeter run``, or under ``FLOPMETER_AUTO=1``
where another process is the job's root), it joins that job: the job's root names the reports
at the end, once.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import uuid
from collections.abc import Mapping
from datetime import datetime, timezone
from pathlib import Path
from types import FrameType
from typing import Any

from flopmeter.auto import (
    JOB_CWD_ENV,
    JOB_DIR_ENV,
    JOB_ID_ENV,
    JOB_ROOT_ENV,
    LAUNCHER_ENV,
    SWITCH_ENV,
)
from flopmeter.auto.env_options import add_option_flags, env_from_flags
from flopmeter.cli.command_python import check_command_python
from flopmeter.errors import ConfigurationError

__all__ = [
    "LAUNCHER",
    "SITE_FOLDER",
    "check_before_start",
    "command_env",
    "flags_named",
    "register",
    "run",
]

#: The launcher ``flopmeter run`` names in the job's variables and the report.
LAUNCHER = "flopmeter run"
#: The folder holding the ``sitecustomize`` put first on the command's ``PYTHONPATH``.
SITE_FOLDER = Path(__file__).resolve().parent.parent / "auto" / "site"
#: The signals passed on to the command.
FORWARDED = (signal.SIGINT, signal.SIGTERM)


def register(sub: Any) -> None:
    """Adds the ``run`` subcommand."""
    p = sub.add_parser(
        "run",
        help="run a training command with the meter attached, no code changed",
        description=__doc__.splitlines()[0].replace("``", ""),
        epilog="Example: flopmeter run --output runs/ --pretrain-flops catalog -- "
        "torchrun --nproc-per-node 2 train.py",
    )
    add_option_flags(p)
    p.add_argument("cmd", nargs=argparse.REMAINDER, metavar="-- CMD ARGS", help="the command")
    p.set_defaults(func=run)


def command_env(
    base: Mapping[str, str], options: Mapping[str, str], job: Mapping[str, str]
) -> dict[str, str]:
    """The command's environment: ``base``, the options' variables, the job's variables, the
    switch, and :data:`SITE_FOLDER` first on ``PYTHONPATH``."""
    env = {**base, **options, **job, SWITCH_ENV: "1"}
    rest = base.get("PYTHONPATH", "")
    env["PYTHONPATH"] = str(SITE_FOLDER) + (os.pathsep + rest if rest else "")
    return env


def _command(args: argparse.Namespace) -> list[str]:
    cmd = list(args.cmd or [])
    if cmd and cmd[0] == "--":
        cmd = cmd[1:]
    if not cmd:
        raise ConfigurationError("flopmeter run needs a command: flopmeter run [options] -- CMD")
    return cmd


def flags_named(message: str, given: Mapping[str, str]) -> str:
    """``message`` with each variable set by a flag the user typed named as that flag
    (``--pad-id``, not ``FLOPMETER_PAD_ID``)."""
    from flopmeter.auto.env_options import ENV_OPTIONS

    for option in ENV_OPTIONS:
        if option.env in given:
            message = message.replace(option.env, option.flag)
    return message


def check_before_start(options: Any) -> None:
    """What a meter refuses only once it is made, checked before the command starts: the
    report file can be written (not a special file, not a folder that cannot be made), every
    parent run is a report, and the ledger opens (it is made if new, as the meter would).

    Raises:
        ConfigurationError: the first that fails, naming it.
    """
    from flopmeter.report.output_path import check_writable
    from flopmeter.report.parent_runs import read_parent_runs

    if options.output is not None:
        check_writable(options.output)
    read_parent_runs(options.parent_runs, options.output)
    if options.ledger is not None:
        from flopmeter.ledger.store import Ledger

        Ledger(options.ledger)


def run(args: argparse.Namespace) -> int:
    """Runs the command (see the module); returns its exit status."""
    from flopmeter.auto.env_options import meter_options_from_env

    cmd = _command(args)
    joined: dict[str, str] = dict(getattr(args, "joined_job", None) or {})
    base = dict(os.environ)
    options = env_from_flags(args)
    try:  # a bad option: exit 2 before the command runs, named as the user gave it
        checked = meter_options_from_env({**base, **options})
        check_before_start(checked)
    except ConfigurationError as exc:
        raise ConfigurationError(flags_named(str(exc), options)) from None
    started = datetime.now(timezone.utc).isoformat(timespec="seconds")
    folder = None
    if joined:  # a flopmeter run inside a job: its root ends the job; its launcher, if it named one
        job = {LAUNCHER_ENV: LAUNCHER, **joined}
    else:
        folder = tempfile.mkdtemp(prefix="flopmeter-job-")
        job = {
            JOB_DIR_ENV: folder,
            JOB_ID_ENV: uuid.uuid4().hex[:16],
            JOB_ROOT_ENV: str(os.getpid()),  # no child is the root: this process is
            JOB_CWD_ENV: os.getcwd(),
            LAUNCHER_ENV: LAUNCHER,
        }
    env = command_env(base, options, job)
    try:
        check_command_python(cmd, env)
    except ConfigurationError:
        if folder is not None:
            shutil.rmtree(folder, ignore_errors=True)
        raise
    status, ran = 1, False
    try:
        status, ran = _run_child(cmd, env)
    finally:
        if folder is not None:  # a command that never started has no job to end
            _end(folder, env, started, status if ran else None)
    return status


def _end(folder: str, env: Mapping[str, str], started: str, status: int | None) -> None:
    """Ends the job (never raises: the command's status is what the command says)."""
    try:
        if status is not None:
            from flopmeter.auto.finish import finish_job

            finish_job(folder, exit_status=status, started_at=started, environ=env)
    except Exception as exc:
        print(f"flopmeter: the job's end failed: {type(exc).__name__}: {exc}", file=sys.stderr)
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def _run_child(cmd: list[str], env: Mapping[str, str]) -> tuple[int, bool]:
    """Starts ``cmd``, forwards the signals, waits: its exit status as a shell gives it, and
    whether it started at all."""
    try:
        child = subprocess.Popen(cmd, env=dict(env))
    except FileNotFoundError:
        print(f"flopmeter: run: command not found: {cmd[0]}", file=sys.stderr)
        return 127, False
    except PermissionError:
        print(f"flopmeter: run: permission denied: {cmd[0]}", file=sys.stderr)
        return 126, False
    except OSError as exc:
        print(f"flopmeter: run: cannot run {cmd[0]}: {exc.strerror or exc}", file=sys.stderr)
        return 126, False

    def forward(signum: int, frame: FrameType | None) -> None:
        if signum == signal.SIGINT and _terminal_sent_it():
            return  # Ctrl-C: the terminal sent it to the command too, once is enough
        with contextlib.suppress(OSError):
            child.send_signal(signum)

    previous = {s: signal.signal(s, forward) for s in FORWARDED}
    try:
        while True:
            try:
                code = child.wait()
                break
            except InterruptedError:  # pragma: no cover - PEP 475 retries for us
                continue
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
    return (128 - code if code < 0 else code), True


def _terminal_sent_it() -> bool:
    """Whether this process group is the terminal's foreground group (a Ctrl-C reaches the
    command, which shares it, directly)."""
    for stream in (sys.stdin, sys.stderr, sys.stdout):
        try:
            return os.tcgetpgrp(stream.fileno()) == os.getpgrp()
        except (OSError, ValueError, AttributeError):
            continue
    return False
