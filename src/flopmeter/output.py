"""The report file on disk: where it goes, whether it may be written, and its life from the
run's start to its end.

Rank 0 writes the report. :meth:`ReportFile.open` checks and claims the path when the run
starts and writes a ``running`` report at once, so an earlier run's report never stays in place
looking current; the meter rewrites it (refreshes, then the final report) through
:meth:`ReportFile.write`, which never raises. The meter never replaces a file that is not its
own: folders, devices, FIFOs, sockets and files that are not flopmeter reports are refused, and
a lock held for the run's lifetime refuses a second live run writing the same path.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import signal
import stat
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path

from flopmeter.errors import ConfigurationError
from flopmeter.report import FlopReport, write_text_atomic

try:
    import fcntl
except ImportError:  # pragma: no cover - Windows: no lock
    fcntl = None  # type: ignore[assignment]

__all__ = [
    "DEFAULT_FILENAME",
    "FULL_REPORT_FILENAME",
    "ReportFile",
    "check_writable",
    "fallback_path",
    "lock_path",
    "resolve_output",
    "write_report",
]

logger = logging.getLogger("flopmeter")

#: The file name used when ``output`` is a folder.
DEFAULT_FILENAME = "flops_meter.json"
#: The full report's file name beside an AWS-keyed ``flops_meter.json`` (the HF callback's
#: ``aws_keys=True``), which ``flopmeter upload`` points to.
FULL_REPORT_FILENAME = "flopmeter_report.json"

#: A file larger than this (bytes) is not taken for a report without reading it.
_MAX_REPORT_BYTES = 16 * 1024 * 1024

_SPECIAL_KINDS = (
    (stat.S_ISCHR, "character device"),
    (stat.S_ISBLK, "block device"),
    (stat.S_ISFIFO, "FIFO (named pipe)"),
    (stat.S_ISSOCK, "socket"),
)

_PATH_ERRORS = (OSError, TypeError, ValueError, RuntimeError)


def _as_text(output: object) -> str:
    """``output`` as a path string.

    Raises:
        ConfigurationError: ``output`` is not a path (not ``str``/``bytes``/``os.PathLike``).
    """
    try:
        raw = os.fspath(output)  # type: ignore[call-overload]
        return os.fsdecode(raw) if isinstance(raw, bytes) else raw
    except _PATH_ERRORS as exc:
        raise ConfigurationError(
            f"output must be a file or folder path, got {type(output).__name__} ({_reason(exc)})."
        ) from None


def _as_path(output: object) -> Path:
    """``output`` as a user-expanded :class:`Path` (see :func:`_as_text`).

    Raises:
        ConfigurationError: ``output`` is not a path, or ``~user`` cannot be expanded.
    """
    raw = _as_text(output)
    try:
        return Path(raw).expanduser()
    except _PATH_ERRORS as exc:
        raise ConfigurationError(f"output {raw!r} cannot be used: {_reason(exc)}.") from None


def _reason(exc: BaseException) -> str:
    """A short reason for ``exc``: its OS message where it has one."""
    return getattr(exc, "strerror", None) or str(exc) or type(exc).__name__


def resolve_output(output: str | os.PathLike[str] | None) -> Path | None:
    """The file the report goes to; a folder (existing, or named with a trailing slash) gets
    ``flops_meter.json`` inside it.

    Raises:
        ConfigurationError: ``output`` is not a path, or the path cannot be looked at (too
            long, a NUL byte, no permission on a parent folder...).
    """
    if output is None:
        return None
    raw = _as_text(output)
    path = _as_path(raw)
    try:
        if raw.endswith(("/", os.sep)) or path.is_dir():
            path = path / DEFAULT_FILENAME
    except _PATH_ERRORS as exc:
        raise ConfigurationError(f"output {raw!r} cannot be used: {_reason(exc)}.") from None
    return path


def lock_path(path: Path) -> Path:
    """The sidecar lock file of the report at ``path`` (``.flops_meter.json.lock`` next to it)."""
    return path.with_name(f".{path.name}.lock")


def fallback_path(path: Path, run_id: str | None = None) -> Path:
    """Where a report that cannot be written to ``path`` is saved instead:
    ``<tempdir>/flopmeter-<run_id or pid>-<file name>``."""
    label = re.sub(r"[^A-Za-z0-9_.-]", "_", run_id or str(os.getpid()))
    return Path(tempfile.gettempdir()) / f"flopmeter-{label}-{path.name}"


def _named(output: Path, real: Path) -> str:
    """``output`` for messages, with the file it leads to when that is another one."""
    return repr(str(output)) + ("" if real == output else f" (-> {str(real)!r})")


def _not_a_report(data: bytes) -> str | None:
    """Why ``data`` is not a flopmeter report, or ``None`` when it is one (or is empty).

    Lenient on purpose: this keeps the meter from clobbering someone's file, it does not
    validate reports.
    """
    if not data.strip():
        return None  # an empty file holds nothing to lose (``mktemp`` makes them)
    try:
        parsed = json.loads(data)
    except (ValueError, RecursionError):
        return "it is not JSON"
    if not isinstance(parsed, dict):
        return f"it holds a JSON {type(parsed).__name__}, not a report object"
    run = parsed.get("run")  # schema 2.0: run.status; 1.x (flat): status or flops_architecture
    keys = parsed.keys() | (run.keys() if isinstance(run, dict) else set())
    if "schema_version" not in parsed or not {"status", "flops_architecture"} & keys:
        return "it is a JSON object without a report's schema_version and status keys"
    return None


def _check_existing(output: Path, real: Path) -> None:
    """Refuses ``real`` when it exists and is not a file this meter may replace.

    Raises:
        ConfigurationError: a folder, a special file, or a file that is not a flopmeter report.
    """
    try:
        st = os.stat(real)  # follows symlinks: a link to /dev/null is /dev/null
    except FileNotFoundError:
        return
    if stat.S_ISDIR(st.st_mode):
        raise ConfigurationError(
            f"output {_named(output, real)} is a folder where a file is needed."
        )
    if not stat.S_ISREG(st.st_mode):
        kind = next((name for test, name in _SPECIAL_KINDS if test(st.st_mode)), "special file")
        raise ConfigurationError(
            f"output {_named(output, real)} is a {kind}, not a regular file; flopmeter replaces "
            "its report file when it writes it, so it refuses special files. Choose a file path."
        )
    if st.st_size > _MAX_REPORT_BYTES:
        why = f"it is {st.st_size} bytes, far larger than a report"
    else:
        why = _not_a_report(real.read_bytes())
    if why is not None:
        raise ConfigurationError(
            f"output {_named(output, real)} exists and is not a flopmeter report ({why}); "
            "flopmeter does not overwrite other files. Move it away or choose another output."
        )


def _claimable(output: object) -> tuple[Path, Path]:
    """Checks that the report may be written at ``output`` and makes its folder.

    Returns:
        ``output`` as a path, and the real file the report goes to (symlinks followed).

    Raises:
        ConfigurationError: ``output`` is not a path, is a folder, a special file or another
            file that is not a flopmeter report, or its folder cannot be made.
    """
    path = _as_path(output)
    try:
        real = Path(os.path.realpath(path))
        _check_existing(path, real)
        real.parent.mkdir(parents=True, exist_ok=True)
    except ConfigurationError:
        raise
    except _PATH_ERRORS as exc:
        raise ConfigurationError(
            f"The report cannot be written to output {_named(path, path)}: {_reason(exc)}. "
            "Choose a folder this process can write to."
        ) from None
    return path, real


def check_writable(path: Path) -> None:
    """Fails now, not after hours of training, when the report cannot be written to ``path``.

    Raises:
        ConfigurationError: ``path`` is a folder, a special file or a file that is not a
            flopmeter report, or its folder cannot be made or written.
    """
    path, real = _claimable(path)
    try:
        with tempfile.NamedTemporaryFile(dir=real.parent, prefix=".flopmeter-check-"):
            pass
    except OSError as exc:
        raise ConfigurationError(
            f"The report cannot be written to output {_named(path, real)}: {_reason(exc)}. "
            "Choose a folder this process can write to."
        ) from None


def _save(report: FlopReport, real: Path, closed: bool = False) -> bool:
    """Writes ``report`` to ``real`` atomically; on failure logs it at ERROR level with the
    report's JSON and saves a copy at :func:`fallback_path`. Never raises.

    Returns:
        Whether ``real`` was written.
    """
    try:
        if closed:
            raise ValueError("the report file was closed; the path is no longer this run's")
        report.write_json(real)
        return True
    except Exception as exc:  # a report that cannot be written never stops training
        error = f"{type(exc).__name__}: {exc}"
    fallback = fallback_path(real, report.run.run_id)
    try:
        text = report.to_json()
    except Exception:  # the log still says what there was
        text = repr(report)
    try:
        write_text_atomic(fallback, text + "\n")
        saved = f"a copy was saved to {fallback}"
    except Exception as exc:  # the fallback is best effort
        saved = f"no copy could be saved to {fallback} either ({type(exc).__name__}: {exc})"
    logger.error(
        "flopmeter could not write its report to %s (%s); %s. The report: %s",
        real,
        error,
        saved,
        text,
    )
    return False


@contextlib.contextmanager
def _sigterm_held() -> Iterator[None]:
    """Holds SIGTERM back while a report is written on the main thread.

    The meter's SIGTERM handler writes a report itself; run in the middle of a write on the
    same thread, it would wait forever for the write's lock (or be overwritten by it). Blocked
    here, the signal is delivered when the write is done (``pthread_sigmask``; where it does not
    exist, nothing is held).
    """
    mask = getattr(signal, "pthread_sigmask", None)
    if mask is None or threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = mask(signal.SIG_BLOCK, {signal.SIGTERM})
    try:
        yield
    finally:
        mask(signal.SIG_SETMASK, previous)


def write_report(report: FlopReport, path: Path) -> bool:
    """Writes ``report`` atomically to the file ``path`` leads to (a symlink stays a symlink); a
    failure is logged with the report's JSON and a copy saved at :func:`fallback_path`, never
    raised.

    Returns:
        Whether the file at ``path`` was written.
    """
    try:
        real = Path(os.path.realpath(path))
    except _PATH_ERRORS:
        real = Path(path)
    return _save(report, real)


class ReportFile:
    """The report file of one run, from its start to its end.

    Made by :meth:`open`; :meth:`write` rewrites the report (refreshes and the final one);
    :meth:`close` releases the path. Also a context manager that closes on exit.
    """

    def __init__(self, output: Path, path: Path, lock_fd: int | None) -> None:
        self.output = output
        self.path = path  #: The real file written (``output`` with symlinks followed).
        self._lock_fd = lock_fd
        self._closed = False
        self._final_written = False
        # Reentrant: the meter's SIGTERM handler may write while a write on the same thread is
        # under way (a process signal can be taken by another thread, so holding it back on
        # this one is not enough); see write().
        self._writing = threading.RLock()
        self._final_report: FlopReport | None = None
        self._finals = 0  # final (non-running) reports written

    @classmethod
    def open(cls, output: Path, first: FlopReport) -> ReportFile:
        """Checks and claims ``output``, then writes ``first`` (a ``running`` report) to it.

        Args:
            output: The report file; a symlink is followed (the target gets the report).
            first: The report written at once, so an earlier run's report is never left in
                place looking current.

        Raises:
            ConfigurationError: ``output`` is not a path; is a folder, a device, FIFO, socket
                or other special file, or an existing file that is not a flopmeter report;
                another live run is writing it; or its folder cannot be made or written.
        """
        path, real = _claimable(output)
        lock_fd = _lock(path, real)
        claimed = cls(path, real, lock_fd)
        try:
            first.write_json(real)
        except Exception as exc:
            claimed.close()
            raise ConfigurationError(
                f"The report cannot be written to output {_named(path, real)}: "
                f"{_reason(exc)}. Choose a folder this process can write to."
            ) from None
        claimed._final_written = first.run.status != "running"
        return claimed

    def write(self, report: FlopReport) -> bool:
        """Writes ``report`` atomically (temporary file, then rename). Never raises.

        On failure the error and the report's full JSON are logged at ERROR level (logger
        ``flopmeter``) and a copy is saved at :func:`fallback_path`; the file keeps this run's
        last report. A ``running`` report after a final one is not written (it would be stale).

        Returns:
            Whether the report file was written.
        """
        with _sigterm_held(), self._writing:
            if self._final_written and report.run.status == "running":
                return False
            finals = self._finals
            written = _save(report, self.path, closed=self._closed)
            if report.run.status != "running":
                self._final_written = self._final_written or written
                self._final_report, self._finals = report, self._finals + 1
            elif self._finals != finals and self._final_report is not None:
                # a final report was written in the middle of this one (the SIGTERM handler):
                # it must be what stays on disk, not this running one
                _save(self._final_report, self.path, closed=self._closed)
            return written

    def close(self) -> None:
        """Releases the path (removes the lock file and unlocks it). Idempotent."""
        self._closed = True
        fd, self._lock_fd = self._lock_fd, None
        if fd is not None:
            _unlock(lock_path(self.path), fd)

    def __enter__(self) -> ReportFile:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"ReportFile({str(self.path)!r}, {'closed' if self._closed else 'open'})"


def _lock(output: Path, real: Path) -> int | None:
    """Takes the lock of ``real`` for this process's lifetime (dies with it, even on SIGKILL).

    The lock file is removed by :func:`_unlock` while still locked; a lock taken on a file
    that was removed (or replaced) meanwhile is dropped and taken again on the new one.

    Returns:
        The locked file descriptor, or ``None`` where ``fcntl`` does not exist.

    Raises:
        ConfigurationError: another live run holds the lock, or the lock file cannot be made.
    """
    if fcntl is None:  # pragma: no cover - Windows
        return None
    sidecar = lock_path(real)
    flags = os.O_RDWR | os.O_CREAT | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)
    for _ in range(8):
        try:
            fd = os.open(sidecar, flags, 0o644)
        except OSError as exc:
            raise ConfigurationError(
                f"The report cannot be written to output {_named(output, real)}: its lock file "
                f"{str(sidecar)!r} cannot be made ({_reason(exc)})."
            ) from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            holder = os.pread(fd, 64, 0).decode(errors="replace").strip() or "unknown"
            os.close(fd)
            raise ConfigurationError(
                f"output {_named(output, real)}: another run (process {holder}) is writing "
                f"this report (it holds {str(sidecar)!r}). Give each run its own output."
            ) from None
        if _is_current(fd, sidecar):
            try:  # the holder's pid, for the message a refused run gets; informational only
                os.ftruncate(fd, 0)
                os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
            except OSError:
                pass
            return fd
        os.close(fd)
    raise ConfigurationError(  # pragma: no cover - another run removes the lock file each time
        f"output {_named(output, real)}: its lock file {str(sidecar)!r} keeps changing; "
        "another run is using this path."
    )


def _is_current(fd: int, sidecar: Path) -> bool:
    """Whether ``fd`` is still the file at ``sidecar`` (not removed or replaced meanwhile)."""
    try:
        return os.path.samestat(os.fstat(fd), os.stat(sidecar, follow_symlinks=False))
    except OSError:
        return False


def _unlock(sidecar: Path, fd: int) -> None:
    """Removes the lock file (while still holding it, so no other run ever locks a removed
    file and thinks itself alone) and releases the lock. Never raises."""
    try:
        if _is_current(fd, sidecar):
            sidecar.unlink()
    except OSError:
        pass
    finally:
        os.close(fd)
