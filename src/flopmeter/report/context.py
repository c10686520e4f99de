"""The report's sections about a run's surroundings (schema 2.0): the hardware figures, the
budget, the lineage (parents and the resumed session) and how zero-code metering attached.
Names carry their units (``_seconds``, ``_joules``, ``_watts``, ``_flops_per_second``)."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field

from flopmeter.types import ParentRun

__all__ = [
    "AttachMethod",
    "AttachSection",
    "BudgetSection",
    "HardwareSection",
    "LineageSection",
    "ResumedRun",
]


class HardwareSection(BaseModel):
    """The GPUs' figures: an upper bound of the compute, and the energy."""

    gpu_name: str | None = None
    gpu_count: int | None = None
    peak_flops_per_second: float | None = Field(None, description="Dense peak per GPU, FLOP/s.")
    bound_flops: float | None = Field(
        None, description="Upper bound: sum over GPUs of seconds x peak FLOP/s (utilisation 1)."
    )
    utilization_weighted_bound_flops: float | None = Field(
        None,
        description="Also an upper bound: bound_flops with each GPU weighted by its mean "
        "NVML utilisation (share of time a kernel ran, not FLOP efficiency).",
    )
    mfu: float | None = Field(None, description="compute.primary_flops / bound_flops.")
    energy_joules: float | None = Field(None, description="GPU energy, J, summed over GPUs.")
    energy_kwh: float | None = Field(None, description="energy_joules in kWh.")
    average_power_watts: float | None = Field(
        None, description="energy_joules over the monitored time, W, all GPUs together."
    )
    notes: list[str] = Field(
        default_factory=list, description="How the hardware figures were obtained; why any is null."
    )


class BudgetSection(BaseModel):
    """The compute budget the run was given (``FlopMeter(budget=...)``)."""

    budget_flops: float = Field(
        description="The compute budget, FLOP. The verdict is computed as always, whatever the "
        "budget."
    )
    source: str | None = Field(
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


class ResumedRun(BaseModel):
    """The run a resumed run's counts continue (``load_state_dict``), as its checkpoint said."""

    run_id: str | None = Field(
        None,
        description="The run (session) whose checkpoint this run resumed from; null when the "
        "checkpoint did not say (saved by an older flopmeter).",
    )
    sessions_flops: dict[str, float] = Field(
        default_factory=dict,
        description="The earlier sessions whose compute this run's counts (and "
        "compute.primary_flops) include, each once: run id -> the compute it added up to the "
        "checkpoint, FLOP. Empty when the checkpoint did not say. Whoever sums runs counts "
        "these inside this run, never again beside it.",
    )
    beyond_checkpoint_flops: float | None = Field(
        None,
        description="The compute that session spent after the checkpoint (its own report's "
        "figure less the checkpoint's), FLOP: steps this run trained again. Spent all the "
        "same, so lineage.cumulative_flops counts it (the cautious reading); null when that "
        "report was not found or has no figure.",
    )
    earlier_report: str | None = Field(
        None,
        description="Where that session's report was kept, moved aside from this run's output "
        "path (null when none was there).",
    )


class LineageSection(BaseModel):
    """The earlier runs this run continues, and the compute of the whole line."""

    parent_runs: list[ParentRun] = Field(
        default_factory=list, description="Earlier runs this run continues."
    )
    cumulative_flops: float | None = Field(
        None,
        description="compute.primary_flops plus the parents' compute, FLOP: what the verdict "
        "judges when parent_runs is not empty. Each earlier run counts once (ancestor_flops), "
        "however many parents lead to it.",
    )
    ancestor_flops: dict[str, float] = Field(
        default_factory=dict,
        description="Every earlier run counted in cumulative_flops, each once: run id -> that "
        "run's own compute, FLOP (the parents and their ancestors). Empty without parent runs.",
    )
    resumed: ResumedRun | None = Field(
        None, description="The run this run resumed from (load_state_dict); null for a fresh run."
    )


#: How a zero-code run found what it meters (see :class:`AttachSection`).
AttachMethod = Literal["hf_trainer", "lightning_trainer", "optimizer"]


class AttachSection(BaseModel):
    """How a zero-code run (``flopmeter run -- CMD`` or ``FLOPMETER_AUTO=1``) found what it
    meters, or why it could not; absent (null) when the script made its meter itself."""

    method: AttachMethod | None = Field(
        None,
        description="hf_trainer: a FlopMeterCallback added to a Hugging Face Trainer (or a "
        "subclass: TRL, axolotl, LLaMA-Factory) when it was built; lightning_trainer: the "
        "Lightning callback added to a Lightning Trainer; optimizer: a raw loop's model, found "
        "as the module whose parameters the first optimizer steps; null: not attached (see "
        "reason).",
    )
    launcher: Literal["flopmeter run", "environment"] | None = Field(
        None, description="What switched zero-code metering on: the command or FLOPMETER_AUTO."
    )
    job_id: str | None = Field(None, description="The job's id, shared by all its processes.")
    trainer_class: str | None = Field(
        None, description="The trainer's class (module.name) the meter attached to."
    )
    model_class: str | None = Field(None, description="The metered module's class (module.name).")
    found: str | None = Field(None, description="What was found and how, in one sentence.")
    unseen_micro_batches: bool | None = Field(
        None,
        description="true: training micro-batches ran before the meter attached and are in no "
        "count (the compute and verdict are then withheld); false: none did; null: not known.",
    )
    reason: str | None = Field(
        None, description="Why the meter did not attach (method null), or stood down."
    )
