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
