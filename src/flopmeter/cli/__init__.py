"""The ``flopmeter`` command: thresholds, a planner before training, and reports after it.

Each subcommand lives in its own module of this package (``register(sub)`` adds its parser,
``run(args)`` does the work) and calls the same functions the library exposes. Every failure is
one line on stderr, ``flopmeter: error: ...``, never a traceback: exit status 2 for bad input
(arguments, environment, a report file), 1 when stdout was closed early (``| head``) or on an
unexpected error, 130 on Ctrl-C.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from collections.abc import Sequence

from flopmeter.auto.boot import leave_job
from flopmeter.cli._args import Parser
from flopmeter.errors import ConfigurationError

__all__ = [
    "COMMANDS",
    "build_parser",
    "main",
]

#: The subcommand modules of this package, in the order ``--help`` lists them.
COMMANDS = ("threshold", "estimate", "report", "schema", "ledger", "upload", "run")


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of the ``flopmeter`` command."""
    from flopmeter._version import __version__

    parser = Parser(prog="flopmeter", description=__doc__.splitlines()[0])
    parser.add_argument("--version", action="version", version=f"flopmeter {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)
    for name in COMMANDS:
        importlib.import_module(f"flopmeter.cli.{name}").register(sub)
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
        joined = leave_job()  # the command itself is never metered, nor a job's root
        args = build_parser().parse_args(argv)
        args.joined_job = joined
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
