"""Zero-code metering's start in each Python process (from the ``flopmeter-auto.pth`` file or
``flopmeter run``'s ``sitecustomize``): when ``FLOPMETER_AUTO`` is on, installs the import
watch (:mod:`flopmeter.auto.watch`) and nothing heavier; the hooks attach when their framework
is imported. Never raises: a failure is one line on stderr and the process goes on unmetered.

Under the switch alone (no ``flopmeter run``), the first process that boots without a job
(``FLOPMETER_JOB_DIR`` unset) becomes the job's root: it makes the job folder, sets the job's
variables in ``os.environ`` (its children inherit them) and ends the job at its exit
(:func:`flopmeter.auto.finish.finish_job`, registered with ``atexit`` before any meter exists,
so it runs after the meters' own exit handlers). Only the standard library is imported here,
and nothing of torch or the meter.
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any

from flopmeter.auto import (
    JOB_DIR_ENV,
    JOB_ID_ENV,
    JOB_ROOT_ENV,
    LAUNCHER_ENV,
    SWITCH_ENV,
    switched_on,
)

__all__ = ["HOOKS", "JOB_ENVS", "boot", "exit_code", "is_root", "leave_job"]

#: What runs after each module is imported: ``"package.module:function"``, called with it.
HOOKS: dict[str, tuple[str, ...]] = {
    "torch": ("flopmeter.auto.job:torch_imported", "flopmeter.auto.raw:patch_torch"),
    "transformers.trainer": ("flopmeter.auto.hf:patch_trainer_module",),
    "lightning.pytorch.trainer.trainer": ("flopmeter.auto.lightning:patch_trainer_module",),
    "pytorch_lightning.trainer.trainer": ("flopmeter.auto.lightning:patch_trainer_module",),
}

#: The job's variables, which a root sets and its children inherit.
JOB_ENVS = (JOB_DIR_ENV, JOB_ID_ENV, JOB_ROOT_ENV, LAUNCHER_ENV)

#: The root's start and folder, in the job folder, for a program the root ``exec``s.
ROOT_FILE = "root.json"

#: What ends the job in the root at its exit, named like the hooks (imported then, not now).
FINISH = "flopmeter.auto.finish:finish_job"

_booted = False
#: This process's job, when it is the root under the switch alone: folder, start, cwd.
_root: dict[str, Any] | None = None


def boot(launcher: str = "environment") -> None:
    """Switches zero-code metering on in this process, once, when ``FLOPMETER_AUTO`` is on.

    Args:
        launcher: What switched it on: ``"flopmeter run"`` or ``"environment"`` (used when the
            job has not said it already).
    """
    global _booted
    if _booted or not switched_on(os.environ.get(SWITCH_ENV)):
        return
    _booted = True
    try:
        _learn_exit_codes()
        folder = os.environ.get(JOB_DIR_ENV) or ""
        if not os.path.isdir(folder):  # no job, or a stale name
            _become_root(launcher)
        elif os.environ.get(JOB_ROOT_ENV) == str(os.getpid()):
            _resume_root(folder)  # the root exec'd another program (axolotl: accelerate)
        from flopmeter.auto import watch

        watch.install(HOOKS)
    except Exception as exc:  # never the job's problem
        print(f"flopmeter: zero-code metering is off: {type(exc).__name__}: {exc}", file=sys.stderr)


def is_root() -> bool:
    """Whether this process is the root of a job it started under the switch alone."""
    return _root is not None and _root["pid"] == os.getpid()


def _become_root(launcher: str) -> None:
    """Makes the job folder, sets the job's variables, and ends the job at exit."""
    import tempfile
    import time

    folder = tempfile.mkdtemp(prefix="flopmeter-job-")
    os.environ[JOB_DIR_ENV] = folder
    os.environ[JOB_ID_ENV] = os.urandom(8).hex()
    os.environ[JOB_ROOT_ENV] = str(os.getpid())
    os.environ.setdefault(LAUNCHER_ENV, launcher)
    started, cwd = time.time(), os.getcwd()
    with open(os.path.join(folder, ROOT_FILE), "w", encoding="utf-8") as f:
        json.dump({"started": started, "cwd": cwd}, f)  # for the program it may exec
    _take_root(folder, started, cwd)


def _resume_root(folder: str) -> None:
    """The root ``exec``'d another program (same process id, a new interpreter): it keeps the
    role, with the job's start and folder as the first program wrote them."""
    try:
        with open(os.path.join(folder, ROOT_FILE), encoding="utf-8") as f:
            saved = json.load(f)
        started, cwd = float(saved["started"]), str(saved["cwd"])
    except (OSError, ValueError, KeyError, TypeError):
        started, cwd = os.path.getctime(folder), os.getcwd()
    _take_root(folder, started, cwd)


def _take_root(folder: str, started: float, cwd: str) -> None:
    global _root
    import atexit

    _root = {
        "pid": os.getpid(),
        "folder": folder,
        "started": started,
        "cwd": cwd,
        "exit": _original_exit or sys.exit,
        "code": None,
    }
    _learn_exit_codes()
    atexit.register(_at_exit)


#: ``sys.exit`` before :func:`_learn_exit_codes` replaced it.
_original_exit: Any = None
#: What each process passed to ``sys.exit`` (by pid: a forked child inherits the dict).
_exit_codes: dict[int, object] = {}


def _learn_exit_codes() -> None:
    """Replaces ``sys.exit`` with :func:`_exit` (once): the one way to learn its code before
    ``atexit`` runs, for the job's end and for a meter still running at exit."""
    global _original_exit
    if sys.exit is not _exit:
        _original_exit = sys.exit
        sys.exit = _exit


def _exit(status: object = None) -> None:
    _exit_codes[os.getpid()] = status
    if _root is not None:
        _root["code"] = status
    raise SystemExit(status)


def exit_code() -> object:
    """What this process passed to ``sys.exit`` (``None``: nothing, or ``sys.exit()``): the
    code a zero-code meter still running at exit ends with."""
    return _exit_codes.get(os.getpid())


def _exit_status(state: dict[str, Any]) -> int:
    """The process's exit status as far as it is known at exit: ``sys.exit``'s code, else 1
    when an exception reached the top (``sys.last_value``), else 0."""
    code = state["code"]
    if code is None:
        last = getattr(sys, "last_value", None)
        if last is None:
            return 0
        return 130 if isinstance(last, KeyboardInterrupt) else 1
    if isinstance(code, bool) or not isinstance(code, int):
        return 1  # sys.exit("message") prints it and exits 1
    return code & 0xFF


def _at_exit() -> None:
    """Ends the job (in the root only: a forked child inherits the handler, not the role)."""
    state = _root
    if state is None or state["pid"] != os.getpid():
        return
    try:
        import importlib
        import shutil
        from datetime import datetime, timezone

        module, _, name = FINISH.partition(":")
        finish = getattr(importlib.import_module(module), name)
        started = datetime.fromtimestamp(state["started"], timezone.utc)
        finish(
            state["folder"],
            exit_status=_exit_status(state),
            started_at=started.isoformat(timespec="seconds"),
            cwd=state["cwd"],
        )
        shutil.rmtree(state["folder"], ignore_errors=True)
    except Exception as exc:  # never the job's problem
        print(f"flopmeter: the job's end failed: {type(exc).__name__}: {exc}", file=sys.stderr)


def leave_job() -> dict[str, str]:
    """Takes this process out of its job (the ``flopmeter`` command is never part of a job it
    meters): a root it made under the switch is undone (no end at exit, its folder removed),
    and the job's variables leave ``os.environ``, so what this process imports is not
    recorded.

    Returns:
        The job's variables when this process is part of a job another process is the root
        of (a ``flopmeter run`` inside a job joins it); empty otherwise.
    """
    global _root
    import atexit
    import shutil

    joined: dict[str, str] = {}
    if is_root() and _root is not None:
        atexit.unregister(_at_exit)
        if sys.exit is _exit:
            sys.exit = _root["exit"]
        shutil.rmtree(_root["folder"], ignore_errors=True)
        _root = None
    elif os.path.isdir(os.environ.get(JOB_DIR_ENV) or ""):  # a live job, not a stale name
        joined = {k: os.environ[k] for k in JOB_ENVS if os.environ.get(k)}
    for key in JOB_ENVS:
        os.environ.pop(key, None)
    return joined
