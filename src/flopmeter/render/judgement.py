"""The threshold, the verdict and what follows, as a person reads them (pure functions).

The sections of :func:`flopmeter.render.sections.build_document` that judge the run: the
threshold with the original compute and the catalogue's figure, the verdict with its margin
band and the parent runs, and, when the threshold is exceeded, the obligations.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from flopmeter.compliance.obligations import NOTIFICATION_ONLY_WITH_SYSTEMIC_RISK
from flopmeter.compliance.original import source_dates
from flopmeter.compliance.verdict import near_rule
from flopmeter.render.document import Row, Section
from flopmeter.units import human_flops, percent

if TYPE_CHECKING:
    from flopmeter.report import FlopReport

__all__ = [
    "BASES",
    "RULES",
    "SOURCES",
    "VERDICTS",
    "obligations_section",
    "summary_section",
    "threshold_section",
    "verdict_section",
]

#: The threshold rules, in words (keys: ``threshold.kind``).
RULES = {
    "one_third_of_original": "one third of the original model's training compute",
    "default_gpai": "one third of 10^23 FLOP (the original model's compute is not known, or "
    "is below 10^23 FLOP)",
    "default_systemic_risk": "one third of 10^25 FLOP (the original model has systemic risk "
    "and its compute is not known)",
}

#: The verdicts, in words (keys: ``verdict.outcome``).
VERDICTS = {
    "below_threshold": "Below the threshold",
    "near_threshold": "Near the threshold (not above it, but above it with the 30% margin of "
    "error added)",
    "exceeds_threshold": "Exceeds the threshold",
}

#: Where the original model's compute came from, in words (``threshold.original_flops_source``).
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


def threshold_section(report: FlopReport) -> Section:
    rows = [
        Row("Threshold", human_flops(report.threshold.threshold_flops) + " (exceeded when above)")
    ]
    if report.threshold.kind is not None:
        rows.append(Row("Rule", RULES.get(report.threshold.kind, report.threshold.kind)))
    rows.append(Row("Source", report.threshold.source or "n/a"))
    if report.threshold.original_flops is not None:
        source = SOURCES.get(
            report.threshold.original_flops_source or "", report.threshold.original_flops_source
        )
        source = source or "a source not recorded"
        rows.append(Row("Original model's compute", f"{human_flops(report.threshold.original_flops)} "
                        f"(from {source})"))  # fmt: skip
        if report.threshold.kind == "default_gpai":  # known, but below 10^23 FLOP
            rows.append(Row("One third of it", f"{human_flops(report.threshold.original_flops / 3)}: not "
                            "applied, the original's compute is below 10^23 FLOP (see Source); "
                            "the threshold applied is the less strict one"))  # fmt: skip
    else:
        rows.append(Row("Original model's compute", "not known: not given (argument, "
                        "PRETRAIN_FLOPS or the catalogue)"))  # fmt: skip
    rows.extend(_catalog_rows(report))
    return Section("threshold", "Threshold", tuple(rows))


def _catalog_rows(report: FlopReport) -> list[Row]:
    cat = report.threshold.catalog
    if cat is None:
        return []
    used = report.threshold.original_flops_source == "catalog"
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
        Row("Threshold it gives", human_flops(cat.threshold_flops)),
    ]


def summary_section(report: FlopReport) -> Section:
    """The answer first, before every detail: the verdict (or why there is none), the figure
    judged, the threshold and the share of it (the sections below give each one's source)."""
    outcome = report.verdict.outcome
    judged, threshold = report.verdict.judged_flops, report.threshold.threshold_flops
    verdict = VERDICTS.get(outcome, outcome) if outcome else None
    why = report.compute.withheld_reason or "no figure"
    rows = (
        Row("Verdict", verdict or f"withheld: {why}"),
        Row("Compute judged", human_flops(judged) if judged is not None else "none (withheld)"),
        Row("Threshold", human_flops(threshold) if threshold is not None else "not known"),
        Row("Share of the threshold", percent(report.verdict.ratio_to_threshold)),
    )
    return Section("summary", "In short", rows)


def verdict_section(report: FlopReport) -> Section:
    margin = report.verdict.uncertainty_margin
    judged = report.verdict.judged_flops
    verdict = (
        VERDICTS.get(report.verdict.outcome, report.verdict.outcome)
        if report.verdict.outcome
        else None
    )
    rows = [Row("Verdict", verdict or f"withheld: {report.compute.withheld_reason or 'no figure'}")]
    resumed = report.lineage.resumed
    if report.lineage.parent_runs:
        rows.append(Row("Compute judged", f"{human_flops(judged)} (this run plus its parents)"))
    elif resumed is not None and resumed.beyond_checkpoint_flops is not None:
        lost = human_flops(resumed.beyond_checkpoint_flops)
        rows.append(
            Row("Compute judged", f"{human_flops(judged)} (with {lost} spent past the checkpoint)")
        )
    if resumed is not None and resumed.run_id:
        rows.append(Row("Resumed from", f"run {resumed.run_id}"))
    rows.append(Row("Share of the threshold", percent(report.verdict.ratio_to_threshold)))
    if judged is not None:
        rows.append(Row(f"Estimate −{margin:.0%} to +{margin:.0%}", _band(judged, margin, report)))
    if report.verdict.basis:
        rows.append(Row("Basis", report.verdict.basis))
    for parent in report.lineage.parent_runs:
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
    t = report.threshold.threshold_flops
    return flops / t if t else None


def obligations_section(report: FlopReport) -> Section | None:
    if report.verdict.outcome != "exceeds_threshold":
        return None
    rows = tuple(Row(f"{o.title} ({o.article})", o.text) for o in report.verdict.obligations)
    lead = (
        "Above the threshold the modifier is presumed to be the provider of the modified model; "
        "its obligations are limited to the modification (Recital 109)."
    )
    if not rows:
        lead += " The obligations are described in docs/compliance.md."
    paragraphs = [lead]
    if rows and not any("52(1)" in o.article for o in report.verdict.obligations):
        paragraphs.append(NOTIFICATION_ONLY_WITH_SYSTEMIC_RISK)
    return Section("obligations", "What follows under the AI Act", rows, tuple(paragraphs))
