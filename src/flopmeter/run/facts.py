"""What a report says about a run besides its counts: :class:`RunFacts`, one frozen value.

The meter fills it from its options, lifecycle and the parts it made (parents, budget, the
resumed session); :func:`flopmeter.run.reporting.build_report` reads it (and re-exports it). It
holds plain values only: no device, clock or process group.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from flopmeter.flops.phases import DEFAULT_PHASE_POLICY, DeclaredPhase
from flopmeter.report.context import AttachSection
from flopmeter.types import CatalogFigure, ParentRun, Status

__all__ = ["RunFacts"]


@dataclass(frozen=True)
class RunFacts:
    """What a report says about the run besides its counts.

    Attributes:
        run_id: This run's id.
        model_name: Name for the report.
        status: ``running``, or how training ended.
        error: ``"Type: message"`` of the exception that ended training.
        started_at: ISO 8601 (UTC).
        ended_at: ISO 8601 (UTC); ``None`` while running.
        epochs: Epochs, when an adapter knows them.
        pretrain_flops: The original model's training compute, FLOP.
        pretrain_flops_source: Where ``pretrain_flops`` came from.
        original_systemic_risk: Whether the original model has systemic risk.
        world_size: Processes in the run.
        census_at_report: The census was taken at report time (no training forward was seen).
        process_group_alive: torch.distributed was initialised when the report was made.
        hook_problems: Problems in the meter's own hooks, by hook.
        notes: Notes added by adapters or the user.
        torch_version: ``torch.__version__``.
        flopmeter_version: ``flopmeter.__version__``.
        updated_at: When the report is made, ISO 8601 (UTC).
        pid: The writing process's id.
        hostname: The writing host.
        catalog: The bundled catalogue's figure for the model, when it knows it (used or not).
        threshold_notes: What the report says about the original compute's source.
        parent_runs: The parent runs this run continues, as read when the meter was made.
        budget_flops: The compute budget, FLOP (``None``: no budget).
        budget_source: Where the budget came from (see ``BudgetSection.source``).
        flops_at_stop: The compute when the budget guard stopped training, FLOP.
        stopped_by_budget: Whether the budget guard stopped training.
        trainable_changed: How the parameters that train changed since the census the model
            profile was taken with, when they did and ``recount()`` was not called.
        beyond_checkpoint_flops: The compute the session this run resumed from spent after
            the checkpoint it saved (steps this run trains again), FLOP, from that session's own
            report; ``None`` when there is none.
        earlier_report: Where that session's report was kept (moved aside from ``output``).
        attach: How a zero-code run attached the meter (``None``: the script made it).
        phase_policy: Which phases enter the judged figure (``MeterOptions.phases``).
        declared_phases: Compute the meter could not see, declared with its source.
        uncounted: Compute of the run known to be in no count (why, one sentence each): the
            figure and the verdict are withheld.
        model_parallel: The tensor-parallel mesh dimensions the model is split over, in words
            (``distributed.ModelParallel.text``); the figure and the verdict are withheld.
    """

    run_id: str
    model_name: str
    status: Status
    error: str | None
    started_at: str | None
    ended_at: str | None
    epochs: float | None
    pretrain_flops: float | None
    pretrain_flops_source: str | None
    original_systemic_risk: bool
    world_size: int
    census_at_report: bool
    process_group_alive: bool
    hook_problems: Mapping[str, str]
    notes: tuple[str, ...]
    torch_version: str
    flopmeter_version: str
    updated_at: str | None = None
    pid: int | None = None
    hostname: str | None = None
    catalog: CatalogFigure | None = None
    threshold_notes: tuple[str, ...] = ()
    parent_runs: tuple[ParentRun, ...] = ()
    budget_flops: float | None = None
    budget_source: str | None = None
    flops_at_stop: float | None = None
    stopped_by_budget: bool = False
    trainable_changed: str | None = None
    beyond_checkpoint_flops: float | None = None
    earlier_report: str | None = None
    attach: AttachSection | None = None
    phase_policy: str = DEFAULT_PHASE_POLICY
    declared_phases: tuple[DeclaredPhase, ...] = ()
    uncounted: tuple[str, ...] = ()
    model_parallel: str | None = None
