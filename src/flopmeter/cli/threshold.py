"""``flopmeter threshold``: the threshold for a modification, with its rule and source."""

from __future__ import annotations

import argparse

from flopmeter.cli._args import add_threshold_args
from flopmeter.compliance import (
    PRETRAIN_FLOPS_ENV,
    Threshold,
    determine_threshold,
    pretrain_flops_from_env,
)
from flopmeter.report import format_flops


def threshold_for_args(args: argparse.Namespace) -> tuple[Threshold, str]:
    """The threshold for the arguments, and a note when the original compute came from the
    environment (``--pretrain-flops`` beats ``PRETRAIN_FLOPS``).

    Raises:
        ConfigurationError: ``PRETRAIN_FLOPS`` is needed and is not a valid FLOP count.
    """
    flops, note = args.pretrain_flops, ""
    if flops is None:
        flops = pretrain_flops_from_env()
        if flops is not None:
            note = f", original compute {format_flops(flops)} from {PRETRAIN_FLOPS_ENV}"
    t = determine_threshold(flops, original_systemic_risk=args.systemic_risk)
    return t, note


def run(args: argparse.Namespace) -> int:
    """Prints the threshold and its source."""
    t, note = threshold_for_args(args)
    print(f"{format_flops(t.value)} ({t.kind}{note})\n{t.source}")
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    """Adds the ``threshold`` subcommand."""
    p = sub.add_parser("threshold", help="the threshold for a modification, with its source")
    add_threshold_args(p)
    p.set_defaults(func=run)
