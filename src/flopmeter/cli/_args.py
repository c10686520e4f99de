"""Argument types and the parser class every subcommand of ``flopmeter`` shares."""

from __future__ import annotations

import argparse
import math
from typing import NoReturn

from flopmeter.compliance.thresholds import CATALOG, PRETRAIN_FLOPS_ENV


class Parser(argparse.ArgumentParser):
    """An argument parser whose errors are one line, like every other error of the command."""

    def error(self, message: str) -> NoReturn:
        """Prints ``flopmeter: error: <message>`` and exits with status 2."""
        self.exit(2, f"flopmeter: error: {message} (see {self.prog} --help)\n")


def non_negative(text: str, what: str) -> float:
    """``text`` as a finite, non-negative float; ``what`` names the expected value."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not {what}: {text!r}") from None
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"must be finite: {text!r}")
    if value < 0:
        raise argparse.ArgumentTypeError(f"must not be negative: {text!r}")
    return value


def flops_arg(text: str) -> float:
    """An argument that is a number of FLOP (``1.2e24``)."""
    return non_negative(text, "a number of FLOP")


def pretrain_flops_arg(text: str) -> float | str:
    """``--pretrain-flops``: a number of FLOP, or ``catalog`` (the bundled catalogue's figure)."""
    if text.strip().lower() == CATALOG:
        return CATALOG
    try:
        return flops_arg(text)
    except argparse.ArgumentTypeError as exc:
        raise argparse.ArgumentTypeError(f"{exc} (or 'catalog')") from None


def add_threshold_args(p: argparse.ArgumentParser) -> None:
    """Adds ``--pretrain-flops`` and ``--systemic-risk``, shared by the commands that judge."""
    p.add_argument(
        "--pretrain-flops",
        type=pretrain_flops_arg,
        metavar="FLOPS|catalog",
        help=f"the original model's training compute, FLOP, or 'catalog' for the bundled "
        f"catalogue's figure for MODEL_ID (default: ${PRETRAIN_FLOPS_ENV}; unknown when "
        "neither is given)",
    )
    p.add_argument(
        "--systemic-risk",
        action="store_true",
        help="the original model is a GPAI model with systemic risk",
    )
