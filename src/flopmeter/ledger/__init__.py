"""The audit trail: every run's final report in a tamper-evident, append-only SQLite ledger,
and sinks that copy it to S3 and DynamoDB (see docs/audit-trail.md)."""
