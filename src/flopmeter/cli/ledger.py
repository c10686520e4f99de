"""``flopmeter ledger``: list, show, verify, export and sum the runs in the audit ledger.

Every subcommand takes ``--ledger PATH``; by default ``$FLOPMETER_LEDGER``, else the per-user
ledger (``$XDG_DATA_HOME/flopmeter/ledger.sqlite``). The ledger is opened read-only: these
commands never change it. ``verify`` exits 1 when the chain is broken; so does ``cumulative``
(its total is the figure an auditor quotes) unless ``--no-verify``; ``list``, ``show`` and
``export`` print what is there with a one-line warning on stderr.
"""

from __future__ import annotations

import argparse
import csv
import dataclasses
import json
import sys
from typing import TYPE_CHECKING, Any, TextIO

from flopmeter.cli._args import add_threshold_args
from flopmeter.compliance.original import OriginalCompute, resolve_original_compute
from flopmeter.compliance.thresholds import pretrain_flops_from_env
from flopmeter.errors import ConfigurationError
from flopmeter.ledger.location import LEDGER_ENV, default_ledger_path, resolve_ledger
from flopmeter.safe_text import csv_cell, json_visible, visible

if TYPE_CHECKING:  # the ledger's and the report's modules are imported by each subcommand
    from flopmeter.ledger.chain import LedgerRecord
    from flopmeter.ledger.cumulative import CumulativeCompute
    from flopmeter.ledger.store import Ledger

#: The report's fields in ``export --format csv``, by their 2.0 paths (the column names).
CSV_REPORT_COLUMNS = (
    "model.name", "run.status", "compute.primary_flops", "lineage.cumulative_flops",
    "threshold.threshold_flops", "verdict.outcome", "tokens.tokens_processed", "run.started_at",
    "run.ended_at",
)  # fmt: skip
#: The columns of ``export --format csv`` (the record's, the report's fields, the record's).
CSV_COLUMNS = (
    "seq", "run_id", "version", "recorded_at", *CSV_REPORT_COLUMNS, "report_sha256",
    "prev_hash", "chain_hash",
)  # fmt: skip


def open_ledger(args: argparse.Namespace) -> Ledger:
    """The ledger named by ``--ledger`` (else ``FLOPMETER_LEDGER``, else the per-user one),
    read-only.

    Raises:
        LedgerError: no ledger there, or the file is not a ledger.
    """
    from flopmeter.ledger.store import Ledger

    path = resolve_ledger(args.ledger if args.ledger else True)
    return Ledger(path or default_ledger_path(), create=False)


def chain_break(ledger: Ledger) -> str | None:
    """The first break of the ledger's chain in one line (and how many there are), or
    ``None`` when it verifies."""
    problems = ledger.verify().problems
    if not problems:
        return None
    more = f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""
    return f"{problems[0].message} [{problems[0].kind}]{more}"


def _checked_records(args: argparse.Namespace) -> list[LedgerRecord]:
    """The ledger's records; a one-line warning on stderr when its chain does not verify."""
    ledger = open_ledger(args)
    broken = chain_break(ledger)
    if broken:
        print(
            f"flopmeter: warning: the ledger {ledger.path} does not verify, these records may "
            f"have been tampered with: {broken} (see `flopmeter ledger verify`)",
            file=sys.stderr,
        )
    return ledger.records()


def _record_dict(record: LedgerRecord) -> dict[str, Any]:
    return {
        "seq": record.seq, "run_id": record.run_id, "version": record.version,
        "recorded_at": record.recorded_at, "report_sha256": record.report_sha256,
        "prev_hash": record.prev_hash, "chain_hash": record.chain_hash,
        "report": record.report(),
    }  # fmt: skip


def _list(args: argparse.Namespace) -> int:
    from flopmeter.report import format_flops
    from flopmeter.report.upgrade import report_value

    records = _checked_records(args)
    print(f"{'seq':>4}  {'run_id':<32}  v  {'status':<11}  {'compute':>12}  {'verdict':<17}  model")
    for r in records:
        rep = r.report()  # schema 1.x or 2.0, as stored: read by the 2.0 names
        status, flops = report_value(rep, "run.status"), report_value(rep, "compute.primary_flops")
        verdict, name = report_value(rep, "verdict.outcome"), report_value(rep, "model.name")
        print(
            visible(
                f"{r.seq:>4}  {r.run_id:<32}  {r.version}  {status!s:<11}  "
                f"{format_flops(flops):>12}  {verdict or '-'!s:<17}  {name}"
            )
        )
    print(f"{len(records)} record(s) in {open_ledger(args).path}")
    return 0


def _show(args: argparse.Namespace) -> int:
    records = _checked_records(args)
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
        print(json_visible(json.dumps(_record_dict(record), indent=2, ensure_ascii=False)))
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
    from flopmeter.report.upgrade import report_value

    records = _checked_records(args)
    out: TextIO = sys.stdout
    if args.output:
        out = open(args.output, "w", encoding="utf-8", newline="")  # noqa: SIM115
    try:
        if args.format == "jsonl":
            for record in records:
                out.write(json_visible(json.dumps(_record_dict(record), ensure_ascii=False)) + "\n")
        else:
            writer = csv.DictWriter(out, CSV_COLUMNS, extrasaction="ignore")
            writer.writeheader()
            for record in records:
                report = record.report()  # schema 1.x or 2.0, as stored
                fields = {path: report_value(report, path) for path in CSV_REPORT_COLUMNS}
                row = {**fields, **_record_dict(record)}
                writer.writerow({key: csv_cell(value) for key, value in row.items()})
    finally:
        if out is not sys.stdout:
            out.close()
    return 0


def _cumulative(args: argparse.Namespace) -> int:
    from flopmeter.ledger.cumulative import cumulative_compute

    ledger = open_ledger(args)
    broken = chain_break(ledger)
    if broken and not args.no_verify:
        print(
            f"flopmeter: error: the ledger {ledger.path} does not verify, so its total is not "
            f"given: {broken} (see `flopmeter ledger verify`; --no-verify sums it anyway)",
            file=sys.stderr,
        )
        return 1
    if broken:
        print(
            f"flopmeter: warning: summing a ledger that does not verify: {broken}", file=sys.stderr
        )
    original = _original_compute(args)
    result = cumulative_compute(
        ledger.records(), args.base, pretrain_flops=original.flops,
        pretrain_flops_source=_source(original), original_systemic_risk=args.systemic_risk,
    )  # fmt: skip
    if original.catalog_asked:
        result = dataclasses.replace(result, notes=[*original.notes, *result.notes])
    if args.format == "json":
        print(json.dumps({**_cumulative_dict(result), "chain_verified": broken is None}, indent=2))
    else:
        _print_cumulative(result)
    return 0


def _original_compute(args: argparse.Namespace) -> OriginalCompute:
    """``--pretrain-flops`` (a number, or ``catalog``: the catalogue's figure for ``--base``),
    else ``PRETRAIN_FLOPS``, resolved as every command and the meter do."""
    argument = args.pretrain_flops
    environment = pretrain_flops_from_env() if argument is None else None
    return resolve_original_compute(
        argument, environment, args.base, original_systemic_risk=args.systemic_risk
    )


def _source(original: OriginalCompute) -> str | None:
    """Where the original compute came from, for the output (``None``: not given)."""
    if original.source == "catalog" and original.catalog is not None:
        return f"the catalogue: {original.catalog.base_model}, {original.catalog.basis}"
    return original.source


def _cumulative_dict(result: CumulativeCompute) -> dict[str, Any]:
    return {
        "base": result.base,
        "runs": [dict(zip(("run_id", "model_name", "status", "flops_architecture", "matched"), r, strict=True))
                 for r in result.runs],
        "total_flops": result.total_flops, "measured_flops": result.measured_flops,
        "withheld_reason": result.withheld_reason,
        "threshold_value": result.threshold.value, "threshold_type": result.threshold.kind,
        "pretrain_flops_source": result.pretrain_flops_source,
        "ratio_to_threshold": result.ratio_to_threshold,
        "exceeds_threshold": result.exceeds_threshold, "verdict": result.verdict,
        "verdict_basis": result.verdict_basis, "notes": result.notes,
    }  # fmt: skip


def _print_cumulative(result: CumulativeCompute) -> None:
    """The sum as text; every line through :func:`~flopmeter.safe_text.visible`."""
    _print_cumulative_lines(result, lambda line: print(visible(line)))


def _print_cumulative_lines(result: CumulativeCompute, emit: Any) -> None:
    from flopmeter.report import format_flops

    emit(f"base model {result.base}: {len(result.runs)} run(s)")
    for run_id, name, status, flops, how in result.runs:
        emit(f"  {run_id}  {format_flops(flops):>10}  {status or '-'}  {name or '-'}  ({how})")
    total = format_flops(result.total_flops) if result.total_flops is not None else "unknown"
    emit(
        f"total compute: {total}"
        + (f" ({result.withheld_reason})" if result.withheld_reason else "")
    )
    if result.measured_flops is not None:
        emit(f"measured cross-check: {format_flops(result.measured_flops)}")
    source = result.pretrain_flops_source or "original compute unknown"
    emit(f"threshold: {format_flops(result.threshold.value)} ({result.threshold.kind}; {source})")
    if result.verdict is not None:
        emit(f"ratio to threshold: {result.ratio_to_threshold:.3g} -> {result.verdict}")
        emit(f"basis: {result.verdict_basis}")
    for note in result.notes:
        emit(f"note: {note}")


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
        "cumulative": (
            _cumulative,
            "total compute of a base model's runs, descendants and their ancestors, judged as "
            "a report is (with the measured cross-check)",
        ),
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
    made["cumulative"].add_argument(
        "--no-verify",
        action="store_true",
        help="sum even when the ledger's chain does not verify (a warning still says so); "
        "without it, a broken chain is refused (exit 1)",
    )
    add_threshold_args(made["cumulative"])
