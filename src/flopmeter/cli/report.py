"""``flopmeter report`` (and ``show``, its alias): a report file, checked strictly, in the form
asked for: text, Markdown, HTML, JSON or the AWS meter's keys; printed, or written with ``-o``."""

from __future__ import annotations

import argparse
import json
import os
import socket
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from flopmeter.errors import ConfigurationError

if TYPE_CHECKING:  # the report modules are imported when a report is read, not at start
    from flopmeter.report import FlopReport


def _writer_gone(report: FlopReport) -> bool:
    """Whether the process that wrote ``report`` ran on this host and no longer exists."""
    if report.run.pid is None or report.run.pid <= 0 or report.run.hostname != socket.gethostname():
        return False
    try:
        os.kill(report.run.pid, 0)  # signal 0: only asks whether the process exists
    except ProcessLookupError:
        return True
    except (OSError, OverflowError):  # PermissionError: it exists, as another user's
        return False
    return False


def running_warning(report: FlopReport) -> str | None:
    """The warning line for a report that is not final, ``None`` for a final one."""
    if report.run.status != "running":
        return None
    when = "its last refresh" + (f" ({report.run.updated_at})" if report.run.updated_at else "")
    head = "flopmeter: warning: this report is not final (status 'running'): "
    if _writer_gone(report):
        return head + (
            f"the process that wrote it (pid {report.run.pid} on this host) is gone, killed before "
            "it could finish (for example by SIGKILL or the out-of-memory killer), so the "
            f"counts are only those of {when}."
        )
    return head + (
        f"the counts are only those up to {when}; the run may still be going on, or its "
        "process may have been killed."
    )


#: The forms ``--format`` takes: the human ones (flopmeter.render), the report's own JSON, and
#: the AWS FlopsMeterCallback's keys.
FORMATS = ("text", "md", "html", "json", "sagemaker")


def render_report(report: FlopReport, fmt: str) -> str:
    """``report`` in format ``fmt`` (one of :data:`FORMATS`), ending with a newline."""
    if fmt == "json":
        return report.to_json() + "\n"
    if fmt == "sagemaker":
        return json.dumps(report.to_sagemaker_dict(), indent=2) + "\n"
    from flopmeter.render import render  # the human forms only when asked for

    return render(report, fmt).rstrip("\n") + "\n"


def _output_path(args: argparse.Namespace) -> Path | None:
    """The real file ``-o`` writes (a symlink followed: the link stays), refused when it is the
    report being read, a folder or a special file (a device is never replaced by a file)."""
    if args.output is None:
        return None
    from flopmeter.report.output_path import DEFAULT_FILENAME, claim_file

    out, real = claim_file(args.output, "-o")
    source = Path(args.report)
    if source.is_dir():
        source = source / DEFAULT_FILENAME
    if real.exists() and source.exists() and real.samefile(source):
        raise ConfigurationError(f"-o {out}: is the report being read; name another file to write.")
    return real


def run(args: argparse.Namespace) -> int:
    """Prints (or writes with ``-o``) the report in ``args.format``."""
    from flopmeter.report import write_text_atomic
    from flopmeter.report.reading import read_report

    output = _output_path(args)
    report = read_report(args.report)
    text = render_report(report, args.format)
    warning = running_warning(report)
    if warning is not None:  # on top of the text; on stderr when stdout is JSON or a file
        human_stdout = args.format == "text" and output is None
        print(warning, file=sys.stdout if human_stdout else sys.stderr)
    if output is None:
        # line by line: a reader that leaves early (| head) is then seen as a broken pipe (one
        # large write into a pipe can end short without an error)
        sys.stdout.writelines(text.splitlines(keepends=True))
        return 0
    try:
        write_text_atomic(output, text)
    except OSError as exc:
        raise ConfigurationError(f"-o {output}: cannot write it ({exc.strerror or exc}).") from None
    print(f"wrote {output}", file=sys.stderr)
    return 0


def _add(sub: argparse._SubParsersAction, name: str, help_text: str) -> None:
    p = sub.add_parser(name, help=help_text)
    p.add_argument("report", help="a report written by FlopMeter, or the folder holding it")
    p.add_argument(
        "--format",
        choices=FORMATS,
        default="text",
        help="text (default), md (Markdown), html (one self-contained page), json (the report "
        "itself) or sagemaker (the AWS meter's keys)",
    )
    p.add_argument("-o", "--output", help="write to this file (atomically) instead of stdout")
    p.set_defaults(func=run)


def register(sub: argparse._SubParsersAction) -> None:
    """Adds the ``report`` subcommand and ``show``, its alias."""
    _add(sub, "report", "read a report file (flops_meter.json) and print it for people")
    _add(sub, "show", "the same as report (its earlier name)")
