"""The report of a run's measurement: a pure function of what the meter knows.

:func:`build_report` turns :class:`~flopmeter.run.facts.RunFacts` (the run's identity and
lifecycle), a :class:`~flopmeter.run.measure.Measurement` (the run's compute, computed once:
the figure, the primary estimate, why it is withheld) and the hardware fields into a
:class:`~flopmeter.report.FlopReport`, with the verdict and every report-level note, written in
one place (:func:`_report_notes`). It reads no device, clock or process group;
:func:`make_report` reads the hardware fields and builds it.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from typing import Any

from flopmeter.compliance.obligations import obligations
from flopmeter.compliance.parents import (
    counted_runs,
    judged_figures,
    judges_cumulative,
    parent_notes,
    parents_withheld_reason,
)
from flopmeter.compliance.thresholds import SYSTEMIC_RISK_FLOPS, determine_threshold
from flopmeter.compliance.verdict import UNCERTAINTY_MARGIN, cross_check_flops, judge
from flopmeter.counting.counters import CountSnapshot
from flopmeter.flops.estimates import estimate_notes, measured_ratio, primary_reason
from flopmeter.flops.phases import TRAINING, PhaseFigure, counted_phases_flops
from flopmeter.hardware.tracker import HardwareTracker
from flopmeter.report import FlopReport
from flopmeter.report.context import HardwareSection, LineageSection, ResumedRun
from flopmeter.report.sections import ComputeSection, ThresholdSection, VerdictSection
from flopmeter.run.facts import RunFacts
from flopmeter.run.measure import Measurement, partial_counts_reason
from flopmeter.run.report_sections import (
    budget_section,
    model_section,
    phase_sections,
    run_section,
    shown_estimates,
    token_section,
)
from flopmeter.safe_text import redact
from flopmeter.types import Estimate, EstimateName

__all__ = ["budget_notes", "build_report", "hardware_notes", "make_report"]

logger = logging.getLogger("flopmeter")


def hardware_notes(snapshot: CountSnapshot, prior_seconds: float) -> tuple[str, ...]:
    """Notes that go with the hardware figures, when there are any."""
    notes: list[str] = []
    if snapshot.untracked_forwards:
        notes.append(
            f"{snapshot.untracked_forwards} forward passes in evaluation mode or without "
            "gradients ran inside the metered window: their time and energy are in the "
            "hardware figures (not in the token counts)."
        )
    if prior_seconds:
        notes.append("The hardware figures cover this session only, not the resumed part.")
    return tuple(notes)


def _original_systemic_risk(facts: RunFacts) -> bool:
    """Whether the original model is a GPAI model with systemic risk: said so, or its known
    compute is above 10^25 FLOP (Art. 51(2))."""
    known = facts.pretrain_flops
    return facts.original_systemic_risk or (known is not None and known > SYSTEMIC_RISK_FLOPS)


def _resumed(facts: RunFacts, snapshot: CountSnapshot) -> ResumedRun | None:
    """The lineage's record of the run a resumed run continues (``None`` for a fresh run)."""
    restored = snapshot.restored
    if restored is None:
        return None
    sessions = dict(restored.sessions or {})
    if not sessions and restored.run_id is not None and restored.flops is not None:
        sessions = {restored.run_id: restored.flops}  # one earlier session, all of it
    return ResumedRun(
        run_id=restored.run_id,
        sessions_flops=sessions,
        beyond_checkpoint_flops=facts.beyond_checkpoint_flops,
        earlier_report=facts.earlier_report,
    )


def _resume_notes(facts: RunFacts, resumed: ResumedRun | None) -> list[str]:
    """What the report says of the sessions its counts continue, and of a parent that is one."""
    if resumed is None:
        return []
    notes = []
    named = {p.run_id for p in facts.parent_runs if p.run_id}
    for key in resumed.sessions_flops.keys() & named:
        notes.append(
            f"Parent run {key} is also a session whose counts this run resumed: its compute "
            "up to the checkpoint is in this run's own figure, so only what it spent beyond "
            "that is added (each session once)."
        )
    beyond = resumed.beyond_checkpoint_flops
    if beyond is not None:
        kept = f"; its report is kept at {resumed.earlier_report}" if resumed.earlier_report else ""
        notes.append(
            f"The session this run resumed from (run {resumed.run_id}) spent {beyond:.3e} FLOP "
            "after the checkpoint it saved, on steps trained again here: spent all the same, "
            "it is counted in lineage.cumulative_flops and shown apart as "
            f"lineage.resumed.beyond_checkpoint_flops{kept}."
        )
    return notes


def _judgement(
    facts: RunFacts,
    flops: float | None,
    estimates: Mapping[str, Estimate],
    primary: EstimateName | None,
    resumed: ResumedRun | None = None,
    others: tuple[float, str] | None = None,
) -> tuple[ThresholdSection, VerdictSection, LineageSection]:
    """The threshold section (with the catalogue's figure), the lineage, and the verdict when
    there is a figure to judge (``flops``, this run's primary figure plus the other phases the
    policy counts, ``None`` when withheld): with parents, on the cumulative compute.
    ``others``: the counted phases' FLOP besides the training passes (in ``flops`` already, added
    to the measured cross-check here), and their names in words."""
    threshold = determine_threshold(
        facts.pretrain_flops, original_systemic_risk=facts.original_systemic_risk
    )
    threshold_section = ThresholdSection(
        original_flops=facts.pretrain_flops,
        original_flops_source=facts.pretrain_flops_source,
        catalog=facts.catalog,
        threshold_flops=threshold.value,
        kind=threshold.kind,
        source=threshold.source,
    )
    lineage: dict[str, Any] = {"parent_runs": list(facts.parent_runs), "resumed": resumed}
    counted = counted_runs(facts.parent_runs)  # each earlier run once
    if facts.parent_runs and counted is not None:
        lineage["ancestor_flops"] = counted
    measured = cross_check_flops(estimates, primary)
    if measured is not None and others is not None:
        measured += others[0]
    beyond = resumed.beyond_checkpoint_flops if resumed is not None else None
    flops, measured = judged_figures(
        flops,
        measured,
        facts.parent_runs,
        sessions=resumed.sessions_flops if resumed is not None else None,
        resumed_from=resumed.run_id if resumed is not None else None,
        beyond=beyond,
    )
    if flops is None:
        return threshold_section, VerdictSection(), LineageSection(**lineage)
    what = "the primary estimate"
    if others is not None:
        what = (
            f"the run's compute under the {facts.phase_policy!r} phase policy (the training "
            f"passes by the {primary} estimate{others[1]})"
        )
    if judges_cumulative(facts.parent_runs, beyond):
        what = "the cumulative compute of this run and its parent runs"
        if not facts.parent_runs:
            what = "the cumulative compute of this run and of its earlier session's lost steps"
        lineage["cumulative_flops"] = flops
    judged = judge(flops, threshold.value, measured_flops=measured, what=what)
    verdict = VerdictSection(
        outcome=judged.verdict,
        exceeds_threshold=judged.exceeds,
        ratio_to_threshold=judged.ratio,
        basis=judged.basis,
        uncertainty_margin=UNCERTAINTY_MARGIN,
        obligations=(
            obligations(systemic_risk=_original_systemic_risk(facts)) if judged.exceeds else []
        ),
    )
    return threshold_section, verdict, LineageSection(**lineage)


def _compliance_notes(facts: RunFacts, threshold_flops: float) -> list[str]:
    """The notes on the original compute's source and on the parent runs."""
    notes = list(facts.threshold_notes)
    base = facts.catalog.base_model if facts.catalog else None
    notes.extend(parent_notes(facts.parent_runs, threshold_flops, base))
    return notes


def budget_notes(facts: RunFacts, flops: float | None) -> list[str]:
    """The report's note when the run's compute (``flops``, FLOP, this run's primary figure)
    is past its budget, whatever the guard said: how far past it, as a ratio."""
    budget = facts.budget_flops
    if budget is None or flops is None or flops <= budget:
        return []
    return [
        f"Compute budget: the run's compute, {flops:.3e} FLOP, is {flops / budget:.2f} x the "
        f"budget of {budget:.3e} FLOP ({facts.budget_source}): the budget was crossed."
    ]


def _others(phases: tuple[PhaseFigure, ...]) -> tuple[tuple[float, str] | None, str | None]:
    """The counted phases besides the training passes: their FLOP and names in words (``None``
    when there are none), or why their sum is not known."""
    total, why = counted_phases_flops(phases)
    if why is not None:
        return None, why
    names = [f.name for f in phases if f.counted and f.name != TRAINING]
    if not names:
        return None, None
    return (total, ", plus " + ", ".join(names)), None


def _report_notes(
    facts: RunFacts,
    measurement: Measurement,
    flops: float | None,
    no_verdict: str | None,
    resumed: ResumedRun | None,
    threshold_flops: float,
) -> list[str]:
    """Every note of the report, in its order, redacted once: why the figure (or only the
    verdict: ``no_verdict``) is withheld; the problems in the meter's hooks; the run's own notes
    (``RunFacts.notes``: the user's and the adapters', the budget's, the archive's); what the
    counts say (one rank's, a census at report time, restored counts); the estimates'; a
    budget crossed by ``flops`` (FLOP, the primary figure shown); the resumed sessions'; the
    original compute's source and the parent runs'."""
    m, snapshot = measurement, measurement.snapshot
    notes: list[str] = []
    if m.withheld is not None and not snapshot.partial:
        notes.append(f"No compute figure and no verdict: {m.withheld}")
    elif no_verdict is not None:
        notes.append(f"No verdict: {no_verdict}")
    notes += [f"Problem in the meter's {k} hook: {v}." for k, v in facts.hook_problems.items()]
    notes += facts.notes
    if snapshot.partial and facts.status != "running":
        notes.append(
            f"Counts are this rank's only: {partial_counts_reason(facts)}. The threshold "
            "comparison is withheld; sum the ranks' reports for the run's compute."
        )
    if facts.census_at_report:
        notes.append("No training forward pass was seen; the census was taken at report time.")
    if snapshot.resumed:
        restored = snapshot.restored
        came_from = f" from run {restored.run_id}" if restored and restored.run_id else ""
        notes.append(
            f"Counts include those restored with load_state_dict (a run resumed{came_from})."
        )
    notes += estimate_notes(m.estimates, m.primary, m.observations)
    notes += budget_notes(facts, flops) + _resume_notes(facts, resumed)
    notes += _compliance_notes(facts, threshold_flops)
    return [redact(note) for note in notes]


def build_report(
    facts: RunFacts, measurement: Measurement, hardware_fields: Mapping[str, Any]
) -> FlopReport:
    """The report of a run's measurement (a pure function): the figure the measurement gives,
    none where it withholds one, and the verdict on it, with every note.

    Args:
        facts: The run's identity and lifecycle (those the measurement was made with).
        measurement: The run's compute (:func:`flopmeter.run.measure.measure`): its estimates,
            the primary one, why the figure is withheld and the other phases. Partial counts
            keep their figure (one rank's); the verdict is withheld for them all the same.
            The phases the policy counts are added to the judged figure, and a counted phase
            without a figure, or a parent run that cannot be counted, withholds the verdict
            (the figure stays).
        hardware_fields: The report's hardware section's fields
            (``HardwareTracker.report_fields``).
    """
    m = measurement
    flops = m.estimate_flops
    if m.withheld is not None and not m.snapshot.partial:
        flops = None  # the counts do not cover the run: no figure rather than a low one
    resumed = _resumed(facts, m.snapshot)
    others, phase_withheld = _others(m.phases)
    judged_in = None if m.withheld is not None or phase_withheld is not None else flops
    if judged_in is not None and others is not None:
        judged_in += others[0]
    threshold, verdict, lineage = _judgement(
        facts, judged_in, m.estimates, m.primary, resumed, others
    )
    no_verdict = None
    if m.withheld is None:
        no_verdict = phase_withheld or parents_withheld_reason(facts.parent_runs)
    withheld = m.withheld or no_verdict
    notes = _report_notes(facts, m, flops, no_verdict, resumed, threshold.threshold_flops or 0.0)
    cumulative = judges_cumulative(facts.parent_runs, facts.beyond_checkpoint_flops)
    judged = lineage.cumulative_flops if cumulative else judged_in
    return FlopReport(
        run=run_section(facts, m.snapshot),
        model=model_section(facts, m.census, m.observations),
        tokens=token_section(m.snapshot),
        compute=ComputeSection(
            primary_flops=flops,
            primary_estimate=m.primary,
            primary_reason=primary_reason(m.estimates, m.primary, m.observations),
            estimates=shown_estimates(m.estimates, flops, withheld, m.snapshot, m.unchecked),
            measured_to_transformer_ratio=measured_ratio(m.estimates),
            withheld_reason=None if withheld is None else redact(withheld),
            phase_policy=facts.phase_policy,
            phases=phase_sections(facts, flops, m.primary, withheld, m.phases),
        ),
        threshold=threshold,
        verdict=verdict.model_copy(update={"judged_flops": judged}),
        hardware=HardwareSection(**hardware_fields),
        budget=budget_section(facts),
        lineage=lineage,
        attach=facts.attach,
        notes=notes,
    )


def make_report(
    facts: RunFacts,
    measurement: Measurement,
    hardware: HardwareTracker,
    *,
    gather: bool,
    prior_seconds: float,
    seal: Callable[[FlopReport], bool] | None = None,
    facts_again: Callable[[], RunFacts] | None = None,
) -> FlopReport:
    """The report of ``measurement``: the hardware fields (``gather``: one collective under
    torch.distributed), then :func:`build_report`.

    Args:
        facts: The run's facts.
        measurement: The run's compute (:func:`flopmeter.run.measure.measure`).
        hardware: The run's hardware tracker.
        gather: Gather the hardware figures over ranks (every rank calls it then).
        prior_seconds: Training time restored from a checkpoint, seconds.
        seal: For a final report: appends it to the ledger, ``False`` when that failed; the
            report is then made again from ``facts_again()`` (which hold the archive's note),
            with no second read of the counts or the hardware.
        facts_again: The run's facts after ``seal``.
    """
    m = measurement
    if m.snapshot.partial and facts.status == "completed":
        why = partial_counts_reason(facts)
        logger.warning("flopmeter: the final report holds this rank's counts only: %s", why)
    fields = hardware.report_fields(
        seconds=m.snapshot.session_seconds,
        primary_flops=m.estimate_flops,
        gather=gather,
        extra_notes=hardware_notes(m.snapshot, prior_seconds),
    )
    report = build_report(facts, m, fields)
    if seal is not None and not seal(report) and facts_again is not None:
        report = build_report(facts_again(), m, fields)
    return report
