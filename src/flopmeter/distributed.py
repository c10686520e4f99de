"""torch.distributed in one place: rank, world size, and the one reduction of a report."""

from __future__ import annotations

import torch
import torch.distributed as dist


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
