"""The run's report on disk over its life (rank 0), apart from the meter's lifecycle.

:class:`RunFile` holds the run's :class:`~flopmeter.report.writing.ReportFile` from the start to the
stop: claimed with a ``running`` report when the run starts, refreshed every
``refresh_seconds`` (handed to the file's writer thread, which also builds the report: a step
that is due pays only the counts' snapshot, and no step waits on the file system),
written as ``interrupted`` on SIGTERM (then the handler that was there runs), and final at the
stop, after which the file's lock is let go. A child the process forks inherits the object but
never writes the file, answers SIGTERM for it or lets its lock go: the file is the parent's.
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Callable
from pathlib import Path

from flopmeter.report import FlopReport
from flopmeter.report.output_path import KeptReport
from flopmeter.report.writing import ReportFile
from flopmeter.run.signals import SigtermHook

__all__ = ["RunFile"]


class RunFile:
    """The report file of one run, while it runs.

    Args:
        output: The report file (``None``: the run writes none).
        refresh_seconds: How often a running report is written, seconds.
        interrupted: Makes the report SIGTERM writes (this rank's counts, ``interrupted``).
    """

    def __init__(
        self,
        output: Path | None,
        refresh_seconds: float,
        interrupted: Callable[[], FlopReport],
    ) -> None:
        self._output = output
        self._refresh_seconds = refresh_seconds
        self._interrupted = interrupted
        self._file: ReportFile | None = None
        self._claimed: Path | None = None
        #: The path asked for and the process holding it, when the run went beside it.
        self.held: tuple[Path, str] | None = None
        self._sigterm = SigtermHook(self._on_sigterm)
        self._next_refresh = 0.0
        #: When a refresh may next be due, ``time.monotonic()`` seconds: the refresh time while
        #: the file is claimed, else infinity (no refresh to do); what the step hook's quiet
        #: path compares the clock with before it leaves :meth:`due` to the full path.
        self.next_due = math.inf
        self._pid = os.getpid()

    @property
    def is_open(self) -> bool:
        """Whether the file is claimed (between :meth:`open` and :meth:`close`)."""
        return self._file is not None

    @property
    def output(self) -> Path | None:
        """The report file: the one claimed once claimed (beside the one asked for when that
        was held), else the one asked for; ``None``: the run writes none."""
        return self._claimed or self._output

    def open(self, first: FlopReport, *, beside_when_held: bool = False) -> KeptReport | None:
        """Claims the file with ``first`` (a ``running`` report) and installs the SIGTERM hook;
        returns another run's report found there and kept aside (``None``: none).
        ``beside_when_held``: a file held by another live run is not refused, this run's own
        is claimed beside it (:meth:`flopmeter.report.writing.ReportFile.open`)."""
        if self._output is None:
            return None
        self._file = ReportFile.open(self._output, first, beside_when_held=beside_when_held)
        self._claimed, self.held, self._pid = self._file.output, self._file.held, os.getpid()
        self._sigterm.install()
        self.wrote()
        return self._file.kept

    def _ours(self) -> ReportFile | None:
        """The file, in the process that claimed it (``None`` elsewhere: a forked child)."""
        return self._file if self._pid == os.getpid() else None

    def wrote(self) -> None:
        """Starts the interval to the next refresh (now: a report was just written)."""
        self._next_refresh = time.monotonic() + self._refresh_seconds
        self.next_due = self._next_refresh if self._file is not None else math.inf

    def due(self) -> bool:
        """Whether a refresh is due (the file is open and the interval has passed)."""
        if self._ours() is None:
            self.next_due = math.inf  # none, or a forked child's: never due here
            return False
        return time.monotonic() >= self._next_refresh

    def write(self, report: FlopReport) -> None:
        """Hands ``report`` to the file's writer (a final one waits a bounded time)."""
        if (file := self._ours()) is not None:
            file.write(report)

    def write_later(self, build: Callable[[], FlopReport | None]) -> None:
        """Hands the file's writer a running report to build (``build``, on its thread) and
        write; returns at once (:meth:`~flopmeter.report.writing.ReportFile.write_later`)."""
        if (file := self._ours()) is not None:
            file.write_later(build)

    def stopping(self) -> None:
        """The run is ending: SIGTERM goes back to the handler that was there."""
        self._sigterm.uninstall()

    def close(self, final: FlopReport | None) -> None:
        """Writes ``final`` (when made) and lets the file go; the last refresh stays otherwise."""
        file, self._file = self._ours(), None
        self.next_due = math.inf
        if file is not None and final is not None:
            file.write(final)
        if file is not None:
            file.close()

    def _on_sigterm(self) -> None:
        if (file := self._ours()) is not None:
            file.write(self._interrupted())
