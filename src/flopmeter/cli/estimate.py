"""``flopmeter estimate``: plan a run's compute and verdict before training."""

from __future__ import annotations

import argparse

from flopmeter.cli._args import add_threshold_args, count_arg
from flopmeter.cli.threshold import threshold_for_args
from flopmeter.compliance import verdict
from flopmeter.errors import ConfigurationError
from flopmeter.report import format_flops


def run(args: argparse.Namespace) -> int:
    """Prints the planned run's estimates, threshold and verdict."""
    # flopmeter.flops imports torch: only when this command runs, so the others start fast
    from flopmeter.flops.formulas import seed_flops, six_nd_flops

    trainable = args.params if args.trainable is None else args.trainable
    if trainable > args.params:
        raise ConfigurationError("--trainable cannot exceed --params.")
    t, note = threshold_for_args(args)
    seed = seed_flops(args.params, trainable, args.tokens)
    six = six_nd_flops(args.params, args.tokens)
    print(
        f"planned run: {args.params:,} parameters ({trainable:,} trainable), {args.tokens:,} tokens"
    )
    print(f"  seed (4N + 2N_trainable) x D   {format_flops(seed)}")
    print(f"  6ND                            {format_flops(six)}")
    print(f"  threshold                      {format_flops(t.value)} ({t.kind}{note})")
    worst = max(seed, six)
    print(f"  verdict (larger estimate)      {verdict(worst, t.value)}")
    if worst > 0:
        print(f"  tokens to reach the threshold  {t.value / worst * args.tokens:.2e}")
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    """Adds the ``estimate`` subcommand."""
    p = sub.add_parser("estimate", help="plan a run: compute and verdict before training")
    p.add_argument("--params", type=count_arg, required=True, help="parameters")
    p.add_argument("--trainable", type=count_arg, help="trainable parameters (default all)")
    p.add_argument("--tokens", type=count_arg, required=True, help="training tokens")
    add_threshold_args(p)
    p.set_defaults(func=run)
