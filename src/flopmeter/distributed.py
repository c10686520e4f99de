"""torch.distributed in one place: rank, world size, the one reduction of a report, and the
mesh dimensions a model is split over beyond data parallelism (tensor parallel)."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import nn


def is_distributed() -> bool:
    """Whether a default process group is initialised."""
    return dist.is_available() and dist.is_initialized()


def rank() -> int:
    """This process's global rank (0 without torch.distributed)."""
    return dist.get_rank() if is_distributed() else 0


def world_size() -> int:
    """The number of processes (1 without torch.distributed)."""
    return dist.get_world_size() if is_distributed() else 1


def _collective_device() -> torch.device:
    backend = str(dist.get_backend()).lower()
    if "nccl" in backend and torch.cuda.is_available():
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def all_reduce_counts(sums: list[int], maxima: list[int]) -> tuple[list[int], list[int]]:
    """Sums ``sums`` and takes the maximum of ``maxima`` over all ranks, in one collective.

    Every rank must call it. Without torch.distributed it returns its inputs.

    Args:
        sums: Counts to add over ranks (tokens, sequences, micro-batches).
        maxima: Counts every rank shares (optimizer steps): the largest is taken.

    Returns:
        ``(summed, maxed)`` as Python ints.
    """
    if not is_distributed():
        return list(sums), list(maxima)
    # SUM and MAX in one collective: gather the small int64 vector from every rank (exact,
    # world_size x a few int64s) and reduce it here.
    stacked = _gather_rows([*sums, *maxima], torch.int64)
    n = len(sums)
    return stacked[:, :n].sum(0).tolist(), stacked[:, n:].max(0).values.tolist()


def all_gather_floats(values: list[float]) -> list[list[float]]:
    """Every rank's ``values`` (same length on all ranks), in rank order, in one collective.

    Every rank must call it. Without torch.distributed it returns ``[values]``. NaN passes
    through (it marks a missing figure).
    """
    if not is_distributed():
        return [list(values)]
    return _gather_rows(values, torch.float64).tolist()


def _gather_rows(values: list[int] | list[float], dtype: torch.dtype) -> torch.Tensor:
    """One all_gather of this rank's ``values``: a ``[world_size, len(values)]`` CPU tensor."""
    payload = torch.tensor(values, dtype=dtype, device=_collective_device())
    gathered = [torch.empty_like(payload) for _ in range(world_size())]
    dist.all_gather(gathered, payload)
    return torch.stack(gathered).cpu()


def all_gather_objects(value: object) -> list[object]:
    """Every rank's ``value`` (picklable), in rank order, in one collective.

    Every rank must call it. Without torch.distributed it returns ``[value]``.
    """
    if not is_distributed():
        return [value]
    gathered: list[object] = [None] * world_size()
    dist.all_gather_object(gathered, value)
    return gathered


def rank0_text(value: str) -> str:
    """Rank 0's ``value`` on every rank (one small collective; every rank must call it).
    Without torch.distributed it returns ``value``."""
    if not is_distributed():
        return value
    box = [value]
    dist.broadcast_object_list(box, src=0, device=_collective_device())
    return str(box[0])


@dataclass(frozen=True)
class ModelParallel:
    """The mesh dimensions a model is split over beyond data parallelism (tensor or sequence
    parallel): ranks along them feed the same micro-batches, each computing a part of them.

    Attributes:
        size: Ranks that share each micro-batch (the product of the dimensions' sizes).
        first: Whether this rank is the first of them (coordinate 0 along every dimension).
        text: The dimensions, in words (``"mesh dimension 'tp' of 2 ranks"``).
    """

    size: int
    first: bool
    text: str


def _data_parallel_groups(model: nn.Module) -> set[frozenset[int]]:
    """The rank groups of the mesh dimensions FSDP2 (``fully_shard``) shards or replicates
    ``model``'s parameters over: data parallelism, whose ranks feed different micro-batches."""
    from flopmeter.internals import fsdp2_mesh

    groups: set[frozenset[int]] = set()
    for module in model.modules():
        mesh = fsdp2_mesh(module)
        for dim in range(mesh.ndim if mesh is not None else 0):
            groups.add(frozenset(dist.get_process_group_ranks(mesh.get_group(dim))))
    return groups


#: How :attr:`ModelParallel.text` starts when the split could not be read (``size`` 0).
SPLIT_UNREAD = "not read"


def unread_split(exc: BaseException) -> str:
    """The :attr:`ModelParallel.text` of a split whose reading raised ``exc``."""
    return f"{SPLIT_UNREAD}: reading the model's device mesh failed ({type(exc).__name__})"


def model_parallel(model: nn.Module) -> ModelParallel | None:
    """How ``model`` is split over ranks that share its micro-batches: the mesh dimensions of
    its DTensor parameters (``parallelize_module``) other than FSDP2's data-parallel ones, or
    ``None`` (no such dimension, or no torch.distributed)."""
    if not is_distributed():
        return None
    from torch.distributed.tensor import DTensor

    data = _data_parallel_groups(model)
    found: dict[frozenset[int], tuple[str, int]] = {}
    meshes = {
        id(p.device_mesh): p.device_mesh for p in model.parameters() if isinstance(p, DTensor)
    }
    for mesh in meshes.values():
        names = mesh.mesh_dim_names or (None,) * mesh.ndim
        for dim, name in enumerate(names):
            ranks = frozenset(dist.get_process_group_ranks(mesh.get_group(dim)))
            if len(ranks) > 1 and ranks not in data:
                found[ranks] = (f"'{name}'" if name else f"{dim}", mesh.get_local_rank(dim))
    if not found:
        return None
    size = math.prod(len(ranks) for ranks in found)
    text = ", ".join(f"mesh dimension {n} of {len(r)} ranks" for r, (n, _) in found.items())
    return ModelParallel(size, all(c == 0 for _, c in found.values()), text)
