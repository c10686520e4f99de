"""The report: what a run measured, how each figure was obtained, and the verdict.

:class:`FlopReport` is a pydantic model (JSON schema via ``FlopReport.model_json_schema()``).
Every figure can be recomputed from the report's own fields and the method it names.
"""

from __future__ import annotations

import math
import os
import tempfile
from pathlib import Path
from typing import Any

from pydantic import BaseModel, Field

from flopmeter.compliance.verdict import UNCERTAINTY_MARGIN
from flopmeter.types import (
    CatalogFigure,
    CountsScope,
    Estimate,
    EstimateName,
    Obligation,
    ParentRun,
    Status,
    ThresholdKind,
    TokenTotals,
    Verdict,
)

__all__ = [
    "DISCLAIMER",
    "KNOWN_SCHEMA_VERSIONS",
    "SCHEMA_VERSION",
    "Estimate",
    "FlopReport",
    "Status",
    "TokenTotals",
]

SCHEMA_VERSION = "1.2"
#: Every schema version this flopmeter can read (1.1 added the run's identity, the writer, the
#: uncounted micro-batches and ``withheld_reason``).
#: 1.2 added the catalogue figure, parent runs, cumulative compute, the verdict's basis and
#: the obligations.
KNOWN_SCHEMA_VERSIONS = ("1.0", "1.1", "1.2")

DISCLAIMER = (
    "flopmeter measures training compute; it is not legal advice. The threshold and verdict "
    "follow the Commission's GPAI guidelines (C(2025) 5045, section 3.2) as documented in "
    "docs/compliance.md."
)


class FlopReport(BaseModel):
    """The compute report of one training run."""

    schema_version: str = SCHEMA_VERSION
    model_name: str | None = None
    run_id: str | None = Field(None, description="This run's id (a new one per meter).")
    status: Status = Field(
        "running",
        description="running: the counts so far, written while training goes on (a running "
        "report whose writer is gone is incomplete: the process was killed); completed, "
        "failed or interrupted: the final report.",
    )
    error: str | None = Field(
        None,
        description="Exception type and message when the run failed (at most 2000 characters, "
        "credentials redacted).",
    )
    started_at: str | None = Field(None, description="ISO 8601, UTC.")
    ended_at: str | None = Field(None, description="ISO 8601, UTC; null while running.")
    updated_at: str | None = Field(None, description="When this report was made, ISO 8601, UTC.")
    pid: int | None = Field(None, description="Process id of the writer (rank 0).")
    hostname: str | None = Field(None, description="Host of the writer.")
    training_duration_seconds: float = 0.0

    n_total: int | None = Field(None, description="Parameters, tied weights once, logical size.")
    n_trainable: int | None = None
    n_frozen: int | None = None
    n_embedding: int | None = Field(None, description="Parameters of embedding tables.")
    n_active: int | None = Field(
        None, description="Parameters a token passes through (mixture-of-experts: top-k)."
    )

    tokens_processed: int = Field(0, description="Non-padding training tokens.")
    tokens_seen: int = Field(0, description="Training tokens including padding.")
    sequences: int = 0
    sum_sq_seq_len: int = Field(0, description="Sum of squared per-sequence lengths, tokens^2.")
    micro_batches: int = 0
    micro_batches_unread: int = Field(
        0,
        description="Training micro-batches whose tokens the meter could not find or read "
        "(not in the counts; any makes the compute and verdict null).",
    )
    micro_batches_inconsistent: int = Field(
        0,
        description="Training micro-batches with inconsistent inputs (a mask of another shape "
        "than the ids, document offsets that decrease or run past the batch); any makes the "
        "compute and verdict null.",
    )
    optimizer_steps: int = 0
    epochs: float | None = Field(None, description="Epochs, when a framework adapter knows them.")

    flops_architecture: float | None = Field(
        None, description="The primary compute figure, FLOP: estimates[primary_estimate]."
    )
    primary_estimate: EstimateName | None = None
    primary_reason: str | None = Field(
        None,
        description="Why primary_estimate is the primary figure (new in 1.1), e.g. "
        "'transformer: architecture recognised, measured within 1%'.",
    )
    estimates: dict[str, Estimate] = Field(default_factory=dict)
    measured_to_transformer_ratio: float | None = Field(
        None,
        description="estimates.measured / estimates.transformer: the run's consistency check "
        "(a warning note beyond 10%).",
    )

    pretrain_flops: float | None = Field(None, description="Original model's compute, FLOP.")
    pretrain_flops_source: str | None = Field(
        None,
        description="Where pretrain_flops came from: 'argument', 'environment variable "
        "PRETRAIN_FLOPS' or 'catalog'; null when unknown. Checked in that order.",
    )
    catalog: CatalogFigure | None = Field(
        None,
        description="The bundled catalogue's figure for the base model when it knows it, shown "
        "whether or not it was chosen (pretrain_flops='catalog' opts in).",
    )
    parent_runs: list[ParentRun] = Field(
        default_factory=list, description="Earlier runs this run continues (new in 1.2)."
    )
    cumulative_flops: float | None = Field(
        None,
        description="flops_architecture plus the parents' compute, FLOP: what the verdict "
        "judges when parent_runs is not empty. Each earlier run counts once (ancestor_flops), "
        "however many parents lead to it.",
    )
    ancestor_flops: dict[str, float] = Field(
        default_factory=dict,
        description="Every earlier run counted in cumulative_flops, each once: run id -> that "
        "run's own compute, FLOP (the parents and their ancestors). Empty without parent runs.",
    )
    uncertainty_margin: float = Field(
        UNCERTAINTY_MARGIN,
        description="The error margin of the guidelines (Annex A.2) used for near_threshold: "
        "near when the figure is not above the threshold but would be with this share added "
        "(from 1/1.3 ≈ 77% of the threshold).",
    )
    verdict_basis: str | None = Field(
        None,
        description="Which figure decided the verdict, in words (e.g. the measured cross-check "
        "would pass the threshold with the margin added).",
    )
    obligations: list[Obligation] = Field(
        default_factory=list,
        description="When the verdict is exceeds_threshold: what follows for the modifier.",
    )
    threshold_value: float | None = Field(None, description="FLOP; exceeded when strictly above.")
    threshold_type: ThresholdKind | None = None
    threshold_source: str | None = None
    ratio_to_threshold: float | None = None
    exceeds_threshold: bool | None = None
    withheld_reason: str | None = Field(
        None,
        description="Why flops_architecture, ratio_to_threshold, exceeds_threshold and "
        "verdict are null, when they are.",
    )
    verdict: Verdict | None = Field(
        None,
        description="below_threshold, near_threshold (not above the threshold, but above it "
        "with 30% added: from 1/1.3 ≈ 77% of it) or exceeds_threshold.",
    )

    gpu_name: str | None = None
    gpu_count: int | None = None
    peak_flops_per_second: float | None = Field(None, description="Dense peak per GPU, FLOP/s.")
    flops_hardware: float | None = Field(
        None, description="Upper bound: sum over GPUs of seconds x peak FLOP/s (utilisation 1)."
    )
    flops_hardware_utilization_weighted: float | None = Field(
        None,
        description="Also an upper bound: flops_hardware with each GPU weighted by its mean "
        "NVML utilisation (share of time a kernel ran, not FLOP efficiency).",
    )
    mfu: float | None = Field(None, description="flops_architecture / flops_hardware.")
    energy_joules: float | None = Field(None, description="GPU energy, J, summed over GPUs.")
    energy_kwh: float | None = Field(None, description="energy_joules in kWh.")
    average_power_watts: float | None = Field(
        None, description="energy_joules over the monitored time, W, all GPUs together."
    )
    hardware_notes: list[str] = Field(
        default_factory=list, description="How the hardware figures were obtained; why any is null."
    )

    budget_flops: float | None = Field(
        None,
        description="The compute budget the run was given, FLOP (FlopMeter(budget=...)); null "
        "without one. The verdict is computed as always, whatever the budget.",
    )
    budget_source: str | None = Field(
        None,
        description="'argument' (a number of FLOP), or for budget='threshold' the rule and the "
        "arithmetic: 'threshold (<rule>): <threshold> FLOP / 1.3 less <parents> FLOP of parent "
        "runs'.",
    )
    flops_at_stop: float | None = Field(
        None,
        description="The run's compute, FLOP, at the optimizer step where the budget guard "
        "stopped training (the guard's reading); null when the guard did not stop it.",
    )
    stopped_by_budget: bool = Field(
        False, description="Whether the budget guard stopped training (should_stop or raise)."
    )

    world_size: int = 1
    counts_scope: CountsScope = "all_ranks"
    torch_version: str | None = None
    flopmeter_version: str | None = None
    notes: list[str] = Field(default_factory=list)
    disclaimer: str = DISCLAIMER

    @property
    def judged_flops(self) -> float | None:
        """The figure the verdict judges, FLOP: ``cumulative_flops`` when the run has parent
        runs, else ``flops_architecture`` (``None`` when not known)."""
        return self.cumulative_flops if self.parent_runs else self.flops_architecture

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
        pct = (
            self.flops_architecture / self.pretrain_flops
            if self.flops_architecture is not None and self.pretrain_flops
            else None
        )
        return {
            "N_total": self.n_total,
            "N_trainable": self.n_trainable,
            "tokens_processed": self.tokens_processed,
            "Flops_architecture": self.flops_architecture,
            "Flops_hardware": self.flops_hardware,
            "Flops_original": self.pretrain_flops,
            "threshold_type": self.threshold_type,
            "threshold_value": self.threshold_value,
            "pct_of_pretrain": pct,
            "exceeds_30pct": self.exceeds_threshold,
            "model_name": self.model_name,
            "num_epochs": self.epochs,
            "training_duration_seconds": self.training_duration_seconds,
            "gpu_name": self.gpu_name,
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
    """Writes ``text`` to ``path`` through a temporary file in the same folder and a rename."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        umask = os.umask(0)
        os.umask(umask)
        os.fchmod(fd, 0o666 & ~umask)  # mkstemp makes 0600; a report is for others to read
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path
