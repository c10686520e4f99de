"""``flopmeter upload``: copy a run's final report to S3 and/or DynamoDB after the job.

The pipeline step after a training job: ``flopmeter upload out/flops_meter.json --s3
s3://bucket/prefix --dynamodb-table runs``. The same sinks as the meter's ``sinks=`` option,
idempotent by run id (uploading the same report again changes nothing). Exit status 0 when every
sink holds the report, 1 when one could not store it (one line each on stderr), 2 for bad input
(the file is not a final flopmeter report, a bad ``--s3``).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from flopmeter.cli._args import non_negative
from flopmeter.errors import ConfigurationError, MissingExtraError

if TYPE_CHECKING:  # the sinks, the ledger and the report are imported by the command's run
    from flopmeter.ledger.sinks import Sink, SinkPayload


def _refuse_aws_keyed_copy(path: str) -> None:
    """Refuses flopmeter's own AWS-keyed file (the AWS meter's keys plus ``run_id`` and
    ``schema_version``), naming the full report the callback wrote beside it."""
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
    except (OSError, ValueError):
        return  # read_report names what is wrong with it
    from flopmeter.report.output_path import FULL_REPORT_FILENAME

    if not (isinstance(data, dict) and "Flops_architecture" in data and "run_id" in data):
        return
    if "schema_version" not in data:
        return
    full = Path(path).expanduser().parent / FULL_REPORT_FILENAME
    there = "" if full.is_file() else " (not there now: upload the full report the run wrote)"
    raise ConfigurationError(
        f"{path} is flopmeter's AWS-keyed copy (aws_keys=True: the AWS meter's keys for the "
        f"pipelines that parse them), not the full report; upload {full} beside it{there}"
    )


def _sinks(args: argparse.Namespace) -> list[Sink]:
    """The sinks the arguments name, with ``--endpoint-url`` and ``--region`` applied."""
    from flopmeter.ledger.sinks import DynamoDBSink, S3Sink, parse_sinks

    sinks: list[Sink] = []
    if args.s3:
        if not args.s3.startswith("s3://"):
            raise ConfigurationError(f"--s3 must be s3://bucket[/prefix], got {args.s3!r}")
        sinks += parse_sinks(args.s3)
    if args.dynamodb_table:
        sinks += parse_sinks(f"dynamodb://{args.dynamodb_table}")
    if not sinks:
        raise ConfigurationError("upload needs --s3 s3://bucket/prefix and/or --dynamodb-table T")
    for sink in sinks:
        if isinstance(sink, (S3Sink, DynamoDBSink)):
            sink.endpoint_url, sink.region = args.endpoint_url, args.region
    return sinks


def _payload(args: argparse.Namespace) -> SinkPayload:
    """The report file's payload, with its ledger record when ``--ledger`` holds it.

    Raises:
        ReportFileError: the file is not a flopmeter report.
        ConfigurationError: the report is not final, or has no run id.
    """
    from flopmeter.ledger.sinks import SinkPayload
    from flopmeter.ledger.store import Ledger
    from flopmeter.report.reading import read_report

    _refuse_aws_keyed_copy(args.report)
    report = read_report(args.report)
    if report.run.status == "running":
        raise ConfigurationError(
            f"{args.report}: the report is not final (status 'running'); upload the report "
            "the run wrote when it ended"
        )
    if not report.run.run_id:
        raise ConfigurationError(f"{args.report}: the report has no run_id (schema 1.0)")
    payload = SinkPayload.of(report)
    if args.ledger:
        for record in Ledger(args.ledger, create=False).get(report.run.run_id):
            if record.report_sha256 == payload.report_sha256:
                payload = SinkPayload.of(record.report(), record)
    return payload


def run(args: argparse.Namespace) -> int:
    """Copies the report to every sink named; 1 when one of them failed."""
    from flopmeter.ledger.sinks import DEFAULT_SINK_TIMEOUT_SECONDS, deliver

    timeout = DEFAULT_SINK_TIMEOUT_SECONDS if args.timeout is None else args.timeout
    try:
        sinks = _sinks(args)
    except MissingExtraError as exc:  # one line, exit 2, like any other missing piece
        raise ConfigurationError(str(exc)) from None
    payload = _payload(args)
    failed = 0
    for outcome in deliver(payload, sinks, timeout):
        if outcome.ok:
            print(f"stored: {outcome.detail}")
        else:
            failed += 1
            print(f"flopmeter: error: {' '.join(outcome.detail.split())}", file=sys.stderr)
    return 1 if failed else 0


def register(sub: argparse._SubParsersAction) -> None:
    """Adds the ``upload`` subcommand."""
    p = sub.add_parser("upload", help="copy a final report to S3 and/or DynamoDB (aws extra)")
    p.add_argument("report", metavar="RUN.json", help="the report file the run wrote")
    p.add_argument("--s3", metavar="s3://BUCKET/PREFIX", help="one object: PREFIX/<run_id>.json")
    p.add_argument("--dynamodb-table", metavar="TABLE", help="one item, partition key run_id")
    p.add_argument("--endpoint-url", metavar="URL", help="another endpoint (a local S3, moto)")
    p.add_argument("--region", help="the AWS region (default: boto3's, else us-east-1)")
    p.add_argument(
        "--timeout",
        type=lambda t: non_negative(t, "a number of seconds") or 1.0,
        default=None,  # the sinks' own: not imported at start, so the command line starts fast
        metavar="SECONDS",
        help="give up after this long (default: the sinks' own timeout, "
        "flopmeter.ledger.sinks.DEFAULT_SINK_TIMEOUT_SECONDS; 0 means 1)",
    )
    p.add_argument("--ledger", metavar="PATH", help="attach the run's ledger record (seq, hash)")
    p.set_defaults(func=run)
