"""The ledger's hash chain: canonical report text, the hashes, and the check of a chain (pure).

A record's ``chain_hash`` is the SHA-256 of its sequence number, run id, version, time, the
SHA-256 of its report and the previous record's ``chain_hash`` (64 zeros for the first record).
Changing any of these in one record, or removing, inserting or moving a record, breaks the
chain at that record or at the one after it; :func:`check_chain` names where.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from flopmeter.report import FlopReport

__all__ = [
    "GENESIS_HASH",
    "ChainProblem",
    "LedgerRecord",
    "canonical_json",
    "chain_hash",
    "check_chain",
    "report_object",
    "sha256_text",
]

#: The ``prev_hash`` of the first record.
GENESIS_HASH = "0" * 64
#: Mixed into every chain hash, so that a hash of this format is never taken for another's.
_DOMAIN = "flopmeter-ledger-v1"


def canonical_json(data: Any) -> str:
    """``data`` as canonical JSON text: sorted keys, no spaces, UTF-8 characters kept, no NaN.

    The same report always gives the same text, so its SHA-256 identifies it.

    Raises:
        ValueError: ``data`` holds a NaN or infinity (not JSON).
    """
    return json.dumps(
        data, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False
    )


def report_object(report: FlopReport | Mapping[str, Any]) -> dict[str, Any]:
    """A report as its JSON object: a :class:`FlopReport` as its report file reads back, a
    mapping (a report file's object) as given. The ledger and the sinks both hash
    :func:`canonical_json` of this object, so the same report has the same SHA-256 in each.
    """
    return json.loads(report.to_json()) if isinstance(report, FlopReport) else dict(report)


def sha256_text(text: str) -> str:
    """The SHA-256 of ``text`` encoded as UTF-8, as 64 lowercase hex digits."""
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def chain_hash(
    seq: int, run_id: str, version: int, recorded_at: str, report_sha256: str, prev_hash: str
) -> str:
    """The chain hash of a record from its fields and the previous record's chain hash."""
    fields = (_DOMAIN, str(seq), run_id, str(version), recorded_at, report_sha256, prev_hash)
    return sha256_text("\n".join(fields))


@dataclass(frozen=True)
class LedgerRecord:
    """One record of the ledger, as stored.

    Attributes:
        seq: Position in the chain, from 1, without gaps.
        run_id: The run's id (the report's ``run_id``).
        version: 1 for a run's first record; a later, different report of the same run is
            appended as version 2, 3, ... (nothing is ever replaced).
        recorded_at: When the record was appended, ISO 8601, UTC.
        report_json: The report, canonical JSON (:func:`canonical_json`).
        report_sha256: SHA-256 of ``report_json``.
        prev_hash: ``chain_hash`` of the record before (:data:`GENESIS_HASH` for the first).
        chain_hash: This record's chain hash (:func:`chain_hash`).
    """

    seq: int
    run_id: str
    version: int
    recorded_at: str
    report_json: str
    report_sha256: str
    prev_hash: str
    chain_hash: str

    def report(self) -> dict[str, Any]:
        """The report as a JSON object (a dict)."""
        return json.loads(self.report_json)


@dataclass(frozen=True)
class ChainProblem:
    """Where the chain is broken, and how.

    Attributes:
        seq: The record at fault (or, for a truncated tail, the last record there is).
        run_id: Its run id.
        kind: ``report_edited``, ``hash_edited``, ``link_broken``, ``seq_gap``,
            ``truncated``, ``not_appended``, ``head_edited`` (the stored head does not match
            the last record) or ``head_missing`` (the stored head was deleted).
        message: One line for a person.
    """

    seq: int | None
    run_id: str | None
    kind: str
    message: str


def _record_problems(
    record: LedgerRecord, expected_seq: int, expected_prev: str
) -> list[ChainProblem]:
    """What is wrong with one record, given where the chain before it ended."""
    problems = []

    def add(kind: str, what: str) -> None:
        problems.append(
            ChainProblem(
                record.seq,
                record.run_id,
                kind,
                f"record seq {record.seq} (run {record.run_id}): {what}",
            )
        )

    if record.seq != expected_seq:
        add("seq_gap", f"expected seq {expected_seq} here: records are missing before it")
    if sha256_text(record.report_json) != record.report_sha256:
        add("report_edited", "its report does not match its SHA-256 (the report was edited)")
    if record.prev_hash != expected_prev:
        add(
            "link_broken",
            "its prev_hash is not the chain hash of the record before it (a record before it "
            "was deleted, inserted or moved, or this one was)",
        )
    again = chain_hash(
        record.seq,
        record.run_id,
        record.version,
        record.recorded_at,
        record.report_sha256,
        record.prev_hash,
    )
    if again != record.chain_hash:
        add("hash_edited", "its chain hash does not match its fields (a hash or field was edited)")
    return problems


def check_chain(
    records: Iterable[LedgerRecord],
    head: tuple[int, str] | None = None,
    *,
    head_is_last: bool = False,
) -> list[ChainProblem]:
    """Every break in a chain of records, in order of ``seq``.

    Args:
        records: The records, ordered by ``seq``.
        head: ``(seq, chain_hash)`` the last record must have (the ledger's stored head, or a
            head exported earlier), ``None`` to check the records only. A tail cut off
            (the last records deleted) leaves a valid chain: only a head kept elsewhere finds it.
        head_is_last: ``head`` is the ledger's stored head, which every append updates: a
            record after it was added by something else than an append.

    Returns:
        The problems found; empty for a valid chain.
    """
    problems: list[ChainProblem] = []
    prev, expected_seq, last, at_head = GENESIS_HASH, 1, None, None
    for record in records:
        problems += _record_problems(record, expected_seq, prev)
        prev, expected_seq, last = record.chain_hash, record.seq + 1, record
        if head is not None and record.seq == head[0]:
            at_head = record
    if head is not None and head[0] > 0:
        problems += _head_problems(head, last, at_head, stored=head_is_last)
    if head is not None and head_is_last and last is not None and last.seq > head[0]:
        problems.append(
            ChainProblem(
                last.seq,
                last.run_id,
                "not_appended",
                (
                    f"record seq {last.seq} (run {last.run_id}) is after the ledger's head (seq "
                    f"{head[0]}): records were added without an append"
                ),
            )
        )
    return problems


def _head_problems(
    head: tuple[int, str],
    last: LedgerRecord | None,
    at_head: LedgerRecord | None,
    *,
    stored: bool = False,
) -> list[ChainProblem]:
    """Whether the chain still reaches the head ``(seq, chain_hash)`` recorded for it
    (``stored``: the ledger's own head, which every append rewrites)."""
    head_seq, head_hash = head
    if last is None:
        return [
            ChainProblem(
                None,
                None,
                "truncated",
                f"the head is record seq {head_seq}, but the ledger holds no records: every "
                "record was deleted",
            )
        ]
    if at_head is None:
        return [
            ChainProblem(
                last.seq,
                last.run_id,
                "truncated",
                (
                    f"the head is record seq {head_seq}, but the last record is seq {last.seq}: "
                    "the records after it were deleted"
                ),
            )
        ]
    if at_head.chain_hash == head_hash:
        return []
    where = f"record seq {at_head.seq} (run {at_head.run_id})"
    if stored and at_head is last:
        return [
            ChainProblem(
                at_head.seq,
                at_head.run_id,
                "head_edited",
                (
                    f"{where}, the last record, is not the ledger's stored head "
                    f"({head_hash[:16]}...): the stored head was edited, or the head record "
                    "was replaced"
                ),
            )
        ]
    return [
        ChainProblem(
            at_head.seq,
            at_head.run_id,
            "truncated",
            (
                f"{where} is not the head recorded ({head_hash[:16]}...): the chain was cut "
                "there and records appended again"
            ),
        )
    ]
