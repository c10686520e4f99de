""":func:`estimate`: the plan of a fine-tuning run, method by method, before it starts.

A plan of bare numbers (``params=``) is pure arithmetic (:mod:`flopmeter.planner.bare`): it
imports neither torch nor transformers. A plan of a model configuration builds the model on
meta (:mod:`flopmeter.planner.model_plan`, imported only then).
"""

from __future__ import annotations

from typing import Any

from flopmeter.errors import ConfigurationError
from flopmeter.planner.plan import Plan, PlanRequest

__all__ = ["estimate"]


def estimate(**inputs: Any) -> Plan:
    """The plan of a fine-tuning run: per method, parameters, compute and verdict.

    Takes the fields of :class:`~flopmeter.planner.plan.PlanRequest` as keywords: ``model``
    (a ``config.json``, a folder holding one, or a bundled model id) or ``params`` (bare
    numbers, with ``trainable``); ``tokens`` or ``dataset`` (JSONL, with ``tokenizer`` and
    ``epochs``); ``seq_len`` (tokens, default 2048); ``batch_size`` (sequences per
    micro-batch, default 1); ``methods`` (default every method of
    :data:`~flopmeter.planner.plan.METHODS` the model can be planned with: spectrum and
    freeze only where it has one stack of blocks, else the plan's notes say they were left
    out; a method asked for by name that cannot be planned is refused); ``lora_r``,
    ``lora_targets``, ``spectrum_fraction``, ``freeze_layers``; ``pretrain_flops`` (FLOP)
    and ``systemic_risk``, or a ready ``threshold``.

    Returns:
        A :class:`~flopmeter.planner.plan.Plan`; ``flops`` in FLOP.

    Raises:
        ConfigurationError: any input that cannot make a plan (one line naming it).
    """
    try:
        req = PlanRequest(**inputs)
    except TypeError as exc:
        raise ConfigurationError(str(exc)) from None
    req.check()
    threshold, note = req.resolve_threshold()
    if req.params is not None:
        from flopmeter.planner.bare import numbers_plan

        return numbers_plan(req, threshold, note)
    from flopmeter.planner.model_plan import model_plan

    return model_plan(req, threshold, note)
