"""Zero-code metering's start in each Python process (from the ``flopmeter-auto.pth`` file or
``flopmeter run``'s ``sitecustomize``): when ``FLOPMETER_AUTO`` is on, installs the import
watch (:mod:`flopmeter.auto.watch`) and nothing heavier; the hooks attach when their framework
is imported. Never raises: a failure is one line on stderr and the process goes on unmetered.

Under the switch alone (no ``flopmeter run``), the first process that boots without a job
(``FLOPMETER_JOB_DIR`` unset) becomes the job's root: it makes the job folder, sets the job's
variables in ``os.environ`` (its children inherit them) and ends the job at its exit
(:func:`flopmeter.auto.finish.finish_job`, registered with ``atexit`` before any meter exists,
so it runs after the meters' own exit handlers). SIGTERM ends the job too: the root's handler
(behind a meter's, which writes its ``interrupted`` report first) names the reports, removes the
folder, then lets the signal end the process as it would have. SIGKILL, ``os._exit`` and the
out-of-memory killer leave the folder behind: the next root sweeps such folders
(:func:`sweep_stale_jobs`), those whose ``root.json`` names a root process of this host that is
gone. Only the standard library is imported here, and nothing of torch or the meter.
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any

from flopmeter.auto import (
    JOB_CWD_ENV,
    JOB_DIR_ENV,
    JOB_ID_ENV,
    JOB_ROOT_ENV,
    LAUNCHER_ENV,
    SWITCH_ENV,
    switched_on,
)

__all__ = [
    "HOOKS",
    "JOB_ENVS",
    "JOB_PREFIX",
    "boot",
    "exit_code",
    "is_root",
    "leave_job",
    "sweep_stale_jobs",
]

#: What runs after each module is imported: ``"package.module:function"``, called with it.
HOOKS: dict[str, tuple[str, ...]] = {
    "torch": ("flopmeter.auto.job:torch_imported", "flopmeter.auto.raw:patch_torch"),
    "transformers.trainer": ("flopmeter.auto.hf:patch_trainer_module",),
    "lightning.pytorch.trainer.trainer": ("flopmeter.auto.lightning:patch_trainer_module",),
    "pytorch_lightning.trainer.trainer": ("flopmeter.auto.lightning:patch_trainer_module",),
}

#: The job's variables, which a root sets and its children inherit.
JOB_ENVS = (JOB_DIR_ENV, JOB_ID_ENV, JOB_ROOT_ENV, JOB_CWD_ENV, LAUNCHER_ENV)

#: The root's start, folder, process id and host, in the job folder: for a program the root
#: ``exec``s, and for the sweep of folders whose root is gone.
ROOT_FILE = "root.json"
#: The start of a job folder's name (in the temporary folder, ``TMPDIR``).
JOB_PREFIX = "flopmeter-job-"
#: One sweep looks at this many folder entries of the temporary folder at most, and at this
#: many job folders.
_SWEEP_ENTRIES, _SWEEP_JOBS = 10_000, 64

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
        from flopmeter.auto import job, watch

        job.record("boot", executable=sys.executable)
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

    sweep_stale_jobs(tempfile.gettempdir())
    folder = tempfile.mkdtemp(prefix=JOB_PREFIX)
    os.environ[JOB_DIR_ENV] = folder
    os.environ[JOB_ID_ENV] = os.urandom(8).hex()
    os.environ[JOB_ROOT_ENV] = str(os.getpid())
    os.environ[JOB_CWD_ENV] = os.getcwd()
    os.environ.setdefault(LAUNCHER_ENV, launcher)
    started, cwd = time.time(), os.getcwd()
    saved = {"started": started, "cwd": cwd, "pid": os.getpid(), "host": _host()}
    with open(os.path.join(folder, ROOT_FILE), "w", encoding="utf-8") as f:
        json.dump(saved, f)  # for the program it may exec, and for a later root's sweep
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
        "ended": False,
        "sigterm": None,
    }
    _learn_exit_codes()
    atexit.register(_at_exit)
    _root["sigterm"] = _end_on_sigterm()


def _end_on_sigterm() -> Any:
    """Installs the root's SIGTERM handler (:func:`_on_sigterm`) where SIGTERM would end the
    process (its default action, and only from the main thread): an ignored SIGTERM ends
    nothing, so the job does not end.

    Returns:
        The handler installed, or ``None``.
    """
    import signal
    import threading

    if threading.current_thread() is not threading.main_thread():
        return None
    try:
        if signal.getsignal(signal.SIGTERM) != signal.SIG_DFL:
            return None
        signal.signal(signal.SIGTERM, _on_sigterm)
    except (ValueError, OSError, AttributeError):  # no SIGTERM, or not allowed here
        return None
    return _on_sigterm


def _on_sigterm(signum: int, frame: Any) -> None:
    """SIGTERM in the root: the job ends (its reports named, its folder removed), then the
    process ends as SIGTERM's default action ends it. Only when the signal came straight here
    or through flopmeter's own hooks (a meter's, which writes its ``interrupted`` report
    first): a framework's handler that calls the one it found (Lightning's, which stops
    training cleanly) decides what SIGTERM does, as it did before this one was there, and the
    job ends at the process's exit."""
    import signal

    if not _reached_directly():
        return
    _at_exit(128 + signum)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    os.kill(os.getpid(), signal.SIGTERM)


def _reached_directly() -> bool:
    """Whether SIGTERM's handler is :func:`_on_sigterm`, or flopmeter's
    :class:`~flopmeter.run.signals.SigtermHook` handing the signal on to it (through others of
    its kind only)."""
    import signal

    from flopmeter.run.signals import SigtermHook

    current = signal.getsignal(signal.SIGTERM)
    for _ in range(16):
        if current == _on_sigterm:
            return True
        hook = getattr(current, "__self__", None)
        if not isinstance(hook, SigtermHook):
            return False
        current = getattr(hook, "_previous", None)  # the handler the hook hands the signal on to
    return False


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


def _at_exit(status: int | None = None) -> None:
    """Ends the job, once (in the root only: a forked child inherits the handler, not the
    role). ``status``: the exit status when known (SIGTERM's 143), else as :func:`_exit_status`
    finds it."""
    state = _root
    if state is None or state["pid"] != os.getpid() or state["ended"]:
        return
    state["ended"] = True
    try:
        import importlib
        import shutil
        from datetime import datetime, timezone

        module, _, name = FINISH.partition(":")
        finish = getattr(importlib.import_module(module), name)
        started = datetime.fromtimestamp(state["started"], timezone.utc)
        finish(
            state["folder"],
            exit_status=_exit_status(state) if status is None else status,
            started_at=started.isoformat(timespec="seconds"),
            cwd=state["cwd"],
        )
        shutil.rmtree(state["folder"], ignore_errors=True)
    except Exception as exc:  # never the job's problem
        print(f"flopmeter: the job's end failed: {type(exc).__name__}: {exc}", file=sys.stderr)


def _stop_ending_on_sigterm() -> None:
    """Puts SIGTERM's default action back where the root's handler is still the one there."""
    import signal

    try:
        if signal.getsignal(signal.SIGTERM) == _on_sigterm:
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
    except (ValueError, OSError):  # off the main thread: the handler stays, and does nothing
        pass


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
        if _root["sigterm"] is not None:
            _stop_ending_on_sigterm()
        if sys.exit is _exit:
            sys.exit = _root["exit"]
        shutil.rmtree(_root["folder"], ignore_errors=True)
        _root = None
    elif os.path.isdir(os.environ.get(JOB_DIR_ENV) or ""):  # a live job, not a stale name
        joined = {k: os.environ[k] for k in JOB_ENVS if os.environ.get(k)}
    for key in JOB_ENVS:
        os.environ.pop(key, None)
    return joined


def _host() -> str:
    """This machine's name (a job folder's root is looked for on the host that made it)."""
    try:
        return os.uname().nodename
    except AttributeError:  # pragma: no cover - Windows
        import socket

        return socket.gethostname()


def sweep_stale_jobs(temp: str) -> list[str]:
    """Removes the job folders in ``temp`` whose root died without ending its job (SIGKILL,
    ``os._exit``, the out-of-memory killer): folders named ``flopmeter-job-*``, owned by this
    user, holding nothing but a ``root.json`` and records (``<pid>.jsonl``), whose
    ``root.json`` names a root process of this host that no longer runs. A folder without a
    ``root.json`` (being made, or ``flopmeter run``'s), another host's, or one whose root runs
    is left alone. At most ``_SWEEP_ENTRIES`` entries of ``temp`` and ``_SWEEP_JOBS`` job
    folders are looked at; never raises.

    Returns:
        The folders removed.
    """
    import itertools
    import shutil

    removed: list[str] = []
    try:
        with os.scandir(temp) as entries:
            named = [
                e.path for e in itertools.islice(entries, _SWEEP_ENTRIES)
                if e.name.startswith(JOB_PREFIX)
            ]  # fmt: skip
    except OSError:
        return removed
    for folder in named[:_SWEEP_JOBS]:
        try:
            if _stale(folder):
                shutil.rmtree(folder)
                removed.append(folder)
        except Exception:  # another process's sweep, a folder changing: leave it
            continue
    return removed


def _stale(folder: str) -> bool:
    """Whether ``folder`` is a job folder of this user whose root process is gone."""
    import stat

    info = os.lstat(folder)
    getuid = getattr(os, "getuid", None)
    if not stat.S_ISDIR(info.st_mode) or getuid is None or info.st_uid != getuid():
        return False
    with os.scandir(folder) as entries:
        names = [e.name for e in entries if e.is_file(follow_symlinks=False)]
    if len(names) != len(os.listdir(folder)) or ROOT_FILE not in names:
        return False  # a folder or link inside, or no root named: not one of ours to remove
    if any(n != ROOT_FILE and not (n.endswith(".jsonl") and n[:-6].isdigit()) for n in names):
        return False
    with open(os.path.join(folder, ROOT_FILE), encoding="utf-8") as f:
        saved = json.loads(f.read(4096))
    pid = saved.get("pid") if isinstance(saved, dict) else None
    if not isinstance(pid, int) or isinstance(pid, bool) or pid <= 0:
        return False
    return saved.get("host") == _host() and not _running(pid)


def _running(pid: int) -> bool:
    """Whether process ``pid`` runs on this host (a zombie, killed but not yet reaped, does not;
    a process this user may not signal does)."""
    try:
        os.kill(pid, 0)  # signal 0 only asks whether it exists
    except ProcessLookupError:
        return False
    except (OSError, OverflowError):
        return True
    try:
        with open(f"/proc/{pid}/stat", encoding="utf-8") as f:
            return f.read().rsplit(")", 1)[-1].split()[:1] != ["Z"]
    except OSError:
        return True
