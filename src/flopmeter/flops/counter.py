"""The counting mode of one sample: PyTorch's FLOP counter, split by kind of work.

A :class:`SampleCounter` runs a :class:`torch.utils.flop_counter.FlopCounterMode` (built by
:func:`flopmeter.internals.flop_counter_class`, with flopmeter's formulas from
:mod:`flopmeter.flops.aten_ops`) and adds each operator's FLOP to one of four totals:
attention-score work, linear work, per-micro-batch work, or activation-checkpoint recomputation
(forward passes run again inside a backward pass, told apart by module hooks; left out of the
estimate, Commission guidelines Annex A.1). Per-micro-batch work is LoRA's ``B @ A`` products
for parameters peft's ``ParamWrapper`` wraps (mixture-of-experts weights): in the forward pass,
what runs inside a ``ParamWrapper`` call but outside its base layer, or inside a peft
parametrization of the wrapped weight; in the backward pass, the autograd nodes of the graph that
parametrization's output was built by (marked with node hooks). A batched product (``bmm``,
``baddbmm``, which ``torch.einsum`` and ``torch.matmul`` dispatch too) is attention-score work
only when no operand derives from a parameter (:mod:`flopmeter.flops.weight_operands`): one
that applies a weight is linear work. It stops counting once closed, never lets a formula's
error reach the user's operator, and remembers compute-like operators that had no formula.
"""

from __future__ import annotations

import contextlib
import functools
import threading
from typing import Any

import torch
from torch.nn.utils import parametrize

from flopmeter import internals
from flopmeter.flops.aten_ops import (
    BLOCK_SPARSE_OPS,
    SDPA_BACKWARD_OPS,
    is_compute_like,
    measured_formulas,
    op_kind,
    op_name,
    sdpa_backward_needed_flop,
)
from flopmeter.flops.watched_call import current_call
from flopmeter.flops.weight_operands import BATCHED_PRODUCTS, WeightOperands

__all__ = ["SampleCounter"]

# Per thread: how deep the current module call is inside a recomputation (a forward pass run
# during backward); while positive, FLOP are recomputation.
_recompute = threading.local()
# Per thread: ``shapes``, the shapes of the 3-D parameters of the modules that ran in the sample
# (both ways round), which tell a batched product over expert weights from attention's.
_weights = threading.local()
# Per thread: ``stack``, whether each module call now running builds LoRA products (its top
# decides in the forward pass); ``nodes``, how many marked autograd nodes are running.
_delta = threading.local()

#: Most autograd nodes marked behind one parametrization output (B @ A, casts, reshapes).
_MAX_DELTA_NODES = 64


def _parameter_of(tensor: Any) -> torch.nn.Parameter | None:
    """The parameter ``tensor`` is, or is a view of (a transposed weight in the backward)."""
    if isinstance(tensor, torch.nn.Parameter):
        return tensor
    base = getattr(tensor, "_base", None) if isinstance(tensor, torch.Tensor) else None
    return base if isinstance(base, torch.nn.Parameter) else None


def _is_peft(module: torch.nn.Module) -> bool:
    return type(module).__module__.startswith("peft.")


def _builds_delta(module: torch.nn.Module, inside: bool = False) -> bool:
    """Whether ``module``'s own work is LoRA products: a peft ``ParamWrapper``, a
    parametrization (``torch.nn.utils.parametrize``) holding a peft module, or, ``inside`` one of
    these, a peft module that wraps no base layer (peft's parametrization proxies)."""
    if isinstance(module, parametrize.ParametrizationList):
        return any(_is_peft(m) for m in module)
    if not _is_peft(module):
        return False
    if type(module).__name__ == "ParamWrapper":
        return True
    return inside and not hasattr(module, "base_layer")


def _node_enter(*args: Any) -> None:
    _delta.nodes = getattr(_delta, "nodes", 0) + 1


def _node_exit(*args: Any) -> None:
    _delta.nodes = max(getattr(_delta, "nodes", 0) - 1, 0)


def _mark_delta_graph(output: Any) -> None:
    """Marks the autograd nodes that built a LoRA-parametrized weight (down to the leaves)."""
    node = getattr(output, "grad_fn", None)
    todo, seen = ([node] if node is not None else []), set()
    while todo and len(seen) < _MAX_DELTA_NODES:
        node = todo.pop()
        if id(node) in seen or not hasattr(node, "register_prehook"):
            continue
        seen.add(id(node))
        if type(node).__name__ == "AccumulateGrad":
            continue
        node.register_prehook(_node_enter)
        node.register_hook(_node_exit)
        todo.extend(n for n, _ in node.next_functions if n is not None)


def _note_batched_weights(module: torch.nn.Module) -> None:
    """Remembers the shapes of ``module``'s own 3-D parameters, and their transposes."""
    shapes = getattr(_weights, "shapes", None)
    if shapes is None:
        shapes = _weights.shapes = set()
    for param in module.parameters(recurse=False):
        if param.dim() == 3:
            e, d_in, d_out = param.shape
            shapes.update({(e, d_in, d_out), (e, d_out, d_in)})


def _recompute_pre_hook(module: torch.nn.Module, args: Any) -> None:
    _note_batched_weights(module)
    if internals.in_backward_pass():
        _recompute.depth = getattr(_recompute, "depth", 0) + 1
    stack = getattr(_delta, "stack", None)
    if stack is None:
        stack = _delta.stack = []
    stack.append(_builds_delta(module, inside=bool(stack and stack[-1])))


def _recompute_post_hook(module: torch.nn.Module, args: Any, output: Any) -> None:
    if internals.in_backward_pass() and getattr(_recompute, "depth", 0) > 0:
        _recompute.depth -= 1
    stack = getattr(_delta, "stack", None)
    if stack:
        stack.pop()
    if isinstance(module, parametrize.ParametrizationList) and _builds_delta(module):
        _mark_delta_graph(output)


def _in_delta() -> bool:
    """Whether the operator now dispatched builds (or differentiates) a LoRA product."""
    stack = getattr(_delta, "stack", None)
    return bool(stack and stack[-1]) or getattr(_delta, "nodes", 0) > 0


def _route(flop_counter: Any, func_packet: Any, out: Any, args: Any, kwargs: Any) -> None:
    """Hands one operator the mode saw to the :class:`SampleCounter` that owns the mode."""
    owner = flop_counter.flopmeter_counter
    owner.count(flop_counter.flop_registry, func_packet, out, args, kwargs)


@functools.cache
def _needed_attention_backward(args: Any, flops: int) -> int:
    """A fused attention backward's FLOP counted for the gradients its inputs need (their
    ``requires_grad``, kept on the tensors saved for backward), else its formula's ``flops``."""
    q, k, v = args[1:4]
    flags = [getattr(t, "requires_grad", None) for t in (q, k, v)]
    if not all(isinstance(f, bool) for f in flags) or not any(flags):
        return flops
    return sdpa_backward_needed_flop(q.shape, k.shape, v.shape, *flags)


def _mode_class() -> type:
    """The counting mode's class, made on first use (importing the counter imports triton)."""
    return internals.flop_counter_class(_route)


class SampleCounter:
    """Counts the FLOP of one sample: linear, attention, per-micro-batch and recompute work.

    Attributes:
        flop_counter: The ``FlopCounterMode`` (pushed by :meth:`enter`, popped by :meth:`exit`).
        linear: FLOP of work that grows with tokens.
        attention: FLOP of attention-score work (grows with seq_len^2).
        per_micro_batch: FLOP of work that is the same in every micro-batch (LoRA's ``B @ A``
            for wrapped parameters).
        recompute: FLOP of activation-checkpoint recomputation.
        custom_recompute: FLOP (within ``linear``) of products a custom autograd function's
            backward ran again from its forward (TRL's fused LM head recomputes its logits).
        closed: Counting has stopped (the mode may still be on the dispatch stack).
        forward_flops: ``linear + attention`` when the sample's forward pass ended, in FLOP.
        unknown: Compute-like operators seen without a formula.
        failed: ``"op: error"`` for each formula that raised.
        weights: The sample's weight-derived tensors, which tell a batched product that
            applies a weight (linear work) from one over two activations.
        block_sparse: Operators counted that compute only the blocks a mask keeps (flex
            attention), billed as the full square: the count is an upper value
            (:data:`~flopmeter.flops.aten_ops.FLEX_ATTENTION_NOTE` says so).
    """

    def __init__(self) -> None:
        self.flop_counter = _mode_class()(display=False, custom_mapping=measured_formulas())
        self.flop_counter.flopmeter_counter = self
        #: Operators of a watched call (another model, the trained model without gradients)
        #: go to that call (:func:`flopmeter.flops.watched_call.current_call`), not to this count.
        self.flop_counter.flopmeter_routes_calls = True
        self.linear = 0
        self.attention = 0
        self.per_micro_batch = 0
        self.recompute = 0
        self.custom_recompute = 0
        self._no_grad_products: set[tuple[Any, ...]] = set()
        self.weights = WeightOperands()
        self.closed = False
        self.forward_flops: int | None = None
        self.unknown: set[str] = set()
        self.failed: list[str] = []
        self.block_sparse: set[str] = set()
        self._hooks: list[Any] = []

    @property
    def total(self) -> int:
        """FLOP counted for the estimate so far (linear, attention and per-micro-batch work)."""
        return self.linear + self.attention + self.per_micro_batch

    def _custom_recompute(self, name: str, args: Any) -> bool:
        """Whether this product is a custom autograd function's backward running again a
        product its forward ran without gradients (same operator, same operand shapes): TRL's
        fused LM head recomputes its logits so. Products run without gradients outside a
        backward pass are remembered for it."""
        if not isinstance(args, (tuple, list)):
            return False
        shapes = (name, *(tuple(a.shape) for a in args if isinstance(a, torch.Tensor)))
        if internals.in_backward_pass():
            return shapes in self._no_grad_products and internals.in_custom_function_backward()
        if not torch.is_grad_enabled():
            self._no_grad_products.add(shapes)
        return False

    def _applies_weight(self, name: str, args: Any, out: Any) -> bool:
        """Whether a batched product (``bmm``, ``baddbmm``: filed as attention) applies a
        weight instead: its work grows with the tokens, not with the square of the lengths.

        Told by :class:`~flopmeter.flops.weight_operands.WeightOperands`: an operand derived
        from a parameter (``torch.einsum``, ``torch.matmul`` or ``torch.bmm`` over a weight of
        any shape; mixture-of-experts weights stored ``[experts, d_in, d_out]`` and applied
        with ``torch.bmm``, as Llama 4's ``Llama4TextExperts``), or in the backward pass the
        weight gradient of such a product. Also by an operand or output of the shape of a 3-D
        parameter of a module that ran in this sample, either way round (a copy of the weight
        made before the sample began). An attention product of exactly such a shape would be
        filed as linear work: its batch would have to be the expert count and its lengths the
        weight's widths.
        """
        if name not in BATCHED_PRODUCTS or not isinstance(args, (tuple, list)):
            return False
        forward = not internals.in_backward_pass() or getattr(_recompute, "depth", 0) > 0
        applies = self.weights.applies(name, args, out, forward=forward)
        shapes = getattr(_weights, "shapes", None)
        if shapes is None:
            shapes = _weights.shapes = set()
        tensors = [a for a in args if isinstance(a, torch.Tensor)]
        for tensor in tensors:
            param = _parameter_of(tensor)
            if param is not None and param.dim() == 3:
                e, d_in, d_out = param.shape
                shapes.update({(e, d_in, d_out), (e, d_out, d_in)})  # for its weight gradient
                applies = True
        if applies:
            return True
        if isinstance(out, torch.Tensor):
            tensors.append(out)
        return any(t.dim() == 3 and tuple(t.shape) in shapes for t in tensors)

    def count(self, registry: Any, func_packet: Any, out: Any, args: Any, kwargs: Any) -> None:
        """Adds one operator's FLOP (from its formula in ``registry``) to its total."""
        if self.closed:
            return
        call = current_call()
        if call is not None and not call.sampling:
            return  # another model's work (or a no-grad call) that is not sampled: not ours
        if call is None:
            with contextlib.suppress(Exception):  # never fails the user's operator
                self.weights.track(args, kwargs, out)
        formula = registry.get(func_packet)
        name = op_name(func_packet)
        if formula is None:
            if call is None and is_compute_like(name):
                self.unknown.add(name)
            return
        if name in BLOCK_SPARSE_OPS:
            self.block_sparse.add(name)
        try:
            flops = int(formula(*args, **kwargs, out_val=out))
            if name in SDPA_BACKWARD_OPS:
                flops = _needed_attention_backward(args, flops)
        except Exception as exc:  # a formula must never fail the user's operator
            if call is not None:
                call.sampling = False
                return
            self.failed.append(f"{name}: {type(exc).__name__}: {exc}")
            return
        if call is not None:
            call.add(flops)  # the watched call's own work, in its phase
            return
        kind = op_kind(name)
        if kind == "attention" and self._applies_weight(name, args, out):
            kind = "linear"  # also in a recomputation: its weights are remembered for backward
        if getattr(_recompute, "depth", 0) > 0:
            self.recompute += flops
        elif kind != "attention" and self._custom_recompute(name, args):
            # Counted as linear work, as the profile counts it ("recomputed there once"), and
            # kept apart so the backward's share is judged without it.
            self.linear += flops
            self.custom_recompute += flops
        elif _in_delta():
            self.per_micro_batch += flops
        elif kind == "attention":
            self.attention += flops
        else:
            self.linear += flops

    def enter(self) -> None:
        """Registers the recomputation hooks and pushes the mode onto the dispatch stack."""
        _weights.shapes = set()
        self._hooks = [
            torch.nn.modules.module.register_module_forward_pre_hook(_recompute_pre_hook),
            torch.nn.modules.module.register_module_forward_pre_hook(self.weights.note_module),
            torch.nn.modules.module.register_module_forward_hook(
                _recompute_post_hook, always_call=True
            ),
        ]
        try:
            self.flop_counter.__enter__()
        except Exception:
            self._remove_hooks()
            raise

    def on_top(self) -> bool:
        """Whether the mode is the innermost dispatch mode of this thread (safe to pop)."""
        # FlopCounterMode pushes its dispatch mode, ``.mode``, when entered.
        return internals.current_dispatch_mode() is self.flop_counter.mode

    def exit(self) -> None:
        """Pops the mode (it must be :meth:`on_top`) and removes the recomputation hooks."""
        try:
            self.flop_counter.__exit__(None, None, None)
        finally:
            self._remove_hooks()
            _recompute.depth = 0
            _delta.stack, _delta.nodes = [], 0
            _weights.shapes = set()
            self.weights = WeightOperands()

    def _remove_hooks(self) -> None:
        for handle in self._hooks:
            handle.remove()
        self._hooks = []
