"""What a report says to a person, in one place: a pure function from a report to sections.

Each human form (``text``, ``markdown``, ``html``) renders the same :class:`Document`, so the
three say the same things in the same order. The sections follow what the AI Act asks a provider
to document about training compute (Annex XI, Section 1, 1(d) and 2(d)-(e); the Code of
Practice's Model Documentation Form): the model and its parameters, the training compute with
the estimation method, the training time, the hardware and energy, then the threshold, the
verdict and, when the threshold is exceeded, what follows. Figures are rounded to two
significant figures here (:mod:`flopmeter.units`); the JSON keeps them in full.
"""

from __future__ import annotations

import json
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from flopmeter.render.document import Banner, Document, Row, Section
from flopmeter.render.judgement import (
    obligations_section,
    summary_section,
    threshold_section,
    verdict_section,
)
from flopmeter.safe_text import visible
from flopmeter.units import human_flops

if TYPE_CHECKING:
    from flopmeter.report import FlopReport

__all__ = [
    "build_document",
    "count",
    "status_banner",
]


def _budget(report: FlopReport) -> Section | None:
    """The compute budget the run was given (``FlopMeter(budget=...)``), when it had one."""
    budget = report.budget
    if budget is None:
        return None
    stopped = budget.stopped_by_budget
    at_stop = human_flops(budget.flops_at_stop) if stopped else "n/a (not stopped by it)"
    rows = (
        Row("Budget", human_flops(budget.budget_flops)),
        Row("Budget source", budget.source or "n/a"),
        Row("Compute when training stopped", at_stop),
        Row("Stopped by the budget", "yes" if stopped else "no"),
    )
    return Section("budget", "Compute budget", rows)


def build_document(report: FlopReport) -> Document:
    """The sections of ``report``, in the order a reader needs them (a pure function)."""
    sections = [
        summary_section(report),
        _attach(report),
        _model(report),
        _compute(report),
        _phases(report),
        _budget(report),
        _time(report),
        _hardware(report),
        threshold_section(report),
        verdict_section(report),
        obligations_section(report),
        _assumptions(report),
        _notes(report),
        _record(report),
    ]
    return visible_document(
        Document(
            title=f"flopmeter report — {report.model.name or 'unnamed model'} ({report.run.status})",
            banner=status_banner(report),
            sections=tuple(s for s in sections if s is not None),
            disclaimer=report.disclaimer,
        )
    )


def visible_document(doc: Document) -> Document:
    """``doc`` with every string safe to show (:func:`flopmeter.safe_text.visible`): terminal
    controls (ESC, BEL, CSI ...) and bidi controls from model names, notes and errors appear as
    ``\\x1b`` / ``\\u202e`` escapes in every format, never as they are."""

    def rows(section: Section) -> tuple[Row, ...]:
        return tuple(
            replace(r, label=visible(r.label), value=visible(r.value)) for r in section.rows
        )

    return replace(
        doc,
        title=visible(doc.title),
        banner=None if doc.banner is None else replace(doc.banner, text=visible(doc.banner.text)),
        sections=tuple(
            replace(
                s,
                title=visible(s.title),
                rows=rows(s),
                paragraphs=tuple(visible(p) for p in s.paragraphs),
            )
            for s in doc.sections
        ),
        disclaimer=visible(doc.disclaimer),
    )


def _attach(report: FlopReport) -> Section | None:
    """How zero-code metering attached (``flopmeter run``, ``FLOPMETER_AUTO``), what it found,
    and whether micro-batches ran before it; or that it did not, and why."""
    attach = report.attach
    if attach is None:
        return None
    how = {
        "hf_trainer": "a FlopMeterCallback added to the Hugging Face Trainer when it was built",
        "lightning_trainer": "the Lightning callback added to the Lightning Trainer",
        "optimizer": "a FlopMeter on the module whose parameters the first optimizer stepped",
    }
    unseen = {
        True: "yes: training micro-batches ran before the meter attached; they are in no "
        "count, so the compute and verdict are withheld",
        False: "none: the meter saw every training micro-batch",
        None: "not known",
    }
    launcher = attach.launcher or "n/a"
    if attach.method is None:
        rows = [
            Row("Measured", "NOT MEASURED: no meter attached to this job"),
            Row("Why", attach.reason or "no reason was recorded"),
            Row("Switched on by", launcher),
        ]
    else:
        rows = [
            Row("Attached by", f"{how.get(attach.method, attach.method)} ({launcher})"),
            Row("Found", attach.found or "n/a"),
            Row("Trainer", attach.trainer_class or "none"),
            Row("Metered module", attach.model_class or "n/a"),
            Row("Micro-batches before it", unseen[attach.unseen_micro_batches]),
        ]
        if attach.reason:
            rows.append(Row("Note", attach.reason))
    rows.append(Row("Job id", attach.job_id or "n/a"))
    return Section("attach", "Zero-code metering", tuple(rows))


def status_banner(report: FlopReport) -> Banner | None:
    """What a reader must know first about a report that is not a completed run's."""
    attach = report.attach
    if attach is not None and attach.method is None:
        ended = f" The command failed: {report.run.error}." if report.run.status == "failed" else ""
        return Banner(
            "error" if report.run.status == "failed" else "warning",
            "NOT MEASURED: no meter attached to any process of this job, so it has no token "
            f"counts, no compute and no verdict. Why: {attach.reason or 'not recorded'}.{ended}",
        )
    if report.run.status == "running":
        when = f" (last updated {report.run.updated_at})" if report.run.updated_at else ""
        return Banner(
            "warning",
            "NOT FINAL: this run was still running when this report was written"
            f"{when}. The figures are the counts up to then; if the run has ended since, its "
            "process was killed before it could write the final report.",
        )
    if report.run.status == "failed":
        error = report.run.error or "no error message was recorded"
        return Banner(
            "error",
            f"THE RUN FAILED: {error}. The figures are what was counted until it failed.",
        )
    if report.run.status == "interrupted":
        return Banner(
            "warning",
            "THE RUN WAS INTERRUPTED (Ctrl-C or SIGTERM) before it finished. The figures are "
            "what was counted until then.",
        )
    return None


def count(value: int | None) -> str:
    """A whole number with thousands separators; ``"n/a"`` when unknown."""
    return "n/a" if value is None else f"{value:,}"


def _model(report: FlopReport) -> Section:
    rows = [
        Row("Model", report.model.name or "not named"),
        Row("Parameters", count(report.model.n_total) + " (tied weights once, logical size)"),
        Row("Trainable parameters", count(report.model.n_trainable)),
        Row("Frozen parameters", count(report.model.n_frozen)),
        Row("Embedding parameters", count(report.model.n_embedding)),
    ]
    if report.model.n_active is not None and report.model.n_active != report.model.n_total:
        rows.append(Row("Active parameters per token", count(report.model.n_active)))
    return Section("model", "Model and parameters", tuple(rows))


def _compute(report: FlopReport) -> Section:
    primary = report.compute.primary_estimate
    rows = [Row("Training compute", _primary_line(report), "primary" if primary else None)]
    if primary and report.compute.primary_reason:
        rows.append(Row("Why this estimate", report.compute.primary_reason))
    if report.compute.withheld_reason:
        rows.append(Row("Withheld", report.compute.withheld_reason))
    for name, est in report.compute.estimates.items():
        is_primary = name == primary
        suffix = " (primary)" if is_primary else ""
        rows.append(Row(f"Estimate {name}", human_flops(est.flops) + suffix,
                        "primary" if is_primary else None))  # fmt: skip
    if report.compute.measured_to_transformer_ratio is not None:
        rows.append(
            Row("Measured / transformer", f"{report.compute.measured_to_transformer_ratio:.3f}")
        )
    rows.extend(_token_rows(report))
    return Section("compute", "Training compute", tuple(rows))


def _phases(report: FlopReport) -> Section | None:
    """The run's compute by phase (schema 2.2), one row each, and the policy that judged them;
    ``None`` for a report without phases (older than 2.2)."""
    compute = report.compute
    if not compute.phases:
        return None
    rows = []
    for phase in compute.phases:
        figure = human_flops(phase.flops) if phase.flops is not None else "not known"
        counted = "counted" if phase.counted else "not counted"
        parts = [f"{figure}, {counted}", phase.method]
        if phase.calls is not None:
            parts.append(
                f"{count(phase.calls)} call(s), {count(phase.samples)} counted at dispatch level"
            )
        if phase.modules:
            parts.append("; ".join(phase.modules))
        if phase.reason and phase.flops is None:
            parts.append(f"why not known: {phase.reason}")
        parts.extend(phase.notes)
        rows.append(Row(phase.name, "; ".join(parts), "primary" if phase.counted else None))
    policy = compute.phase_policy or "n/a"
    judged = report.verdict.judged_flops
    rows.append(Row("Phase policy", policy))
    rows.append(Row("Judged figure", human_flops(judged) if judged is not None else "not known"))
    return Section("phases", "Compute by phase", tuple(rows))


def _primary_line(report: FlopReport) -> str:
    if report.compute.primary_flops is None:
        return "not known (see below)"
    return (
        f"{human_flops(report.compute.primary_flops)} ({report.compute.primary_estimate} estimate)"
    )


def _token_rows(report: FlopReport) -> list[Row]:
    if report.tokens.tokens_processed is None and report.tokens.micro_batches is None:
        return [Row("Training tokens", "not measured: no meter saw this run (null, not 0)")]
    rows = [
        Row(
            "Training tokens",
            f"{count(report.tokens.tokens_processed)} non-padding of {count(report.tokens.tokens_seen)} "
            f"in {count(report.tokens.sequences)} sequences",
        ),
        Row(
            "Steps",
            f"{_many(report.tokens.micro_batches, 'micro-batch', 'micro-batches')}, "
            f"{_many(report.tokens.optimizer_steps, 'optimizer step', 'optimizer steps')}"
            + (
                f", {report.run.epochs:g} epoch{'' if report.run.epochs == 1 else 's'}"
                if report.run.epochs is not None
                else ""
            ),
        ),
    ]
    t = report.tokens
    if t.tokens_meaning is not None:
        rows.insert(1, Row("Tokens are", t.tokens_meaning))
    if t.decoder_tokens or t.cross_pairs:
        rows.append(
            Row(
                "Decoder tokens",
                f"{count(t.decoder_tokens)} non-padding; {count(t.cross_pairs)} "
                "cross-attention query-key pairs",
            )
        )
    if t.non_text_micro_batches:
        rows.append(
            Row(
                "Not only text",
                f"{_many(t.non_text_micro_batches, 'micro-batch', 'micro-batches')} with "
                f"images, audio, floats or a decoder stream; {count(t.items)} items",
            )
        )
    problems = [
        (report.tokens.micro_batches_unread, "whose tokens could not be read"),
        (report.tokens.micro_batches_inconsistent, "with inconsistent inputs"),
    ]
    for n, what in problems:
        if n:
            rows.append(Row("Not counted", f"{_many(n, 'micro-batch', 'micro-batches')} {what}"))
    scope = "summed over all ranks" if report.run.counts_scope == "all_ranks" else "this rank only"
    if report.run.world_size > 1 or report.run.counts_scope != "all_ranks":
        rows.append(Row("Processes", f"{report.run.world_size} ranks; counts {scope}"))
    return rows


def _many(n: int | None, one: str, more: str) -> str:
    """``"1 micro-batch"``, ``"2 micro-batches"``, ``"n/a micro-batches"``."""
    return f"{count(n)} {one if n == 1 else more}"


def _time(report: FlopReport) -> Section:
    seconds = report.run.training_duration_seconds
    if seconds is None:
        shown = "not measured: no meter saw this run (null, not 0)"
    else:
        shown = f"{seconds:.1f} s" + (f" ({seconds / 3600:.2g} h)" if seconds >= 360 else "")
    return Section(
        "time",
        "Training time",
        (
            Row("Wall-clock training time", shown),
            Row("Started", report.run.started_at or "n/a"),
            Row("Ended", report.run.ended_at or "not yet (running)"),
        ),
    )


def _hardware(report: FlopReport) -> Section:
    rows: list[Row] = []
    if report.hardware.gpu_count is not None:
        peak = report.hardware.peak_flops_per_second
        rows.append(
            Row(
                "GPUs",
                f"{report.hardware.gpu_count} x {report.hardware.gpu_name or 'unknown or mixed'}"
                + (f", dense peak {peak:.2g} FLOP/s each" if peak is not None else ""),
            )
        )
    figures = [
        ("Hardware bound", report.hardware.bound_flops, "upper bound: seconds x peak FLOP/s"),
        (
            "Utilisation-weighted bound",
            report.hardware.utilization_weighted_bound_flops,
            "upper bound",
        ),
    ]
    for label, value, what in figures:
        if value is not None:
            rows.append(Row(label, f"{human_flops(value)} ({what})"))
    if report.hardware.mfu is not None:
        rows.append(
            Row(
                "MFU (model FLOP utilisation)",
                f"{report.hardware.mfu:.2g} (compute / hardware bound)",
            )
        )
    if report.hardware.energy_joules is not None:
        power = report.hardware.average_power_watts
        rows.append(
            Row(
                "GPU energy",
                f"{report.hardware.energy_joules / 3.6e6:.2g} kWh ({report.hardware.energy_joules:.3g} J)"
                + (f", average {power:.3g} W" if power is not None else ""),
            )
        )
    if not rows:
        rows.append(Row("GPU figures", "not measured (why: below)"))
    notes = tuple(_plain(note) for note in report.hardware.notes)
    return Section("hardware", "Hardware and energy", tuple(rows), notes)


def _plain(note: str) -> str:
    """A hardware note as a person reads it: the plain "no NVIDIA GPU" note without its NVML
    detail (which stays in the JSON's ``hardware.notes``, for debugging)."""
    if note.startswith("Not measured: no NVIDIA GPU driver") and " Detail: " in note:
        return note.split(" Detail: ", 1)[0]
    return note


def _assumptions(report: FlopReport) -> Section | None:
    rows: list[Row] = []
    for name, est in report.compute.estimates.items():
        rows.append(Row(f"{name}: formula", est.formula))
        scalars = {k: v for k, v in est.inputs.items() if not isinstance(v, (list, dict))}
        nested = {k: v for k, v in est.inputs.items() if isinstance(v, (list, dict))}
        if scalars:
            inputs = "; ".join(f"{k} = {_input(v)}" for k, v in scalars.items())
            rows.append(Row(f"{name}: inputs", inputs))
        if nested:
            parts = ", ".join(f"{k} ({_size(v)})" for k, v in nested.items())
            rows.append(Row(f"{name}: details", f"{parts}: in the JSON report"))
        rows.extend(Row(f"{name}: note", note) for note in est.notes)
    if not rows:
        return None
    return Section("assumptions", "Assumptions behind each estimate", tuple(rows))


def _input(value: Any) -> str:
    """A scalar input as written in a report: counts with separators, floats to 6 figures."""
    if isinstance(value, bool) or value is None:
        return json.dumps(value)
    if isinstance(value, int):
        return f"{value:,}"
    if isinstance(value, float):
        return f"{value:,.0f}" if value.is_integer() and abs(value) < 1e15 else f"{value:.6g}"
    return str(value)


def _size(value: list[Any] | dict[str, Any]) -> str:
    n = len(value)
    if isinstance(value, dict):
        return f"{n} field{'s' if n != 1 else ''}"
    return f"{n} entr{'ies' if n != 1 else 'y'}"


def _notes(report: FlopReport) -> Section | None:
    if not report.notes:
        return None
    return Section("notes", "Notes", paragraphs=tuple(report.notes))


def _record(report: FlopReport) -> Section:
    rows = [
        Row("Run id", report.run.run_id or "n/a"),
        Row("Report updated", report.run.updated_at or "n/a"),
        Row(
            "Written by",
            f"pid {report.run.pid} on {report.run.hostname}" if report.run.pid else "n/a",
        ),
        Row("flopmeter version", report.run.flopmeter_version or "n/a"),
        Row("torch version", report.run.torch_version or "n/a"),
        Row("Report schema", report.schema_version),
    ]
    return Section("record", "Run record", tuple(rows))
