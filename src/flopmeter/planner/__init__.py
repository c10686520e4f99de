"""The planner: a fine-tuning run's compute and verdict before it starts, method by method.

``flopmeter estimate`` runs :func:`estimate`. With a model configuration, each method's model is
built on the ``meta`` device (nothing downloaded or allocated) and costed by the meter's own
``transformer`` estimate over the planned token statistics; see docs/planner.md.

The names below are imported when first used (PEP 562): a plan of bare numbers (``params=``)
imports neither torch nor transformers, so ``flopmeter estimate --params ...`` starts fast.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

#: Each public name and the module that defines it.
_EXPORTS = {
    "DEFAULT_SEQ_LEN": "flopmeter.planner.plan",
    "METHODS": "flopmeter.planner.plan",
    "MethodPlan": "flopmeter.planner.plan",
    "Plan": "flopmeter.planner.plan",
    "PlanRequest": "flopmeter.planner.plan",
    "estimate": "flopmeter.planner.estimator",
    "known_model_ids": "flopmeter.planner.models",
    "parse_count": "flopmeter.planner.numbers",
    "resolve_model": "flopmeter.planner.models",
}

__all__ = [
    "DEFAULT_SEQ_LEN",
    "METHODS",
    "MethodPlan",
    "Plan",
    "PlanRequest",
    "estimate",
    "known_model_ids",
    "parse_count",
    "resolve_model",
]

if TYPE_CHECKING:
    from flopmeter.planner.estimator import estimate
    from flopmeter.planner.models import known_model_ids, resolve_model
    from flopmeter.planner.numbers import parse_count
    from flopmeter.planner.plan import DEFAULT_SEQ_LEN, METHODS, MethodPlan, Plan, PlanRequest


def __getattr__(name: str) -> Any:
    """Imports a public name's module on first use (PEP 562)."""
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'flopmeter.planner' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
