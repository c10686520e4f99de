"""The report file on disk: its life from the run's start to its end.

Rank 0 writes the report. :meth:`ReportFile.open` claims the path when the run starts
(:mod:`flopmeter.report.output_path`: the checks of what is there, and the lock held for the run's
lifetime) and writes a ``running`` report at once, so an earlier run's report never stays in
place looking current; the meter rewrites it (refreshes, then the final report) through
:meth:`ReportFile.write`, which never raises and never blocks a training step on the file
system: the writes are a writer thread's (the latest report only, when it falls behind), and a
final report waits a bounded time. :meth:`ReportFile.write_later` hands the writer a running
report still to be built (the meter's periodic refresh: the build, milliseconds on a large
model, is the writer's too). A failed write, or a final one not done in time, is logged
with the report's JSON and a copy saved at :func:`fallback_path`.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import signal
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path

from flopmeter.errors import ConfigurationError, OutputHeld
from flopmeter.report import FlopReport, write_text_atomic
from flopmeter.report.output_path import (
    PATH_ERRORS,
    KeptReport,
    claim_path,
    keep_earlier_report,
    lock_path,
    named_path,
    os_reason,
    release_lock,
    run_named,
    take_lock,
)

__all__ = [
    "FINAL_WAIT_SECONDS",
    "ReportFile",
    "fallback_path",
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
        _log_unwritten(report, real, f"{type(exc).__name__}: {exc}")
    return False


def _log_unwritten(report: FlopReport, real: Path, error: str) -> None:
    """Logs at ERROR level that ``report`` did not reach ``real`` (why: ``error``), with the
    report's JSON, and saves a copy at :func:`fallback_path`. Never raises."""
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


#: How long a final report's write waits for the writer thread, seconds, before the report is
#: logged and its copy saved at :func:`fallback_path` (the write may still land later).
FINAL_WAIT_SECONDS = 10.0


class ReportFile:
    """The report file of one run, from its start to its end.

    Made by :meth:`open` (which writes the first report itself, before training); after that
    every write goes through one writer thread, so that a slow or hung file system never holds
    up a training step: :meth:`write` hands a ``running`` report to it and returns at once (the
    writer writes the latest one it has, skipping those it had no time for), and waits at most
    :attr:`final_wait_seconds` for a final report. :meth:`close` releases the path (once the
    writer is done). Also a context manager that closes on exit.
    """

    #: How long :meth:`write` waits for a final report to be written, seconds.
    final_wait_seconds: float = FINAL_WAIT_SECONDS

    def __init__(self, output: Path, path: Path, lock_fd: int | None) -> None:
        self.output = output
        self.path = path  #: The real file written (``output`` with symlinks followed).
        self._lock_fd = lock_fd
        self._closed = False  # no write is taken any more
        # One condition guards the writer's state. Reentrant: the meter's SIGTERM handler
        # writes (and waits) on the main thread, possibly while that thread is inside write().
        self._cond = threading.Condition(threading.RLock())
        # the latest report not yet taken, or (write_later) the function that builds it
        self._pending: FlopReport | Callable[[], FlopReport | None] | None = None
        self._final_report: FlopReport | None = None  # the last final report given
        self._given = 0  # reports given to the writer so far
        self._done = 0  # of those, how many the writer has dealt with (written or failed)
        self._result = True  # whether its last write reached the file
        self._busy = False
        self._thread: threading.Thread | None = None
        #: Another run's report that was at the path, moved aside by :meth:`open`.
        self.kept: KeptReport | None = None
        #: The path asked for and the process holding it, when :meth:`open` went beside it.
        self.held: tuple[Path, str] | None = None

    @classmethod
    def open(cls, output: Path, first: FlopReport, *, beside_when_held: bool = False) -> ReportFile:
        """Checks and claims ``output``, then writes ``first`` (a ``running`` report) to it.

        Args:
            output: The report file; a symlink is followed (the target gets the report).
            first: The report written at once, so an earlier run's report is never left in
                place looking current.
            beside_when_held: When another live run is writing ``output``, claim this run's
                own file beside it instead (:func:`~flopmeter.report.output_path.run_named`:
                ``flops_meter.<run id>.json``; :attr:`held` says so): for a path the user did
                not choose (zero-code metering's default), never for one they did.

        Raises:
            ConfigurationError: ``output`` is not a path; is a folder, a device, FIFO, socket
                or other special file, or an existing file that is not a flopmeter report;
                another live run is writing it (``OutputHeld``); or its folder cannot be made
                or written.
        """
        path, real = claim_path(output)
        held: tuple[Path, str] | None = None
        try:
            lock_fd = take_lock(path, real)
        except OutputHeld as exc:
            if not beside_when_held or not (first.run.run_id or "").isalnum():
                raise
            held = (path, exc.holder)
            path, real = claim_path(run_named(path, first.run.run_id))
            lock_fd = take_lock(path, real)
        claimed = cls(path, real, lock_fd)
        claimed.held = held
        claimed.kept = keep_earlier_report(real, first.run.run_id or "")  # never overwritten
        try:
            first.write_json(real)
        except Exception as exc:
            claimed.close()
            raise ConfigurationError(
                f"The report cannot be written to output {named_path(path, real)}: "
                f"{os_reason(exc)}. Choose a folder this process can write to."
            ) from None
        if first.run.status != "running":
            claimed._final_report = first
        return claimed

    def write(self, report: FlopReport) -> bool:
        """Hands ``report`` to the writer thread, which writes it atomically (temporary file,
        then rename). Never raises, never blocks on the file system.

        A ``running`` report returns at once (a later one replaces it while the writer is busy;
        one after a final report is dropped, it would be stale). A final report waits up to
        :attr:`final_wait_seconds`; a failed write, or one not done by then, is logged at
        ERROR level (logger ``flopmeter``) with the report's full JSON and a copy is saved at
        :func:`fallback_path`; the file keeps this run's last report written.

        Returns:
            For a running report, whether it was taken; for a final one, whether it reached
            the file within the wait.
        """
        final = report.run.status != "running"
        if self._closed:
            if final:
                _save(report, self.path, closed=True)  # logged, and the copy saved
            return False
        with self._cond:
            if not final and self._final_report is not None:
                return False
            if final and report is self._final_report:  # given before (ahead of the ledger)
                # written: its result; still with the writer: the wait ran out and said so
                return self._result if self._done >= self._given else False
            if final:
                self._final_report = report
            self._pending = report
            self._given += 1
            ticket = self._given
            self._start_writer()
            self._cond.notify_all()
            if not final:
                return True
            deadline = time.monotonic() + self.final_wait_seconds
            while self._done < ticket:
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                self._cond.wait(left)
            if self._done >= ticket:
                return self._result
        why = f"the write did not end within {self.final_wait_seconds:g} s (no answer)"
        _log_unwritten(report, self.path, why)
        return False

    def write_later(self, build: Callable[[], FlopReport | None]) -> bool:
        """Hands the writer thread a ``running`` report to build and write: ``build`` is called
        there (it must read only what it was given, never what training changes; ``None``: no
        report, the file keeps the last one). Returns at once, as :meth:`write` does for a
        running report: a later report replaces it while the writer is busy, and it is dropped
        after a final report (also when the final one comes while it is being built).

        Returns:
            Whether it was taken.
        """
        with self._cond:
            if self._closed or self._final_report is not None:
                return False
            self._pending = build
            self._given += 1
            self._start_writer()
            self._cond.notify_all()
        return True

    def _start_writer(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(
                target=self._run_writer, name="flopmeter-report-writer", daemon=True
            )
            self._thread.start()

    def _run_writer(self) -> None:
        """The writer thread: writes the latest report given, until the file is closed."""
        mask = getattr(signal, "pthread_sigmask", None)
        if mask is not None:  # SIGTERM is the main thread's to take, never this one's
            with contextlib.suppress(OSError, ValueError):
                mask(signal.SIG_BLOCK, {signal.SIGTERM})
        while True:
            with self._cond:
                while self._pending is None and not self._closed:
                    self._cond.wait()
                report, ticket = self._pending, self._given
                self._pending = None
                if report is None:  # closed, and nothing left to write
                    self._release()
                    return
                self._busy = True
            written = self._write_taken(report)
            with self._cond:
                self._busy = False
                self._done, self._result = ticket, written
                self._cond.notify_all()

    def _write_taken(self, taken: FlopReport | Callable[[], FlopReport | None]) -> bool:
        """The writer thread: builds ``taken`` when it is a function, then writes it."""
        if isinstance(taken, FlopReport):
            return _save(taken, self.path)
        report = taken()
        with self._cond:  # a final report given while this one was built: this one is stale
            stale = report is None or self._final_report is not None
        return False if stale else _save(report, self.path)

    def close(self) -> None:
        """Takes no more writes and releases the path (removes the lock file and unlocks it)
        once the writer has written what it holds; at once when it holds nothing. Idempotent."""
        with self._cond:
            self._closed = True
            if self._thread is None or (not self._busy and self._pending is None):
                self._release()
            self._cond.notify_all()

    def _release(self) -> None:
        fd, self._lock_fd = self._lock_fd, None
        if fd is not None:
            release_lock(lock_path(self.path), fd)

    def __enter__(self) -> ReportFile:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"ReportFile({str(self.path)!r}, {'closed' if self._closed else 'open'})"
