"""The ``flopmeter`` command: thresholds, a planner before training, and reports after it.

Subcommands call the same pure functions the library exposes. Every failure is one line on
stderr, ``flopmeter: error: ...``, never a traceback: exit status 2 for bad input (arguments,
environment, a report file), 1 when stdout was closed early (``| head``) or on an unexpected
error, 130 on Ctrl-C.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import socket
import sys
from collections.abc import Sequence
from typing import NoReturn

from flopmeter import __version__
from flopmeter.compliance import (
    PRETRAIN_FLOPS_ENV,
    Threshold,
    determine_threshold,
    pretrain_flops_from_env,
    verdict,
)
from flopmeter.errors import ConfigurationError
from flopmeter.flops.formulas import seed_flops, six_nd_flops
from flopmeter.report import FlopReport, format_flops
from flopmeter.report_file import read_report

__all__ = ["build_parser", "main", "running_warning"]


class _Parser(argparse.ArgumentParser):
    """An argument parser whose errors are one line, like every other error of the command."""

    def error(self, message: str) -> NoReturn:
        """Prints ``flopmeter: error: <message>`` and exits with status 2."""
        self.exit(2, f"flopmeter: error: {message} (see {self.prog} --help)\n")


def _non_negative(text: str, what: str) -> float:
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


def _flops(text: str) -> float:
    """An argument that is a number of FLOP (``1.2e24``)."""
    return _non_negative(text, "a number of FLOP")


def _count(text: str) -> int:
    """An argument that is a whole, non-negative count; ``3.2e9`` is accepted, ``0.5`` is not."""
    number = _non_negative(text, "a number")
    if not number.is_integer():
        raise argparse.ArgumentTypeError(f"not a whole number: {text!r}")
    try:
        return int(text)  # exact, for integers a float cannot hold
    except ValueError:
        return int(number)


def _threshold(args: argparse.Namespace) -> tuple[Threshold, str]:
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


def _cmd_threshold(args: argparse.Namespace) -> int:
    t, note = _threshold(args)
    print(f"{format_flops(t.value)} ({t.kind}{note})\n{t.source}")
    return 0


def _cmd_estimate(args: argparse.Namespace) -> int:
    trainable = args.params if args.trainable is None else args.trainable
    if trainable > args.params:
        raise ConfigurationError("--trainable cannot exceed --params.")
    t, note = _threshold(args)
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


def _writer_gone(report: FlopReport) -> bool:
    """Whether the process that wrote ``report`` ran on this host and no longer exists."""
    if report.pid is None or report.pid <= 0 or report.hostname != socket.gethostname():
        return False
    try:
        os.kill(report.pid, 0)  # signal 0: only asks whether the process exists
    except ProcessLookupError:
        return True
    except (OSError, OverflowError):  # PermissionError: it exists, as another user's
        return False
    return False


def running_warning(report: FlopReport) -> str | None:
    """The warning line for a report that is not final, ``None`` for a final one."""
    if report.status != "running":
        return None
    when = "its last refresh" + (f" ({report.updated_at})" if report.updated_at else "")
    head = "flopmeter: warning: this report is not final (status 'running'): "
    if _writer_gone(report):
        return head + (
            f"the process that wrote it (pid {report.pid} on this host) is gone, killed before "
            "it could finish (for example by SIGKILL or the out-of-memory killer), so the "
            f"counts are only those of {when}."
        )
    return head + (
        f"the counts are only those up to {when}; the run may still be going on, or its "
        "process may have been killed."
    )


def _cmd_show(args: argparse.Namespace) -> int:
    report = read_report(args.report)
    warning = running_warning(report)
    if warning is not None:  # on top of the text; on stderr when stdout is JSON
        print(warning, file=sys.stdout if args.format == "text" else sys.stderr)
    if args.format == "json":
        print(report.to_json())
    elif args.format == "sagemaker":
        print(json.dumps(report.to_sagemaker_dict(), indent=2))
    else:
        print(report.to_text())
    return 0


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of the ``flopmeter`` command."""
    parser = _Parser(prog="flopmeter", description=__doc__.splitlines()[0])
    parser.add_argument("--version", action="version", version=f"flopmeter {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)

    def add_threshold_args(p: argparse.ArgumentParser) -> None:
        p.add_argument(
            "--pretrain-flops",
            type=_flops,
            help=f"the original model's training compute, FLOP (default: ${PRETRAIN_FLOPS_ENV}; "
            "unknown when neither is given)",
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
    p.add_argument("--params", type=_count, required=True, help="parameters")
    p.add_argument("--trainable", type=_count, help="trainable parameters (default all)")
    p.add_argument("--tokens", type=_count, required=True, help="training tokens")
    add_threshold_args(p)
    p.set_defaults(func=_cmd_estimate)

    p = sub.add_parser("show", help="print a report file (flops_meter.json), checked strictly")
    p.add_argument("report", help="a report written by FlopMeter, or the folder holding it")
    p.add_argument("--format", choices=["text", "json", "sagemaker"], default="text")
    p.set_defaults(func=_cmd_show)
    return parser


def _error(message: object) -> None:
    """Prints ``flopmeter: error: <message>`` as one line on stderr."""
    print("flopmeter: error: " + " ".join(str(message).split()), file=sys.stderr)


def _quiet_stdout() -> None:
    """Points stdout at /dev/null, so the interpreter's last flush cannot fail again."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError):  # stdout without a file descriptor (a test's capture)
        pass


def main(argv: Sequence[str] | None = None) -> int:
    """Runs the command line; returns the exit status.

    Argument errors exit through ``SystemExit(2)`` (argparse), ``--help`` and ``--version``
    through ``SystemExit(0)``; every other outcome is the returned status.
    """
    try:
        args = build_parser().parse_args(argv)
        status = int(args.func(args))
        sys.stdout.flush()  # a closed pipe fails here, inside the handler, not at exit
    except BrokenPipeError:  # the reader left early (| head): its choice, not an error to show
        _quiet_stdout()
        return 1
    except ConfigurationError as exc:
        _error(exc)
        return 2
    except KeyboardInterrupt:
        return 130
    except Exception as exc:  # a bug: still one line, with the type to report it by
        _error(f"unexpected {type(exc).__name__}: {exc}")
        return 1
    return status


if __name__ == "__main__":
    sys.exit(main())
