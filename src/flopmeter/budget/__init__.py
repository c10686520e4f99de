"""The compute budget: the pure guard and the run side that drives it.

* :mod:`flopmeter.budget.resolve`: ``resolve_budget`` (``budget=`` checked; ``"threshold"`` is
  the threshold / 1.3 less the parents' compute), and what a checkpoint saves for the guard.
* :mod:`flopmeter.budget.rates`: the FLOP model's rates, for a step's upper bound.
* :mod:`flopmeter.budget.guard`: ``BudgetGuard``, the pure decisions (when to read the counts,
  the next step's predicted compute, when to stop, the warnings, the plan).
* :mod:`flopmeter.budget.controller`: ``BudgetController``, what a metered run does with its
  guard at each event (given what it needs as callables; it never imports the meter), and
  ``NullBudget``, the same methods for a run without a budget.

See docs/budget.md.
"""

from __future__ import annotations

from flopmeter.budget.controller import (
    BudgetController,
    Compute,
    NullBudget,
    RunBudget,
    budget_controller,
)
from flopmeter.budget.guard import NEAR_STEPS, WARNING_FRACTIONS, BudgetGuard, BudgetReading
from flopmeter.budget.rates import StepRates, step_rates
from flopmeter.budget.resolve import (
    BUDGET_ACTIONS,
    THRESHOLD_MARGIN,
    Budget,
    BudgetAction,
    resolve_budget,
    restored_budget,
    saved_budget,
    threshold_budget_flops,
    validate_budget,
    validate_budget_action,
)
from flopmeter.errors import BudgetExceeded

__all__ = [
    "BUDGET_ACTIONS",
    "NEAR_STEPS",
    "THRESHOLD_MARGIN",
    "WARNING_FRACTIONS",
    "Budget",
    "BudgetAction",
    "BudgetController",
    "BudgetExceeded",
    "BudgetGuard",
    "BudgetReading",
    "Compute",
    "NullBudget",
    "RunBudget",
    "StepRates",
    "budget_controller",
    "resolve_budget",
    "restored_budget",
    "saved_budget",
    "step_rates",
    "threshold_budget_flops",
    "validate_budget",
    "validate_budget_action",
]
