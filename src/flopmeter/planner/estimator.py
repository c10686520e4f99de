""":func:`estimate`: the plan of a fine-tuning run, method by method, before it starts.

A plan of bare numbers (``params=``) is pure arithmetic (:mod:`flopmeter.planner.bare`): it
imports neither torch nor transformers. A plan of a model configuration builds the model on
meta (:mod:`flopmeter.planner.model_plan`, imported only then); with ``cache``, a plan of the
same inputs made before is read from disk instead (:mod:`flopmeter.planner.plan_cache`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from flopmeter.errors import ConfigurationError
from flopmeter.planner.plan import Plan, PlanRequest

__all__ = ["estimate"]


def estimate(*, cache: bool | str | Path = False, **inputs: Any) -> Plan:
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

    ``cache``: ``False`` (the default) makes the plan; ``True`` reads a plan of the same
    inputs (and versions, and flopmeter source) from the on-disk plan cache in the user's
    cache folder, else makes and stores it; a path names the folder of the cache files
    instead (docs/planner.md, "Speed"). A plan of bare numbers is never cached.

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
    if cache is not False:
        from flopmeter.planner.plan_cache import cached_model_plan

        folder = None if cache is True else Path(cache)
        return cached_model_plan(req, threshold, note, folder)
    from flopmeter.planner.model_plan import model_plan

    return model_plan(req, threshold, note)
