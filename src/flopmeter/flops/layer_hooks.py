"""The profile's layer hooks: what each kind of layer records when the profiled forward runs.

:class:`LayerHooks` holds the temporary forward hooks that the :class:`~flopmeter.flops.capture.
Profiler` puts on the modules :mod:`flopmeter.flops.classify` reads, one kind of hook per kind of
layer: weight matrices (multiply-adds per row, the rows that passed, whether autograd computes
the gradient of the input, whether the weight trains), expert modules (the routed rows, per
expert weight), LoRA ``ParamWrapper`` products, layers flopmeter cannot model, and attention
modules (whether the query, key and value projections' outputs require a gradient). Everything
is read from shapes and ``requires_grad`` flags, into one :class:`~flopmeter.flops.build.
Captured`: no host synchronisation. An error in a hook is recorded there, never raised into
training. When the window over the micro-batch opens and closes is the profiler's.
"""

from __future__ import annotations

import logging
from collections import defaultdict
from dataclasses import dataclass, field, replace
from typing import Any

import torch
from torch import nn
from torch.nn.utils import parametrize

from flopmeter import internals
from flopmeter.flops.build import AttentionRecord, CallRecord, Captured, DeltaRecord
from flopmeter.flops.classify import (
    ExpertLayer,
    OpaqueLayer,
    WeightLayer,
    lora_param_wrappers,
    projections,
    sequence_mixer,
)
from flopmeter.flops.mixers import ScanMixerLayer, scan_mixer_work

logger = logging.getLogger("flopmeter")

__all__ = ["LayerHooks"]


def _first_tensor(args: tuple[Any, ...], kwargs: dict[str, Any]) -> torch.Tensor | None:
    for value in (*args, *kwargs.values()):
        if isinstance(value, torch.Tensor):
            return value
    return None


def _output_tensor(out: Any) -> torch.Tensor | None:
    if isinstance(out, torch.Tensor):
        return out
    if isinstance(out, (tuple, list)):
        return _first_tensor(tuple(out), {})
    return None


def _in_backward_pass() -> bool:
    """:func:`internals.in_backward_pass`, False while dynamo traces a hook: dynamo cannot trace
    the autograd query (a graph break), and the hooks must not break the graph of a model
    compiled as a whole (the forward pass dynamo traces is never inside a backward pass)."""
    return not torch.compiler.is_compiling() and internals.in_backward_pass()


def _requires_grad(out: Any) -> bool:
    t = _output_tensor(out)
    return bool(t is not None and t.requires_grad)


@dataclass
class LayerHooks:
    """The profile's forward hooks on the layers of one model, and what they record.

    Args:
        model: The profiled model.
        seen: Where the hooks record (shared with the profiler's weight watch).
    """

    model: nn.Module
    seen: Captured
    #: Handles of the hooks on the model's submodules.
    handles: list[Any] = field(default_factory=list)
    #: Handles of the hooks on the model itself.
    model_handles: list[Any] = field(default_factory=list)
    #: ids of parameters wrapped by a LoRA ``ParamWrapper`` with a trainable factor.
    lora_trains: set[int] = field(default_factory=set)

    def lora_wrappers(self, layers: dict[int, Any]) -> set[int]:
        """Hooks the model's LoRA ``ParamWrapper``s (``layers``: by module id, its class).

        Returns:
            The ids of their factors' weights, which the wrappers use outside the factors'
            modules (``B @ A``): recorded as LoRA products, not by the weight watch.
        """
        factor_ids: set[int] = set()
        for name, wrapper, holder in lora_param_wrappers(self.model):
            layer = layers.get(id(holder))
            pname = wrapper.parameter_name
            modelled = (isinstance(layer, ExpertLayer) and pname in layer.names) or (
                isinstance(layer, WeightLayer) and pname == "weight"
            )
            factors = (*wrapper.lora_A.values(), *wrapper.lora_B.values())
            factor_ids.update(id(f.weight) for f in factors)
            if any(f.weight.requires_grad for f in factors):
                self.lora_trains.add(id(wrapper.get_param()))
            self._hook_lora_wrapper(name, wrapper, modelled)
        return factor_ids

    def _guard(self, hook: Any) -> Any:
        """Wraps a hook so that an error in it is recorded, never raised into training."""

        def guarded(*args: Any) -> None:
            try:
                hook(*args)
            except Exception as exc:
                if not self.seen.errors:
                    logger.warning("flopmeter (profile): %s: %s", type(exc).__name__, exc)
                self.seen.errors.append(f"{type(exc).__name__}: {exc}")

        return guarded

    def keep(self, module: nn.Module, handle: Any) -> None:
        """Keeps the handle of a hook on ``module``, to be removed with these hooks.

        The model's own hooks (a model that is itself a layer flopmeter reads, or owns a weight
        the weight watch follows) are kept apart: they are never removed while torch runs them
        after an exception (:meth:`remove_submodule_hooks`), only by :meth:`remove`.
        """
        (self.model_handles if module is self.model else self.handles).append(handle)

    def keep_hook(self, module: nn.Module, hook: Any, with_kwargs: bool = False) -> None:
        """Registers ``hook`` as a forward hook of ``module``, guarded, and keeps its handle."""
        self.keep(module, module.register_forward_hook(self._guard(hook), with_kwargs=with_kwargs))

    def _record(
        self,
        name: str,
        kind: str,
        macs: int,
        rows: int,
        input_grad: bool,
        weight_grad: bool,
        first: bool = True,
    ) -> None:
        grad = torch.is_grad_enabled()
        record = CallRecord(
            kind, macs, rows, grad and input_grad, weight_grad=weight_grad, first=first
        )
        seen = self.seen
        if _in_backward_pass():  # recomputed by activation checkpointing
            if grad:
                seen.recomputed[name].append(record)
            return
        if not grad and first:  # a module's call counts once, however many records it makes
            seen.nograd_modules += 1
            seen.nograd_calls[name] = seen.nograd_calls.get(name, 0) + 1
        seen.calls[name].append(record)

    def linear(self, name: str, module: nn.Module, layer: WeightLayer) -> None:
        """Hooks a weight matrix: its multiply-adds per row, the rows that passed, whether its
        input needs a gradient and whether its weight trains."""
        d_in, macs = layer.d_in, layer.d_in * layer.d_out

        def hook(mod: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any], out: Any) -> None:
            x = _first_tensor(args, kwargs)
            if x is None or x.dim() == 0 or x.shape[-1] != d_in:
                if not layer.strict:  # a 2-D weight not applied as a linear layer to the input
                    self.seen.unknown_ran[name] = macs
                return
            # A trainable weight gets its gradient even when this call ran without gradients
            # (reentrant checkpointing recomputes it with them).
            weight_grad = bool(getattr(getattr(mod, "weight", None), "requires_grad", False))
            self._record(name, layer.kind, macs, x.numel() // d_in, x.requires_grad, weight_grad)

        self.keep_hook(module, hook, with_kwargs=True)

    def experts(self, name: str, module: nn.Module, layer: ExpertLayer) -> None:
        """Hooks an expert module: its routed rows per expert weight.

        Given the routing (an integer ``[tokens, top_k]`` index beside the hidden states, as
        Mixtral's, Qwen's and gpt-oss's experts take it), the rows are tokens times ``top_k``.
        Without one, the input is already the rows the experts run, ``experts`` blocks of them
        applied one block per expert (Llama 4's ``Llama4TextExperts`` views its input as
        ``[experts, rows / experts, d]`` and runs ``bmm``: every expert sees every token, the
        scores zeroing the tokens not routed to it, whatever ``top_k``).
        """

        def hook(mod: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any], out: Any) -> None:
            x = _first_tensor(args, kwargs)
            index = next(
                (
                    v
                    for v in (*args[1:], *kwargs.values())
                    if isinstance(v, torch.Tensor) and not v.is_floating_point()
                ),
                None,
            )
            rows = x.numel() // x.shape[-1] if x is not None and x.dim() >= 1 else 0
            if rows and index is not None and index.dim() >= 1:
                self.seen.top_k_seen.add(int(index.shape[-1]))
                rows *= int(index.shape[-1])
            if x is None or not rows or (index is None and rows % layer.experts):
                unknown = self.seen.unknown_ran
                unknown[name] = unknown.get(name, 0) + layer.per_expert
                return
            work = self._expert_work(mod, layer, x.requires_grad)
            for i, ((input_grad, weight_grad), macs) in enumerate(sorted(work.items())):
                self._record(name, "experts", macs, rows, input_grad, weight_grad, first=i == 0)

        self.keep_hook(module, hook, with_kwargs=True)

    def _expert_work(
        self, mod: nn.Module, layer: ExpertLayer, input_grad: bool
    ) -> dict[tuple[bool, bool], int]:
        """Weights per routed row of an expert module, by ``(input_grad, weight_grad)``.

        A frozen expert weight wrapped by an active LoRA ParamWrapper is ``W + B @ A``, whose
        gradient autograd computes (then passes on to B and A). The parameters are applied in
        their order (``gate_up_proj``, then ``down_proj``): after one whose weight trains, the
        next one's input needs a gradient even when the module's input does not.
        """
        work: dict[tuple[bool, bool], int] = defaultdict(int)
        for pname, p in zip(layer.names, layer.params, strict=True):
            lora = id(p) in self.lora_trains and parametrize.is_parametrized(mod, pname)
            weight_grad = p.requires_grad or lora
            work[(input_grad, weight_grad)] += p.numel() // layer.experts
            input_grad = input_grad or weight_grad
        return work

    def _hook_lora_wrapper(self, name: str, wrapper: nn.Module, modelled: bool) -> None:
        """Records the ``B @ A`` products one call of a LoRA ``ParamWrapper`` built."""

        def hook(mod: nn.Module, args: tuple[Any, ...], out: Any) -> None:
            adapters = [a for a in mod.active_adapters if a in mod.lora_A]
            if mod.disable_adapters or mod.merged or not adapters:
                return
            param = mod.get_param()
            if not modelled:
                self.seen.unknown_ran[f"{name} (LoRA on {mod.parameter_name})"] = param.numel()
                return
            products = internals.lora_delta_forward_products(mod, len(adapters))
            grad = torch.is_grad_enabled()
            for adapter in adapters:
                a, b = mod.lora_A[adapter].weight, mod.lora_B[adapter].weight
                rank = a.shape[0] // max(int(getattr(mod, "num_experts", 1)), 1)
                self._add_delta(
                    DeltaRecord(
                        name=f"{name}:{adapter}",
                        macs=param.numel() * rank,
                        forward_products=products,
                        factor_grads=int(grad) * (int(a.requires_grad) + int(b.requires_grad)),
                        lora_params=a.numel() + b.numel(),
                    )
                )

        self.keep_hook(wrapper, hook)

    def _add_delta(self, record: DeltaRecord) -> None:
        """Keeps a LoRA product record. One recomputed in the backward pass (reentrant
        checkpointing) is not counted again: it gives its factor gradients to the matching
        product built without gradients in the forward pass, as that backward computes them."""
        if not _in_backward_pass():
            self.seen.lora_delta.append(record)
            return
        for earlier in self.seen.lora_delta if record.factor_grads else ():
            if earlier.name == record.name and not earlier.factor_grads:
                earlier.factor_grads = record.factor_grads
                return

    def unread(self, name: str, module: nn.Module, layer: ScanMixerLayer | OpaqueLayer) -> None:
        """Hooks a layer that is not a weight matrix: a selective-scan mixer the FLOP model
        reads (:meth:`scan_mixer`), or a layer it cannot model (:meth:`unknown`)."""
        if isinstance(layer, ScanMixerLayer):
            self.scan_mixer(name, module, layer)
        else:
            self.unknown(name, module, layer.numel)

    def scan_mixer(self, name: str, module: nn.Module, layer: ScanMixerLayer) -> None:
        """Hooks a selective-scan mixer (:mod:`flopmeter.flops.mixers`): its first training
        call's sizes and which gradients its convolution and scan compute."""

        def hook(mod: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any], out: Any) -> None:
            x = _first_tensor(args, kwargs)
            if name in self.seen.scan_mixers or _in_backward_pass() or x is None:
                return
            work = scan_mixer_work(name, mod, layer, x.requires_grad)
            if not torch.is_grad_enabled():  # no backward through this call
                work = replace(work, conv_grads=0, scan_grads=0)
            self.seen.scan_mixers[name] = work

        self.keep_hook(module, hook, with_kwargs=True)

    def unknown(self, name: str, module: nn.Module, numel: int) -> None:
        """Hooks a layer flopmeter cannot model: that it ran (by name and class), and its
        weights' size. A sequence mixer (:func:`~flopmeter.flops.classify.sequence_mixer`) is
        also marked for a measured cross-check, with why."""
        why = sequence_mixer(module)
        key = f"{name} ({type(module).__name__})"

        def hook(mod: nn.Module, args: tuple[Any, ...], out: Any) -> None:
            self.seen.unknown_ran[key] = numel
            if why is not None:
                self.seen.unmodelled.setdefault(name, why)
                self.seen.mixers.add(key)

        self.keep_hook(module, hook)

    def attention(self, module: nn.Module, position: int) -> None:
        """Hooks an attention module and its q/k/v projections: its calls, and which outputs
        require a gradient (``position``: its index when it has no ``layer_idx``)."""
        index = getattr(module, "layer_idx", None)
        record = AttentionRecord(index=index if isinstance(index, int) else position)
        self.seen.attention.append(record)

        def on_output(attrs: tuple[str, ...]) -> Any:
            def hook(mod: nn.Module, args: tuple[Any, ...], out: Any) -> None:
                flag = _requires_grad(out)
                for attr in attrs:
                    setattr(record, attr, bool(getattr(record, attr)) or flag)

            return hook

        for child, attrs in projections(module):
            self.keep_hook(child, on_output(attrs))

        def on_attention(mod: nn.Module, args: tuple[Any, ...], out: Any) -> None:
            record.calls += 1
            record.out = bool(record.out) or _requires_grad(out)

        self.keep_hook(module, on_attention)

    def remove_submodule_hooks(self) -> None:
        """Removes the hooks on the model's submodules (safe while the model's own hooks run)."""
        for handle in self.handles:
            handle.remove()
        self.handles.clear()

    def remove(self) -> None:
        """Removes every hook kept here (idempotent)."""
        self.remove_submodule_hooks()
        for handle in self.model_handles:
            handle.remove()
        self.model_handles.clear()
