"""What the zero-code attach paths share (Hugging Face, Lightning, a raw loop): the report's
attach section, whether a meter is the script's own, and the guard that keeps a failure in
zero-code metering out of the job."""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Iterator
from typing import Any

from flopmeter.auto import JOB_ID_ENV, LAUNCHER_ENV
from flopmeter.auto.job import problem
from flopmeter.report.context import AttachMethod, AttachSection
from flopmeter.run import events as meter_events

__all__ = ["attach_section", "explicit_meters", "guarded", "is_zero_code", "qualified_name"]

logger = logging.getLogger("flopmeter")


def qualified_name(obj: Any) -> str:
    """``module.QualName`` of a class, or of an object's class."""
    cls = obj if isinstance(obj, type) else type(obj)
    return f"{cls.__module__}.{cls.__qualname__}"


def attach_section(
    method: AttachMethod,
    found: str,
    *,
    trainer: Any = None,
    model: Any = None,
    unseen_micro_batches: bool | None = False,
) -> AttachSection:
    """The report's attach section of a meter zero-code metering attaches now.

    Args:
        method: How it attached (``hf_trainer``, ``lightning_trainer``, ``optimizer``).
        found: What was found and how, one sentence.
        trainer: The trainer it attached to, if any.
        model: The module it meters, if known.
        unseen_micro_batches: Whether training micro-batches ran before it (``None``: unknown).
    """
    launcher = os.environ.get(LAUNCHER_ENV) or "environment"
    return AttachSection(
        method=method,
        launcher=launcher if launcher in ("flopmeter run", "environment") else "environment",
        job_id=os.environ.get(JOB_ID_ENV) or None,
        trainer_class=None if trainer is None else qualified_name(trainer),
        model_class=None if model is None else qualified_name(model),
        found=found,
        unseen_micro_batches=unseen_micro_batches,
    )


def is_zero_code(meter: Any) -> bool:
    """Whether ``meter`` was attached by zero-code metering (it has an attach section)."""
    return getattr(meter, "attach", None) is not None


def explicit_meters() -> list[Any]:
    """The meters running in this process that the script made itself."""
    return [m for m in meter_events.running() if not is_zero_code(m)]


@contextlib.contextmanager
def guarded(where: str) -> Iterator[None]:
    """Runs the block; an exception in it is logged once, recorded in the job folder
    (``problem``) and swallowed: zero-code metering never breaks the job."""
    try:
        yield
    except Exception as exc:
        problem(where, exc)
