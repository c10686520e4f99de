"""Sinks: copies of each run's record outside the machine, in S3 and DynamoDB (``aws`` extra).

* :class:`S3Sink` (``"s3://bucket/prefix"``): one object per run, ``prefix/<run_id>.json``,
  holding the report's canonical JSON (a report file ``flopmeter show`` reads), with its SHA-256
  (and the ledger's ``seq`` and ``chain_hash`` when the run is in a ledger) as object metadata.
* :class:`DynamoDBSink` (``"dynamodb://table"``): one item per run, key ``run_id`` (a string
  partition key), holding the report's JSON and its headline figures.

Both are idempotent by run id: the same report again changes nothing; another report under the
same run id is refused (conditional writes), never overwritten. Each attempt is retried with
backoff on connection errors, throttling and server errors (any HTTP 5xx answer, a HEAD's
bodiless 500 too), and :func:`deliver` runs the sinks in threads with a deadline, so the end of
a training run is never held up past it. A run id that is not one (``../other/x``) is refused
before any key is made from it.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol
from urllib.parse import urlparse

from flopmeter.errors import ConfigurationError, MissingExtraError
from flopmeter.ledger.chain import LedgerRecord, canonical_json, report_object, sha256_text
from flopmeter.report import FlopReport
from flopmeter.report.upgrade import report_value
from flopmeter.safe_text import check_run_id, redact, run_id_problem

__all__ = [
    "DEFAULT_SINK_TIMEOUT_SECONDS",
    "SINKS_ENV",
    "DynamoDBSink",
    "S3Sink",
    "Sink",
    "SinkError",
    "SinkOutcome",
    "SinkPayload",
    "deliver",
    "parse_sinks",
]

#: Environment variable with sinks, comma-separated (``s3://bucket/prefix,dynamodb://table``).
SINKS_ENV = "FLOPMETER_SINKS"
#: How long the end of a run waits for its sinks, seconds, by default.
DEFAULT_SINK_TIMEOUT_SECONDS = 30.0
#: Error codes worth another try (throttling, server errors).
_RETRY_CODES = frozenset(
    {
        "Throttling",
        "ThrottlingException",
        "ProvisionedThroughputExceededException",
        "RequestLimitExceeded",
        "InternalError",
        "InternalServerError",
        "ServiceUnavailable",
        "SlowDown",
        "RequestTimeout",
    }
)


class SinkError(Exception):
    """A sink could not store a record (the message names the sink and why)."""


@dataclass(frozen=True)
class SinkPayload:
    """What a sink stores for one run.

    Attributes:
        run_id: The run's id.
        report_json: The report, canonical JSON.
        report_sha256: Its SHA-256.
        record: The run's ledger record, when the run is in a ledger.
    """

    run_id: str
    report_json: str
    report_sha256: str
    record: LedgerRecord | None = None

    @classmethod
    def of(
        cls, report: FlopReport | Mapping[str, Any], record: LedgerRecord | None = None
    ) -> SinkPayload:
        """The payload of a report (a :class:`FlopReport` or its JSON object), with its ledger
        record if any.

        Raises:
            SinkError: the report has no run id.
        """
        data = report_object(report)
        run_id = report_value(data, "run.run_id")  # schema 2.0, or a 1.x report's run_id
        if not isinstance(run_id, str) or not run_id:
            raise SinkError("a report without a run_id cannot be stored by run id")
        problem = run_id_problem(run_id)
        if problem is not None:  # "../tenant-b/x" would name a key outside the prefix
            raise SinkError(f"run_id: {problem}")
        text = record.report_json if record is not None else canonical_json(data)
        return cls(run_id, text, sha256_text(text), record)

    def report(self) -> dict[str, Any]:
        """The report as a JSON object."""
        return json.loads(self.report_json)


class Sink(Protocol):
    """Something that stores a run's record; :meth:`put` is idempotent by run id."""

    name: str

    def put(self, payload: SinkPayload, timeout_seconds: float) -> str:
        """Stores ``payload``; returns where (or that it was already there). Raises on failure."""
        ...


def _boto3() -> Any:
    try:
        import boto3
    except ImportError:
        raise MissingExtraError("boto3", "aws", "the S3 and DynamoDB sinks") from None
    return boto3


def _client(service: str, endpoint_url: str | None, region: str | None, timeout: float) -> Any:
    """A boto3 client that fails fast (one attempt per call; :func:`_retrying` retries)."""
    from botocore.config import Config

    config = Config(
        connect_timeout=max(1.0, min(5.0, timeout)),
        read_timeout=max(1.0, min(10.0, timeout)),
        retries={"max_attempts": 1, "mode": "standard"},
    )
    session = _boto3().session.Session()
    region = region or session.region_name or "us-east-1"
    return session.client(service, endpoint_url=endpoint_url, region_name=region, config=config)


def _code(exc: BaseException) -> str:
    return str(getattr(exc, "response", {}).get("Error", {}).get("Code", ""))


def _retryable(exc: BaseException) -> bool:
    from botocore.exceptions import ClientError, ConnectionError, HTTPClientError

    if isinstance(exc, (ConnectionError, HTTPClientError)):
        return True
    if not isinstance(exc, ClientError):
        return False
    status = getattr(exc, "response", {}).get("ResponseMetadata", {}).get("HTTPStatusCode")
    code = _code(exc)  # a HEAD's 500 has no body, so its code is just "500"
    return (
        code in _RETRY_CODES
        or (isinstance(status, int) and status >= 500)
        or (code.isdigit() and int(code) >= 500)
    )


def _retrying(call: Callable[[], str], name: str, timeout_seconds: float) -> str:
    """``call()``, tried again with backoff (0.5 s, 1 s, 2 s ...) on transient errors until
    ``timeout_seconds`` have passed.

    Raises:
        SinkError: the last error, with the sink's name.
    """
    deadline = time.monotonic() + timeout_seconds
    delay = 0.5
    while True:
        try:
            return call()
        except SinkError:
            raise
        except Exception as exc:
            left = deadline - time.monotonic()
            if not _retryable(exc) or left <= delay:
                raise SinkError(f"{name}: {_describe(exc)}") from None
            time.sleep(delay)
            delay *= 2


def _describe(exc: BaseException) -> str:
    text = redact(" ".join(str(exc).split())) or type(exc).__name__
    return text if len(text) < 300 else text[:297] + "..."


@dataclass
class S3Sink:
    """One object per run at ``s3://bucket/prefix/<run_id>.json``.

    Args:
        bucket: The bucket.
        prefix: The key prefix (no leading or trailing ``/`` needed).
        endpoint_url: Another endpoint than AWS's (a local S3); by default boto3's
            (``AWS_ENDPOINT_URL`` is honoured).
        region: The region; by default boto3's, else ``us-east-1``.
    """

    bucket: str
    prefix: str = ""
    endpoint_url: str | None = None
    region: str | None = None

    @property
    def name(self) -> str:
        return f"s3://{self.bucket}/{self.prefix}".rstrip("/")

    def key(self, run_id: str) -> str:
        """The object key of a run (always under the prefix).

        Raises:
            ValueError: ``run_id`` is not a run id (``../other/x`` would climb out).
        """
        check_run_id(run_id)
        return f"{self.prefix.strip('/')}/{run_id}.json".lstrip("/")

    def put(self, payload: SinkPayload, timeout_seconds: float) -> str:
        """Puts the report's object unless it is there (same report: nothing to do).

        Raises:
            SinkError: another report is stored under this run id, or S3 failed.
        """
        client = _client("s3", self.endpoint_url, self.region, timeout_seconds)
        key = self.key(payload.run_id)
        where = f"s3://{self.bucket}/{key}"

        def once() -> str:
            from botocore.exceptions import ClientError

            try:
                meta = client.head_object(Bucket=self.bucket, Key=key).get("Metadata", {})
            except ClientError as exc:
                if _code(exc) not in ("404", "NoSuchKey", "NotFound"):
                    raise
            else:
                if meta.get("report-sha256") == payload.report_sha256:
                    return f"{where} (already there)"
                raise SinkError(f"{where} already holds another report of run {payload.run_id}")
            client.put_object(
                Bucket=self.bucket,
                Key=key,
                Body=payload.report_json.encode("utf-8"),
                ContentType="application/json",
                Metadata=_metadata(payload),
            )
            return where

        return _retrying(once, self.name, timeout_seconds)


def _metadata(payload: SinkPayload) -> dict[str, str]:
    meta = {"report-sha256": payload.report_sha256}
    if payload.record is not None:
        meta.update(
            {"ledger-seq": str(payload.record.seq), "ledger-chain-hash": payload.record.chain_hash}
        )
    return meta


@dataclass
class DynamoDBSink:
    """One item per run in a DynamoDB table whose partition key is ``run_id`` (a string).

    Args:
        table: The table's name.
        endpoint_url: Another endpoint than AWS's; by default boto3's (``AWS_ENDPOINT_URL``).
        region: The region; by default boto3's, else ``us-east-1``.
    """

    table: str
    endpoint_url: str | None = None
    region: str | None = None

    @property
    def name(self) -> str:
        return f"dynamodb://{self.table}"

    def put(self, payload: SinkPayload, timeout_seconds: float) -> str:
        """Puts the run's item unless it is there (same report: nothing to do).

        Raises:
            SinkError: another report is stored under this run id, or DynamoDB failed.
        """
        client = _client("dynamodb", self.endpoint_url, self.region, timeout_seconds)
        where = f"{self.name} run_id={payload.run_id}"

        def once() -> str:
            from botocore.exceptions import ClientError

            try:
                client.put_item(
                    TableName=self.table,
                    Item=_item(payload),
                    ConditionExpression="attribute_not_exists(run_id) OR report_sha256 = :sha",
                    ExpressionAttributeValues={":sha": {"S": payload.report_sha256}},
                )
            except ClientError as exc:
                if _code(exc) == "ConditionalCheckFailedException":
                    raise SinkError(f"{where} already holds another report of this run") from None
                raise
            return where

        return _retrying(once, self.name, timeout_seconds)


#: The DynamoDB item's string attributes: attribute name -> the report field (2.0 path).
ITEM_STRINGS = {
    "model_name": "model.name",
    "status": "run.status",
    "verdict": "verdict.outcome",
    "started_at": "run.started_at",
    "ended_at": "run.ended_at",
    "threshold_kind": "threshold.kind",
}
#: The DynamoDB item's number attributes: attribute name -> the report field (2.0 path).
ITEM_NUMBERS = {
    "primary_flops": "compute.primary_flops",
    "threshold_flops": "threshold.threshold_flops",
    "judged_flops": "verdict.judged_flops",
    "tokens_processed": "tokens.tokens_processed",
    "n_total": "model.n_total",
    "n_trainable": "model.n_trainable",
    "cumulative_flops": "lineage.cumulative_flops",
}


def _item(payload: SinkPayload) -> dict[str, dict[str, str]]:
    """The DynamoDB item: the report and its headline figures (:data:`ITEM_STRINGS`,
    :data:`ITEM_NUMBERS`; null figures left out), read from a report of either schema."""
    report = payload.report()
    item = {
        "run_id": {"S": payload.run_id},
        "report": {"S": payload.report_json},
        "report_sha256": {"S": payload.report_sha256},
    }
    for key, path in ITEM_STRINGS.items():
        value = report_value(report, path)
        if isinstance(value, str):
            item[key] = {"S": value}
    for key, path in ITEM_NUMBERS.items():
        value = report_value(report, path)
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            item[key] = {"N": repr(value)}
    if payload.record is not None:
        item["ledger_seq"] = {"N": str(payload.record.seq)}
        item["ledger_chain_hash"] = {"S": payload.record.chain_hash}
    return item


def parse_sinks(value: object) -> list[Sink]:
    """Sinks from an option: a sink, a spec string, or a sequence of them (``None``: none).

    Specs: ``s3://bucket[/prefix]`` and ``dynamodb://table``; a string may hold several,
    comma-separated (as ``FLOPMETER_SINKS`` does).

    Raises:
        ConfigurationError: a spec that is neither, or something that is not a sink.
        MissingExtraError: boto3 is not installed.
    """
    if value is None:
        return []
    items = value.split(",") if isinstance(value, str) else value
    if not isinstance(items, Sequence):
        items = [items]
    sinks: list[Sink] = []
    for item in items:
        if isinstance(item, str):
            if item.strip():
                sinks.append(_parse_spec(item.strip()))
        elif callable(getattr(item, "put", None)) and isinstance(getattr(item, "name", None), str):
            sinks.append(item)
        else:
            raise ConfigurationError(
                f"sinks: {item!r} is not a sink (give 's3://bucket/prefix', "
                "'dynamodb://table', or an object with name and put())."
            )
    if any(isinstance(s, (S3Sink, DynamoDBSink)) for s in sinks):
        _boto3()
    return sinks


def _parse_spec(spec: str) -> Sink:
    parsed = urlparse(spec)
    if parsed.scheme == "s3" and parsed.netloc:
        return S3Sink(parsed.netloc, parsed.path.strip("/"))
    if parsed.scheme == "dynamodb" and parsed.netloc and not parsed.path.strip("/"):
        return DynamoDBSink(parsed.netloc)
    raise ConfigurationError(
        f"sinks: {spec!r} is not a sink; give 's3://bucket/prefix' or 'dynamodb://table'."
    )


@dataclass(frozen=True)
class SinkOutcome:
    """What one sink did with one record.

    Attributes:
        sink: The sink's name.
        ok: Whether the record is stored there.
        detail: Where it is stored, or why not.
    """

    sink: str
    ok: bool
    detail: str


def deliver(
    payload: SinkPayload, sinks: Sequence[Sink], timeout_seconds: float
) -> list[SinkOutcome]:
    """Stores ``payload`` in every sink at once, waiting ``timeout_seconds`` at most. Never raises.

    Each sink runs in its own daemon thread; one still running at the deadline is reported as
    not done (it may still finish in the background while the process lives).
    """
    results: dict[int, SinkOutcome] = {}

    def run(i: int, sink: Sink) -> None:
        try:
            results[i] = SinkOutcome(sink.name, True, sink.put(payload, timeout_seconds))
        except Exception as exc:  # a SinkError names the sink; anything else is named here
            text = _describe(exc)
            named = text if text.startswith(sink.name) else f"{sink.name}: {text}"
            results[i] = SinkOutcome(sink.name, False, named)

    threads = [
        threading.Thread(target=run, args=(i, s), name=f"flopmeter-sink-{i}", daemon=True)
        for i, s in enumerate(sinks)
    ]
    deadline = time.monotonic() + timeout_seconds
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(max(0.0, deadline - time.monotonic()))
    return [
        results.get(i)
        or SinkOutcome(s.name, False, f"{s.name}: not done within {timeout_seconds:g} s")
        for i, s in enumerate(sinks)
    ]
