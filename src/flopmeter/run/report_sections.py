"""The report's sections that are read off a run's facts and counts, one builder each (pure):
its run, model and token sections, its budget and phases, and its estimates as shown
(:func:`flopmeter.run.reporting.build_report` judges the figures and writes the notes)."""

from __future__ import annotations

from flopmeter.counting.census import Census
from flopmeter.counting.counters import META_REASON, CountSnapshot
from flopmeter.flops.estimates import n_active
from flopmeter.flops.phases import TRAINING, PhaseFigure
from flopmeter.flops.recorder import FlopObservations
from flopmeter.report.context import BudgetSection
from flopmeter.report.sections import (
    ModelSection,
    PhaseSection,
    RunSection,
    TokenSection,
    run_modality,
    tokens_meaning,
)
from flopmeter.run.facts import RunFacts
from flopmeter.safe_text import redact
from flopmeter.types import Estimate, EstimateName

__all__ = [
    "budget_section",
    "model_section",
    "phase_sections",
    "run_section",
    "shown_estimates",
    "token_section",
]


def budget_section(facts: RunFacts) -> BudgetSection | None:
    """The budget guard's section of the report (see :mod:`flopmeter.budget`); ``None``
    without a budget."""
    if facts.budget_flops is None:
        return None
    return BudgetSection(
        budget_flops=facts.budget_flops,
        source=facts.budget_source,
        flops_at_stop=facts.flops_at_stop,
        stopped_by_budget=facts.stopped_by_budget,
    )


def phase_sections(
    facts: RunFacts,
    flops: float | None,
    primary: EstimateName | None,
    withheld: str | None,
    phases: tuple[PhaseFigure, ...],
) -> list[PhaseSection]:
    """The report's phases: the training passes (the primary figure), then the others."""
    training = PhaseSection(
        name=TRAINING,
        flops=flops,
        counted=True,
        method=f"the {primary} estimate (compute.primary_estimate)" if primary else "none",
        modules=[f"{facts.model_name} (the trained model)"],
        reason=None if flops is not None else withheld,
    )
    return [
        training,
        *(
            PhaseSection(
                name=f.name,
                flops=f.flops,
                counted=f.counted,
                method=f.method,
                calls=f.calls,
                samples=f.samples,
                modules=list(f.modules),
                notes=list(f.notes),
                reason=f.reason,
            )
            for f in phases
        ),
    ]


def run_section(facts: RunFacts, snapshot: CountSnapshot) -> RunSection:
    """The report's run section: the run's identity and life (its error redacted)."""
    return RunSection(
        run_id=facts.run_id,
        status=facts.status,
        error=None if facts.error is None else redact(facts.error),
        started_at=facts.started_at,
        ended_at=facts.ended_at,
        updated_at=facts.updated_at,
        pid=facts.pid,
        hostname=facts.hostname,
        training_duration_seconds=snapshot.seconds,
        epochs=facts.epochs,
        world_size=facts.world_size,
        counts_scope=snapshot.scope,
        torch_version=facts.torch_version,
        flopmeter_version=facts.flopmeter_version,
    )


def model_section(facts: RunFacts, census: Census, observations: FlopObservations) -> ModelSection:
    """The report's model section: its name and parameter census."""
    return ModelSection(
        name=facts.model_name,
        n_total=census.n_total,
        n_trainable=census.n_trainable,
        n_frozen=census.n_frozen,
        n_embedding=census.n_embedding,
        n_active=n_active(census, observations.profile),
    )


def token_section(snapshot: CountSnapshot) -> TokenSection:
    """The report's token section: the counts, and what its tokens are."""
    modality = run_modality(snapshot.modality_micro_batches)
    return TokenSection(
        **snapshot.totals.model_dump(),
        modality=modality,
        tokens_meaning=tokens_meaning(
            modality, snapshot.totals.input_shapes, snapshot.modality_micro_batches
        ),
        micro_batches_unread=snapshot.unread,
        micro_batches_inconsistent=snapshot.inconsistent,
        optimizer_steps=snapshot.optimizer_steps,
    )


def shown_estimates(
    estimates: dict[str, Estimate],
    flops: float | None,
    withheld: str | None,
    snapshot: CountSnapshot,
    unchecked: bool,
) -> dict[str, Estimate]:
    """The estimates as the report shows them: each null (never 0 FLOP) when the counts do not
    cover the run; kept when the FLOP model alone is unchecked, and for meta tensors' shapes
    (counted for planning)."""
    planning = snapshot.unread_reason == META_REASON and not snapshot.inconsistent
    covered = snapshot.partial or planning or unchecked
    if flops is None and withheld is not None and not covered:
        return {k: e.model_copy(update={"flops": None}) for k, e in estimates.items()}
    return estimates
