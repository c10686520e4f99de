"""The plan of bare numbers (``--params``): the seed and 6ND formulas, the larger one.

Pure Python, importing neither torch nor transformers, so ``flopmeter estimate --params ...``
starts in well under a second. The two formulas are the meter's own
(:mod:`flopmeter.flops.formulas`, which imports nothing).
"""

from __future__ import annotations

from flopmeter.compliance.thresholds import Threshold
from flopmeter.flops.formulas import seed_flops, six_nd_flops
from flopmeter.planner.plan import MethodPlan, Plan, PlanRequest, judged
from flopmeter.types import TokenTotals

__all__ = ["numbers_plan"]


def numbers_plan(req: PlanRequest, threshold: Threshold, note: str) -> Plan:
    """The plan of ``req.params`` parameters (``req.trainable`` of them training, default all)
    over ``req.tokens`` tokens, judged against ``threshold`` (``note``: where it came from).

    Args:
        req: A checked request with ``params`` and ``tokens``.
        threshold: The threshold, FLOP.
        note: The threshold line's tail (:meth:`PlanRequest.resolve_threshold`).

    Returns:
        A :class:`Plan` of one method, ``given``; ``flops`` in FLOP.
    """
    assert req.params is not None and req.tokens is not None
    params, tokens = int(req.params), int(req.tokens)
    trainable = params if req.trainable is None else int(req.trainable)
    seed = seed_flops(params, trainable, tokens)
    six = six_nd_flops(params, tokens)
    name, flops = ("six_nd", six) if six >= seed else ("seed", seed)
    totals = TokenTotals(tokens_processed=tokens)
    entry = MethodPlan(
        method="given",
        model=None,
        n_total=params,
        n_trainable=trainable,
        tokens=tokens,
        sequences=None,  # no sequence length without a configuration: not known, not 0
        sum_sq_seq_len=None,
        micro_batches=None,
        estimate=name,
        seed_flops=seed,
        six_nd_flops=six,
        notes=["No configuration: the larger of seed and 6ND (not the transformer estimate)."],
        **judged(flops, totals, threshold, None),
    )
    return Plan(
        model=None,
        source="no configuration: the seed and 6ND formulas, the larger one (attention, "
        "sequence length and the layers' gradients not modelled)",
        tokens_from="--tokens",
        approximate_tokens=False,
        threshold_source=threshold.source,
        threshold_note=note,
        base_parameters=params,
        methods=[entry],
    )
