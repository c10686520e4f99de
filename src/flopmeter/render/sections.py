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
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

from flopmeter.compliance.obligations import NOTIFICATION_ONLY_WITH_SYSTEMIC_RISK
from flopmeter.compliance.original import source_dates
from flopmeter.compliance.verdict import near_rule
from flopmeter.units import human_flops, percent

if TYPE_CHECKING:
    from flopmeter.report import FlopReport

__all__ = ["Banner", "Document", "Row", "Section", "build_document"]

#: The threshold rules, in words (keys: ``FlopReport.threshold_type``).
RULES = {
    "one_third_of_original": "one third of the original model's training compute",
    "default_gpai": "one third of 10^23 FLOP (the original model's compute is not known, or "
    "is below 10^23 FLOP)",
    "default_systemic_risk": "one third of 10^25 FLOP (the original model has systemic risk "
    "and its compute is not known)",
}

#: The verdicts, in words (keys: ``FlopReport.verdict``).
VERDICTS = {
    "below_threshold": "Below the threshold",
    "near_threshold": "Near the threshold (not above it, but above it with the 30% margin of "
    "error added)",
    "exceeds_threshold": "Exceeds the threshold",
}

#: Where the original model's compute came from, in words (``pretrain_flops_source``).
SOURCES = {
    "argument": "the pretrain_flops argument",
    "catalog": "the bundled catalogue",
}

#: The catalogue's bases, in words (keys: ``CatalogFigure.basis``).
BASES = {
    "stated": "stated by the developer",
    "6nd": "6ND from the model card's parameters and tokens",
    "independent_estimate": "an independent estimate",
    "not_disclosed": "not disclosed by the developer",
}


@dataclass(frozen=True)
class Row:
    """One labelled figure or statement.

    Attributes:
        label: What the value is.
        value: The value, in words and rounded figures.
        mark: A short tag a renderer may emphasise (``"primary"``), or ``None``.
    """

    label: str
    value: str
    mark: str | None = None


@dataclass(frozen=True)
class Section:
    """A titled part of the report: rows, then paragraphs of prose."""

    key: str
    title: str
    rows: tuple[Row, ...] = ()
    paragraphs: tuple[str, ...] = ()


@dataclass(frozen=True)
class Banner:
    """The line at the top of a report that is not a completed one.

    Attributes:
        level: ``"warning"`` (running, interrupted) or ``"error"`` (failed).
        text: What it means, in words.
    """

    level: Literal["warning", "error"]
    text: str


@dataclass(frozen=True)
class Document:
    """A report as a person reads it: title, status banner, sections, disclaimer."""

    title: str
    banner: Banner | None
    sections: tuple[Section, ...] = field(default_factory=tuple)
    disclaimer: str = ""


def _budget(report: FlopReport) -> Section | None:
    """The compute budget the run was given (``FlopMeter(budget=...)``), when it had one."""
    if report.budget_flops is None:
        return None
    stopped = report.stopped_by_budget
    at_stop = human_flops(report.flops_at_stop) if stopped else "n/a (not stopped by it)"
    rows = (
        Row("Budget", human_flops(report.budget_flops)),
        Row("Budget source", report.budget_source or "n/a"),
        Row("Compute when training stopped", at_stop),
        Row("Stopped by the budget", "yes" if stopped else "no"),
    )
    return Section("budget", "Compute budget", rows)


def build_document(report: FlopReport) -> Document:
    """The sections of ``report``, in the order a reader needs them (a pure function)."""
    sections = [
        _model(report),
        _compute(report),
        _budget(report),
        _time(report),
        _hardware(report),
        _threshold(report),
        _verdict(report),
        _obligations(report),
        _assumptions(report),
        _notes(report),
        _record(report),
    ]
    return Document(
        title=f"flopmeter report — {report.model_name or 'unnamed model'} ({report.status})",
        banner=status_banner(report),
        sections=tuple(s for s in sections if s is not None),
        disclaimer=report.disclaimer,
    )


def status_banner(report: FlopReport) -> Banner | None:
    """What a reader must know first about a report that is not a completed run's."""
    if report.status == "running":
        when = f" (last updated {report.updated_at})" if report.updated_at else ""
        return Banner(
            "warning",
            "NOT FINAL: this run was still running when this report was written"
            f"{when}. The figures are the counts up to then; if the run has ended since, its "
            "process was killed before it could write the final report.",
        )
    if report.status == "failed":
        error = report.error or "no error message was recorded"
        return Banner(
            "error",
            f"THE RUN FAILED: {error}. The figures are what was counted until it failed.",
        )
    if report.status == "interrupted":
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
        Row("Model", report.model_name or "not named"),
        Row("Parameters", count(report.n_total) + " (tied weights once, logical size)"),
        Row("Trainable parameters", count(report.n_trainable)),
        Row("Frozen parameters", count(report.n_frozen)),
        Row("Embedding parameters", count(report.n_embedding)),
    ]
    if report.n_active is not None and report.n_active != report.n_total:
        rows.append(Row("Active parameters per token", count(report.n_active)))
    return Section("model", "Model and parameters", tuple(rows))


def _compute(report: FlopReport) -> Section:
    primary = report.primary_estimate
    rows = [Row("Training compute", _primary_line(report), "primary" if primary else None)]
    if primary and report.primary_reason:
        rows.append(Row("Why this estimate", report.primary_reason))
    if report.withheld_reason:
        rows.append(Row("Withheld", report.withheld_reason))
    for name, est in report.estimates.items():
        is_primary = name == primary
        suffix = " (primary)" if is_primary else ""
        rows.append(Row(f"Estimate {name}", human_flops(est.flops) + suffix,
                        "primary" if is_primary else None))  # fmt: skip
    if report.measured_to_transformer_ratio is not None:
        rows.append(Row("Measured / transformer", f"{report.measured_to_transformer_ratio:.3f}"))
    rows.extend(_token_rows(report))
    return Section("compute", "Training compute", tuple(rows))


def _primary_line(report: FlopReport) -> str:
    if report.flops_architecture is None:
        return "not known (see below)"
    return f"{human_flops(report.flops_architecture)} ({report.primary_estimate} estimate)"


def _token_rows(report: FlopReport) -> list[Row]:
    rows = [
        Row(
            "Training tokens",
            f"{count(report.tokens_processed)} non-padding of {count(report.tokens_seen)} "
            f"in {count(report.sequences)} sequences",
        ),
        Row(
            "Steps",
            f"{_many(report.micro_batches, 'micro-batch', 'micro-batches')}, "
            f"{_many(report.optimizer_steps, 'optimizer step', 'optimizer steps')}"
            + (
                f", {report.epochs:g} epoch{'' if report.epochs == 1 else 's'}"
                if report.epochs is not None
                else ""
            ),
        ),
    ]
    problems = [
        (report.micro_batches_unread, "whose tokens could not be read"),
        (report.micro_batches_inconsistent, "with inconsistent inputs"),
    ]
    for n, what in problems:
        if n:
            rows.append(Row("Not counted", f"{_many(n, 'micro-batch', 'micro-batches')} {what}"))
    scope = "summed over all ranks" if report.counts_scope == "all_ranks" else "this rank only"
    if report.world_size > 1 or report.counts_scope != "all_ranks":
        rows.append(Row("Processes", f"{report.world_size} ranks; counts {scope}"))
    return rows


def _many(n: int | None, one: str, more: str) -> str:
    """``"1 micro-batch"``, ``"2 micro-batches"``, ``"n/a micro-batches"``."""
    return f"{count(n)} {one if n == 1 else more}"


def _time(report: FlopReport) -> Section:
    seconds = report.training_duration_seconds
    hours = f" ({seconds / 3600:.2g} h)" if seconds >= 360 else ""
    return Section(
        "time",
        "Training time",
        (
            Row("Wall-clock training time", f"{seconds:.1f} s{hours}"),
            Row("Started", report.started_at or "n/a"),
            Row("Ended", report.ended_at or "not yet (running)"),
        ),
    )


def _hardware(report: FlopReport) -> Section:
    rows: list[Row] = []
    if report.gpu_count is not None:
        peak = report.peak_flops_per_second
        rows.append(
            Row(
                "GPUs",
                f"{report.gpu_count} x {report.gpu_name or 'unknown or mixed'}"
                + (f", dense peak {peak:.2g} FLOP/s each" if peak is not None else ""),
            )
        )
    figures = [
        ("Hardware bound", report.flops_hardware, "upper bound: seconds x peak FLOP/s"),
        ("Utilisation-weighted bound", report.flops_hardware_utilization_weighted, "upper bound"),
    ]
    for label, value, what in figures:
        if value is not None:
            rows.append(Row(label, f"{human_flops(value)} ({what})"))
    if report.mfu is not None:
        rows.append(
            Row("MFU (model FLOP utilisation)", f"{report.mfu:.2g} (compute / hardware bound)")
        )
    if report.energy_joules is not None:
        power = report.average_power_watts
        rows.append(
            Row(
                "GPU energy",
                f"{report.energy_joules / 3.6e6:.2g} kWh ({report.energy_joules:.3g} J)"
                + (f", average {power:.3g} W" if power is not None else ""),
            )
        )
    if not rows:
        rows.append(Row("GPU figures", "not measured (why: below)"))
    notes = tuple(_plain(note) for note in report.hardware_notes)
    return Section("hardware", "Hardware and energy", tuple(rows), notes)


def _plain(note: str) -> str:
    """A hardware note as a person reads it: the plain "no NVIDIA GPU" note without its NVML
    detail (which stays in the JSON's ``hardware_notes``, for debugging)."""
    if note.startswith("Not measured: no NVIDIA GPU driver") and " Detail: " in note:
        return note.split(" Detail: ", 1)[0]
    return note


def _threshold(report: FlopReport) -> Section:
    rows = [Row("Threshold", human_flops(report.threshold_value) + " (exceeded when above)")]
    if report.threshold_type is not None:
        rows.append(Row("Rule", RULES.get(report.threshold_type, report.threshold_type)))
    rows.append(Row("Source", report.threshold_source or "n/a"))
    if report.pretrain_flops is not None:
        source = SOURCES.get(report.pretrain_flops_source or "", report.pretrain_flops_source)
        source = source or "a source not recorded"
        rows.append(Row("Original model's compute", f"{human_flops(report.pretrain_flops)} "
                        f"(from {source})"))  # fmt: skip
        if report.threshold_type == "default_gpai":  # known, but below 10^23 FLOP
            rows.append(Row("One third of it", f"{human_flops(report.pretrain_flops / 3)}: not "
                            "applied, the original's compute is below 10^23 FLOP (see Source); "
                            "the threshold applied is the less strict one"))  # fmt: skip
    else:
        rows.append(Row("Original model's compute", "not known: not given (argument, "
                        "PRETRAIN_FLOPS or the catalogue)"))  # fmt: skip
    rows.extend(_catalog_rows(report))
    return Section("threshold", "Threshold", tuple(rows))


def _catalog_rows(report: FlopReport) -> list[Row]:
    cat = report.catalog
    if cat is None:
        return []
    used = report.pretrain_flops_source == "catalog"
    figure = human_flops(cat.flops) if cat.flops is not None else "not disclosed"
    basis = BASES.get(cat.basis, cat.basis)
    if cat.basis == "6nd" and cat.params is not None and cat.tokens is not None:
        basis += f" (N = {cat.params:.2g} parameters, D = {cat.tokens:.2g} tokens)"
    return [
        Row(
            "Catalogue figure",
            f"{figure} for {cat.base_model} (looked up as {cat.model_id}), "
            f"{basis}; " + ("used" if used else "not used (pretrain_flops='catalog' opts in)"),
        ),
        Row("Catalogue source", f"{cat.source} ({source_dates(cat.date, cat.catalog_compiled)})"),
        Row("Threshold it gives", human_flops(cat.threshold_value)),
    ]


def _verdict(report: FlopReport) -> Section:
    margin = report.uncertainty_margin
    judged = report.judged_flops
    verdict = VERDICTS.get(report.verdict, report.verdict) if report.verdict else None
    rows = [Row("Verdict", verdict or f"withheld: {report.withheld_reason or 'no figure'}")]
    if report.parent_runs:
        rows.append(Row("Compute judged", f"{human_flops(judged)} (this run plus its parents)"))
    rows.append(Row("Share of the threshold", percent(report.ratio_to_threshold)))
    if judged is not None:
        rows.append(Row(f"Estimate −{margin:.0%} to +{margin:.0%}", _band(judged, margin, report)))
    if report.verdict_basis:
        rows.append(Row("Basis", report.verdict_basis))
    for parent in report.parent_runs:
        who = parent.ref + (f" (run {parent.run_id})" if parent.run_id else "")
        status = f", {parent.status}" if parent.status else ""
        figure = human_flops(parent.flops)
        if parent.flops is None and parent.reason:
            figure += f" ({parent.reason})"
        rows.append(Row("Parent run", f"{who}: {figure}{status}"))
    paragraph = near_rule(margin)
    return Section("verdict", "Verdict", tuple(rows), (paragraph,))


def _band(judged: float, margin: float, report: FlopReport) -> str:
    """The judged figure's margin band, in FLOP and as shares of the threshold: where the true
    compute lies if the estimate is off by at most the margin either way; the verdict is near
    when the band's upper end passes the threshold."""
    low, high = judged * (1 - margin), judged * (1 + margin)
    low_pct, high_pct = percent(_share(low, report)), percent(_share(high, report))
    shares = low_pct if low_pct == high_pct else f"{low_pct} to {high_pct}"
    return (
        f"{human_flops(low)} to {human_flops(high)}, {shares} of the threshold: where the "
        f"compute lies if the estimate is off by up to {margin:.0%} either way (the upper end "
        "decides near_threshold)"
    )


def _share(flops: float, report: FlopReport) -> float | None:
    t = report.threshold_value
    return flops / t if t else None


def _obligations(report: FlopReport) -> Section | None:
    if report.verdict != "exceeds_threshold":
        return None
    rows = tuple(Row(f"{o.title} ({o.article})", o.text) for o in report.obligations)
    lead = (
        "Above the threshold the modifier is presumed to be the provider of the modified model; "
        "its obligations are limited to the modification (Recital 109)."
    )
    if not rows:
        lead += " The obligations are described in docs/compliance.md."
    paragraphs = [lead]
    if rows and not any("52(1)" in o.article for o in report.obligations):
        paragraphs.append(NOTIFICATION_ONLY_WITH_SYSTEMIC_RISK)
    return Section("obligations", "What follows under the AI Act", rows, tuple(paragraphs))


def _assumptions(report: FlopReport) -> Section | None:
    rows: list[Row] = []
    for name, est in report.estimates.items():
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
        Row("Run id", report.run_id or "n/a"),
        Row("Report updated", report.updated_at or "n/a"),
        Row("Written by", f"pid {report.pid} on {report.hostname}" if report.pid else "n/a"),
        Row("flopmeter version", report.flopmeter_version or "n/a"),
        Row("torch version", report.torch_version or "n/a"),
        Row("Report schema", report.schema_version),
    ]
    return Section("record", "Run record", tuple(rows))
