"""Whose optimizer steps a model when the optimizer holds none of its parameters: DeepSpeed.

DeepSpeed's ZeRO optimizers (stages 1, 2 and 3, with or without offload) hand the torch
optimizer they wrap flat partitions of the parameters, not the model's own tensors, so an
optimizer step cannot be told as the model's by its parameters. It can by the engine that takes
it: the torch optimizer's step runs inside ``DeepSpeedEngine.step`` (through the ZeRO
optimizer's), and the engine names its model (``engine.module``) and its optimizer
(``engine.optimizer``, whose ``optimizer`` is the torch one). The engine steps the torch
optimizer once per accumulation boundary (``gradient_accumulation_steps`` in its config), and
never on a step it skips (an fp16 overflow), so counting that optimizer's steps counts the run's
optimizer steps as DeepSpeed does, once the torch steps of one model step (one per parameter
group, or per partition sub-group under ZeRO-3) are counted as one (:class:`EngineStep`).

Nothing here imports DeepSpeed: it is asked only when ``deepspeed`` is already imported.
"""

from __future__ import annotations

import sys
from typing import Any

from torch import nn

from flopmeter.internals import find_caller_local

__all__ = ["ENGINE_FRAMES", "EngineStep", "engine_optimizer", "stepping_engine"]

#: How many frames above the step hook the engine's ``step`` is looked for (the torch optimizer's
#: step wrapper, the ZeRO optimizer's step, the engine's ``_take_model_step`` and ``step``, with
#: room for offload and mixed-precision wrappers between them).
ENGINE_FRAMES = 16


def _engine_class() -> type | None:
    if "deepspeed" not in sys.modules:
        return None
    engine = sys.modules.get("deepspeed.runtime.engine")
    return getattr(engine, "DeepSpeedEngine", None)


def engine_optimizer(optimizer: Any) -> Any:
    """The torch optimizer a DeepSpeed ZeRO optimizer wraps (``optimizer.optimizer``), or
    ``optimizer`` itself when it is not one (a ``torch.optim.Optimizer``, or anything else)."""
    module = type(optimizer).__module__ or ""
    inner = getattr(optimizer, "optimizer", None)
    if module.startswith("deepspeed.") and inner is not None and hasattr(inner, "param_groups"):
        return inner
    return optimizer


def _optimizers_of(engine: Any) -> list[Any]:
    wrapper = getattr(engine, "optimizer", None)
    return [o for o in (wrapper, getattr(wrapper, "optimizer", None)) if o is not None]


def _engine_of(value: Any, engine_class: type, model: nn.Module) -> bool:
    """Whether ``value`` is a DeepSpeed engine training ``model`` (the engine itself, its
    module, or a module inside it)."""
    if not isinstance(value, engine_class):
        return False
    if value is model:
        return True
    inner = getattr(value, "module", None)
    return isinstance(inner, nn.Module) and any(m is model for m in inner.modules())


class EngineStep:
    """The model steps of one DeepSpeed engine, told apart from the torch optimizer's steps.

    A ZeRO optimizer steps the torch optimizer once per parameter group (stages 1 and 2) or
    per sub-group of partitions (stage 3) within one model step; the engine's ``global_steps``
    goes up once, after them. So a torch step is the first of a model step when the engine's
    count has moved since the last one counted.

    Args:
        engine: The ``DeepSpeedEngine`` whose ``step`` runs the optimizer.
    """

    def __init__(self, engine: Any) -> None:
        self.engine = engine
        self._last: object = None

    def first_of_model_step(self) -> bool:
        """Whether the torch optimizer's step now running is the first of an engine step."""
        now = getattr(self.engine, "global_steps", None)
        if not isinstance(now, int):
            return True  # no count to tell them apart: each is counted
        if now == self._last:
            return False
        self._last = now
        return True


def stepping_engine(optimizer: Any, model: nn.Module, *, skip: int = 1) -> EngineStep | None:
    """The DeepSpeed engine of ``model`` whose ``step`` runs ``optimizer``'s, now running, or
    ``None`` (none: DeepSpeed not imported, or the step is not an engine's).

    Called from the optimizer step hook, once per optimizer (the answer is kept by the caller):
    a walk of at most :data:`ENGINE_FRAMES` frames for the engine whose ``step`` this is.

    Args:
        optimizer: The optimizer whose step hook runs.
        model: The meter's model.
        skip: Frames between the caller and the hook's caller to skip.
    """
    engine_class = _engine_class()
    if engine_class is None:
        return None
    engine = find_caller_local(
        "self", lambda v: _engine_of(v, engine_class, model), skip=skip + 1, depth=ENGINE_FRAMES
    )
    if engine is None or not any(o is optimizer for o in _optimizers_of(engine)):
        return None
    return EngineStep(engine)
