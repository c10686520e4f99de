"""The reports of a zero-code job's runs, for its end: each run's file found by its run id,
one line per report and the job's total, every file read leniently (a report that cannot be
read is a line saying so, never an error).

A job of several runs (``trainer.train()`` twice, two trainers, ``fit`` twice) has one report
per run: a run whose file a later run of the process claimed is found where that one kept it
(``flops_meter.<run id>.json``, :func:`run_report`)."""

from __future__ import annotations

import json
import os
import socket
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from flopmeter.report.output_path import run_named

__all__ = ["job_total_line", "report_line", "run_report"]

_SHORT = 120


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
