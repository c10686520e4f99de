"""``flopmeter ledger``: list, show, verify, export and sum the runs in the audit ledger.

Every subcommand takes ``--ledger PATH``; by default ``$FLOPMETER_LEDGER``, else the per-user
ledger (``$XDG_DATA_HOME/flopmeter/ledger.sqlite``). The ledger is opened read-only: these
commands never change it. ``verify`` exits 1 when the chain is broken.
"""

from __future__ import annotations

import argparse
import csv
import json
import sys
from typing import Any, TextIO

from flopmeter.cli._args import add_threshold_args
from flopmeter.compliance import PRETRAIN_FLOPS_ENV, pretrain_flops_from_env
from flopmeter.errors import ConfigurationError
from flopmeter.ledger.chain import LedgerRecord
from flopmeter.ledger.cumulative import CumulativeCompute, cumulative_compute
from flopmeter.ledger.store import LEDGER_ENV, Ledger, default_ledger_path, resolve_ledger
from flopmeter.report import format_flops

#: The columns of ``export --format csv`` (the report's own fields, then the record's).
CSV_COLUMNS = (
    "seq", "run_id", "version", "recorded_at", "model_name", "status", "flops_architecture",
    "cumulative_flops", "threshold_value", "verdict", "tokens_processed", "started_at",
    "ended_at", "report_sha256", "prev_hash", "chain_hash",
)  # fmt: skip


def open_ledger(args: argparse.Namespace) -> Ledger:
    """The ledger named by ``--ledger`` (else ``FLOPMETER_LEDGER``, else the per-user one),
    read-only.

    Raises:
        LedgerError: no ledger there, or the file is not a ledger.
    """
    path = resolve_ledger(args.ledger if args.ledger else True)
    return Ledger(path or default_ledger_path(), create=False)


def _record_dict(record: LedgerRecord) -> dict[str, Any]:
    return {
        "seq": record.seq, "run_id": record.run_id, "version": record.version,
        "recorded_at": record.recorded_at, "report_sha256": record.report_sha256,
        "prev_hash": record.prev_hash, "chain_hash": record.chain_hash,
        "report": record.report(),
    }  # fmt: skip


def _list(args: argparse.Namespace) -> int:
    ledger = open_ledger(args)
    records = ledger.records()
    print(f"{'seq':>4}  {'run_id':<32}  v  {'status':<11}  {'compute':>12}  {'verdict':<17}  model")
    for r in records:
        rep = r.report()
        print(
            f"{r.seq:>4}  {r.run_id:<32}  {r.version}  {rep.get('status')!s:<11}  "
            f"{format_flops(rep.get('flops_architecture')):>12}  "
            f"{rep.get('verdict') or '-'!s:<17}  {rep.get('model_name')}"
        )
    print(f"{len(records)} record(s) in {ledger.path}")
    return 0


def _show(args: argparse.Namespace) -> int:
    records = open_ledger(args).records()
    versions = [r for r in records if r.run_id == args.run_id]
    if not versions:
        matches = sorted({r.run_id for r in records if r.run_id.startswith(args.run_id)})
        if len(matches) > 1:
            raise ConfigurationError(f"run id {args.run_id!r} is ambiguous: {', '.join(matches)}")
        versions = [r for r in records if matches and r.run_id == matches[0]]
    if not versions:
        raise ConfigurationError(f"no run {args.run_id!r} in the ledger")
    chosen = versions if args.all_versions else versions[-1:]
    for record in chosen:
        print(json.dumps(_record_dict(record), indent=2, ensure_ascii=False))
    return 0


def _head_arg(text: str) -> tuple[int, str]:
    seq, _, digest = text.partition(":")
    if not seq.isdigit() or len(digest) != 64:
        raise argparse.ArgumentTypeError(f"not SEQ:CHAIN_HASH (64 hex digits): {text!r}")
    return int(seq), digest.lower()


def _verify(args: argparse.Namespace) -> int:
    ledger = open_ledger(args)
    result = ledger.verify(expected_head=args.head)
    for problem in result.problems:
        print(f"TAMPERED: {problem.message} [{problem.kind}]")
    head = f"head {result.head[0]}:{result.head[1]}" if result.head else "empty"
    if result.ok:
        print(f"ok: {result.records} record(s), chain valid, {head}")
        return 0
    print(
        f"FAILED: {len(result.problems)} problem(s) in {result.records} record(s) of {ledger.path}",
        file=sys.stderr,
    )
    return 1


def _export(args: argparse.Namespace) -> int:
    records = open_ledger(args).records()
    out: TextIO = sys.stdout
    if args.output:
        out = open(args.output, "w", encoding="utf-8", newline="")  # noqa: SIM115
    try:
        if args.format == "jsonl":
            for record in records:
                out.write(json.dumps(_record_dict(record), ensure_ascii=False) + "\n")
        else:
            writer = csv.DictWriter(out, CSV_COLUMNS, extrasaction="ignore")
            writer.writeheader()
            for record in records:
                writer.writerow({**record.report(), **_record_dict(record)})
    finally:
        if out is not sys.stdout:
            out.close()
    return 0


def _cumulative(args: argparse.Namespace) -> int:
    flops, source = args.pretrain_flops, "argument" if args.pretrain_flops is not None else None
    if flops is None:
        flops = pretrain_flops_from_env()
        source = f"environment variable {PRETRAIN_FLOPS_ENV}" if flops is not None else None
    result = cumulative_compute(
        open_ledger(args).records(), args.base, pretrain_flops=flops,
        pretrain_flops_source=source, original_systemic_risk=args.systemic_risk,
    )  # fmt: skip
    if args.format == "json":
        print(json.dumps(_cumulative_dict(result), indent=2))
    else:
        _print_cumulative(result)
    return 0


def _cumulative_dict(result: CumulativeCompute) -> dict[str, Any]:
    return {
        "base": result.base,
        "runs": [dict(zip(("run_id", "model_name", "status", "flops_architecture", "matched"), r, strict=True))
                 for r in result.runs],
        "total_flops": result.total_flops, "withheld_reason": result.withheld_reason,
        "threshold_value": result.threshold.value, "threshold_type": result.threshold.kind,
        "pretrain_flops_source": result.pretrain_flops_source,
        "ratio_to_threshold": result.ratio_to_threshold, "verdict": result.verdict,
        "notes": result.notes,
    }  # fmt: skip


def _print_cumulative(result: CumulativeCompute) -> None:
    print(f"base model {result.base}: {len(result.runs)} run(s)")
    for run_id, name, status, flops, how in result.runs:
        print(f"  {run_id}  {format_flops(flops):>10}  {status}  {name}  ({how})")
    total = format_flops(result.total_flops) if result.total_flops is not None else "unknown"
    print(
        f"total compute: {total}"
        + (f" ({result.withheld_reason})" if result.withheld_reason else "")
    )
    source = result.pretrain_flops_source or "original compute unknown"
    print(f"threshold: {format_flops(result.threshold.value)} ({result.threshold.kind}; {source})")
    if result.verdict is not None:
        print(f"ratio to threshold: {result.ratio_to_threshold:.3g} -> {result.verdict}")
    for note in result.notes:
        print(f"note: {note}")


def _add_ledger_arg(p: argparse.ArgumentParser, default: Any = None) -> None:
    p.add_argument(
        "--ledger",
        metavar="PATH",
        default=default,
        help=f"the ledger file (default: ${LEDGER_ENV}, else {default_ledger_path()})",
    )


def register(sub: argparse._SubParsersAction) -> None:
    """Adds the ``ledger`` subcommand and its own subcommands."""
    p = sub.add_parser("ledger", help="the audit ledger: list, show, verify, export, cumulative")
    _add_ledger_arg(p)
    inner = p.add_subparsers(dest="ledger_command", required=True)
    cmds = {
        "list": (_list, "every record, oldest first"),
        "show": (_show, "one run's record (JSON)"),
        "verify": (_verify, "check the hash chain; exit 1 when it is broken"),
        "export": (_export, "every record as JSON lines or CSV"),
        "cumulative": (_cumulative, "total compute of a base model's runs and descendants"),
    }
    made = {}
    for name, (func, text) in cmds.items():
        made[name] = inner.add_parser(name, help=text, description=text)
        _add_ledger_arg(made[name], default=argparse.SUPPRESS)  # keeps one given before
        made[name].set_defaults(func=func)
    made["show"].add_argument("run_id", metavar="RUN_ID", help="a run id (or a unique prefix)")
    made["show"].add_argument("--all-versions", action="store_true", help="every version")
    made["verify"].add_argument(
        "--head", type=_head_arg, metavar="SEQ:HASH",
        help="a head exported earlier (`verify` prints it): finds the last records deleted",
    )  # fmt: skip
    made["export"].add_argument("--format", choices=("jsonl", "csv"), default="jsonl")
    made["export"].add_argument("-o", "--output", metavar="FILE", help="write to FILE")
    made["cumulative"].add_argument(
        "--base",
        required=True,
        metavar="MODEL_ID",
        help="the base model id (as in the reports' model_name)",
    )
    made["cumulative"].add_argument("--format", choices=("text", "json"), default="text")
    add_threshold_args(made["cumulative"])
