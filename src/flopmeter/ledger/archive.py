"""What a meter does with its final report besides the report file: the ledger and the sinks.

:class:`RunArchive` is held by the meter (rank 0). Neither of its methods raises: inside
training, a ledger or sink failure never costs the run or its report file. A ledger failure is
one of its :meth:`RunArchive.notes`, which the meter composes into the report's notes.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from flopmeter.ledger.chain import LedgerRecord
from flopmeter.ledger.sinks import (
    DEFAULT_SINK_TIMEOUT_SECONDS,
    Sink,
    SinkOutcome,
    SinkPayload,
    deliver,
)
from flopmeter.ledger.store import Ledger
from flopmeter.report import FlopReport
from flopmeter.report.output_path import KeptReport
from flopmeter.report.reading import read_report
from flopmeter.safe_text import describe_error

__all__ = ["RunArchive"]

logger = logging.getLogger("flopmeter")


@dataclass
class RunArchive:
    """The ledger and sinks one run's final report goes to.

    Attributes:
        ledger: The ledger file, or ``None``.
        sinks: The sinks (S3, DynamoDB, ...).
        sink_timeout_seconds: How long the end of the run waits for the sinks, seconds.
        record: The run's last ledger record, once appended.
        interrupt: A Ctrl-C that came during an append (:meth:`seal` keeps it, so the report
            is still written with its note; the meter raises it after the write).
    """

    ledger: Path | None = None
    sinks: Sequence[Sink] = ()
    sink_timeout_seconds: float = DEFAULT_SINK_TIMEOUT_SECONDS
    record: LedgerRecord | None = field(default=None, init=False)
    interrupt: KeyboardInterrupt | None = field(default=None, init=False, repr=False)
    _notes: list[str] = field(default_factory=list, init=False, repr=False)
    _at_start: str | None = field(default=None, init=False, repr=False)

    def unwritable_at_start(self, exc: BaseException) -> None:
        """The ledger could not be opened for writing when the meter was made, and the run is
        metered all the same (zero-code metering with ``FLOPMETER_LEDGER``): every report says
        so (:meth:`notes`) until the final report's append (:meth:`seal`) tries again and says
        how that went. Never raises."""
        why = describe_error(exc)
        logger.warning(
            "flopmeter: the ledger %s cannot be written (%s); the run is metered and its report "
            "says that its record could not be appended",
            self.ledger,
            why,
        )
        self._at_start = (
            f"The ledger record of this run cannot be appended to {self.ledger}: {why} (found "
            "when the meter was made; the run was metered all the same, and the final report's "
            "append is tried again at the end)"
        )

    def seal(self, report: FlopReport) -> bool:
        """Appends ``report`` to the ledger (when there is one). Never raises: a failure is
        logged as a warning and kept as a note (:meth:`notes`); a KeyboardInterrupt during the
        append too, kept in :attr:`interrupt` for the meter to raise once the report is written.

        Returns:
            Whether the report can be written as it is: ``False`` when the append failed, so
            the report to write is made again with the new note.
        """
        if self.ledger is None:
            return True
        try:
            self.record = Ledger(self.ledger).append(report).record
            return True
        except KeyboardInterrupt as exc:  # Ctrl-C while waiting for or inside the commit
            self.interrupt = exc
            why = (
                "interrupted (KeyboardInterrupt, Ctrl-C) during the append, which SQLite rolls "
                f"back: the ledger holds no record of this run unless `flopmeter ledger show "
                f"{report.run.run_id}` finds one"
            )
        except Exception as exc:
            why = describe_error(exc)
        logger.warning("flopmeter: the run's record was not appended to the ledger: %s", why)
        note = f"The ledger record of this run could not be appended to {self.ledger}: {why}"
        if note not in self._notes:
            self._notes.append(note)
        return False

    def notes(self) -> tuple[str, ...]:
        """The report's notes on the archive: each ledger append that failed (before the end,
        the ledger that could not be written at the start)."""
        if self._at_start is not None and self.record is None and not self._notes:
            return (self._at_start,)
        return tuple(self._notes)

    def recover(self, kept: KeptReport) -> list[str]:
        """The final report of another run found at this run's output (``kept``), appended to
        the ledger when it is missing there: its run was killed between writing its file and
        appending its record. Appending is idempotent (a report already there is a no-op), so
        only a missing one is appended, with a note. Never raises.

        Returns:
            The report's notes (none when the ledger had the record, or there is no ledger).
        """
        if self.ledger is None or kept.status in (None, "running"):
            return []
        try:
            if not Ledger(self.ledger).append(read_report(kept.path)).appended:
                return []
        except Exception as exc:
            why = describe_error(exc)
            logger.warning(
                "flopmeter: %s could not be checked against the ledger: %s", kept.path, why
            )
            return [
                f"The final report of run {kept.run_id} found at this run's output (kept at "
                f"{kept.path}) could not be checked against the ledger {self.ledger}: {why}"
            ]
        return [
            f"The final report of run {kept.run_id} ({kept.status}) found at this run's output "
            f"(kept at {kept.path}) was not in the ledger {self.ledger}: that run ended between "
            "writing its file and appending its record. It was appended now."
        ]

    def add(self, sink: Sink) -> None:
        """One more copy of the final report (anything with ``name`` and ``put``: the
        :class:`~flopmeter.ledger.sinks.Sink` protocol), delivered with the others."""
        self.sinks = (*self.sinks, sink)

    def ship(self, report: FlopReport) -> list[SinkOutcome]:
        """Copies ``report`` (with its ledger record, if appended) to every sink, waiting
        ``sink_timeout_seconds`` at most. Never raises; failures are logged as warnings.

        Returns:
            One outcome per sink.
        """
        if not self.sinks:
            return []
        try:
            record = (
                self.record if self.record and self.record.run_id == report.run.run_id else None
            )
            payload = SinkPayload.of(report, record)
            outcomes = deliver(payload, self.sinks, self.sink_timeout_seconds)
        except Exception as exc:
            outcomes = [SinkOutcome(s.name, False, describe_error(exc)) for s in self.sinks]
        for outcome in outcomes:
            if not outcome.ok:
                logger.warning(
                    "flopmeter: the run's report was not copied to %s: %s (the report file and "
                    "ledger are unaffected; `flopmeter upload` can copy it later)",
                    outcome.sink,
                    outcome.detail,
                )
        return outcomes
