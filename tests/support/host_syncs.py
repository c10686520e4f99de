"""A recorder of what reads device values on the host: the tensor methods and torch functions
that synchronise (``.item()``, ``.tolist()``, ``.cpu()``, ``bool(t)``, ``nonzero``, ...) and the
torch.distributed collectives, each call recorded with its caller while a block runs."""

from __future__ import annotations

import contextlib
import functools
import traceback
from collections.abc import Callable, Iterator
from typing import Any

import torch
import torch.distributed as dist

#: The torch functions that read device values on the host (also tensor methods).
TORCH_FUNCTIONS = (
    "nonzero",
    "argwhere",
    "unique",
    "unique_consecutive",
    "masked_select",
    "bincount",
    "equal",
    "is_nonzero",
)
TENSOR_METHODS = (
    "item",
    "tolist",
    "cpu",
    "numpy",
    "__bool__",
    "__int__",
    "__float__",
    "__index__",
    "__array__",
    "__repr__",
    "__format__",
    *TORCH_FUNCTIONS,
)
COLLECTIVES = (
    "all_reduce",
    "all_gather",
    "all_gather_into_tensor",
    "all_gather_object",
    "reduce",
    "reduce_scatter_tensor",
    "broadcast",
    "barrier",
    "gather",
    "scatter",
    "all_to_all_single",
)


def _is_cpu(value: Any) -> bool:
    return (isinstance(value, str) and value.startswith("cpu")) or (
        isinstance(value, torch.device) and value.type == "cpu"
    )


def _never(*args: Any, **kwargs: Any) -> bool:
    return False


@contextlib.contextmanager
def record_host_syncs(calls: list[str]) -> Iterator[None]:
    """Records (in ``calls``) every host read, host copy and collective made inside the block."""
    saved: list[tuple[Any, str, Any]] = []

    def patch(owner: Any, name: str, check: Callable[..., bool] | None = None) -> None:
        original = getattr(owner, name)

        @functools.wraps(original)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            if check is None or check(*args, **kwargs):
                where = traceback.extract_stack(limit=3)[0]
                calls.append(f"{name} at {where.filename}:{where.lineno}")
            return original(*args, **kwargs)

        saved.append((owner, name, original))
        setattr(owner, name, wrapper)

    def to_cpu(*args: Any, **kwargs: Any) -> bool:
        return any(_is_cpu(a) for a in (*args[1:], kwargs.get("device")))

    try:
        for name in TENSOR_METHODS:
            # .numpy() exists only for CPU tensors (a view of host memory): never a device read
            patch(torch.Tensor, name, None if name != "numpy" else _never)
        for name in TORCH_FUNCTIONS:
            patch(torch, name)
        for name in COLLECTIVES:
            patch(dist, name)
        patch(torch.Tensor, "to", to_cpu)
        yield
    finally:
        for owner, name, original in reversed(saved):
            setattr(owner, name, original)
