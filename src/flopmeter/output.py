"""The report file on disk: its life from the run's start to its end.

Rank 0 writes the report. :meth:`ReportFile.open` claims the path when the run starts
(:mod:`flopmeter.output_path`: the checks of what is there, and the lock held for the run's
lifetime) and writes a ``running`` report at once, so an earlier run's report never stays in
place looking current; the meter rewrites it (refreshes, then the final report) through
:meth:`ReportFile.write`, which never raises: a failed write is logged with the report's JSON
and a copy saved at :func:`fallback_path`.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import signal
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path

from flopmeter.errors import ConfigurationError
from flopmeter.output_path import (
    DEFAULT_FILENAME,
    FULL_REPORT_FILENAME,
    PATH_ERRORS,
    KeptReport,
    check_writable,
    claim_path,
    keep_earlier_report,
    lock_path,
    named_path,
    os_reason,
    release_lock,
    resolve_output,
    take_lock,
)
from flopmeter.report import FlopReport, write_text_atomic

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


def fallback_path(path: Path, run_id: str | None = None) -> Path:
    """Where a report that cannot be written to ``path`` is saved instead:
    ``<tempdir>/flopmeter-<run_id or pid>-<file name>``."""
    label = re.sub(r"[^A-Za-z0-9_.-]", "_", run_id or str(os.getpid()))
    return Path(tempfile.gettempdir()) / f"flopmeter-{label}-{path.name}"


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
    except PATH_ERRORS:
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
        #: Another run's report that was at the path, moved aside by :meth:`open`.
        self.kept: KeptReport | None = None

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
        path, real = claim_path(output)
        lock_fd = take_lock(path, real)
        claimed = cls(path, real, lock_fd)
        claimed.kept = keep_earlier_report(real, first.run.run_id or "")  # never overwritten
        try:
            first.write_json(real)
        except Exception as exc:
            claimed.close()
            raise ConfigurationError(
                f"The report cannot be written to output {named_path(path, real)}: "
                f"{os_reason(exc)}. Choose a folder this process can write to."
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
            release_lock(lock_path(self.path), fd)

    def __enter__(self) -> ReportFile:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"ReportFile({str(self.path)!r}, {'closed' if self._closed else 'open'})"
