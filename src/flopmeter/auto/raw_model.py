"""Which module a raw loop trains, found from what its optimizer steps (zero-code metering).

The model is the module the loop calls, and the optimizer says nothing of it: only the
parameters it steps. So, among the modules alive now, the candidates are those holding every
parameter the optimizer steps; the one chosen has the fewest *trainable* parameters
(``requires_grad``), outermost among equals:

* a model beside an EMA copy: the copy holds other tensors, it is no candidate;
* a container of the model and a trainable teacher or EMA (an ``nn.ModuleDict``): more
  trainable parameters than the model, so the model;
* a DDP (or ``torch.compile``) wrapper over the model: the same parameters, the wrapper is
  outermost, and it is what the loop calls;
* LoRA (the optimizer steps the adapters only): the inner ``LlamaModel`` holds every adapter
  but so does the ``PeftModel`` around it, and the frozen ``lm_head`` between them is not
  trainable: they tie, and the ``PeftModel`` (outermost) is chosen, not a LoRA layer. (Counting
  all parameters would choose the inner ``LlamaModel``, which the loop does not call.)

The modules alive are found once, with ``gc.get_objects()``; only the owners of one stepped
parameter and their ancestors are then looked at, so the cost is one pass over the objects and
the modules' child lists, not one over every module's parameters.
"""

from __future__ import annotations

import gc
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from torch import nn

from flopmeter.errors import ConfigurationError
from flopmeter.options import validate_pad_id

__all__ = ["Found", "find_model", "pad_id_of_model", "parameter_count"]


@dataclass(frozen=True)
class Found:
    """The module found, or why none was.

    Attributes:
        module: The module chosen (``None``: none holds every stepped parameter).
        candidates: How many modules hold every stepped parameter.
        ambiguous: How many unrelated modules tied (1: none did).
        reason: Why none was found (``module`` is ``None``), one sentence.
    """

    module: nn.Module | None
    candidates: int = 0
    ambiguous: int = 1
    reason: str | None = None


def parameter_count(module: nn.Module, *, trainable: bool = False) -> int:
    """The module's parameter elements (each tensor once), or only those with
    ``requires_grad``."""
    return sum(p.numel() for p in module.parameters() if p.requires_grad or not trainable)


def _contains(outer: nn.Module, inner: nn.Module) -> bool:
    return any(m is inner for m in outer.modules())


def _outermost(modules: Sequence[nn.Module]) -> list[nn.Module]:
    return [m for m in modules if not any(o is not m and _contains(o, m) for o in modules)]


def _alive_modules() -> list[nn.Module]:
    return [obj for obj in gc.get_objects() if issubclass(type(obj), nn.Module)]  # no __class__


def find_model(stepped: Sequence[Any], modules: Sequence[nn.Module] | None = None) -> Found:
    """The module whose parameters are ``stepped`` (an optimizer's), by the rule above.

    Args:
        stepped: The tensors the optimizer steps.
        modules: The modules to choose from (default: every module alive).
    """
    want = {id(p) for p in stepped}
    if not want:
        return Found(None, reason="the optimizer steps no parameters")
    alive = _alive_modules() if modules is None else list(modules)
    first = stepped[0]
    owners = [m for m in alive if any(v is first for v in m.parameters(recurse=False))]
    if not owners:
        return Found(None, reason="no torch.nn.Module holds the tensors the optimizer steps")
    parents: dict[int, list[nn.Module]] = {}
    for m in alive:
        for child in m.children():
            parents.setdefault(id(child), []).append(m)
    seen: dict[int, nn.Module] = {}
    todo = list(owners)
    while todo:
        m = todo.pop()
        if id(m) not in seen:
            seen[id(m)] = m
            todo.extend(parents.get(id(m), ()))
    candidates = [m for m in seen.values() if want <= {id(p) for p in m.parameters()}]
    if not candidates:
        return Found(
            None,
            reason=f"no torch.nn.Module holds every one of the {len(want)} tensors the "
            "optimizer steps (two models, or a tensor outside any module)",
        )
    counts = {id(m): parameter_count(m, trainable=True) for m in candidates}
    fewest = min(counts.values())
    best = [m for m in candidates if counts[id(m)] == fewest]
    outer = _outermost(best)
    if len(outer) == 1:
        return Found(outer[0], candidates=len(candidates))
    shared = [m for m in best if all(_contains(o, m) for o in outer)]  # what every one calls
    chosen = _outermost(shared)[0] if shared else outer[0]
    return Found(chosen, candidates=len(candidates), ambiguous=len(outer))


def pad_id_of_model(model: Any) -> int | None:
    """The padding id in the model's config (``pad_token_id``), looking through wrappers
    (DDP's ``module``, ``torch.compile``'s ``_orig_mod``); ``None`` when none has a usable
    one."""
    for _ in range(8):
        config = getattr(model, "config", None)
        try:
            pad = validate_pad_id(getattr(config, "pad_token_id", None))
        except ConfigurationError:
            pad = None
        if pad is not None:
            return pad
        inner = getattr(model, "module", None) or getattr(model, "_orig_mod", None)
        if not isinstance(inner, nn.Module):
            return None
        model = inner
    return None
