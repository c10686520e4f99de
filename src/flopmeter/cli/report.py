"""``flopmeter show``: print a report file, checked strictly, in the form asked for."""

from __future__ import annotations

import argparse
import json
import os
import socket
import sys

from flopmeter.report import FlopReport
from flopmeter.report_file import read_report


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


def run(args: argparse.Namespace) -> int:
    """Prints the report in ``args.format``."""
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


def register(sub: argparse._SubParsersAction) -> None:
    """Adds the ``show`` subcommand."""
    p = sub.add_parser("show", help="print a report file (flops_meter.json), checked strictly")
    p.add_argument("report", help="a report written by FlopMeter, or the folder holding it")
    p.add_argument("--format", choices=["text", "json", "sagemaker"], default="text")
    p.set_defaults(func=run)
