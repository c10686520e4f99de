"""The ledger file's layout: its tables and triggers, the facts ``ledger_meta`` holds, and
the checks of a file before it is opened as a ledger.

What :class:`flopmeter.ledger.store.Ledger` creates, refuses and reads by: the magic string and
format in ``ledger_meta``, the record columns in chain order, the triggers that refuse
``UPDATE`` and ``DELETE``, SQLite's file header, and the head as ``ledger_meta`` stores it.
No connection is made here.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from flopmeter.ledger.chain import GENESIS_HASH, ChainProblem

__all__ = [
    "COLUMNS",
    "FORMAT",
    "HEAD_MISSING",
    "MAGIC",
    "SCHEMA",
    "SQLITE_HEADER",
    "file_problem",
    "head_of",
]

#: What ``ledger_meta.magic`` holds in a flopmeter ledger.
MAGIC = "flopmeter-ledger"
#: The ledger format this flopmeter writes and reads.
FORMAT = "1"
#: The first bytes of every SQLite database file.
SQLITE_HEADER = b"SQLite format 3\x00"
#: The record columns, in the order :class:`~flopmeter.ledger.chain.LedgerRecord` holds them.
COLUMNS = "seq, run_id, version, recorded_at, report_json, report_sha256, prev_hash, chain_hash"
#: The tables and the triggers that refuse editing the records, made in a new file.
SCHEMA = (
    "CREATE TABLE IF NOT EXISTS ledger_meta (key TEXT PRIMARY KEY, value TEXT NOT NULL)",
    "CREATE TABLE IF NOT EXISTS ledger_records (seq INTEGER PRIMARY KEY, run_id TEXT NOT NULL, "
    "version INTEGER NOT NULL, recorded_at TEXT NOT NULL, report_json TEXT NOT NULL, "
    "report_sha256 TEXT NOT NULL, prev_hash TEXT NOT NULL, chain_hash TEXT NOT NULL, "
    "UNIQUE (run_id, version))",
    "CREATE TRIGGER IF NOT EXISTS ledger_no_update BEFORE UPDATE ON ledger_records "
    "BEGIN SELECT RAISE(ABORT, 'the flopmeter ledger is append-only'); END",
    "CREATE TRIGGER IF NOT EXISTS ledger_no_delete BEFORE DELETE ON ledger_records "
    "BEGIN SELECT RAISE(ABORT, 'the flopmeter ledger is append-only'); END",
)


def file_problem(path: Path) -> str | None:
    """Why ``path`` cannot be a ledger file, or ``None`` (missing, empty, or SQLite)."""
    if not path.exists():
        return None
    if not path.is_file():
        return "it is not a regular file"
    with path.open("rb") as f:
        head = f.read(len(SQLITE_HEADER))
    if head and head != SQLITE_HEADER:
        return "it is not an SQLite database"
    return None


def head_of(meta: Mapping[str, str]) -> tuple[int, str]:
    """The head ``(seq, chain_hash)`` that ``ledger_meta`` stores (``-1`` for a seq that is not
    a number)."""
    try:
        return int(meta.get("head_seq", "0")), str(meta.get("head_hash", GENESIS_HASH))
    except ValueError:
        return -1, str(meta.get("head_hash"))


#: The problem of a ledger whose stored head was deleted from ``ledger_meta``.
HEAD_MISSING = ChainProblem(
    None,
    None,
    "head_missing",
    "the ledger's stored head (head_seq and head_hash in ledger_meta) is missing: it was "
    "deleted, so a cut tail cannot be found without a head exported earlier (--head)",
)
