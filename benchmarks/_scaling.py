"""The meter's per-micro-batch cost against the model's depth and the batch's shape, and the
memory it holds (benchmarks/test_scaling.py).

No model here is trained: a real :class:`flopmeter.FlopMeter` is attached to a real Hugging
Face ``LlamaForCausalLM`` of the given depth (hidden size 32, so an 80-layer model builds in a
second) and the hooks it registered with torch (found in torch's hook dictionaries, not in the
meter's internals) are called as torch calls them in a training step: its forward pre-hook with
the micro-batch's keyword arguments, then its optimizer-step hook.
"""

from __future__ import annotations

import gc
import sys
import tracemalloc
import types
from collections.abc import Callable
from typing import Any

import torch
from torch import nn
from torch.optim.optimizer import _global_optimizer_post_hooks

import _workloads
from flopmeter import FlopMeter

PAD_ID = 0
VOCAB = 256
#: (layers, rows, cols): depth at a fixed 8 x 512 batch, then sequence length and batch size
#: on the 2-layer model.
CASES = sorted(
    {(layers, 8, 512) for layers in (2, 8, 32, 80)}
    | {(2, 1, cols) for cols in (128, 1024, 8192, 32768)}
    | {(2, rows, 2048) for rows in (1, 8, 32)}
)


def make_model(layers: int) -> nn.Module:
    """The step benchmark's Llama at ``layers`` blocks, hidden size 32, 32k positions."""
    return _workloads.make_model(
        vocab_size=VOCAB,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=layers,
        num_attention_heads=2,
        num_key_value_heads=1,
        max_position_embeddings=32768,
        pad_token_id=PAD_ID,
    )


def make_batch(rows: int, cols: int, seed: int = 0) -> dict[str, torch.Tensor]:
    """Right-padded ids (half to all of each row real), attention mask and labels."""
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(max(1, cols // 2), cols + 1, (rows,), generator=g)
    mask = (torch.arange(cols) < lengths[:, None]).long()
    ids = torch.randint(1, VOCAB, (rows, cols), generator=g) * mask
    return {"input_ids": ids, "attention_mask": mask, "labels": ids.masked_fill(mask == 0, -100)}


class AttachedMeter:
    """A started FlopMeter on ``model`` and the two hooks it registered with torch.

    ``per_micro_batch(batch)`` is what torch runs of the meter in one training step.
    """

    def __init__(self, model: nn.Module) -> None:
        self.model = model
        self.optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
        forward_before = set(model._forward_pre_hooks)
        step_before = set(_global_optimizer_post_hooks)
        self.meter = FlopMeter(model, pad_id=PAD_ID, measure_every=0, output=None).start()
        forward = [h for k, h in model._forward_pre_hooks.items() if k not in forward_before]
        step = [h for k, h in _global_optimizer_post_hooks.items() if k not in step_before]
        if len(forward) != 1 or len(step) > 1:
            raise RuntimeError(
                f"expected the meter to register one forward pre-hook and at most one global "
                f"step hook, found {len(forward)} and {len(step)}"
            )
        self.forward_hook: Callable[..., Any] = forward[0]
        self.step_hook: Callable[..., Any] | None = step[0] if step else None

    def per_micro_batch(self, batch: dict[str, torch.Tensor]) -> None:
        self.forward_hook(self.model, (), batch)
        if self.step_hook is not None:
            self.step_hook(self.optimizer, (), {})

    def close(self) -> None:
        self.meter.stop()


def held(meter: FlopMeter, model: nn.Module) -> dict[str, int]:
    """What the meter holds: the bytes of the tensors reachable from it (its device buffers;
    the model's own parameters, buffers and gradients left out) and the size of the Python
    objects reachable from it (``sys.getsizeof``; the model, the optimizer, modules, classes
    and functions' globals left out), with the count of those objects."""
    own = {id(model)}
    model_storage = set()
    for t in [*model.parameters(), *model.buffers()]:
        model_storage.add(t.untyped_storage().data_ptr())
        if t.grad is not None:
            model_storage.add(t.grad.untyped_storage().data_ptr())
    seen: set[int] = set()
    storages: dict[int, int] = {}
    host = objects = 0
    stack: list[Any] = [meter]
    while stack:
        obj = stack.pop()
        if id(obj) in seen or id(obj) in own:
            continue
        seen.add(id(obj))
        if isinstance(
            obj,
            nn.Module | torch.optim.Optimizer | types.ModuleType | type | types.FunctionType,
        ):
            continue
        if isinstance(obj, torch.Tensor):
            storage = obj.untyped_storage()
            if storage.data_ptr() not in model_storage:
                storages[storage.data_ptr()] = storage.nbytes()
            continue
        objects += 1
        host += sys.getsizeof(obj)
        if objects > 500_000:
            break
        stack.extend(gc.get_referents(obj))
    return {"tensor_bytes": sum(storages.values()), "host_bytes": host, "host_objects": objects}


def memory_growth(micro_batches: tuple[int, ...] = (10, 1000)) -> dict[str, Any]:
    """What a meter on a 2-layer model holds after each count of micro-batches, for one shape
    repeated and for a new shape every micro-batch (``rows`` fixed, ``cols`` growing).

    Returns:
        ``{"same_shape": [...], "new_shape_each": [...]}``, one entry per count with
        ``micro_batches``, ``distinct_shapes``, :func:`held`'s figures and ``traced_bytes``
        (Python memory allocated since the meter was made and still held, by tracemalloc).
    """
    out: dict[str, Any] = {}
    for mode in ("same_shape", "new_shape_each"):
        model = make_model(2)
        same = make_batch(4, 48)
        gc.collect()
        tracemalloc.start()
        base = tracemalloc.get_traced_memory()[0]
        attached = AttachedMeter(model)
        rows, done = [], 0
        for target in micro_batches:
            while done < target:
                batch = same if mode == "same_shape" else make_batch(1, 16 + done, seed=done)
                attached.per_micro_batch(batch)
                done += 1
            del batch
            gc.collect()
            rows.append(
                {
                    "micro_batches": done,
                    "distinct_shapes": 1 if mode == "same_shape" else done,
                    **held(attached.meter, model),
                    "traced_bytes": tracemalloc.get_traced_memory()[0] - base,
                }
            )
        tracemalloc.stop()
        counted = attached.meter.report().tokens.micro_batches
        attached.close()
        if counted != done:
            raise AssertionError(f"the meter saw {counted} micro-batches of {done}")
        out[mode] = rows
    return out
