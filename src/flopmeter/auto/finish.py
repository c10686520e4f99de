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
:func:`run_report`). After their lines comes the job's total (:func:`job_total_line`): each
run's tokens and compute, and their sums, or why a sum is not given. A ``running`` report whose writer is gone (killed by SIGKILL, the out-of-memory killer) is named
as such. When no meter of the job started at all, but some process imported torch, it writes the
job's report itself (:func:`unattached_report`): nothing measured, why, tokens null (never 0),
compute and verdict withheld. A job none of whose processes imported torch trained nothing: no
report is written, and under ``flopmeter run`` one line says so (under the switch alone such a
process is a platform's tool, pip or a shell helper, and stays quiet). Nothing here raises: a
failure is one line on stderr.
"""

from __future__ import annotations

import contextlib
import json
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
from flopmeter.report import FlopReport
from flopmeter.report.context import AttachSection
from flopmeter.report.output_path import DEFAULT_FILENAME, check_writable, run_named
from flopmeter.report.sagemaker import SageMakerCopy, sagemaker_output_path
from flopmeter.report.sections import ComputeSection, RunSection, TokenSection

__all__ = [
    "NOTHING_FOUND",
    "finish_job",
    "job_total_line",
    "report_line",
    "run_report",
    "unattached_report",
]

#: Why nothing attached, when no process recorded a reason of its own.
NOTHING_FOUND = (
    "no Hugging Face or Lightning Trainer was built and no torch optimizer stepped the "
    "parameters of an nn.Module in any Python process of the job"
)
#: The counts a report of a run no meter saw has as null (schema 2.1), never 0.
_NULL_COUNTS = dict.fromkeys(
    ("tokens_processed", "tokens_seen", "sequences", "sum_sq_seq_len", "micro_batches",
     "optimizer_steps")
)  # fmt: skip
_SHORT = 120


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
        return _name_reports(meters, stream, env.get(JOB_ID_ENV) or None)
    if not any(r["event"] == "torch" for r in records):
        if env.get(LAUNCHER_ENV) == "environment":
            return []  # a tool under the switch alone (pip, a shell helper): nothing to say
        _say(
            stream,
            "flopmeter: nothing trained: no Python process of the job imported torch, so no "
            "report was written",
        )
        return []
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
    return seen


#: At most this many files beside a report are read to find a run's report moved aside.
_MAX_SIBLINGS = 256


def run_report(path: Path, item: Mapping[str, Any], job_id: str | None) -> Path:
    """The file holding the report of the run an ``attached`` record names: ``path``, unless a
    later run claimed that file and kept this run's report aside (``<stem>.<run id><suffix>``,
    :func:`~flopmeter.report.output_path.run_named`). Found by the record's run id; a record
    without one (a raw loop's) by its process and job (the report's ``run.pid`` and
    ``attach.job_id``). ``path`` when nothing else is found."""
    run_id = item.get("run_id")
    if isinstance(run_id, str) and run_id.isalnum():
        wanted: tuple[Any, ...] = (run_id, None, None)
        candidates = [path, run_named(path, run_id)]
    elif job_id is not None and isinstance(item.get("pid"), int):
        wanted = (None, job_id, item["pid"])
        candidates = [path, *sorted(path.parent.glob(f"{path.stem}.*{path.suffix}"))]
    else:
        return path
    for candidate in candidates[: _MAX_SIBLINGS + 1]:
        found = _identity(candidate)
        if found is not None and all(
            w is None or w == f for w, f in zip(wanted, found, strict=True)
        ):
            return candidate
    return path


def _read(path: Path) -> dict[str, Any] | None:
    """The report file's JSON object, read leniently (``None``: none, or unreadable)."""
    try:
        if path.stat().st_size > 16 * 1024 * 1024:
            return None
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError, RecursionError):
        return None
    return data if isinstance(data, dict) else None


def _identity(path: Path) -> tuple[Any, Any, Any] | None:
    """A report's run id, job id and writer's process id, or ``None`` (no report there)."""
    data = _read(path)
    if data is None:
        return None
    run, attach = data.get("run"), data.get("attach")
    run = run if isinstance(run, dict) else {}
    attach = attach if isinstance(attach, dict) else {}
    return run.get("run_id"), attach.get("job_id"), run.get("pid")


def job_total_line(paths: Sequence[Path]) -> str:
    """The line of a job of several reports (several runs: ``trainer.train()`` twice, two
    trainers, a raw loop and a trainer): each run's non-padding tokens and compute, and their
    sums. A sum is left out, saying why, when a run's figure is unknown (null: not counted,
    withheld), not final (a ``running`` report) or holds an earlier session's (a run resumed
    from a checkpoint, whose counts continue that session's): never a partial sum.

    ``flopmeter: job total: 2 runs: 4,096 non-padding tokens, 2.460e+09 FLOP (run A: 2,048
    tokens, 1.230e+09 FLOP; run B: ...); each run's verdict is its own (above)``
    """
    each, tokens, flops, why_tokens, why_flops = [], 0, 0.0, "", ""
    for path in paths:
        data = _read(path) or {}
        run, counts, compute, lineage = (
            data.get(k) if isinstance(data.get(k), dict) else {}
            for k in ("run", "tokens", "compute", "lineage")
        )
        name = f"run {run.get('run_id') or path.name}"
        count, figure = counts.get("tokens_processed"), compute.get("primary_flops")
        known_count = isinstance(count, int) and not isinstance(count, bool)
        known_figure = isinstance(figure, (int, float)) and not isinstance(figure, bool)
        each.append(
            f"{name}: " + (f"{count:,} tokens" if known_count else "tokens unknown") + ", "
            + (f"{figure:.3e} FLOP" if known_figure else "compute withheld")
        )  # fmt: skip
        why = _not_summed(name, data, run, lineage)
        if not known_count or why:
            why_tokens = why_tokens or why or f"{name} has no token count"
        if not known_figure or why:
            why_flops = why_flops or why or f"{name}'s compute is withheld"
        tokens += count if known_count else 0
        flops += float(figure) if known_figure else 0.0
    said_tokens = (
        f"no token total ({why_tokens})" if why_tokens else f"{tokens:,} non-padding tokens"
    )
    said_flops = f"no compute total ({why_flops})" if why_flops else f"{flops:.3e} FLOP"
    return (
        f"flopmeter: job total: {len(paths)} runs: {said_tokens}, {said_flops} "
        f"({'; '.join(each)}); each run's verdict is its own (above)"
    )


def _not_summed(name: str, data: Mapping[str, Any], run: Mapping[str, Any], lineage: Any) -> str:
    """Why a run's figures cannot go into the job's sums ("": they can)."""
    if not data:
        return f"{name}'s report cannot be read"
    if run.get("status") == "running":
        return f"{name}'s report is not final (running)"
    if isinstance(lineage, Mapping) and lineage.get("resumed"):
        return f"{name} continues the counts of an earlier session from a checkpoint"
    return ""


def report_line(path: Path) -> str:
    """``flopmeter: report: PATH (status, outcome)``, read leniently from the file."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        run = data.get("run") or {}
        verdict = data.get("verdict") or {}
        compute = data.get("compute") or {}
    except Exception as exc:
        return f"flopmeter: report: {path} (unreadable: {type(exc).__name__}: {exc})"
    status = str(run.get("status"))
    outcome = verdict.get("outcome")
    attach = data.get("attach")
    if isinstance(attach, dict) and attach.get("method") is None and attach.get("reason"):
        said = f"no verdict: not measured: {attach['reason']}"  # the whole reason: the news
    elif outcome:
        said = str(outcome)
    else:
        said = "no verdict: " + _short(compute.get("withheld_reason"))
    if status == "running" and _writer_gone(run.get("pid"), run.get("hostname")):
        return (
            f"flopmeter: report: {path} (running: its writer, pid {run.get('pid')}, is gone, "
            "killed before it could finish: the counts are those of its last refresh; "
            f"{said})"
        )
    return f"flopmeter: report: {path} ({status}, {said})"


def _short(reason: object) -> str:
    if not isinstance(reason, str) or not reason.strip():
        return "the verdict is withheld"
    text = " ".join(reason.split())
    return text if len(text) <= _SHORT else text[: _SHORT - 3].rstrip() + "..."


def _writer_gone(pid: object, hostname: object) -> bool:
    """Whether the writer ran on this host and no longer exists."""
    if not isinstance(pid, int) or pid <= 0 or hostname != socket.gethostname():
        return False
    try:
        os.kill(pid, 0)  # signal 0 only asks whether it exists
    except ProcessLookupError:
        return True
    except (OSError, OverflowError):
        return False
    return _zombie(pid)


def _zombie(pid: int) -> bool:
    """A child that was killed but not yet reaped still answers signal 0 (Linux: state Z)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[-1].split()[:1] == ["Z"]


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
        else:
            continue
        if text not in said:
            said.append(text)
    return "; ".join(said) if said else NOTHING_FOUND


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
    from flopmeter import __version__

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
