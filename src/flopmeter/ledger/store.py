"""The ledger on disk: an SQLite file that runs are appended to and never edited in.

One table of records (``ledger_records``) chained by hash (:mod:`flopmeter.ledger.chain`), one
table of facts about the ledger (``ledger_meta``: the magic string, the format and the head,
that is the last record's ``seq`` and ``chain_hash``, updated in the same transaction as each
append). Triggers refuse ``UPDATE`` and ``DELETE`` on the records, so a mistake through SQLite
cannot edit the history; a deliberate edit (dropping the triggers, editing the file) is found by
:meth:`Ledger.verify`. The tables, the triggers and the checks of a file before it is opened are
:mod:`flopmeter.ledger.schema`'s; where the ledger is, :mod:`flopmeter.ledger.location`'s.

Appends take SQLite's write lock first (``BEGIN IMMEDIATE``) and wait up to ``timeout_seconds``
for it, so processes appending at once are serialised: none is lost and the chain stays valid.
"""

from __future__ import annotations

import contextlib
import os
import sqlite3
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from flopmeter.errors import ConfigurationError, ReportFileError
from flopmeter.ledger.chain import (
    GENESIS_HASH,
    ChainProblem,
    LedgerRecord,
    canonical_json,
    chain_hash,
    check_chain,
    report_object,
    sha256_text,
)
from flopmeter.ledger.schema import (
    COLUMNS,
    FORMAT,
    HEAD_MISSING,
    MAGIC,
    SCHEMA,
    file_problem,
    head_of,
)
from flopmeter.report import FlopReport
from flopmeter.report.upgrade import report_value
from flopmeter.safe_text import run_id_problem

#: Where the ledger is (``LEDGER_ENV``, :func:`default_ledger_path`, :func:`resolve_ledger`)
#: lives in :mod:`flopmeter.ledger.location`; re-exported here, where the options and the CLI
#: import it.
__all__ = [
    "AppendResult",
    "Ledger",
    "LedgerError",
    "VerifyResult",
]

#: How long an append waits for another process's append, seconds, by default.
DEFAULT_TIMEOUT_SECONDS = 30.0


class LedgerError(ConfigurationError):
    """The ledger cannot be used: not a ledger, read-only, missing, or a report it refuses."""


@dataclass(frozen=True)
class AppendResult:
    """What an append did.

    Attributes:
        record: The run's record (the new one, or the one already there).
        appended: ``False`` when the same report of the same run was already in the ledger.
    """

    record: LedgerRecord
    appended: bool


@dataclass(frozen=True)
class VerifyResult:
    """The outcome of :meth:`Ledger.verify`.

    Attributes:
        records: How many records were checked.
        head: The stored head ``(seq, chain_hash)``, or ``None`` for an empty ledger.
        problems: Every break found; empty when the chain is valid.
    """

    records: int
    head: tuple[int, str] | None
    problems: list[ChainProblem] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        """Whether the chain is valid."""
        return not self.problems


def _utc_now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="microseconds")


def _report_text(report: FlopReport | Mapping[str, Any]) -> tuple[str, str]:
    """The run id and canonical JSON of a report (a :class:`FlopReport` or its JSON object).

    Raises:
        LedgerError: the report has no run id, or is not a report of the strict model
            (:func:`~flopmeter.report.reading.check_report_object`: a known schema version, every
            field and only those, each of its type, every count and figure finite and not
            negative); the message names the field.
    """
    from flopmeter.report.reading import check_report_object  # the strict reader, same layer

    data = report_object(report)
    run_id = report_value(data, "run.run_id")  # schema 2.0, or a 1.x report's run_id
    if not isinstance(run_id, str) or not run_id:
        raise LedgerError("a report without a run_id cannot go into the ledger")
    problem = run_id_problem(run_id)  # first: the id keys the record, whatever else is wrong
    if problem is not None:
        raise LedgerError(f"run_id: {problem}")
    try:
        check_report_object(data, "the report", figures=False)
    except ReportFileError as exc:
        raise LedgerError(f"refused, not a valid flopmeter report: {exc}") from None
    return run_id, canonical_json(data)


class Ledger:
    """A flopmeter ledger file (see the module's docstring).

    Args:
        path: The SQLite file.
        create: Make the file (and its folder) when it does not exist; otherwise a missing
            file is an error. Opening for writing also checks that the file can be written.
        timeout_seconds: How long an append waits for another process's append.

    Raises:
        LedgerError: the file is not a ledger (not SQLite, or SQLite without the ledger's
            tables), is missing (``create=False``), or cannot be written (``create=True``).
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        create: bool = True,
        timeout_seconds: float = DEFAULT_TIMEOUT_SECONDS,
    ) -> None:
        self.path = Path(path).expanduser()
        self.timeout_seconds = timeout_seconds
        self.writable = create
        why = file_problem(self.path)
        if why is not None:
            raise LedgerError(f"{self.path} is not a flopmeter ledger ({why}).")
        if create:
            self._prepare_for_writing()
        elif not self.path.exists():
            raise LedgerError(f"no flopmeter ledger at {self.path} (the file does not exist).")
        else:
            self._roll_back_unfinished_append()
        self._check_magic()

    # ------------------------------------------------------------------ opening
    def _connect(self, read_only: bool = False) -> sqlite3.Connection:
        target = f"{self.path.resolve().as_uri()}?mode=ro" if read_only else str(self.path)
        con = sqlite3.connect(
            target, timeout=self.timeout_seconds, isolation_level=None, uri=read_only
        )
        return con

    def _prepare_for_writing(self) -> None:
        """Makes the folder and the tables; fails when the file or folder is read-only."""
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise LedgerError(
                f"the ledger's folder {self.path.parent} cannot be made: {exc.strerror or exc}."
            ) from None
        folder_ok = os.access(self.path.parent, os.W_OK | os.X_OK)
        if not folder_ok or (self.path.exists() and not os.access(self.path, os.W_OK)):
            raise LedgerError(
                f"the ledger {self.path} is read-only for this process (the file or its folder "
                "cannot be written); a run's record cannot be appended to it."
            )
        with self._transaction() as con:
            exists = con.execute(
                "SELECT count(*) FROM sqlite_master WHERE type='table' AND name LIKE 'ledger_%'"
            ).fetchone()[0]
            others = con.execute("SELECT count(*) FROM sqlite_master").fetchone()[0]
            if exists == 0 and others == 0:  # a new (or empty) file: make it a ledger
                for statement in SCHEMA:
                    con.execute(statement)
                con.executemany(
                    "INSERT INTO ledger_meta (key, value) VALUES (?, ?)",
                    [
                        ("magic", MAGIC),
                        ("format", FORMAT),
                        ("head_seq", "0"),
                        ("head_hash", GENESIS_HASH),
                    ],
                )

    def _roll_back_unfinished_append(self) -> None:
        """Rolls back an append that a crash left unfinished, so that reading can go on.

        A process that dies inside an append leaves SQLite's journal (``<file>-journal``) hot:
        the file may hold half of that append until the journal is played back, and a read-only
        connection may not do that (SQLite refuses it). A connection that may write plays it
        back on its first read, as any writer's would; nothing is added or edited, the
        unfinished append is undone.

        Raises:
            LedgerError: there is a journal to play back and this process cannot write the
                ledger or its folder.
        """
        journal = self.path.with_name(self.path.name + "-journal")
        try:
            if journal.stat().st_size == 0:
                return
        except OSError:
            return  # no journal: nothing was left unfinished
        try:
            with contextlib.closing(self._connect()) as con:
                con.execute("SELECT count(*) FROM sqlite_master").fetchone()
        except sqlite3.OperationalError as exc:
            if "readonly" not in str(exc) and "unable to open" not in str(exc):
                raise LedgerError(f"the ledger {self.path} cannot be read: {exc}.") from None
            raise LedgerError(
                f"the ledger {self.path} has an append that a crash left unfinished (its journal "
                f"{journal} is still there); SQLite must undo it before the ledger can be read, "
                "which needs write access to the file and its folder. Run this command once as "
                "a user who can write them."
            ) from None
        except sqlite3.DatabaseError:
            return  # not SQLite's: _check_magic says so

    def _check_magic(self) -> None:
        """Raises :class:`LedgerError` unless the file is a flopmeter ledger of a known format."""
        try:
            with contextlib.closing(self._connect(read_only=not self.writable)) as con:
                meta = dict(con.execute("SELECT key, value FROM ledger_meta").fetchall())
                con.execute("SELECT count(*) FROM ledger_records").fetchone()
        except sqlite3.DatabaseError as exc:
            raise LedgerError(
                f"{self.path} is not a flopmeter ledger (an SQLite database without the ledger "
                f"tables: {exc})."
            ) from None
        if meta.get("magic") != MAGIC:
            raise LedgerError(
                f"{self.path} is not a flopmeter ledger (ledger_meta has no magic {MAGIC!r})."
            )
        if meta.get("format") != FORMAT:
            raise LedgerError(
                f"{self.path} is a flopmeter ledger of format {meta.get('format')!r}; this "
                f"flopmeter reads format {FORMAT}."
            )

    @contextlib.contextmanager
    def _transaction(self) -> Iterator[sqlite3.Connection]:
        """A write transaction holding SQLite's write lock from its start (``BEGIN IMMEDIATE``).

        Raises:
            LedgerError: the lock was not had within ``timeout_seconds``, or the file cannot be
                written.
        """
        try:
            con = self._connect()
        except sqlite3.Error as exc:
            raise LedgerError(f"the ledger {self.path} cannot be opened: {exc}.") from None
        try:
            con.execute("BEGIN IMMEDIATE")
            try:
                yield con
            except BaseException:
                con.execute("ROLLBACK")
                raise
            con.execute("COMMIT")
        except sqlite3.OperationalError as exc:
            text = str(exc)
            why = "it is read-only for this process" if "readonly" in text else text
            raise LedgerError(f"the ledger {self.path} cannot be written: {why}.") from None
        except sqlite3.DatabaseError as exc:  # the file is damaged (its pages are not SQLite's)
            raise LedgerError(
                f"{self.path} is not a flopmeter ledger: the SQLite file is damaged ({exc}). "
                "Restore it from a copy, or move it away to start a new ledger."
            ) from None
        finally:
            con.close()

    # ------------------------------------------------------------------ writing
    def append(self, report: FlopReport | Mapping[str, Any]) -> AppendResult:
        """Appends a run's report; the same report of the same run again is a no-op.

        A different report of a run already in the ledger (an interrupted report, then the
        run's final one) is appended as the next version of that run; nothing is replaced.

        Args:
            report: The report (a :class:`FlopReport`, or its JSON object), with a ``run_id``.

        Returns:
            The record, and whether it was appended now.

        Raises:
            LedgerError: no ``run_id``, or the ledger cannot be written.
        """
        run_id, text = _report_text(report)
        digest = sha256_text(text)
        with self._transaction() as con:
            same = con.execute(
                f"SELECT {COLUMNS} FROM ledger_records WHERE run_id = ? AND report_sha256 = ?",
                (run_id, digest),
            ).fetchone()
            if same is not None:
                return AppendResult(LedgerRecord(*same), appended=False)
            version = con.execute(
                "SELECT coalesce(max(version), 0) + 1 FROM ledger_records WHERE run_id = ?",
                (run_id,),
            ).fetchone()[0]
            last = con.execute(
                "SELECT seq, chain_hash FROM ledger_records ORDER BY seq DESC LIMIT 1"
            ).fetchone()
            seq, prev = (last[0] + 1, last[1]) if last else (1, GENESIS_HASH)
            now = _utc_now()
            record = LedgerRecord(
                seq,
                run_id,
                version,
                now,
                text,
                digest,
                prev,
                chain_hash(seq, run_id, version, now, digest, prev),
            )
            con.execute(
                f"INSERT INTO ledger_records ({COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                (
                    record.seq,
                    record.run_id,
                    record.version,
                    record.recorded_at,
                    record.report_json,
                    record.report_sha256,
                    record.prev_hash,
                    record.chain_hash,
                ),
            )
            con.executemany(
                "UPDATE ledger_meta SET value = ? WHERE key = ?",
                [(str(seq), "head_seq"), (record.chain_hash, "head_hash")],
            )
        return AppendResult(record, appended=True)

    # ------------------------------------------------------------------ reading
    def records(self) -> list[LedgerRecord]:
        """Every record, in chain order (``seq``)."""
        with contextlib.closing(self._connect(read_only=True)) as con:
            rows = con.execute(f"SELECT {COLUMNS} FROM ledger_records ORDER BY seq").fetchall()
        return [LedgerRecord(*row) for row in rows]

    def latest(self) -> list[LedgerRecord]:
        """The last version of each run, in the order the runs first entered the ledger."""
        by_run: dict[str, LedgerRecord] = {}
        for record in self.records():
            by_run[record.run_id] = record
        return list(by_run.values())

    def get(self, run_id: str) -> list[LedgerRecord]:
        """Every version of one run's record (oldest first); empty when the run is unknown."""
        return [r for r in self.records() if r.run_id == run_id]

    def head(self) -> tuple[int, str]:
        """The stored head: the last record's ``(seq, chain_hash)`` (``(0, 64 zeros)`` when
        empty)."""
        return head_of(self._meta())

    def _meta(self) -> dict[str, str]:
        """``ledger_meta`` as a dictionary."""
        with contextlib.closing(self._connect(read_only=True)) as con:
            return dict(con.execute("SELECT key, value FROM ledger_meta").fetchall())

    def verify(self, expected_head: tuple[int, str] | None = None) -> VerifyResult:
        """Checks the whole chain, and that it still reaches its head.

        Args:
            expected_head: A head ``(seq, chain_hash)`` exported earlier (``flopmeter ledger
                verify --head SEQ:HASH``): the only check that finds the last records
                deleted together with the stored head.

        Returns:
            The records checked, the stored head, and every problem.
        """
        records = self.records()
        meta = self._meta()
        if not {"head_seq", "head_hash"} <= meta.keys():  # every ledger is created with one
            problems = [*check_chain(records), HEAD_MISSING]
            head = (0, GENESIS_HASH)
        else:
            head = head_of(meta)
            problems = check_chain(records, head, head_is_last=True)
        if expected_head is not None:
            problems += [p for p in check_chain(records, expected_head) if p.kind == "truncated"]
        return VerifyResult(len(records), head if head[0] else None, problems)
