"""Which batched products apply a weight: operands derived from a parameter, as the dispatch
counter sees them.

The registry files ``bmm`` and ``baddbmm`` as attention-score work (it grows with the squared
length), but ``torch.einsum``, ``torch.matmul`` and ``torch.bmm`` over a parameter dispatch them
too: ``torch.einsum("bld,de->ble", x, w)`` runs ``bmm([1, b*l, d], [1, d, e])`` on a view of
``w``, work that grows with the tokens. A :class:`WeightOperands` follows, within one sample,
which tensors derive from a parameter: a parameter (or a floating-point buffer of a module that
ran in the sample, a fixed tensor too: a rotary embedding's ``inv_freq``, which transformers
multiplies by the positions with ``@``), a view of one (``Tensor._base``), or the
output of an operator whose tensor inputs (0-d tensors aside) all so derive (a reshape, a
transpose, an expand, a cast to the autocast dtype, a contiguous copy; also a weight computed
from parameters alone, such as a merged ``A @ B``). A batched product with such an operand
applies a weight: linear work. Its weight gradient in the backward pass has none
(``x^T @ dY``): it is told by its output, of the shape of a weight operand a product applied in
the forward pass, together with an operand that is (a view of) the activation such a product
applied its weight to. Activation x activation products (attention scores) stay attention.

Only identities, shapes and ``_base`` are read: no host synchronisation. A weight sliced to the
sequence length (a token-mixing matrix ``w[:L, :L]``) is filed as linear although its work grows
with the square: the text rule's check on the samples themselves
(:func:`flopmeter.flops.rule_check.text_rule_contradiction`) sees that.
"""

from __future__ import annotations

import contextlib
import weakref
from typing import Any

import torch

__all__ = ["BATCHED_PRODUCTS", "WeightOperands"]

#: Batched products the registry files as attention, with the positions of their two operands.
BATCHED_PRODUCTS: dict[str, tuple[int, int]] = {"bmm": (0, 1), "baddbmm": (1, 2)}

_Table = dict[int, "weakref.ref[torch.Tensor]"]


def _tensors(args: Any, kwargs: Any = None) -> list[torch.Tensor]:
    """The tensors among ``args`` (one level of lists included) and ``kwargs``' values."""
    values = [*args, *(kwargs or {}).values()] if isinstance(args, (tuple, list)) else [args]
    found: list[torch.Tensor] = []
    for value in values:
        if isinstance(value, torch.Tensor):
            found.append(value)
        elif isinstance(value, (list, tuple)):
            found.extend(v for v in value if isinstance(v, torch.Tensor))
    return found


def _root(tensor: torch.Tensor) -> torch.Tensor:
    """The tensor ``tensor`` is a view of (itself when it is none)."""
    base = getattr(tensor, "_base", None)
    return base if isinstance(base, torch.Tensor) else tensor


def _known(table: _Table, tensor: torch.Tensor) -> bool:
    ref = table.get(id(tensor))
    return ref is not None and ref() is tensor


def _remember(table: _Table, tensor: torch.Tensor) -> None:
    with contextlib.suppress(TypeError):  # a tensor-like that takes no weak reference
        table[id(tensor)] = weakref.ref(tensor)


class WeightOperands:
    """The weight-derived tensors of one sample and what its batched products applied them to.

    Attributes:
        shapes: Shapes of the weight operands the sample's batched products applied (a weight
            gradient has one of them).
    """

    def __init__(self) -> None:
        self._derived: _Table = {}
        self._partners: _Table = {}
        self.shapes: set[tuple[int, ...]] = set()

    def note_module(self, module: torch.nn.Module, args: Any = None) -> None:
        """Remembers ``module``'s own floating-point buffers as weights (a forward pre-hook)."""
        for buffer in module.buffers(recurse=False):
            if buffer.is_floating_point():
                _remember(self._derived, buffer)

    def derived(self, tensor: Any) -> bool:
        """Whether ``tensor`` is a parameter, a view of one, or was computed from them alone."""
        if not isinstance(tensor, torch.Tensor):
            return False
        for t in (tensor, _root(tensor)):
            if isinstance(t, torch.nn.Parameter) or _known(self._derived, t):
                return True
        return False

    def track(self, args: Any, kwargs: Any, out: Any) -> None:
        """Marks the outputs of one operator as weight-derived when all its tensor inputs
        (0-d tensors aside) are, the first of them included."""
        inputs = _tensors(args, kwargs)
        if not inputs or not self.derived(inputs[0]):
            return
        if all(t.dim() == 0 or self.derived(t) for t in inputs[1:]):
            for tensor in _tensors((out,)):
                _remember(self._derived, tensor)

    def applies(self, name: str, args: Any, out: Any, *, forward: bool) -> bool:
        """Whether the batched product ``name`` (one of :data:`BATCHED_PRODUCTS`) applies a
        weight: an operand derives from a parameter; or, outside the forward pass, its output
        has the shape of a weight operand applied before and an operand is (a view of) an
        activation a weight was applied to (the weight gradient).

        Args:
            forward: Whether the product is a forward one (a recomputed forward pass too): its
                weight operands and their activations are remembered for the backward pass.
        """
        where = BATCHED_PRODUCTS.get(name)
        if where is None or not isinstance(args, (tuple, list)) or len(args) <= max(where):
            return False
        operands = [args[i] for i in where]
        if not all(isinstance(t, torch.Tensor) for t in operands):
            return False
        weights = [self.derived(t) for t in operands]
        if any(weights):
            if forward:
                for tensor, weight in zip(operands, weights, strict=True):
                    if weight:
                        self.shapes.add(tuple(tensor.shape))
                    else:
                        _remember(self._partners, _root(tensor))
            return True
        if forward or not isinstance(out, torch.Tensor) or tuple(out.shape) not in self.shapes:
            return False
        return any(_known(self._partners, _root(t)) for t in operands)
