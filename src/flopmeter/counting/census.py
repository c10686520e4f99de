"""Parameter census: how many parameters a model has, trains and embeds, counted logically.

"Logically" means the number of elements the model computes with, not what a process stores:
a bitsandbytes 4-bit weight counts its unpacked shape, a DeepSpeed ZeRO-3 partition its full
size (``ds_numel``), an FSDP flat parameter its unsharded size, an original parameter that FSDP
keeps as a view into its rank's shard (``use_orig_params=True``) the shape FSDP recorded for it,
a DTensor its global shape (which ``numel()`` already reports). Tied weights are one parameter
and count once.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from torch import nn

from flopmeter.internals import (
    fsdp_flat_param_members,
    fsdp_flat_param_sizes,
    is_dtensor,
    iter_fsdp_flat_params,
)


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
    flat_sizes = fsdp_flat_param_sizes(param)  # FSDP1 FlatParameter
    if flat_sizes is not None:
        unsharded, numels = flat_sizes  # numels: per original parameter, without padding
        n = sum(numels) if numels is not None else math.prod(unsharded)
        return n, "partitioned" if param.numel() != n else ""
    quant_state = getattr(param, "quant_state", None)  # bitsandbytes Params4bit
    if quant_state is not None and type(param).__name__ == "Params4bit":
        shape = getattr(quant_state, "shape", None)
        if shape is not None:
            return math.prod(shape), "4bit"
    if is_dtensor(param):
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
    params = list(model.parameters())  # deduplicates by identity: tied weights once
    param_ids = {id(p) for p in params}
    flat_params = list(iter_fsdp_flat_params(model, params))
    # FSDP1 with use_orig_params=True: the original parameters are views into this rank's
    # shard (numel 0 or a part), so they count by the full size FSDP recorded for them.
    orig_numel: dict[int, tuple[int, str]] = {}
    covered_flat: set[int] = set()  # flat parameters whose originals are counted instead
    flat_embedding: dict[int, int] = {}  # embedding elements inside a flat parameter
    for flat in flat_params:
        members = fsdp_flat_param_members(flat)
        unsharded, numels = fsdp_flat_param_sizes(flat)  # type: ignore[misc]  # both recorded
        originals = members["originals"]
        if originals is None:  # use_orig_params=False: the flat parameter itself counts
            flat_embedding[id(flat)] = _flat_embedding_numel(members, numels)
            continue
        # Sharded unless this rank's shard is the whole (NO_SHARD, or a world of one).
        sharded = members["sharded_size"]
        whole = sharded is not None and math.prod(sharded) == math.prod(unsharded)
        for orig, numel in zip(originals, numels, strict=True):
            orig_numel[id(orig)] = (numel, "" if whole else "partitioned")
        # A tied parameter shared inside one flat parameter is the very object of its
        # primary (FSDP keys shared parameters by identity), so it is already mapped; one
        # shared across FSDP units is flattened into one of them only, so it maps once too.
        if any(id(orig) in param_ids for orig in originals):
            covered_flat.add(id(flat))
    total = trainable = embedding = quantized = partitioned = 0
    for param in params:
        if id(param) in covered_flat:
            continue  # its original parameters are in the walk too: never count twice
        if id(param) in orig_numel:
            n, storage = orig_numel[id(param)]
        else:
            n, storage = logical_numel(param)
        total += n
        if param.requires_grad:
            trainable += n
        if id(param) in embedding_ids:
            embedding += n
        elif id(param) in flat_embedding:
            embedding += flat_embedding[id(param)]
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


def _flat_embedding_numel(members: dict[str, Any], numels: list[int]) -> int:
    """Elements of a flat parameter that are embedding tables, from FSDP's record of its members.

    A table tied to another module is flattened once, under whichever module FSDP met first;
    the shared-parameter records name the others, so it counts if any of its modules embeds.
    """
    embeds = {
        (id(info.prim_module), info.prim_param_name)
        for info in members["shared_infos"]
        if isinstance(getattr(info, "module", None), nn.Embedding)
    }
    n = 0
    for info, numel in zip(members["param_infos"], numels, strict=True):
        module = getattr(info, "module", None)
        if isinstance(module, nn.Embedding) or (id(module), info.param_name) in embeds:
            n += numel
    return n
