"""The job folder: what each process of a zero-code job attached, for the job's root to read.

Every process appends JSON lines to its own file in ``FLOPMETER_JOB_DIR``
(``<pid>.jsonl``: one writer per file, so no lock), each line one event with the process's pid,
rank and time. The events:

``boot``
    zero-code metering started in the process (``executable``): a job with no such record ran
    no Python metering could start in (``python -S``, ``python -I``, or no Python at all);
``unmetered``
    a Python of the job cannot import flopmeter and ran unmetered (``executable``; written by
    the ``sitecustomize`` with the standard library alone);
``torch``
    the process imported torch (a job none of whose processes did trains nothing);
``attached``
    a zero-code meter started: ``method`` (``hf_trainer``, ``lightning_trainer``,
    ``optimizer``), ``report`` (its file, absolute; rank 0's is the job's report),
    ``run_id`` (its report's run id: a later run of the process that claims the same file
    moves this one's aside, to ``<stem>.<run id><suffix>``, where the job's end finds it),
    ``trainer_class``, ``model_class``;
``explicit``
    a meter the script made itself started (``report``: its file, or null): the zero-code
    one stood down or never attached;
``not_attached``
    a trainer or optimizer was seen but could not be metered: ``reason``;
``problem``
    something in zero-code metering failed and was caught (the job went on): ``where``,
    ``detail``.

Only the standard library is imported here (it runs before torch in every process).
"""

from __future__ import annotations

import json
import logging
import os
import time
from pathlib import Path
from typing import Any

from flopmeter.auto import JOB_DIR_ENV

__all__ = ["EVENTS", "problem", "read_records", "record", "torch_imported"]

#: The events a record may hold.
EVENTS = ("boot", "unmetered", "torch", "attached", "explicit", "not_attached", "problem")


def _rank() -> int | None:
    for name in ("RANK", "SLURM_PROCID", "OMPI_COMM_WORLD_RANK"):
        value = os.environ.get(name, "")
        if value.isdigit():
            return int(value)
    return None


def record(event: str, **fields: Any) -> None:
    """Appends one event of this process to the job folder; does nothing outside a job, never
    raises (a full disk loses the record, never the job)."""
    folder = os.environ.get(JOB_DIR_ENV)
    if not folder or event not in EVENTS:
        return
    line = {"event": event, "pid": os.getpid(), "rank": _rank(), "time": time.time(), **fields}
    try:
        text = json.dumps(line, default=str) + "\n"
        with open(Path(folder) / f"{os.getpid()}.jsonl", "a", encoding="utf-8") as f:
            f.write(text)
    except Exception:
        pass


def problem(where: str, exc: BaseException) -> None:
    """A failure in zero-code metering, caught: logged (logger ``flopmeter``, WARNING) and
    recorded as ``problem``; the job goes on."""
    logging.getLogger("flopmeter").warning(
        "flopmeter: zero-code metering: %s failed: %s: %s", where, type(exc).__name__, exc
    )
    record("problem", where=where, detail=f"{type(exc).__name__}: {exc}")


def read_records(folder: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """Every event recorded in ``folder``, oldest first (unreadable lines are skipped: a process
    killed mid-write leaves half a line)."""
    out: list[dict[str, Any]] = []
    for path in sorted(Path(folder).glob("*.jsonl")):
        try:
            lines = path.read_text(encoding="utf-8").splitlines()
        except OSError:
            continue
        for text in lines:
            try:
                item = json.loads(text)
            except ValueError:
                continue
            if isinstance(item, dict) and item.get("event") in EVENTS:
                out.append(item)
    return sorted(out, key=lambda item: float(item.get("time") or 0.0))


def torch_imported(module: Any) -> None:
    """The boot's first hook on ``torch``: records that this process imported it (a job none
    of whose processes did trains nothing, and gets no report of its own)."""
    record("torch", version=getattr(module, "__version__", None))
