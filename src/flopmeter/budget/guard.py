"""The compute budget guard's pure logic: when to read the counts, and when to stop.

A run with a budget (``FlopMeter(..., budget=...)``) stops at the last optimizer step whose
total compute stays within it. This module holds the arithmetic and the decisions, and nothing
that reads a device, a clock or a process group: the meter tells the guard each training
micro-batch's shape (:meth:`BudgetGuard.add_shape`, host integers), reads the counts when
:meth:`BudgetGuard.needs_reading` says so and hands the total to :meth:`BudgetGuard.on_reading`.

The prediction: a micro-batch's padded shape (rows x columns) is known on the host without
reading any tensor, and the FLOP model's rates (:class:`StepRates`: FLOP per token, per
(query, key) pair, per micro-batch) turn it into an upper bound of its compute: padding counted
as tokens, each row one sequence of the full width. Summed per optimizer step, these bounds give
an upper bound of the run's total between readings (the last reading plus the bounds since) and
of the next step (the largest step bound seen). The counts are read (a host synchronisation) only
when that upper total is within :data:`NEAR_STEPS` predicted steps of the budget, or crosses a
warning level (50%, 80%, 95%), and the stop is decided on the exact total read plus the next
step's bound. Before the rates are known (the profile is taken on the first micro-batch), the
first optimizer step is read. A single next step larger than every step before it can still
cross the budget by its excess over the largest step seen; nothing else can.

Under torch.distributed every rank sees only its own shapes, and the decision to read must be
the same on every rank; there the bound since the last reading is not used: each reading
exchanges every rank's largest step bound, their sum predicts a step, and the next reading is
scheduled halfway to the predicted end of the budget (steps growing more than twofold between
two readings can cross it). Every input of a decision is then the same on every rank, so every
rank reads at the same steps and stops at the same step.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from flopmeter.budget.rates import StepRates
from flopmeter.budget.resolve import Budget

__all__ = ["NEAR_STEPS", "WARNING_FRACTIONS", "BudgetGuard", "BudgetReading"]

#: The fractions of the budget at which a warning is logged, once each.
WARNING_FRACTIONS = (0.5, 0.8, 0.95)
#: Within this many (predicted) steps of the budget, the counts are read at every step.
NEAR_STEPS = 3
#: "No scheduled reading": the step bounds say when to read.
_NEVER = 2**62


@dataclass(frozen=True)
class BudgetReading:
    """What one reading of the counts decided.

    Attributes:
        stop: Training should stop after this step (the next would cross the budget).
        messages: What to log, in order (warnings, the plan, the stop), each with its level
            (``"warning"``, ``"info"`` or ``"error"``).
    """

    stop: bool
    messages: tuple[tuple[str, str], ...] = ()


@dataclass
class BudgetGuard:
    """The budget guard's state over a run: bounds, readings, the prediction, the decision.

    Steps are this session's optimizer steps (``0`` at the start, ``1`` after the first step).

    Args:
        budget: The resolved budget.
    """

    budget: Budget
    #: The run continues saved counts; set by :meth:`start`.
    resumed: bool = False
    #: The bound since the last reading decides when to read (one process); ``False`` under
    #: torch.distributed, where each rank sees only its own shapes.
    local: bool = True
    #: The step and total (FLOP) of the last reading; ``None`` before one.
    last_step: int | None = None
    last_flops: float | None = None
    #: The largest per-step compute between readings, FLOP (their difference over the steps).
    step_flops: float | None = None
    #: The FLOP model's rates (given with :meth:`use_rates` when they change).
    rates: StepRates | None = None
    #: This rank's largest step bound, FLOP; and the one the prediction uses (summed over
    #: ranks at readings under torch.distributed).
    own_step_upper_flops: float | None = None
    step_upper_flops: float | None = None
    #: Upper bound of the compute since the last reading, FLOP; ``None`` when a step since had
    #: no rates to bound it.
    since_reading_flops: float | None = 0.0
    #: The step at or after which the next reading is due (whatever the bounds say).
    next_reading_step: int = 1
    #: The total (FLOP) and step at which the guard said stop; ``None`` while it has not.
    flops_at_stop: float | None = None
    stop_step: int | None = None
    unknown_reason: str | None = None
    planned_steps: int | None = None
    #: Training went on after the stop, and the meter has said so.
    overrun_logged: bool = False
    _warned: set[float] = field(default_factory=set)
    _plan_said: bool = False
    _shapes: list[int] = field(default_factory=lambda: [0, 0, 0])  # tokens, sum L^2, batches

    def start(
        self,
        *,
        resumed: bool = False,
        local: bool = True,
        restored_flops: float | None = None,
        restored_step_flops: float | None = None,
    ) -> BudgetReading:
        """Begins the run's session (before its first optimizer step).

        Args:
            resumed: The run continues saved counts.
            local: One process (see :attr:`local`).
            restored_flops: The restored counts' compute, FLOP, when the saved state holds it.
            restored_step_flops: The saved run's largest step, FLOP (its bound, or its mean).

        Returns:
            A stop, at once, when the restored compute is within one step of the budget.
        """
        self.resumed, self.local = resumed, local
        if not resumed:
            self.last_step, self.last_flops = 0, 0.0  # a fresh run starts from nothing
            return BudgetReading(False)
        if restored_flops is None:
            return BudgetReading(False)  # known from a reading only: the first step is read
        self.last_step, self.last_flops = 0, restored_flops
        self.step_flops = restored_step_flops
        self._warned.update(f for f in WARNING_FRACTIONS if restored_flops >= f * self.budget.flops)
        if self._next_step_crosses(restored_flops):
            return BudgetReading(True, (self._stop(0, restored_flops),))
        return BudgetReading(False)

    # ------------------------------------------------------------------ bounds (hot path)
    def use_rates(self, rates: StepRates | None) -> None:
        """The FLOP model's rates from now on (``None``: not known yet)."""
        self.rates = rates

    def lose_bound(self) -> None:
        """A step could not be bounded: readings go by the schedule until the next reading."""
        self.since_reading_flops = None

    def first_overrun(self) -> bool:
        """Whether this is the first step trained after the stop (to be said once)."""
        first = self.stopped and not self.overrun_logged
        self.overrun_logged = self.overrun_logged or first
        return first

    def add_shape(self, rows: int, cols: int) -> None:
        """One training micro-batch's padded shape (host integers; no tensor is read)."""
        shapes = self._shapes
        shapes[0] += rows * cols
        shapes[1] += rows * cols * cols
        shapes[2] += 1

    def close_step(self) -> None:
        """Ends an optimizer step: bounds its compute from its micro-batches' shapes."""
        tokens, sum_sq, micro = self._shapes
        self._shapes = [0, 0, 0]
        if self.rates is None:
            self.since_reading_flops = None  # a step without a bound: readings are scheduled
            return
        bound = self.rates.bound_flops(tokens, sum_sq, micro)
        self.own_step_upper_flops = max(self.own_step_upper_flops or 0.0, bound)
        if self.local:
            self.step_upper_flops = self.own_step_upper_flops
        if self.since_reading_flops is not None:
            self.since_reading_flops += bound

    # ------------------------------------------------------------------ queries
    @property
    def stopped(self) -> bool:
        """Whether the guard has said stop (training should not take another step)."""
        return self.stop_step is not None

    def needs_reading(self, step: int) -> bool:
        """Whether the counts should be read at optimizer step ``step``: when due, or when the
        upper bound of the total is within :data:`NEAR_STEPS` steps of the budget or past the
        next warning level (a few float operations, at every optimizer step)."""
        if self.stopped or self.unknown_reason is not None:
            return False
        if step >= self.next_reading_step:
            return True
        upper = self.upper_total_flops
        next_step = self.next_step_flops()
        if upper is None or next_step is None:
            return False
        budget = self.budget.flops
        if upper + NEAR_STEPS * next_step >= budget:
            return True
        level = self._next_level()
        return level is not None and upper >= level * budget

    @property
    def upper_total_flops(self) -> float | None:
        """An upper bound of the run's compute now: the last reading plus the step bounds
        since, FLOP (``None`` under torch.distributed, before a reading, or without rates)."""
        if not self.local or self.last_flops is None or self.since_reading_flops is None:
            return None
        return self.last_flops + self.since_reading_flops

    @property
    def budget_left_flops(self) -> float | None:
        """The budget less the total of the last reading, FLOP (``None`` before one, or when
        the compute is unknown). May be negative when a step crossed it."""
        if self.unknown_reason is not None or self.last_step is None or self.last_flops is None:
            return None
        if self.last_step == 0 and not self.resumed:
            return None  # nothing read yet
        return self.budget.flops - self.last_flops

    def plan(self, planned_steps: int | None) -> None:
        """Notes how many optimizer steps (of this session) the run plans; the guard says what
        they will use at the first reading that knows the per-step compute."""
        if planned_steps is not None and planned_steps > 0:
            self.planned_steps = int(planned_steps)

    def next_step_flops(self) -> float | None:
        """The next step's predicted compute, FLOP: the largest step bound seen, or the largest
        step between readings when larger (``None`` when neither is known)."""
        known = [v for v in (self.step_upper_flops, self.step_flops) if v is not None]
        return max(known) if known else None

    def _next_step_crosses(self, total_flops: float) -> bool:
        """Whether the run at ``total_flops`` (FLOP) has crossed the budget, or would with a
        next step of the predicted size."""
        next_step = self.next_step_flops()
        budget = self.budget.flops
        return total_flops > budget or (next_step is not None and total_flops + next_step > budget)

    def _next_level(self) -> float | None:
        """The lowest warning fraction not yet warned of (``None`` when all were)."""
        return next((f for f in WARNING_FRACTIONS if f not in self._warned), None)

    # ------------------------------------------------------------------ decisions
    def on_reading(
        self,
        step: int,
        total_flops: float | None,
        why_unknown: str = "",
        step_upper_flops: float | None = None,
    ) -> BudgetReading:
        """Takes one reading (the run's total compute at optimizer step ``step``) and decides.

        Args:
            step: This session's optimizer steps so far.
            total_flops: The run's compute so far, FLOP (the report's figure, summed over
                ranks), or ``None`` when the meter does not know it.
            why_unknown: Why it is unknown, for the log.
            step_upper_flops: Under torch.distributed, the ranks' largest step bounds summed,
                FLOP (the same on every rank).
        """
        if total_flops is None:
            self.unknown_reason = why_unknown or "the run's compute is not known"
            return BudgetReading(
                False,
                (
                    (
                        "error",
                        f"the compute budget cannot be enforced: {self.unknown_reason}. "
                        "Training goes on without the guard.",
                    ),
                ),
            )
        if step_upper_flops is not None:
            self.step_upper_flops = max(self.step_upper_flops or 0.0, step_upper_flops)
        self._learn_step_size(step, total_flops)
        self.since_reading_flops = 0.0
        messages = self._warnings(total_flops)
        messages.extend(self._plan_message(step, total_flops))
        if self._next_step_crosses(total_flops):
            messages.append(self._stop(step, total_flops))
            return BudgetReading(True, tuple(messages))
        self.next_reading_step = self._schedule(step, total_flops)
        return BudgetReading(False, tuple(messages))

    def _learn_step_size(self, step: int, total_flops: float) -> None:
        if self.last_step is not None and self.last_flops is not None and step > self.last_step:
            per_step = (total_flops - self.last_flops) / (step - self.last_step)
            self.step_flops = max(self.step_flops or 0.0, per_step)
        self.last_step, self.last_flops = step, total_flops

    def _stop(self, step: int, total_flops: float) -> tuple[str, str]:
        self.flops_at_stop, self.stop_step = total_flops, step
        budget = self.budget.flops
        if total_flops > budget:
            return (
                "error",
                f"the compute budget of {budget:.3e} FLOP was crossed at optimizer step {step} "
                f"({total_flops:.3e} FLOP, {total_flops - budget:.3e} over): that step was "
                "larger than any step before it by more than the room left (or it was the "
                "first step, which nothing predicts). Stopping now.",
            )
        where = "before the first step of this session" if step == 0 else f"after step {step}"
        return (
            "warning",
            f"compute budget: stopping {where} at {total_flops:.3e} FLOP "
            f"({total_flops / budget:.1%} of {budget:.3e}); the next step (up to about "
            f"{self.next_step_flops():.3e} FLOP, the largest step seen) would cross it.",
        )

    def _schedule(self, step: int, total_flops: float) -> int:
        """The step of the next scheduled reading: none while the step bounds decide (one
        process with rates); else halfway to the predicted end of the budget, at the predicted
        crossing of the next warning level, or the next step when near."""
        step_flops = self.next_step_flops()
        if self.local and self.rates is not None and self.step_upper_flops is not None:
            return _NEVER  # needs_reading's bound says when
        if step_flops is None or step_flops <= 0:
            return step + 1  # nothing known about a step's size yet
        left_steps = (self.budget.flops - total_flops) / step_flops
        if left_steps <= NEAR_STEPS + 1:
            return step + 1
        gap = max(1, math.floor(left_steps / 2))
        level = self._next_level()
        if level is not None:
            to_level = (level * self.budget.flops - total_flops) / step_flops
            gap = min(gap, max(1, math.ceil(to_level)))
        return step + gap

    def _warnings(self, total_flops: float) -> list[tuple[str, str]]:
        out = []
        for fraction in WARNING_FRACTIONS:
            if fraction not in self._warned and total_flops >= fraction * self.budget.flops:
                self._warned.add(fraction)
                out.append(
                    (
                        "warning",
                        f"compute budget: {total_flops:.3e} FLOP used, over {fraction:.0%} of "
                        f"the budget of {self.budget.flops:.3e} FLOP.",
                    )
                )
        return out

    def _plan_message(self, step: int, total_flops: float) -> list[tuple[str, str]]:
        step_flops = self.next_step_flops()
        if self._plan_said or self.planned_steps is None or step_flops is None:
            return []
        self._plan_said = True
        remaining = max(0, self.planned_steps - step)
        whole = total_flops + remaining * step_flops
        budget = self.budget.flops
        if whole <= budget:
            verdict = "fits in the budget"
            level = "info"
        else:
            last = step + max(0, math.floor((budget - total_flops) / step_flops))
            verdict = f"does not fit: the guard will stop it at about step {last}"
            level = "warning"
        return [
            (
                level,
                f"compute budget: the run plans {self.planned_steps} optimizer steps; at up to "
                f"{step_flops:.3e} FLOP per step it will use about {whole:.3e} FLOP, "
                f"{whole / budget:.0%} of the budget of {budget:.3e} FLOP: it {verdict}.",
            )
        ]
