"""The report from a snapshot of a run: a pure function of what the meter knows.

:func:`build_report` turns :class:`~flopmeter.run.facts.RunFacts` (the run's identity and
lifecycle; exported here too), a :class:`~flopmeter.counting.counters.CountSnapshot`, the parameter
census, the FLOP estimates and the hardware fields into a :class:`~flopmeter.report.FlopReport`,
with every report-level note in one place. It reads no device, clock or process group.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from flopmeter.compliance.obligations import obligations
from flopmeter.compliance.parents import (
    counted_runs,
    judged_figures,
    parent_notes,
    parents_withheld_reason,
)
from flopmeter.compliance.thresholds import SYSTEMIC_RISK_FLOPS, determine_threshold
from flopmeter.compliance.verdict import UNCERTAINTY_MARGIN, cross_check_flops, judge
from flopmeter.counting.census import Census
from flopmeter.counting.counters import CountSnapshot
from flopmeter.flops.estimates import estimate_notes, measured_ratio, primary_reason
from flopmeter.flops.phases import TRAINING, PhaseFigure, counted_phases_flops
from flopmeter.flops.recorder import FlopObservations
from flopmeter.report import FlopReport
from flopmeter.report.context import HardwareSection, LineageSection, ResumedRun
from flopmeter.report.sections import ComputeSection, ThresholdSection, VerdictSection
from flopmeter.run.facts import RunFacts
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

__all__ = [
    "budget_notes",
    "build_report",
    "hardware_notes",
    "partial_counts_reason",
    "withheld_reason",
]


def partial_counts_reason(facts: RunFacts) -> str:
    """Why a final report holds one rank's counts of a run that had several."""
    if facts.status == "failed" and facts.process_group_alive:
        return "the run failed, and a failed rank makes no collective"
    return (
        "torch.distributed was no longer initialised when the meter stopped (leave "
        "the FlopMeter block before destroy_process_group)"
    )


def withheld_reason(facts: RunFacts, snapshot: CountSnapshot) -> str | None:
    """Why the report gives no verdict (and, but for partial counts, no compute), or None."""
    unread, inconsistent = snapshot.unread, snapshot.inconsistent
    if unread:
        why = snapshot.unread_reason or "on another rank"
        return (
            f"{unread} training micro-batch(es) could not be read ({why}), so the run's compute "
            "is not known. Tell the meter where the tokens are: FlopMeter(..., "
            "token_inputs='name') or a function of the forward call's (args, kwargs)."
        )
    if inconsistent:
        what = snapshot.inconsistent_reason or (
            "document offsets (cu_seqlens) that decrease, start below 0 or run past the batch"
        )
        return (
            f"{inconsistent} training micro-batch(es) had inconsistent inputs ({what}), so "
            "their tokens cannot be trusted; fix the batches (or the collator) that produce them."
        )
    if snapshot.uncounted_steps:
        steps = snapshot.uncounted_steps
        return (
            f"Training resumed at optimizer step {steps} from a checkpoint without flopmeter "
            f"counts, so the {steps} step(s) before it are in no count and this figure would "
            "be this session's part only. Resume from a checkpoint saved while the meter ran "
            "(the FlopMeterCallback saves its counts in trainer_state.json; without a Trainer, "
            "pass the earlier meter.state_dict() to load_state_dict())."
        )
    if facts.attach is not None and facts.attach.unseen_micro_batches:
        return (
            "Training micro-batches ran before the zero-code meter attached "
            f"({facts.attach.found or 'at the first optimizer step'}); they are in no count, so "
            "this figure would be a part of the run only. Meter the run from its start: build "
            "the optimizer before training, or use FlopMeter / a framework callback in the script."
        )
    if facts.trainable_changed:
        return (
            f"The parameters that train changed after the census ({facts.trainable_changed}) "
            "and recount() was not called, so the figure, modelled on the parameters that "
            "trained then, does not cover what trains now. Call meter.recount() right after "
            "changing requires_grad."
        )
    if snapshot.totals.micro_batches == 0:
        return "No training micro-batch has been counted yet: there is nothing to judge."
    if snapshot.partial:
        return f"Counts are this rank's only: {partial_counts_reason(facts)}."
    return None


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


def _notes(
    facts: RunFacts,
    snapshot: CountSnapshot,
    estimates: dict[str, Estimate],
    primary: EstimateName | None,
    observations: FlopObservations,
) -> list[str]:
    notes = [f"Problem in the meter's {k} hook: {v}." for k, v in facts.hook_problems.items()]
    notes.extend(facts.notes)
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
    notes.extend(estimate_notes(estimates, primary, observations))
    return notes


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
    if facts.parent_runs or beyond is not None:
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


def build_report(
    facts: RunFacts,
    snapshot: CountSnapshot,
    census: Census,
    estimates: dict[str, Estimate],
    primary: EstimateName | None,
    observations: FlopObservations,
    hardware_fields: Mapping[str, Any],
    *,
    withheld: str | None = None,
    unchecked: bool = False,
    phases: tuple[PhaseFigure, ...] = (),
) -> FlopReport:
    """The report of a run (a pure function).

    Args:
        facts: The run's identity and lifecycle.
        snapshot: Its counts.
        census: Its parameter census.
        estimates: Every estimate, by name (``flops.estimates.compute_estimates``).
        primary: The estimate that is ``compute.primary_flops``; ``None`` when none is checked
            by a dispatch-level count of the run (``flops.estimates.choose_primary``).
        observations: What the FLOP model saw (for ``n_active`` and the notes).
        hardware_fields: The report's hardware section's fields
            (``HardwareTracker.report_fields``).
        withheld: Why the figure is withheld besides what the counts say
            (``Measurement.withheld``: a resumed session that cannot go on measuring, or no
            estimate checked by a dispatch-level count).
        unchecked: ``withheld`` is the FLOP model's (``Measurement.unchecked``): the counts
            cover the run, so the estimates keep their figures.
        phases: The run's phases besides its training passes (``Measurement.phases``); those
            the phase policy counts are added to the judged figure, and a counted phase without
            a figure withholds the verdict (the training figure stays).
    """
    counts_withheld = withheld_reason(facts, snapshot)
    unchecked = unchecked and counts_withheld is None
    withheld = counts_withheld or withheld
    flops = None if primary is None else estimates[primary].flops
    if withheld is not None and not snapshot.partial:
        flops = None  # the counts do not cover the run: no figure rather than a low one
    notes = _notes(facts, snapshot, estimates, primary, observations)
    if withheld is not None and not snapshot.partial:
        notes.insert(0, f"No compute figure and no verdict: {withheld}")
    resumed = _resumed(facts, snapshot)
    others, phase_withheld = _others(phases)
    judged_in = None if withheld is not None or phase_withheld is not None else flops
    if judged_in is not None and others is not None:
        judged_in += others[0]
    threshold, verdict, lineage = _judgement(facts, judged_in, estimates, primary, resumed, others)
    for reason in (phase_withheld, parents_withheld_reason(facts.parent_runs)):
        if withheld is None and reason is not None:  # the figure stays; the verdict goes
            withheld = reason
            notes.insert(0, f"No verdict: {reason}")
    notes += budget_notes(facts, flops) + _resume_notes(facts, resumed)
    notes += _compliance_notes(facts, threshold.threshold_flops or 0.0)
    cumulative = facts.parent_runs or facts.beyond_checkpoint_flops is not None
    judged = lineage.cumulative_flops if cumulative else judged_in
    shown = shown_estimates(estimates, flops, withheld, snapshot, unchecked)
    notes = [redact(note) for note in notes]  # one redaction, for every note
    return FlopReport(
        run=run_section(facts, snapshot),
        model=model_section(facts, census, observations),
        tokens=token_section(snapshot),
        compute=ComputeSection(
            primary_flops=flops,
            primary_estimate=primary,
            primary_reason=primary_reason(estimates, primary, observations),
            estimates=shown,
            measured_to_transformer_ratio=measured_ratio(estimates),
            withheld_reason=None if withheld is None else redact(withheld),
            phase_policy=facts.phase_policy,
            phases=phase_sections(facts, flops, primary, withheld, phases),
        ),
        threshold=threshold,
        verdict=verdict.model_copy(update={"judged_flops": judged}),
        hardware=HardwareSection(**hardware_fields),
        budget=budget_section(facts),
        lineage=lineage,
        attach=facts.attach,
        notes=notes,
    )
