"""The report: what a run measured, how each figure was obtained, and the verdict.

:class:`FlopReport` is a pydantic model (JSON schema via ``FlopReport.model_json_schema()``).
Every figure can be recomputed from the report's own fields and the method it names. The
sections are in :mod:`flopmeter.report.sections`; :mod:`flopmeter.report.upgrade` reads schema
1.x reports as 2.0.
"""

from __future__ import annotations

import math
import os
import secrets
from pathlib import Path
from typing import Any

from pydantic import BaseModel, Field

from flopmeter.report.context import AttachSection, BudgetSection, HardwareSection, LineageSection
from flopmeter.report.sections import (
    ComputeSection,
    ModelSection,
    RunSection,
    ThresholdSection,
    TokenSection,
    VerdictSection,
)

__all__ = [
    "DISCLAIMER",
    "KNOWN_SCHEMA_VERSIONS",
    "SCHEMA_VERSION",
    "FlopReport",
]

SCHEMA_VERSION = "2.2"
#: Every schema version this flopmeter can read (1.1 added the run's identity, the writer, the
#: uncounted micro-batches and ``withheld_reason``).
#: 1.2 added the catalogue figure, parent runs, cumulative compute, the verdict's basis and
#: the obligations.
#: 2.0 grouped the fields in sections and named them for what they hold (1.x files are read
#: through :func:`flopmeter.report.upgrade.upgrade_report`).
#: 2.1 added the ``attach`` section (zero-code metering) and null token counts for a run the
#: meter never saw (2.0 files read as 2.1 unchanged).
#: 2.2 added ``compute.phases`` and ``compute.phase_policy`` (2.0 and 2.1 files read as 2.2, with
#: no phases and a null policy: their judged figure is the training passes').
KNOWN_SCHEMA_VERSIONS = ("1.0", "1.1", "1.2", "2.0", "2.1", "2.2")

DISCLAIMER = (
    "flopmeter measures training compute; it is not legal advice. The threshold and verdict "
    "follow the Commission's GPAI guidelines (C(2025) 5045, section 3.2) as documented in "
    "docs/compliance.md."
)


class FlopReport(BaseModel):
    """The compute report of one training run (schema 2.2: one section per concept)."""

    schema_version: str = SCHEMA_VERSION
    run: RunSection = Field(default_factory=RunSection)
    model: ModelSection = Field(default_factory=ModelSection)
    tokens: TokenSection = Field(default_factory=TokenSection)
    compute: ComputeSection = Field(default_factory=ComputeSection)
    threshold: ThresholdSection = Field(default_factory=ThresholdSection)
    verdict: VerdictSection = Field(default_factory=VerdictSection)
    hardware: HardwareSection = Field(default_factory=HardwareSection)
    budget: BudgetSection | None = Field(
        None, description="The compute budget the run was given; null without one."
    )
    lineage: LineageSection = Field(default_factory=LineageSection)
    attach: AttachSection | None = Field(
        None,
        description="How a zero-code run (flopmeter run, FLOPMETER_AUTO) attached the meter; "
        "null when the script made its meter itself.",
    )
    notes: list[str] = Field(default_factory=list)
    disclaimer: str = DISCLAIMER

    @property
    def judged_flops(self) -> float | None:
        """The figure the verdict judges, FLOP: ``verdict.judged_flops``."""
        return self.verdict.judged_flops

    def to_json(self, indent: int = 2) -> str:
        """The report as JSON text (numbers are JSON numbers)."""
        return self.model_dump_json(indent=indent)

    def write_json(self, path: str | os.PathLike[str]) -> Path:
        """Writes the report to ``path`` atomically (temporary file, then rename).

        Returns:
            The path written.
        """
        return write_text_atomic(Path(path), self.to_json() + "\n")

    def to_sagemaker_dict(self) -> dict[str, Any]:
        """The keys of the AWS FlopsMeterCallback's ``flops_meter.json``.

        Meanings that differ from the AWS meter (see docs/compliance.md): ``threshold_value`` is
        the threshold itself (one third, not 30%, of the original compute), ``exceeds_30pct``
        means "exceeds the threshold", and ``pct_of_pretrain`` is a fraction of the original
        model's compute, null when that is unknown. Numbers are numbers, never strings.
        """
        primary = self.compute.primary_flops
        original = self.threshold.original_flops
        pct = primary / original if primary is not None and original else None
        return {
            "N_total": self.model.n_total,
            "N_trainable": self.model.n_trainable,
            "tokens_processed": self.tokens.tokens_processed,
            "Flops_architecture": primary,
            "Flops_hardware": self.hardware.bound_flops,
            "Flops_original": original,
            "threshold_type": self.threshold.kind,
            "threshold_value": self.threshold.threshold_flops,
            "pct_of_pretrain": pct,
            "exceeds_30pct": self.verdict.exceeds_threshold,
            "model_name": self.model.name,
            "num_epochs": self.run.epochs,
            "training_duration_seconds": self.run.training_duration_seconds,
            "gpu_name": self.hardware.gpu_name,
        }

    def to_text(self) -> str:
        """The report as plain text for a terminal or a log (:mod:`flopmeter.render.text`)."""
        from flopmeter.render.text import render_text  # render imports this module

        return render_text(self)


def format_flops(value: float | None) -> str:
    """FLOP in scientific notation with two significant figures, ``"2.3e+22 FLOP"``.

    The short form of the command's one-line answers; the reports use
    :func:`flopmeter.units.human_flops` (``"2.3 × 10^22 FLOP"``).
    """
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "n/a"
    return f"{value:.1e} FLOP"


def write_text_atomic(path: Path, text: str) -> Path:
    """Writes ``text`` to ``path`` through a temporary file in the same folder and a rename.

    The temporary file is made with mode ``0o666`` less the process's umask, applied by the
    system as for any new file (a report is for others to read): the umask is never changed,
    not even for a moment, so files other threads make meanwhile keep theirs.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = _new_temporary(path)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def _new_temporary(path: Path) -> tuple[int, Path]:
    """A new file ``.<name>.<random>.tmp`` beside ``path``, opened for writing (mode ``0o666``
    less the umask; never an existing file or a link)."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0)
    for _ in range(100):
        tmp = path.with_name(f".{path.name}.{secrets.token_hex(6)}.tmp")
        try:
            return os.open(tmp, flags, 0o666), tmp
        except FileExistsError:
            continue
    raise FileExistsError(f"no free temporary file name beside {path}")  # pragma: no cover
