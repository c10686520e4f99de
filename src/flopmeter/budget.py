"""The compute budget guard: when to read the counts, and when to stop (pure logic).

A run with a budget (``FlopMeter(..., budget=...)``) stops at the last optimizer step whose
total compute stays within it. This module holds the arithmetic and the decisions, and nothing
that reads a device, a clock or a process group: the meter reads the counts when
:meth:`BudgetGuard.needs_reading` says so and hands the total to :meth:`BudgetGuard.on_reading`.

The prediction: the next step's compute is taken to be the largest per-step compute seen so far
(the differences between readings, divided by the steps between them). Readings are made at
optimizer steps only, and rarely: the first step of a fresh run (the guard knows nothing
before it; a resumed run reads at its first two steps), then halfway to the step at which the
budget is predicted to run out (so that steps growing up to twice the size seen so far are
still caught in time), at the steps where a warning level (50%, 80%, 95%) is predicted to be
crossed, and at every step once the budget is within :data:`NEAR_STEPS` steps. A run far from
its budget therefore makes a handful of readings in all (about log2 of its steps), none per
micro-batch.

Every input of a decision (the summed counts of a reading, the step numbers) is the same on
every rank, so every rank reads at the same steps and stops at the same step.
"""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass, field
from typing import Literal

from flopmeter.errors import BudgetExceeded, ConfigurationError

__all__ = [
    "BUDGET_ACTIONS",
    "NEAR_STEPS",
    "THRESHOLD_MARGIN",
    "WARNING_FRACTIONS",
    "Budget",
    "BudgetAction",
    "BudgetExceeded",
    "BudgetGuard",
    "BudgetReading",
    "resolve_budget",
    "threshold_budget_flops",
    "validate_budget",
    "validate_budget_action",
]

#: ``budget="threshold"`` is the threshold divided by this (the guidelines' 30% margin), so the
#: run stays below the threshold even if the estimate were 30% low.
THRESHOLD_MARGIN = 1.3
#: The fractions of the budget at which a warning is logged, once each.
WARNING_FRACTIONS = (0.5, 0.8, 0.95)
#: Within this many (predicted) steps of the budget, the counts are read at every step.
NEAR_STEPS = 3

BudgetAction = Literal["stop", "raise"]
BUDGET_ACTIONS: tuple[BudgetAction, ...] = ("stop", "raise")


@dataclass(frozen=True)
class Budget:
    """A run's compute budget, resolved.

    Attributes:
        flops: The budget, FLOP (finite, positive).
        source: ``"argument"``, or for ``budget="threshold"`` the arithmetic that gave it
            (``"threshold: <T> FLOP / 1.3 less <P> FLOP of parent runs"``).
        action: ``"stop"`` (``should_stop``, the adapters stop the trainer) or ``"raise"``
            (:class:`BudgetExceeded` from the optimizer step).
    """

    flops: float
    source: str
    action: BudgetAction = "stop"


def validate_budget_action(value: object) -> BudgetAction:
    """``"stop"`` or ``"raise"``.

    Raises:
        ConfigurationError: anything else (the message names ``budget_action``).
    """
    if value not in BUDGET_ACTIONS or not isinstance(value, str):
        raise ConfigurationError(f"budget_action must be 'stop' or 'raise', got {value!r}.")
    return value  # type: ignore[return-value]


def validate_budget(value: object) -> float | Literal["threshold"] | None:
    """``budget=`` checked for its form: ``None``, a positive finite number of FLOP (as a
    float), or ``"threshold"``.

    Raises:
        ConfigurationError: a negative, zero, NaN, infinite, bool or non-numeric budget (a
            numeric string included).
    """
    if value is None:
        return None
    if isinstance(value, str) and value == "threshold":
        return "threshold"
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise ConfigurationError(
            f"budget must be a number of FLOP (for example 4e22) or 'threshold', got {value!r}."
        )
    flops = float(value)
    if not math.isfinite(flops) or flops <= 0:
        raise ConfigurationError(
            f"budget must be a positive, finite number of FLOP, got {value!r}."
        )
    return flops


def threshold_budget_flops(
    threshold_flops: float | None, parents_flops: float | None = 0.0
) -> float:
    """The budget of ``budget="threshold"``: the threshold / :data:`THRESHOLD_MARGIN`, less the
    compute of the runs this run continues, FLOP.

    Args:
        threshold_flops: The run's threshold, FLOP (``None``: it cannot be determined).
        parents_flops: The parent runs' compute summed, FLOP (``None``: some parent's compute
            is not known).

    Raises:
        ConfigurationError: the threshold is unknown or not a positive finite number, the
            parents' compute is unknown, or the parent runs have used the whole budget.
    """
    if threshold_flops is None or not math.isfinite(threshold_flops) or threshold_flops <= 0:
        raise ConfigurationError(
            "budget='threshold' needs the run's threshold, and it cannot be determined "
            f"(got {threshold_flops!r}); give the budget as a number of FLOP instead."
        )
    if parents_flops is None:
        raise ConfigurationError(
            "budget='threshold' needs the compute of the parent runs, and a parent's is not "
            "known (see its report's withheld_reason); give the budget as a number of FLOP."
        )
    flops = threshold_flops / THRESHOLD_MARGIN - parents_flops
    if not flops > 0:
        raise ConfigurationError(
            f"budget='threshold' leaves nothing to train: the threshold {threshold_flops:.3e} "
            f"FLOP / {THRESHOLD_MARGIN} is used up by the parent runs' {parents_flops:.3e} FLOP."
        )
    return flops


def resolve_budget(
    value: object,
    action: object = "stop",
    *,
    threshold_flops: float | None = None,
    parents_flops: float | None = 0.0,
) -> Budget | None:
    """Checks ``budget=`` (and ``budget_action=``) and resolves it to a :class:`Budget`.

    Args:
        value: ``None`` (no budget), a positive finite number of FLOP, or ``"threshold"``.
        action: ``"stop"`` or ``"raise"``.
        threshold_flops: The run's threshold, FLOP (for ``"threshold"``; ``None``: unknown).
        parents_flops: The compute of the runs this run continues, FLOP (``None``: unknown).

    Raises:
        ConfigurationError: a negative, zero, NaN, infinite, bool or non-numeric budget, an
            unknown threshold for ``"threshold"``, or a bad ``budget_action``.
    """
    checked_action = validate_budget_action(action)
    checked = validate_budget(value)
    if checked is None:
        return None
    if checked == "threshold":
        flops = threshold_budget_flops(threshold_flops, parents_flops)
        source = (
            f"threshold: {threshold_flops:.4g} FLOP / {THRESHOLD_MARGIN} less "
            f"{parents_flops:.4g} FLOP of parent runs"
        )
        return Budget(flops, source, checked_action)
    return Budget(checked, "argument", checked_action)


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
    """The budget guard's state over a run: readings, the prediction, the decision.

    Steps are this session's optimizer steps (``0`` at the start, ``1`` after the first step).

    Args:
        budget: The resolved budget.
    """

    budget: Budget
    #: The run continues saved counts (their compute is unknown until read, so the per-step
    #: compute needs two readings); set by :meth:`start`.
    resumed: bool = False
    #: The step and total (FLOP) of the last reading; ``None`` before one.
    last_step: int | None = None
    last_flops: float | None = None
    #: The largest per-step compute seen, FLOP; ``None`` until two readings (or one, fresh).
    step_flops: float | None = None
    #: The step at or after which the next reading is due.
    next_reading_step: int = 1
    stopped: bool = False
    flops_at_stop: float | None = None
    stop_step: int | None = None
    unknown_reason: str | None = None
    planned_steps: int | None = None
    #: Training went on after the stop, and the meter has said so.
    overrun_logged: bool = False
    _warned: set[float] = field(default_factory=set)
    _plan_said: bool = False

    def start(self, *, resumed: bool = False) -> None:
        """Begins the run's session (before its first optimizer step).

        Args:
            resumed: The run continues saved counts.
        """
        self.resumed = resumed
        if not resumed:
            self.last_step, self.last_flops = 0, 0.0  # a fresh run starts from nothing

    # ------------------------------------------------------------------ queries
    def needs_reading(self, step: int) -> bool:
        """Whether the counts should be read at optimizer step ``step`` (a Python comparison:
        what the meter asks at every optimizer step)."""
        return not self.stopped and self.unknown_reason is None and step >= self.next_reading_step

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

    # ------------------------------------------------------------------ decisions
    def on_reading(
        self, step: int, total_flops: float | None, why_unknown: str = ""
    ) -> BudgetReading:
        """Takes one reading (the run's total compute at optimizer step ``step``) and decides.

        Args:
            step: This session's optimizer steps so far.
            total_flops: The run's compute so far, FLOP (the report's figure, summed over
                ranks), or ``None`` when the meter does not know it.
            why_unknown: Why it is unknown, for the log.
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
        self._learn_step_size(step, total_flops)
        messages = self._warnings(total_flops)
        messages.extend(self._plan_message(step, total_flops))
        budget = self.budget.flops
        if total_flops > budget or (
            self.step_flops is not None and total_flops + self.step_flops > budget
        ):
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
        self.stopped, self.flops_at_stop, self.stop_step = True, total_flops, step
        budget = self.budget.flops
        if total_flops > budget:
            return (
                "error",
                f"the compute budget of {budget:.3e} FLOP was crossed at optimizer step {step} "
                f"({total_flops:.3e} FLOP): a step larger than any before it (or the first "
                "step, which cannot be predicted). Stopping now.",
            )
        return (
            "warning",
            f"compute budget: stopping after optimizer step {step} at {total_flops:.3e} FLOP "
            f"({total_flops / budget:.1%} of {budget:.3e}); the next step (about "
            f"{self.step_flops:.3e} FLOP) would cross it.",
        )

    def _schedule(self, step: int, total_flops: float) -> int:
        """The step of the next reading: halfway to the predicted end of the budget, at the
        predicted crossing of the next warning level, or the next step when near."""
        if self.step_flops is None or self.step_flops <= 0:
            return step + 1  # nothing known about a step's size yet
        left_steps = (self.budget.flops - total_flops) / self.step_flops
        if left_steps <= NEAR_STEPS + 1:
            return step + 1
        gap = max(1, math.floor(left_steps / 2))
        for fraction in WARNING_FRACTIONS:
            if fraction not in self._warned:
                to_level = (fraction * self.budget.flops - total_flops) / self.step_flops
                gap = min(gap, max(1, math.ceil(to_level)))
                break
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
        if self._plan_said or self.planned_steps is None or self.step_flops is None:
            return []
        self._plan_said = True
        remaining = max(0, self.planned_steps - step)
        whole = total_flops + remaining * self.step_flops
        budget = self.budget.flops
        if whole <= budget:
            verdict = "fits in the budget"
            level = "info"
        else:
            last = step + max(0, math.floor((budget - total_flops) / self.step_flops))
            verdict = f"does not fit: the guard will stop it at about step {last}"
            level = "warning"
        return [
            (
                level,
                f"compute budget: the run plans {self.planned_steps} optimizer steps; at up to "
                f"{self.step_flops:.3e} FLOP per step it will use about {whole:.3e} FLOP, "
                f"{whole / budget:.0%} of the budget of {budget:.3e} FLOP: it {verdict}.",
            )
        ]
