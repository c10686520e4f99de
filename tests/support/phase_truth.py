"""PyTorch's own count of a whole run, split by the model whose forward call runs each operator:
the truth a phase of the meter's report is held to, with nothing of flopmeter's involved.

:func:`count_by_model` runs a callable under a ``FlopCounterMode`` subclass whose every
operator is filed under the innermost watched model whose forward call is running (with
whether gradients were on and whether the trained model was in training mode), or under
``"backward"`` inside a backward pass, or ``"outside"`` otherwise.
"""

from __future__ import annotations

import collections
from collections.abc import Callable, Mapping
from typing import Any

import torch
from torch.utils.flop_counter import FlopCounterMode


def count_by_model(run: Callable[[], Any], models: Mapping[str, torch.nn.Module]) -> dict[str, int]:
    """FLOP of ``run()`` by ``"<name>/grad"`` or ``"<name>/nograd"`` (the forward calls of each
    named model), ``"backward"`` and ``"outside"``; ``"total"`` is their sum.

    Args:
        run: What to count (``trainer.train``).
        models: The models to file operators under, by name (the first one holding a running
            forward call, innermost first).
    """
    stack: list[str] = []
    handles = []
    for name, module in models.items():

        def pre(m: Any, args: Any, kwargs: Any, name: str = name) -> None:
            stack.append(f"{name}/{'grad' if torch.is_grad_enabled() else 'nograd'}")

        def post(m: Any, args: Any, kwargs: Any, out: Any) -> None:
            if stack:
                stack.pop()

        handles.append(module.register_forward_pre_hook(pre, with_kwargs=True))
        handles.append(module.register_forward_hook(post, with_kwargs=True, always_call=True))
    counts: collections.Counter[str] = collections.Counter()

    class ByModel(FlopCounterMode):
        def _count_flops(self, func_packet: Any, out: Any, args: Any, kwargs: Any) -> Any:
            formula = self.flop_registry.get(func_packet)
            if formula is not None:
                flops = formula(*args, **kwargs, out_val=out)
                if torch._C._current_graph_task_id() != -1:
                    key = "backward"
                else:
                    key = stack[-1] if stack else "outside"
                counts[key] += flops
            return out

    # TRL's fused head accumulates its weight gradient with the in-place aten.addmm_, for which
    # PyTorch's registry has no formula: counted as the out-of-place addmm is.
    def addmm_(self_shape: Any, a: Any, b: Any, *rest: Any, **kwargs: Any) -> int:
        return 2 * a[0] * a[1] * b[1]  # 2 x [m, k] @ [k, n]

    in_place = {torch.ops.aten.addmm_: addmm_}
    try:
        with ByModel(display=False, custom_mapping=in_place):
            run()
    finally:
        for handle in handles:
            handle.remove()
    out = dict(counts)
    out["total"] = sum(counts.values())
    return out
