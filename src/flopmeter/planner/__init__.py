"""The planner: a fine-tuning run's compute and verdict before it starts, method by method.

``flopmeter estimate`` runs :func:`estimate`. With a model configuration, each method's model is
built on the ``meta`` device (nothing downloaded or allocated) and costed by the meter's own
``transformer`` estimate over the planned token statistics; see docs/planner.md.
"""

from flopmeter.planner.estimator import estimate
from flopmeter.planner.models import known_model_ids, resolve_model
from flopmeter.planner.numbers import parse_count
from flopmeter.planner.plan import DEFAULT_SEQ_LEN, METHODS, MethodPlan, Plan, PlanRequest

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
