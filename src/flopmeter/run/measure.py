"""The run's compute now: one chain from the counts to the figure the report judges.

:func:`measure` turns a snapshot of the counts, the parameter census and the FLOP model's
observations into a :class:`Measurement`: every estimate, the primary one, and whether the report
withholds the figure, and why (:func:`withheld_reason`: what the counts cannot cover; else a
resumed session's or the FLOP model's reason). The report, the budget guard's readings and the
saved state all take the run's compute from it, so the three cannot disagree.
:func:`compose_notes` puts the notes each part of a run reports (the user's and the adapters',
the budget's, the archive's) in their order for ``RunFacts.notes``. All are pure functions.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from flopmeter import distributed
from flopmeter.counting.census import Census
from flopmeter.counting.counters import CountSnapshot
from flopmeter.errors import BudgetExceeded
from flopmeter.flops.estimates import choose_primary, compute_estimates
from flopmeter.flops.phases import PhaseFigure, phase_figures
from flopmeter.flops.recorder import FlopObservations
from flopmeter.run.facts import RunFacts
from flopmeter.types import Estimate, EstimateName, Status

__all__ = [
    "Measurement",
    "compose_notes",
    "continue_restored",
    "measure",
    "partial_counts_reason",
    "saved_compute",
    "status_of",
    "withheld_reason",
]


@dataclass(frozen=True)
class Measurement:
    """The run's compute at one moment, computed once.

    Attributes:
        census: The parameter census it was computed with.
        snapshot: The counts.
        estimates: Every estimate, by name (``flops.estimates.compute_estimates``).
        primary: The estimate the report gives as the run's compute; ``None`` when no
            estimate is checked by a dispatch-level count of the run (``flops.estimates.choose_primary``).
        observations: What the FLOP model had seen.
        withheld: Why the report gives no verdict (and, but for partial counts, no compute
            figure); ``None`` when it judges the figure.
        unchecked: Whether ``withheld`` is the FLOP model's (no estimate is checked by a
            dispatch-level count): the counts cover the run, and the estimates keep their
            figures in the report.
        phases: The run's phases besides its training passes (generation, scoring, other
            models, declared, evaluation), with their figures and whether the policy counts
            them.
    """

    census: Census
    snapshot: CountSnapshot
    estimates: dict[str, Estimate]
    primary: EstimateName | None
    observations: FlopObservations
    withheld: str | None
    unchecked: bool = False
    phases: tuple[PhaseFigure, ...] = ()

    @property
    def other_phases_flops(self) -> float:
        """The known figures of the phases besides the training passes that the phase policy
        counts, FLOP (what the budget adds to the training passes)."""
        return sum(f.flops for f in self.phases if f.counted and f.flops is not None)

    @property
    def estimate_flops(self) -> float | None:
        """The primary estimate's figure, FLOP, withheld or not (``None``: no primary)."""
        return None if self.primary is None else self.estimates[self.primary].flops

    @property
    def flops(self) -> float | None:
        """The run's compute, FLOP, when the report judges it; ``None`` when it withholds it
        (what the budget guard decides on, and what a checkpoint saves)."""
        return self.estimate_flops if self.withheld is None else None

    @property
    def guard_flops(self) -> float | None:
        """The figure the compute budget enforces, FLOP: :attr:`flops` when the report judges
        one; when the only reason it does not is that no dispatch-level count checked the FLOP
        model (:attr:`unchecked`: sampling off, a compiled model), the larger of the
        ``transformer`` and ``measured`` figures there are (a guard stops early rather than
        late); never the seed or 6ND formula; ``None`` otherwise."""
        if self.withheld is None:
            flops = self.estimate_flops
            return None if flops is None else flops + self.other_phases_flops
        if not self.unchecked or self.snapshot.partial:
            return None
        known = [
            e.flops
            for name in ("transformer", "measured")
            if (e := self.estimates.get(name)) is not None and e.flops is not None
        ]
        return max(known) + self.other_phases_flops if known else None


def partial_counts_reason(facts: RunFacts) -> str:
    """Why a final report holds one rank's counts of a run that had several."""
    if facts.status == "failed" and facts.process_group_alive:
        return "the run failed, and a failed rank makes no collective"
    return (
        "torch.distributed was no longer initialised when the meter stopped (leave "
        "the FlopMeter block before destroy_process_group)"
    )


def _counts_reason(snapshot: CountSnapshot) -> str | None:
    """Why the counts themselves cannot be trusted (unread or inconsistent micro-batches)."""
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
    return None


def _split_reason(split: str) -> str:
    """Why a run whose model is split over ranks that share micro-batches is not judged
    (``split``: ``RunFacts.model_parallel``)."""
    if split.startswith(distributed.SPLIT_UNREAD):
        return (
            f"How the model is split over ranks is not known ({split}): ranks "
            "that share micro-batches (tensor parallel) would be counted once each, so the "
            "run's tokens and compute are not known."
        )
    return (
        f"The model is split over ranks that share each micro-batch ({split}: "
        "tensor parallel). Its tokens are counted once per data-parallel replica, but the "
        "dispatch count that checks the FLOP model sees, on each such rank, some operators "
        "whole (on DTensors) and others as the rank's part (on its local shards), so the "
        "run's compute is not known."
    )


def withheld_reason(facts: RunFacts, snapshot: CountSnapshot) -> str | None:
    """Why the report gives no verdict (and, but for partial counts, no compute), or None."""
    why = _counts_reason(snapshot)
    if why is not None:
        return why
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
    if facts.uncounted:
        return (
            f"Compute of this run is known to be in no count ({'; '.join(facts.uncounted)}), so "
            "this figure would be a part of the run only. Meter every model that trains: one "
            "FlopMeter per model, or FlopMeter.declare_phase for compute the meter cannot see."
        )
    if facts.model_parallel:
        return _split_reason(facts.model_parallel)
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


def measure(
    census: Census, snapshot: CountSnapshot, observations: FlopObservations, facts: RunFacts
) -> Measurement:
    """The run's compute now (a pure function).

    Args:
        census: The parameter census.
        snapshot: The counts (``RunCounters.snapshot``).
        observations: The FLOP model's observations (``FlopModelRecorder.observations``).
        facts: The run's facts (its status decides how partial counts are explained).
    """
    estimates, primary = compute_estimates(census, snapshot.totals, observations)
    why = withheld_reason(facts, snapshot)
    if why is None and snapshot.restored is not None:
        estimates, primary, why = continue_restored(estimates, primary, observations, snapshot)
    unchecked = why is None and primary is None
    if unchecked:
        why = choose_primary(estimates, observations).withheld
    phases = tuple(phase_figures(observations.phases, facts.declared_phases, facts.phase_policy))
    return Measurement(census, snapshot, estimates, primary, observations, why, unchecked, phases)


#: The formulas: never the primary figure, nor continued from a checkpoint that saved one.

_FORMULAS = ("seed", "six_nd")


def continue_restored(
    estimates: dict[str, Estimate],
    primary: EstimateName | None,
    observations: FlopObservations,
    snapshot: CountSnapshot,
) -> tuple[dict[str, Estimate], EstimateName | None, str | None]:
    """A resumed run's compute goes on as the earlier session measured it (a pure function).

    A session whose own estimates give a checked primary figure measures the whole run
    (restored counts included) with it. One without (it trained no micro-batch, which is what a
    resume after a budget stop does, or its profile failed) has no figure of its own for counts
    the earlier session measured: when it trained nothing, the run's compute is the figure the
    checkpoint saved, under the estimate that gave it (never a formula's); when it trained
    without a profile while the checkpoint saved a figure, or the checkpoint saved none and it
    trained nothing, the figure is withheld with the reason. Otherwise ``primary`` stays None
    and :func:`measure` withholds with the FLOP model's reason.

    Returns:
        ``(estimates, primary, withheld)``: ``withheld`` ``None`` when nothing here withholds.
    """
    restored = snapshot.restored
    if restored is None or primary is not None:
        return estimates, primary, None
    trained = snapshot.session_micro_batches
    if restored.estimate in _FORMULAS and restored.flops is not None:
        return estimates, primary, None  # a formula's figure is never continued
    if restored.flops is None or restored.estimate is None:
        if trained:
            return estimates, primary, None  # as a fresh run of this model would be
        return (
            estimates,
            primary,
            (
                "The run was resumed from a checkpoint that holds no compute figure of the earlier "
                "session (saved by an older flopmeter, or withheld there), and this session trained "
                "no micro-batch to profile the model, so the only figure would be the seed formula "
                "for counts it never saw. Resume from a checkpoint saved by this flopmeter version, "
                "or judge the earlier session's own report."
            ),
        )
    how = f"the {restored.estimate} estimate"
    if trained and observations.profile is not None:
        return estimates, primary, None  # profiled, but unchecked: the FLOP model's reason
    if trained:
        return (
            estimates,
            primary,
            (
                f"The earlier session measured the restored counts with {how} "
                f"({restored.flops:.3e} FLOP), and this session has no model profile of its own "
                f"({observations.profile_reason or 'none was taken'}), so it could only switch to "
                "a formula for the whole run, which is never judged. Call meter.recount() after "
                "the model is "
                "ready, or make its first training forward pass complete."
            ),
        )
    name: EstimateName = restored.estimate  # type: ignore[assignment]
    since = f" (run {restored.run_id})" if restored.run_id else ""
    kept = Estimate(
        flops=restored.flops,
        method=name,
        formula="primary_flops_saved of the checkpoint resumed from",
        inputs={
            "primary_flops_saved": restored.flops,
            "tokens_processed": restored.tokens_processed,
            "micro_batches": restored.micro_batches,
        },
        notes=[
            f"This session trained no micro-batch: the run's compute is the figure the earlier "
            f"session{since} saved with its counts, measured with {how}, not a formula of "
            "this session."
        ],
    )
    return {**estimates, name: kept}, name, None


def compose_notes(
    added: Iterable[str], budget: Iterable[str] = (), archive: Iterable[str] = ()
) -> tuple[str, ...]:
    """The run's own notes for ``RunFacts.notes``, in order: those added with
    ``FlopMeter.add_note`` (the user, the adapters), then the budget's, then the archive's (a
    ledger record that could not be appended). The report builder puts them after the hook
    problems and before the notes it derives from the counts."""
    return (*added, *budget, *archive)


def saved_compute(measurement: Measurement, run_id: str) -> dict[str, Any]:
    """What a checkpoint saves of the run's compute (``FlopMeter.state_dict``), for the run
    that resumes from it: this run's id, its primary figure and the estimate that gave it
    (``None`` when withheld), and each session's part of that figure, FLOP (the restored
    sessions', then this one's: the figure less theirs); ``None`` where it is not known."""
    m = measurement
    flops = m.flops
    restored = m.snapshot.restored
    sessions: dict[str, float] | None = {}
    if restored is not None:
        if restored.sessions is not None:
            sessions = dict(restored.sessions)
        elif restored.run_id is not None and restored.flops is not None:
            sessions = {restored.run_id: restored.flops}
        else:
            sessions = None  # an older state: whose compute it held is not known
    if flops is not None and sessions is not None:
        sessions[run_id] = max(flops - sum(sessions.values(), 0.0), 0.0)
    return {
        "run_id": run_id,
        "primary_flops_saved": flops,
        "primary_estimate_saved": m.primary if flops is not None else None,
        "sessions_flops_saved": sessions if flops is not None else None,
    }


def status_of(exc: BaseException | None) -> Status:
    """How a run ended: a clean ``SystemExit`` (code 0 or None), or a stop by the budget
    guard at a step boundary, is a completed run."""
    if exc is None or (isinstance(exc, SystemExit) and exc.code in (0, None)):
        return "completed"
    if isinstance(exc, BudgetExceeded):
        return "completed"
    return "interrupted" if isinstance(exc, KeyboardInterrupt) else "failed"
