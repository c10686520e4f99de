"""The budget's run side: what a metered run does with its guard at each step.

:class:`BudgetController` holds the pure :class:`~flopmeter.budget.guard.BudgetGuard` of a run
with a budget and does what the guard asks at the run's events: it hands each training
micro-batch's shape to the guard, closes each optimizer step's bound with the FLOP model's rates,
reads the run's compute when the guard asks for it (under torch.distributed: two small
collectives, so every rank decides on the same numbers), logs what the guard says and keeps the
report's budget notes. It never imports the meter: what it needs of the run comes in as
callables. A run without a budget holds a :class:`NullBudget`, which has the same methods and
does nothing.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol

from flopmeter import distributed
from flopmeter.budget.guard import BudgetGuard
from flopmeter.budget.rates import step_rates
from flopmeter.budget.resolve import Budget, restored_budget, saved_budget
from flopmeter.errors import BudgetExceeded

if TYPE_CHECKING:
    from flopmeter.counting.census import Census
    from flopmeter.flops.recorder import FlopObservations

__all__ = ["BudgetController", "Compute", "NullBudget", "RunBudget", "budget_controller"]

logger = logging.getLogger("flopmeter")


class Compute(Protocol):
    """The run's compute now, as the report would give it (``flopmeter.run.measure.Measurement``)."""

    @property
    def flops(self) -> float | None: ...  # FLOP; None when the report would withhold it

    @property
    def withheld(self) -> str | None: ...  # why it is withheld

    @property
    def guard_flops(self) -> float | None: ...  # FLOP the budget enforces; None: not known


class NullBudget:
    """The budget of a run without one: every method a no-op, never a stop."""

    active = False
    should_stop = False
    budget_left: float | None = None

    def start(self, *, resumed: bool) -> None:
        """Nothing to start."""

    def restore(self, state: object) -> None:
        """Nothing to restore; the saved figures are checked all the same (a damaged state is
        refused whether or not this session has a budget)."""
        restored_budget(state)

    def check_forward(self) -> None:
        """Never stops a forward pass."""

    def add_shape(self, rows: int, cols: int) -> None:
        """No bound to keep."""

    def on_step(self, step: int) -> None:
        """Nothing to decide."""

    def plan(self, planned_steps: int | None) -> None:
        """Nothing to forecast."""

    def facts(self) -> dict[str, Any]:
        """No budget fields: the report's defaults."""
        return {}

    def saved(self, flops: float | None, optimizer_steps: int) -> dict[str, float]:
        """The saved compute and mean step, FLOP, for a resumed run that has a budget."""
        return saved_budget(flops, optimizer_steps)

    def notes(self) -> tuple[str, ...]:
        """No notes."""
        return ()


class BudgetController:
    """The run side of a compute budget (see :mod:`flopmeter.budget`).

    Args:
        budget: The resolved budget.
        read_compute: Reads the run's compute now, summed over ranks (a host read; a
            collective under torch.distributed, so every rank calls it at the same step).
        observations: The FLOP model's observations now (host data).
        census: The parameter census, ``None`` before the first training micro-batch.
        on_problem: Called with a fault of the guard's own (the run goes on without it).
    """

    active = True

    def __init__(
        self,
        budget: Budget,
        *,
        read_compute: Callable[[], Compute],
        observations: Callable[[], FlopObservations],
        census: Callable[[], Census | None],
        on_problem: Callable[[BaseException], None],
    ) -> None:
        self.guard = BudgetGuard(budget)
        self._read_compute = read_compute
        self._observations = observations
        self._census = census
        self._on_problem = on_problem
        self._rates_key: object = None
        self._restored: tuple[float | None, float | None] = (None, None)
        self._notes: list[str] = []

    # ------------------------------------------------------------------ queries
    @property
    def should_stop(self) -> bool:
        """Whether the guard has said stop."""
        return self.guard.stopped

    @property
    def budget_left(self) -> float | None:
        """The budget less the compute at the last reading, FLOP (``None`` before one)."""
        return self.guard.budget_left_flops

    def facts(self) -> dict[str, Any]:
        """The report's budget fields (``RunFacts``' budget fields)."""
        guard = self.guard
        return {
            "budget_flops": guard.budget.flops,
            "budget_source": guard.budget.source,
            "flops_at_stop": guard.flops_at_stop,
            # the guard asked, and training did stop there (not a loop that went on)
            "stopped_by_budget": guard.stopped and not guard.overrun_logged,
        }

    def saved(self, flops: float | None, optimizer_steps: int) -> dict[str, float]:
        """The saved compute and largest step, FLOP, for a checkpoint (``state_dict``)."""
        return saved_budget(flops, optimizer_steps, self.guard.next_step_flops())

    def notes(self) -> tuple[str, ...]:
        """The report's notes on the budget (a clean stop, a guard that could not work)."""
        return tuple(self._notes)

    # ------------------------------------------------------------------ events
    def restore(self, state: object) -> None:
        """Keeps the saved compute of a state being restored (``load_state_dict``)."""
        self._restored = restored_budget(state)

    def plan(self, planned_steps: int | None) -> None:
        """The optimizer steps this session plans, for the guard's forecast."""
        self.guard.plan(planned_steps)

    def start(self, *, resumed: bool) -> None:
        """Starts the guard; a resumed run whose saved compute is within one step of the
        budget stops at once (before any step of this session)."""
        flops, step_flops = self._restored if resumed else (None, None)
        decision = self.guard.start(
            resumed=resumed,
            local=not distributed.is_distributed(),
            restored_flops=flops,
            restored_step_flops=step_flops,
        )
        self._act(decision.messages, decision.stop)

    def check_forward(self) -> None:
        """Before a training forward, with ``budget_action="raise"``: a stopped guard raises
        before anything more trains (a resumed run already at its budget, before anything of
        this session trains; a stop decided at a DeepSpeed engine's step, whose raise waits
        for the step's last parameter group)."""
        guard = self.guard
        if guard.stopped and guard.budget.action == "raise":
            raise self._exceeded(guard.stop_step or 0)

    def add_shape(self, rows: int, cols: int) -> None:
        """A training micro-batch's padded shape (host integers), for the step's bound."""
        self.guard.add_shape(rows, cols)

    def on_step(self, step: int) -> None:
        """At optimizer step ``step`` (this session's): read the counts if the guard asks,
        decide, and act (log, note, or raise :class:`BudgetExceeded`)."""
        guard = self.guard
        if guard.stopped:
            if guard.budget.action == "raise":
                raise self._exceeded(step)
            if guard.first_overrun():
                logger.error(
                    "flopmeter: training went on after the compute budget asked it to stop "
                    "(meter.should_stop) at step %s; the budget may be crossed",
                    guard.stop_step,
                )
                self._overrun_note()
            return
        try:
            self._close_step()
        except Exception as exc:  # no bound: readings fall back to the schedule
            guard.lose_bound()
            self._on_problem(exc)
        if not guard.needs_reading(step):
            return  # the common case: a few float operations, no host read
        try:
            flops, why, step_upper = self._read_total()
            decision = guard.on_reading(step, flops, why, step_upper)
        except Exception as exc:
            self._on_problem(exc)
            return
        self._act(decision.messages, decision.stop)
        if decision.stop and guard.budget.action == "raise":
            raise self._exceeded(step)

    # ------------------------------------------------------------------ helpers
    def _close_step(self) -> None:
        """Closes the step's upper bound, with the FLOP model's rates (host data only)."""
        observations = self._observations()
        census = self._census()
        key = (id(observations.profile), len(observations.samples), id(census))
        if key != self._rates_key:
            self._rates_key = key
            self.guard.use_rates(step_rates(observations, census))
        self.guard.close_step()

    def _read_total(self) -> tuple[float | None, str, float | None]:
        """The run's compute now, FLOP, as the report would give it (``None`` with the reason
        when the report would withhold it), and under torch.distributed the ranks' largest step
        bounds summed, FLOP. Under torch.distributed the figure is the largest of any rank (a
        second small collective after the count's), so every rank decides on the same number. A
        rank that fails between the two still joins the second (with NaN, its figure unknown),
        so no rank waits in it alone."""
        try:
            compute = self._read_compute()
            flops, why = compute.guard_flops, compute.withheld
        except Exception as exc:  # into the collective as unknown, then said
            flops, why = None, f"the meter could not compute it ({type(exc).__name__}: {exc})"
        if not distributed.is_distributed():
            return flops, why or "", None
        own_upper = self.guard.own_step_upper_flops
        gathered = distributed.all_gather_floats(
            [math.nan if flops is None else flops, math.nan if own_upper is None else own_upper]
        )
        values = [row[0] for row in gathered]
        uppers = [row[1] for row in gathered]
        flops = None if any(math.isnan(v) for v in values) else max(values)
        if flops is None:
            why = why or "another rank's counts are not complete"
        step_upper = None if any(math.isnan(v) for v in uppers) else sum(uppers)
        return flops, why or "", step_upper

    def _act(self, messages: tuple[tuple[str, str], ...], stop: bool) -> None:
        """Logs the guard's messages (errors also become notes) and notes a clean stop."""
        for level, message in messages:
            logger.log(logging.getLevelName(level.upper()), "flopmeter: %s", message)
            if level == "error":
                self._notes.append(f"Compute budget: {message}")
        if stop:
            self._stop_note()

    def _stop_note(self) -> None:
        """The report's note on a clean stop (a crossing is noted with its error)."""
        guard = self.guard
        at, budget = guard.flops_at_stop, guard.budget.flops
        if at is None or at > budget:
            return
        when = (
            "before this session's first step"
            if guard.stop_step == 0
            else f"after optimizer step {guard.stop_step} of this session"
        )
        self._notes.append(
            f"{_STOP_NOTE} {when} at {at:.3e} FLOP, within the budget of "
            f"{budget:.3e} FLOP ({guard.budget.source}); the next step would have crossed it."
        )

    def _overrun_note(self) -> None:
        """Training took a step after the guard said stop: the clean-stop note is no longer
        true, and the report says what happened instead (the final figure against the budget
        is the report's own note, from its compute)."""
        guard = self.guard
        self._notes = [n for n in self._notes if not n.startswith(_STOP_NOTE)]
        at = guard.flops_at_stop
        reading = f" at {at:.3e} FLOP" if at is not None else ""
        self._notes.append(
            f"Compute budget: the guard asked training to stop (meter.should_stop) after "
            f"optimizer step {guard.stop_step} of this session{reading}, but training went on; "
            f"the compute in this report includes every step trained, budget or not."
        )

    def _exceeded(self, step: int) -> BudgetExceeded:
        """The error of a stopped guard (``budget_action="raise"``); the guard stops only on a
        known total, so ``flops_at_stop`` is set."""
        guard = self.guard
        assert guard.flops_at_stop is not None
        return BudgetExceeded(guard.budget.flops, guard.flops_at_stop, step)


#: How the note of a clean stop begins (dropped when training goes on after it).
_STOP_NOTE = "Compute budget: training stopped"

#: What a meter holds: a controller, or the null budget of a run without one.
RunBudget = BudgetController | NullBudget


def budget_controller(budget: Budget | None, **callables: Any) -> RunBudget:
    """A :class:`BudgetController` for ``budget`` (``callables`` as it takes them), or a
    :class:`NullBudget` when there is none."""
    return NullBudget() if budget is None else BudgetController(budget, **callables)
