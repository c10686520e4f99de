"""The audit trail: every run's final report in a tamper-evident, append-only SQLite ledger,
and sinks that copy it to S3 and DynamoDB (see docs/audit-trail.md)."""

from flopmeter.ledger.chain import ChainProblem, LedgerRecord, canonical_json
from flopmeter.ledger.store import (
    LEDGER_ENV,
    AppendResult,
    Ledger,
    LedgerError,
    VerifyResult,
    default_ledger_path,
    resolve_ledger,
)

__all__ = [
    "LEDGER_ENV",
    "AppendResult",
    "ChainProblem",
    "Ledger",
    "LedgerError",
    "LedgerRecord",
    "VerifyResult",
    "canonical_json",
    "default_ledger_path",
    "resolve_ledger",
]
