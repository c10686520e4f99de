"""The compute budget as given, checked and resolved (pure): ``budget=`` and ``budget_action=``,
``"threshold"`` (the threshold / 1.3 less the parents' compute), and what a saved state holds
for a resumed run's guard."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

from flopmeter.checks import is_number, real_number
from flopmeter.errors import ConfigurationError

__all__ = [
    "BUDGET_ACTIONS",
    "SAVED_BUDGET_KEYS",
    "THRESHOLD_MARGIN",
    "Budget",
    "BudgetAction",
    "resolve_budget",
    "restored_budget",
    "saved_budget",
    "threshold_budget_flops",
    "validate_budget",
    "validate_budget_action",
]

#: ``budget="threshold"`` is the threshold divided by this (the guidelines' 30% margin), so the
#: run stays below the threshold even if the estimate were 30% low.
THRESHOLD_MARGIN = 1.3
BudgetAction = Literal["stop", "raise"]
BUDGET_ACTIONS: tuple[BudgetAction, ...] = ("stop", "raise")


@dataclass(frozen=True)
class Budget:
    """A run's compute budget, resolved.

    Attributes:
        flops: The budget, FLOP (finite, positive).
        source: ``"argument"``, or for ``budget="threshold"`` the rule and the arithmetic that
            gave it (``"threshold (<rule>): <T> FLOP / 1.3 less <P> FLOP of parent runs"``).
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
    return real_number(
        value, "budget", what="a number of FLOP (for example 4e22) or 'threshold'", positive=True
    )


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


#: Why each threshold rule applies, for ``budget_source`` (keys: ``Threshold.kind``).
_RULE_REASONS = {
    "one_third_of_original": "one third of the original compute",
    "default_gpai": "default_gpai: original compute unknown or below 1e23 FLOP",
    "default_systemic_risk": "default_systemic_risk: original compute unknown, systemic risk",
}


def resolve_budget(
    value: object,
    action: object = "stop",
    *,
    threshold_flops: float | None = None,
    parents_flops: float | None = 0.0,
    threshold_rule: str | None = None,
) -> Budget | None:
    """Checks ``budget=`` (and ``budget_action=``) and resolves it to a :class:`Budget`.

    Args:
        value: ``None`` (no budget), a positive finite number of FLOP, or ``"threshold"``.
        action: ``"stop"`` or ``"raise"``.
        threshold_flops: The run's threshold, FLOP (for ``"threshold"``; ``None``: unknown).
        parents_flops: The compute of the runs this run continues, FLOP (``None``: unknown).
        threshold_rule: The rule that gave the threshold (``Threshold.kind``), named in the
            source: a default rule (the guidelines' fallback when the original compute is not
            known) is a determined threshold, and the source says it was the fallback.

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
        rule = f" ({_RULE_REASONS.get(threshold_rule, threshold_rule)})" if threshold_rule else ""
        source = (
            f"threshold{rule}: {threshold_flops:.4g} FLOP / {THRESHOLD_MARGIN} less "
            f"{parents_flops:.4g} FLOP of parent runs"
        )
        return Budget(flops, source, checked_action)
    return Budget(checked, "argument", checked_action)


#: The saved budget figures of a meter state (:func:`saved_budget`), FLOP.
SAVED_BUDGET_KEYS = ("budget_flops_saved", "budget_step_flops_saved")


def restored_budget(state: object) -> tuple[float | None, float | None]:
    """The saved compute and largest step of a meter state (``FlopMeter.state_dict``), FLOP:
    ``(None, None)`` when the state does not hold them (saved by an older version, or with the
    compute unknown: both absent or null).

    Raises:
        ConfigurationError: a saved figure that is there but not a finite, non-negative number
            (NaN, negative, infinite, a bool, text), or only one of the two; the message names
            the key. A checkpoint that says so is damaged, not a run of 0 FLOP.
    """
    if not isinstance(state, dict) and not hasattr(state, "get"):
        return None, None
    values = tuple(state.get(key) for key in SAVED_BUDGET_KEYS)  # type: ignore[union-attr]
    if all(value is None for value in values):
        return None, None
    for key, value in zip(SAVED_BUDGET_KEYS, values, strict=True):
        if not is_number(value) or not math.isfinite(value) or value < 0:  # type: ignore[arg-type]
            raise ConfigurationError(
                f"FlopMeter state: {key!r} must be a finite, non-negative number of FLOP "
                f"(what state_dict() saves), got {value!r}; the checkpoint is damaged."
            )
    return float(values[0]), float(values[1])  # type: ignore[arg-type]


def saved_budget(
    flops: float | None, optimizer_steps: int, predicted_step_flops: float | None = None
) -> dict[str, float]:
    """What a saved state holds for a resumed run's guard (:func:`restored_budget` reads it):
    the run's compute, FLOP, and its largest step, FLOP (the mean step, or the guard's
    prediction when larger). Empty when the compute is unknown or no step was taken."""
    if flops is None or not optimizer_steps:
        return {}
    known = [flops / optimizer_steps]
    if predicted_step_flops is not None:
        known.append(predicted_step_flops)
    return {"budget_flops_saved": flops, "budget_step_flops_saved": max(known)}
