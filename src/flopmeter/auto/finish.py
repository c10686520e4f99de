"""The end of a zero-code job: where its reports are, and a report of its own when nothing
attached.

:func:`finish_job` runs once per job, in its root process (``flopmeter run`` after the command,
or the first process under ``FLOPMETER_AUTO=1`` alone, at its exit). It reads the job folder's
records (:mod:`flopmeter.auto.job`) and prints to stderr one line per report of the job (rank 0's
``attached`` and ``explicit`` records)::

    flopmeter: report: /abs/flops_meter.json (completed, below_threshold)
    flopmeter: report: /abs/flops_meter.json (completed, no verdict: <short reason>)

A job of several runs (``trainer.train()`` twice, two trainers, ``fit`` twice) has one report
per run, none in place of another: each record names its run id, and a run whose file a later
run of the process claimed is found where that one kept it (``flops_meter.<run id>.json``,
:func:`~flopmeter.auto.job_reports.run_report`). After their lines comes the job's total
(:func:`~flopmeter.auto.job_reports.job_total_line`): each run's tokens and compute, and their
sums, or why a sum is not given. A ``running`` report whose writer is gone (killed by SIGKILL,
the out-of-memory killer) is named as such. When no meter of the job started at all, but some process imported torch, it writes the
job's report itself (:func:`unattached_report`): nothing measured, why, tokens null (never 0),
compute and verdict withheld. A job whose metered processes never imported torch trained
nothing: no report is written, and under ``flopmeter run`` one line says so (under the switch
alone such a process is a platform's tool, pip or a shell helper, and stays quiet). Under
``flopmeter run``, a job no Python of which metering started in (``python -S`` in a shell script)
or with a Python that cannot import flopmeter may have trained unseen: it gets the report of
nothing measured, saying so (:func:`unseen_python`). Nothing here raises: a failure is one line
on stderr.
"""

from __future__ import annotations

import contextlib
import os
import socket
import sys
import uuid
from collections.abc import Mapping, Sequence
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, TextIO

from flopmeter.auto import JOB_ID_ENV, LAUNCHER_ENV
from flopmeter.auto.job import read_records
from flopmeter.auto.job_reports import job_total_line, report_line, run_report
from flopmeter.report import FlopReport
from flopmeter.report.context import AttachSection
from flopmeter.report.output_path import DEFAULT_FILENAME, check_writable, run_named
from flopmeter.report.sagemaker import SageMakerCopy, sagemaker_output_path
from flopmeter.report.sections import ComputeSection, RunSection, TokenSection

__all__ = [
    "NOTHING_FOUND",
    "NOTHING_TRAINED",
    "NO_PYTHON_METERED",
    "finish_job",
    "other_node_line",
    "unattached_report",
    "unseen_python",
]

#: Why nothing attached, when no process recorded a reason of its own.
NOTHING_FOUND = (
    "no Hugging Face or Lightning Trainer was built and no torch optimizer stepped the "
    "parameters of an nn.Module in any Python process of the job"
)
#: The line of a ``flopmeter run`` job whose every metered Python process never imported torch.
NOTHING_TRAINED = (
    "flopmeter: nothing trained: no Python process of the job imported torch, so no report was "
    "written"
)
#: Why nothing attached, when no Python process of the job started zero-code metering.
NO_PYTHON_METERED = (
    "no Python process of the job started zero-code metering: the command ran no Python, or "
    "only Pythons metering cannot start in (python -S or -I: no site module, so no "
    "sitecustomize; a Python started with a PYTHONPATH of its own)"
)
#: The counts a report of a run no meter saw has as null (schema 2.1), never 0.
_NULL_COUNTS = dict.fromkeys(
    ("tokens_processed", "tokens_seen", "sequences", "sum_sq_seq_len", "micro_batches",
     "optimizer_steps")
)  # fmt: skip


def _say(stream: TextIO | None, line: str) -> None:
    with contextlib.suppress(Exception):  # a closed stderr loses the line, not the status
        print(line, file=stream or sys.stderr, flush=True)


def finish_job(
    folder: str | os.PathLike[str],
    *,
    exit_status: int,
    output: str | os.PathLike[str] | None = None,
    started_at: str | None = None,
    cwd: str | os.PathLike[str] | None = None,
    environ: Mapping[str, str] | None = None,
    stream: TextIO | None = None,
) -> list[Path]:
    """Ends a job: prints where its reports are, writes its own when nothing attached.

    Args:
        folder: The job folder.
        exit_status: The command's exit status (0: completed; else failed).
        output: Where the job's own report goes (default ``FLOPMETER_OUTPUT``, else
            ``flops_meter.json`` in ``cwd``); a folder gets ``flops_meter.json``.
        started_at: When the job started, ISO 8601 (default: unknown).
        cwd: The root's folder at the job's start (default: the current folder).
        environ: The job's environment (default ``os.environ``).
        stream: Where the lines go (default stderr).

    Returns:
        The job's report files named (those of its meters, or the one written here).
    """
    try:
        return _finish(Path(folder), exit_status, output, started_at, cwd, environ, stream)
    except Exception as exc:  # the end of the job is never its problem
        _say(stream, f"flopmeter: the job's end failed: {type(exc).__name__}: {exc}")
        return []


def _finish(
    folder: Path,
    exit_status: int,
    output: str | os.PathLike[str] | None,
    started_at: str | None,
    cwd: str | os.PathLike[str] | None,
    environ: Mapping[str, str] | None,
    stream: TextIO | None,
) -> list[Path]:
    env = os.environ if environ is None else environ
    records = read_records(folder) if folder.is_dir() else []
    meters = [r for r in records if r["event"] in ("attached", "explicit")]
    if meters:
        named = _name_reports(meters, stream, env.get(JOB_ID_ENV) or None)
        unmetered = [r for r in records if r["event"] == "unmetered"]
        if unmetered:  # its work is in no report: the reports above are not the whole job
            _say(stream, f"flopmeter: warning: {_reason(unmetered)}: the job's compute in it is "
                 "in no report above")  # fmt: skip
        return named
    if not any(r["event"] == "torch" for r in records):
        if env.get(LAUNCHER_ENV) == "environment":
            return []  # a tool under the switch alone (pip, a shell helper): nothing to say
        unseen = unseen_python(records)
        if unseen is None:
            _say(stream, NOTHING_TRAINED)
            return []
        records = [*records, {"event": "not_attached", "reason": unseen}]
    path = _output_path(output, cwd, env)
    report = unattached_report(records, exit_status=exit_status, started_at=started_at, environ=env)
    if os.path.lexists(path):
        # never in place of what is there (another run's report, the user's file): a report
        # of nothing must not replace a measurement; beside it, under its own run id
        path = run_named(path.with_suffix(path.suffix or ".json"), report.run.run_id or "")
    try:
        check_writable(path)
        report.write_json(path)
    except Exception as exc:
        _say(stream, f"flopmeter: no report written: {exc}")
        return []
    _sagemaker_copy(report, env, stream)
    _say(stream, report_line(path))
    return [path]


def _name_reports(
    meters: Sequence[Mapping[str, Any]], stream: TextIO | None, job_id: str | None
) -> list[Path]:
    """One line per rank-0 meter's report (each file once); for several, the job's total."""
    seen: list[Path] = []
    for item in meters:
        if item.get("rank") not in (None, 0):
            continue
        report = item.get("report")
        if not report:
            if item["event"] == "explicit":
                _say(stream, "flopmeter: the script's own meter writes no report file")
            continue
        path = Path(str(report))
        if item["event"] == "attached":
            path = run_report(path, item, job_id)
        if path not in seen:
            seen.append(path)
            _say(stream, report_line(path))
    if len(seen) > 1:
        _say(stream, job_total_line(seen))
    ranks = sorted({r["rank"] for r in meters if isinstance(r.get("rank"), int) and r["rank"] > 0})
    if ranks and not any(r.get("rank") in (None, 0) for r in meters):
        _say(stream, other_node_line(ranks, meters))
    return seen


def other_node_line(ranks: Sequence[int], meters: Sequence[Mapping[str, Any]]) -> str:
    """The line of a node of a multi-node job where rank 0 did not run: this node's ranks fed
    the job's one report, which rank 0 writes on its own node. The path is the one this node's
    ranks named (rank 0's is the same file when the nodes start in the same folder, or were
    given one absolute ``--output``)."""
    paths = sorted({str(r["report"]) for r in meters if r.get("report")})
    named = f"; this node's ranks named it {paths[0]}" if len(paths) == 1 else ""
    return (
        f"flopmeter: no report on this node: its rank(s) {', '.join(map(str, ranks))} fed the "
        f"job's one report, which rank 0 writes on its own node{named}"
    )


def _output_path(
    output: str | os.PathLike[str] | None,
    cwd: str | os.PathLike[str] | None,
    env: Mapping[str, str],
) -> Path:
    from flopmeter.report.output_path import resolve_output

    chosen = output if output is not None else (env.get("FLOPMETER_OUTPUT") or None)
    base = Path(cwd) if cwd is not None else Path.cwd()
    if chosen is None:
        return base / DEFAULT_FILENAME
    path = Path(os.fspath(chosen)).expanduser()
    if not path.is_absolute():
        path = base / path
    resolved = resolve_output(str(path) + (os.sep if str(chosen).endswith(("/", os.sep)) else ""))
    return resolved if resolved is not None else base / DEFAULT_FILENAME


def _reason(records: Sequence[Mapping[str, Any]]) -> str:
    """Why nothing attached: the processes' own reasons and problems, else :data:`NOTHING_FOUND`."""
    said: list[str] = []
    for item in records:
        if item["event"] == "not_attached" and item.get("reason"):
            text = str(item["reason"])
        elif item["event"] == "problem":
            text = f"{item.get('where') or 'zero-code metering'} failed: {item.get('detail')}"
        elif item["event"] == "unmetered":
            text = (
                f"a Python process of the job ({item.get('executable')}) cannot import "
                "flopmeter, so it ran unmetered"
            )
        else:
            continue
        if text not in said:
            said.append(text)
    return "; ".join(said) if said else NOTHING_FOUND


def unseen_python(records: Sequence[Mapping[str, Any]]) -> str | None:
    """Why a ``flopmeter run`` job that recorded no torch import may have trained unseen, or
    None when metering started in some Python of the job and no Python ran without it (then
    nothing trained: every Python it could see stayed away from torch).

    A Python that cannot import flopmeter records ``unmetered`` (its reason is the report's);
    a job with no ``boot`` record ran no Python metering started in, and its exit status alone
    cannot say whether it trained: it gets a report, not measured, saying so."""
    unmetered = [r for r in records if r["event"] == "unmetered"]
    if unmetered:
        return _reason(unmetered)
    if any(r["event"] == "boot" for r in records):
        return None
    return NO_PYTHON_METERED


def _now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


def unattached_report(
    records: Sequence[Mapping[str, Any]],
    *,
    exit_status: int,
    started_at: str | None = None,
    environ: Mapping[str, str] | None = None,
) -> FlopReport:
    """The report of a job no meter saw: nothing measured, and why.

    Args:
        records: The job folder's records (their ``not_attached`` reasons and ``problem``
            details are the report's reason).
        exit_status: The command's exit status: 0 is ``completed``, anything else ``failed``.
        started_at: When the job started, ISO 8601.
        environ: The job's environment (its id and launcher).
    """
    from flopmeter._version import __version__

    env = os.environ if environ is None else environ
    reason = _reason(records)
    ended = _now()
    launcher = env.get(LAUNCHER_ENV) or "environment"
    run = RunSection(
        run_id=uuid.uuid4().hex,
        status="completed" if exit_status == 0 else "failed",
        error=None if exit_status == 0 else f"the command exited with status {exit_status}",
        started_at=started_at if started_at is not None and started_at <= ended else ended,
        ended_at=ended,
        updated_at=ended,
        pid=os.getpid(),
        hostname=socket.gethostname(),
        training_duration_seconds=None,  # no meter timed any training: not 0 s
        flopmeter_version=__version__,
    )
    attach = AttachSection(
        method=None,
        launcher=launcher if launcher in ("flopmeter run", "environment") else "environment",
        job_id=env.get(JOB_ID_ENV) or None,
        found="nothing to meter",
        unseen_micro_batches=None,
        reason=reason,
    )
    withheld = f"not measured: zero-code metering did not attach ({reason})"
    return FlopReport(
        run=run,
        tokens=TokenSection(**_NULL_COUNTS),
        compute=ComputeSection(withheld_reason=withheld),
        attach=attach,
        notes=[
            "Not measured: no meter attached to any process of this job, so it has no token "
            "counts (null, not 0), no compute and no verdict. Why: " + reason + "."
        ],
    )


def _sagemaker_copy(report: FlopReport, env: Mapping[str, str], stream: TextIO | None) -> None:
    """On SageMaker (or with ``FLOPS_METER_OUT``), the AWS-keyed copy and the full report
    beside it, as the Hugging Face callback writes them."""
    path = sagemaker_output_path(env)
    if path is None:
        return
    try:
        if path.is_dir():
            path = path / DEFAULT_FILENAME
        if os.path.lexists(path):  # an earlier process's copy: a measurement, or as good
            _say(stream, f"flopmeter: the SageMaker copy {path} is another run's: left as it is")
            return
        check_writable(path)
        SageMakerCopy(path, environ=env).write(report)
    except Exception as exc:
        _say(stream, f"flopmeter: no SageMaker copy of the report: {exc}")
