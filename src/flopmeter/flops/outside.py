"""Weights used outside their module, found by the weight during the profiled micro-batch.

TRL's ``SFTTrainer`` (its fused LM head: ``trl.trainer.utils.add_fused_lm_head``, which calls
``trl.kernels.ChunkedLogProbFunction`` on ``lm_head.weight``) and fused linear-cross-entropy
kernels (Liger, cut-cross-entropy, Unsloth) multiply the hidden states by the output
projection's weight without calling its module, so no module hook sees that work. A
:class:`WeightWatch` (a ``TorchFunctionMode``, on the stack only while the first training
micro-batch is profiled) looks at every matrix product and finds those that take a known weight
matrix, or a view of it (a slice, a transpose), as an operand while that weight's module is not
running. Only shapes and ``requires_grad`` flags are read: no host synchronisation.
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.overrides import TorchFunctionMode

from flopmeter import internals
from flopmeter.flops.build import CallRecord, Captured

__all__ = ["KnownWeight", "WeightWatch", "sweep_stranded"]

Tensor = torch.Tensor
#: Products flopmeter counts: ``(func, index of the left operand, index of the right one)``.
_PRODUCTS: dict[Any, tuple[int, int]] = {
    F.linear: (0, 1),
    torch.matmul: (0, 1),
    torch.mm: (0, 1),
    torch.addmm: (1, 2),
    Tensor.__matmul__: (0, 1),
    Tensor.__rmatmul__: (1, 0),
    Tensor.matmul: (0, 1),
    Tensor.mm: (0, 1),
    Tensor.addmm: (1, 2),
    Tensor.addmm_: (1, 2),
}
#: Other compute on a weight: no rule here, so the measured cross-check is taken.
_NO_RULE = frozenset(
    {
        torch.einsum,
        torch.bmm,
        torch.baddbmm,
        torch.tensordot,
        torch.mv,
        torch.addmv,
        torch.dot,
        torch.inner,
        torch.outer,
        torch.linalg.multi_dot,
        F.bilinear,
        F.conv1d,
        F.conv2d,
        F.conv3d,
        Tensor.bmm,
        Tensor.baddbmm,
        Tensor.mv,
        Tensor.dot,
    }
)


#: Copies that keep what a tensor is (a cast to the autocast dtype, a contiguous copy): TRL's
#: fused head multiplies by ``weight[start:end].to(compute_dtype)``, under bf16 autocast a copy.
_COPIES = frozenset(
    {
        Tensor.to,
        Tensor.type,
        Tensor.float,
        Tensor.half,
        Tensor.bfloat16,
        Tensor.double,
        Tensor.contiguous,
        Tensor.clone,
        torch.clone,
    }
)


#: Every function the watch looks at; all others pass through untouched.
_WATCHED = frozenset({*_PRODUCTS, *_NO_RULE, *_COPIES})


@dataclass(frozen=True)
class KnownWeight:
    """A weight matrix the profile knows, with its module.

    Attributes:
        name: The module's qualified name.
        kind: The module's kind ("linear", "lm_head", ...).
        weight: The parameter.
    """

    name: str
    kind: str
    weight: nn.Parameter


def _operands(args: Any) -> list[Tensor]:
    """Tensors among ``args``, one level of lists included (``einsum``, ``multi_dot``)."""
    found: list[Tensor] = []
    for value in args:
        if isinstance(value, Tensor):
            found.append(value)
        elif isinstance(value, (list, tuple)):
            found.extend(v for v in value if isinstance(v, Tensor))
    return found


def _storage_address(tensor: Tensor) -> int:
    """The address of ``tensor``'s storage, 0 when it has none (meta, or no storage at all)."""
    try:
        return 0 if tensor.is_meta else int(tensor.untyped_storage().data_ptr())
    except (RuntimeError, NotImplementedError):  # tensor subclasses without storage
        return 0


def _base_requires_grad(tensor: Tensor) -> bool:
    """Whether ``tensor`` or the tensor it is a view of requires a gradient."""
    base = internals.view_base(tensor)
    return tensor.requires_grad or (base is not None and base.requires_grad)


class WeightWatch(TorchFunctionMode):
    """Records matrix products that use a known weight outside its module.

    Args:
        known: The weights, by ``id`` of the parameter.
        seen: Where the records go (``calls``, ``outside``, ``unmodelled``).
    """

    def __init__(self, known: dict[int, KnownWeight], seen: Captured) -> None:
        super().__init__()
        self.known = known
        self.seen = seen
        self.closed = False
        self._running: dict[int, int] = {}
        #: Copies of a known weight, or of a tensor that needs a gradient made with gradients
        #: disabled, by ``id``: ``(the copy, weakly; the weight or None, whether it needs one)``.
        self._copies: dict[int, tuple[Any, KnownWeight | None, bool]] = {}
        #: Known weights by storage address, made on first use.
        self._storages: dict[int, KnownWeight] | None = None

    def hook_modules(self, modules: dict[int, nn.Module]) -> list[tuple[nn.Module, Any]]:
        """Marks each weight's module as running during its own calls.

        Returns:
            ``(module, handle)`` for every hook registered.
        """
        handles = []
        for key, module in modules.items():

            def enter(mod: nn.Module, args: Any, key: int = key) -> None:
                self._running[key] = self._running.get(key, 0) + 1

            def leave(mod: nn.Module, args: Any, out: Any, key: int = key) -> None:
                self._running[key] = max(0, self._running.get(key, 0) - 1)

            handles.append((module, module.register_forward_pre_hook(enter)))
            handles.append((module, module.register_forward_hook(leave, always_call=True)))
        return handles

    def __torch_function__(
        self, func: Any, types: Any, args: tuple[Any, ...] = (), kwargs: Any = None
    ) -> Any:
        kwargs = kwargs or {}
        if self.closed or func not in _WATCHED:
            # Everything but the products and copies passes straight through, asking nothing
            # else: torch.compiler.is_compiling() asked here for every call breaks a compiled
            # flex_attention on inputs needing a gradient (dynamo tracing the mode gets the
            # question's answer for ``query.dim()``: "query.dim: False", torch 2.13)
            return func(*args, **kwargs)
        if torch.compiler.is_compiling():
            # traced by torch.compile (a compiled function inside the model): pass through, so
            # dynamo sees nothing of the watch's own state
            return func(*args, **kwargs)
        out = func(*args, **kwargs)
        if func in _COPIES:
            self._note_copy(args, out)
        elif func in _PRODUCTS or func in _NO_RULE:
            try:
                self._inspect(func, args, out)
            except Exception as exc:  # the meter never breaks training
                self.seen.errors.append(f"{type(exc).__name__}: {exc}")
        return out

    def _copy_of(self, tensor: Tensor) -> tuple[KnownWeight | None, bool] | None:
        """What ``tensor``, or the tensor it is a view of, is a recorded copy of."""
        for candidate in (tensor, internals.view_base(tensor)):
            entry = self._copies.get(id(candidate)) if candidate is not None else None
            if entry is not None and entry[0]() is candidate:
                return entry[1], entry[2]
        return None

    def _note_copy(self, args: tuple[Any, ...], out: Any) -> None:
        """Remembers a copy of a known weight, or a no-grad copy of a tensor needing a grad."""
        source = args[0] if args else None
        if not isinstance(source, Tensor) or not isinstance(out, Tensor) or out is source:
            return
        known = self._find(source)
        needs_grad = not torch.is_grad_enabled() and self._needs_grad(source)
        if known is not None or needs_grad:
            self._copies[id(out)] = (weakref.ref(out), known, needs_grad)

    def _needs_grad(self, tensor: Tensor) -> bool:
        """Whether ``tensor``, the tensor it is a view of, or what it was copied from with
        gradients disabled, requires a gradient."""
        copied = self._copy_of(tensor)
        return _base_requires_grad(tensor) or bool(copied is not None and copied[1])

    def _find(self, tensor: Tensor) -> KnownWeight | None:
        known = self.known.get(id(tensor))
        if known is None:
            base = internals.view_base(tensor)
            known = self.known.get(id(base)) if base is not None else None
        if known is None:
            copied = self._copy_of(tensor)
            known = copied[0] if copied is not None else None
        return known

    def _by_storage(self, tensors: list[Tensor]) -> KnownWeight | None:
        """The known weight whose memory one of ``tensors`` reads without being the weight, a
        view autograd knows, or a recorded copy: what code compiled by torch.compile passes to
        its matrix products (it reinterprets the weight's storage). Reads storage addresses only
        (no host synchronisation); weights on the meta device have none."""
        if self._storages is None:
            self._storages = {}
            for known in self.known.values():
                ptr = _storage_address(known.weight)
                if ptr:
                    self._storages.setdefault(ptr, known)
        for tensor in tensors:
            known = self._storages.get(_storage_address(tensor))
            if known is not None:
                return known
        return None

    def _inspect(self, func: Any, args: tuple[Any, ...], out: Any) -> None:
        operands = _operands(args)
        hits = [(t, k) for t in operands if (k := self._find(t)) is not None]
        if not hits:
            known = self._by_storage(operands)
            if known is not None and not self._running.get(id(known.weight)):
                self.seen.unmodelled.setdefault(
                    known.name,
                    "a matrix product read its weight's memory without taking the weight "
                    "(code compiled by torch.compile does this), so that work is not modelled",
                )
            return
        tensor, known = hits[0]
        if self._running.get(id(known.weight)):
            return  # its module's own call, counted by the module's hook
        name = getattr(func, "__name__", str(func))
        if func not in _PRODUCTS or not isinstance(out, Tensor):
            self.seen.unmodelled[known.name] = f"its weight went through {name}, no rule for it"
            return
        left, right = (args[i] for i in _PRODUCTS[func])
        other = right if left is tensor else left
        contracted = left.shape[-1] if func is not F.linear else right.shape[-1]
        macs = out.numel() * int(contracted)
        grad = torch.is_grad_enabled()
        input_grad = other.requires_grad if grad else self._needs_grad(other)
        calls = self.seen.calls[known.name]
        calls.append(
            CallRecord(
                known.kind, macs, 1, input_grad=input_grad, weight_grad=known.weight.requires_grad
            )
        )
        if not grad and input_grad:  # a custom autograd function's forward (TRL's fused head)
            self.seen.unmodelled.setdefault(
                known.name,
                f"its weight went through {name} inside a custom autograd function, whose "
                "backward the profile does not see (input gradient assumed, and the product "
                "recomputed there once, as TRL's fused LM head does)",
            )
            calls.append(CallRecord(known.kind, macs, 1, False, False, first=False))
        self.seen.outside[known.name] = self.seen.outside.get(known.name, 0) + 1

    def leave(self) -> bool:
        """Stops recording and leaves the stack when on top of it; True once off the stack.

        A watch under another mode (a later meter's watch, a user's mode) cannot leave from
        the middle of the stack: it stays, closed (every call passes straight through), and
        leaves as soon as it is on top again (:func:`sweep_stranded`). Meters stopped in the
        order they started used to leave every earlier watch on the stack for good: a Python
        call added to every torch function of the process."""
        self.closed = True
        self._copies.clear()
        self.known = {}  # a closed watch keeps no weight alive
        if internals.function_mode_on_top(self):
            self.__exit__(None, None, None)
            sweep_stranded()
            return True
        if self not in _STRANDED:
            _STRANDED.append(self)
        return False


#: Closed watches left under another mode, by :meth:`WeightWatch.leave`: they leave the stack
#: once on top of it.
_STRANDED: list[WeightWatch] = []


def sweep_stranded() -> None:
    """Takes closed watches off the top of this thread's mode stack while one is on top (each
    watch leaving, and each profile starting, calls it)."""
    while _STRANDED:
        top = next((w for w in _STRANDED if internals.function_mode_on_top(w)), None)
        if top is None:
            return
        _STRANDED.remove(top)
        top.__exit__(None, None, None)
