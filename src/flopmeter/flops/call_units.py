"""A forward call's form and units, from its shapes alone: what a watched phase is counted
by (:mod:`flopmeter.flops.phases` combines the sampled calls' FLOP over these units)."""

from __future__ import annotations

import math
from typing import Any

import torch

__all__ = ["call_units", "uses_cache"]


def _int_tensor(value: Any) -> bool:
    return isinstance(value, torch.Tensor) and not (
        value.is_floating_point() or value.is_complex() or value.dtype == torch.bool
    )


def call_units(
    args: tuple[Any, ...], kwargs: dict[str, Any], *, after: bool = False
) -> tuple[str, tuple[float, ...]]:
    """A forward call's form and units, from its shapes (no host read of any value).

    A text call (``input_ids``, or the first integer tensor, or ``inputs_embeds``) has the units
    ``(rows, tokens, key-value pairs, head tokens)``: tokens are rows x query length, pairs are
    tokens x key length (the length the key-value cache holds before the call plus the
    query's, with a cache: ``past_key_values``, or ``cache`` in generation; else the attention
    mask's width; else the query's),
    head tokens are what ``logits_to_keep`` keeps (all tokens without it). Its form says whether
    it read a key-value cache and what ``logits_to_keep`` was. Any other call is one form per
    set of input shapes, with one unit: the call. ``after``: read once the call has run (its
    cache then holds its own keys too).
    """
    ids = kwargs.get("input_ids")
    if not _int_tensor(ids):
        ids = next((a for a in args if _int_tensor(a)), None)
    embeds = kwargs.get("inputs_embeds")
    if _int_tensor(ids) and ids.dim() >= 1:
        rows, query = math.prod(ids.shape[:-1]), ids.shape[-1]
    elif isinstance(embeds, torch.Tensor) and embeds.dim() >= 2:
        rows, query = math.prod(embeds.shape[:-2]), embeds.shape[-2]
    else:
        shapes = [
            f"{name}{tuple(v.shape)}"
            for name, v in (*enumerate(args), *kwargs.items())
            if isinstance(v, torch.Tensor)
        ]
        return "shapes " + ", ".join(shapes), (1.0,)
    past = _cache_of(kwargs)
    keys = query
    mask = kwargs.get("attention_mask")
    if past is not None and callable(getattr(past, "get_seq_length", None)):
        keys = int(past.get_seq_length()) + (0 if after else query)
    elif isinstance(mask, torch.Tensor) and mask.dim() >= 2 and mask.shape[-1] >= query:
        keys = mask.shape[-1]
    keep = kwargs.get("logits_to_keep")
    if isinstance(keep, int) and not isinstance(keep, bool) and keep > 0:
        head = rows * min(keep, query)
        kept = f", logits_to_keep={keep}"
    elif isinstance(keep, torch.Tensor):
        head, kept = rows * keep.numel(), ", logits_to_keep=indices"
    else:
        head, kept = rows * query, ""
    form = ("text, key-value cache" if past is not None else "text") + kept
    tokens = rows * query
    return form, (float(rows), float(tokens), float(tokens * keys), float(head))


def _cache_of(kwargs: dict[str, Any]) -> Any:
    """The call's key-value cache (``past_key_values``, or ``cache`` in Transformers 5's
    generation), or ``None``."""
    for name in ("past_key_values", "cache"):
        value = kwargs.get(name)
        if value is not None:
            return value
    return None


def uses_cache(kwargs: dict[str, Any]) -> bool:
    """Whether a forward call reads or fills a key-value cache (generation)."""
    return _cache_of(kwargs) is not None
