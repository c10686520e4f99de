"""The ``flopmeter`` command: thresholds, a planner before training, and reports after it.

Subcommands call the same pure functions the library exposes.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path

from flopmeter.compliance import determine_threshold, validate_pretrain_flops, verdict
from flopmeter.errors import ConfigurationError
from flopmeter.flops.formulas import seed_flops, six_nd_flops
from flopmeter.report import FlopReport, format_flops


def _positive_int(text: str) -> int:
    try:
        value = int(float(text))
    except (ValueError, OverflowError):
        raise argparse.ArgumentTypeError(f"not a finite number: {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"must not be negative: {text!r}")
    return value


def _cmd_threshold(args: argparse.Namespace) -> int:
    t = determine_threshold(args.pretrain_flops, original_systemic_risk=args.systemic_risk)
    print(f"{format_flops(t.value)} ({t.kind})\n{t.source}")
    return 0


def _cmd_estimate(args: argparse.Namespace) -> int:
    trainable = args.params if args.trainable is None else args.trainable
    if trainable > args.params:
        raise ConfigurationError("--trainable cannot exceed --params.")
    t = determine_threshold(args.pretrain_flops, original_systemic_risk=args.systemic_risk)
    seed = seed_flops(args.params, trainable, args.tokens)
    six = six_nd_flops(args.params, args.tokens)
    print(
        f"planned run: {args.params:,} parameters ({trainable:,} trainable), {args.tokens:,} tokens"
    )
    print(f"  seed (4N + 2N_trainable) x D   {format_flops(seed)}")
    print(f"  6ND                            {format_flops(six)}")
    print(f"  threshold                      {format_flops(t.value)} ({t.kind})")
    worst = max(seed, six)
    print(f"  verdict (larger estimate)      {verdict(worst, t.value)}")
    if worst > 0:
        print(f"  tokens to reach the threshold  {t.value / worst * args.tokens:.2e}")
    return 0


def _cmd_show(args: argparse.Namespace) -> int:
    data = json.loads(Path(args.report).read_text(encoding="utf-8"))
    report = FlopReport.model_validate(data)
    if args.format == "json":
        print(report.to_json())
    elif args.format == "sagemaker":
        print(json.dumps(report.to_sagemaker_dict(), indent=2))
    else:
        print(report.to_text())
    return 0


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of the ``flopmeter`` command."""
    parser = argparse.ArgumentParser(prog="flopmeter", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)

    def add_threshold_args(p: argparse.ArgumentParser) -> None:
        p.add_argument(
            "--pretrain-flops",
            type=lambda s: validate_pretrain_flops(s, name="--pretrain-flops"),
            help="the original model's training compute, FLOP (unknown when omitted)",
        )
        p.add_argument(
            "--systemic-risk",
            action="store_true",
            help="the original model is a GPAI model with systemic risk",
        )

    p = sub.add_parser("threshold", help="the threshold for a modification, with its source")
    add_threshold_args(p)
    p.set_defaults(func=_cmd_threshold)

    p = sub.add_parser("estimate", help="plan a run: compute and verdict before training")
    p.add_argument("--params", type=_positive_int, required=True, help="parameters")
    p.add_argument("--trainable", type=_positive_int, help="trainable parameters (default all)")
    p.add_argument("--tokens", type=_positive_int, required=True, help="training tokens")
    add_threshold_args(p)
    p.set_defaults(func=_cmd_estimate)

    p = sub.add_parser("show", help="print a report file (flops_meter.json)")
    p.add_argument("report", help="path to a report written by FlopMeter")
    p.add_argument("--format", choices=["text", "json", "sagemaker"], default="text")
    p.set_defaults(func=_cmd_show)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Runs the command line; returns the exit status."""
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.func(args))
    except ConfigurationError as exc:
        print(f"flopmeter: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
