"""Parameter census: how many parameters a model has, trains and embeds, counted logically.

"Logically" means the number of elements the model computes with, not what a process stores:
a bitsandbytes 4-bit weight counts its unpacked shape, a DeepSpeed ZeRO-3 partition its full
size (``ds_numel``), an FSDP flat parameter its unsharded size, a DTensor its global shape (which
``numel()`` already reports). Tied weights are one parameter and count once.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from torch import nn


@dataclass(frozen=True)
class Census:
    """Counts of a model's parameters, in elements.

    Attributes:
        n_total: All distinct parameters (tied weights once).
        n_trainable: Those with ``requires_grad``.
        n_frozen: ``n_total - n_trainable``.
        n_embedding: Parameters of embedding tables (``nn.Embedding`` and subclasses), which
            are looked up, not multiplied; a table tied to the output projection counts here.
        n_quantized_4bit: Logical elements held in 4-bit packed storage.
        n_partitioned: Logical elements whose local storage is a shard (ZeRO-3, FSDP, DTensor).
    """

    n_total: int
    n_trainable: int
    n_frozen: int
    n_embedding: int
    n_quantized_4bit: int = 0
    n_partitioned: int = 0


def logical_numel(param: nn.Parameter) -> tuple[int, str]:
    """The number of elements ``param`` represents, and how its storage differs ("" if plain).

    Returns:
        ``(elements, storage)`` where storage is one of ``""``, ``"4bit"``, ``"partitioned"``.
    """
    ds_numel = getattr(param, "ds_numel", None)  # DeepSpeed ZeRO-3
    if isinstance(ds_numel, int) and ds_numel > 0:
        return ds_numel, "partitioned" if param.numel() != ds_numel else ""
    unsharded = getattr(param, "_unpadded_unsharded_size", None)  # FSDP1 FlatParameter
    if unsharded is not None:
        n = math.prod(unsharded)
        return n, "partitioned" if param.numel() != n else ""
    quant_state = getattr(param, "quant_state", None)  # bitsandbytes Params4bit
    if quant_state is not None and type(param).__name__ == "Params4bit":
        shape = getattr(quant_state, "shape", None)
        if shape is not None:
            return math.prod(shape), "4bit"
    if type(param).__name__ == "DTensor" or hasattr(param, "_local_tensor"):
        # DTensor.numel() is the global (logical) element count.
        return param.numel(), "partitioned"
    return param.numel(), ""


def take_census(model: nn.Module) -> Census:
    """Counts ``model``'s parameters as it is now (after any PEFT wrapping or freezing).

    Args:
        model: Any ``nn.Module``.

    Returns:
        A :class:`Census`; parameters shared between modules (tied weights) count once.
    """
    embedding_ids: set[int] = set()
    for module in model.modules():
        if isinstance(module, nn.Embedding):
            embedding_ids.update(id(p) for p in module.parameters(recurse=False))
    total = trainable = embedding = quantized = partitioned = 0
    seen: set[int] = set()
    for param in model.parameters():  # deduplicates by identity: tied weights once
        if id(param) in seen:
            continue
        seen.add(id(param))
        n, storage = logical_numel(param)
        total += n
        if param.requires_grad:
            trainable += n
        if id(param) in embedding_ids:
            embedding += n
        if storage == "4bit":
            quantized += n
        elif storage == "partitioned":
            partitioned += n
    return Census(
        n_total=total,
        n_trainable=trainable,
        n_frozen=total - trainable,
        n_embedding=embedding,
        n_quantized_4bit=quantized,
        n_partitioned=partitioned,
    )
