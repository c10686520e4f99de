"""The profile's hooks: temporary forward hooks that record one forward pass, then go.

Taken during the first training micro-batch: the :class:`Profiler` registers a forward hook on
every module :mod:`flopmeter.flops.classify` reads and removes them all as soon as that forward
pass ends (no cost afterwards). For every weight matrix that runs it records the multiply-adds
per row, the rows that passed, whether autograd will compute the gradient of its input (the
input requires a gradient), and whether its weight trains; for every attention module, whether
the query, key and value projections' outputs require a gradient. Everything is read from
shapes and ``requires_grad`` flags: no host synchronisation. :func:`~flopmeter.flops.build.
build_profile` turns the records into the profile.
"""

from __future__ import annotations

import logging
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn
from torch.nn.utils import parametrize

from flopmeter import internals
from flopmeter.flops.build import (
    AttentionRecord,
    CallRecord,
    Captured,
    DeltaRecord,
    build_profile,
)
from flopmeter.flops.classify import (
    ExpertLayer,
    OpaqueLayer,
    WeightLayer,
    attention_modules,
    classify,
    find_architecture,
    lora_param_wrappers,
    output_embeddings,
    projections,
)
from flopmeter.flops.model_profile import ModelProfile
from flopmeter.flops.outside import KnownWeight, WeightWatch
from flopmeter.flops.window import MicroBatchWindow, Outputs

logger = logging.getLogger("flopmeter")

__all__ = ["Profiler", "profile_model"]


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
class Profiler:
    """Captures a :class:`ModelProfile` during one training micro-batch (then removes its hooks).

    Use :meth:`start` before the forward pass; the profile is in :attr:`profile` once the
    backward pass from that forward's outputs has ended, or :meth:`finish` was called after the
    forward returned (:attr:`failed` is set when it raised). The window spans the backward so
    that a loss path using a weight after the forward, and layers that activation checkpointing
    recomputes there, are seen.

    Args:
        model: The model about to run its first training micro-batch.
        batch_tokens: Tokens of that micro-batch, padding included (the rows a dense layer sees).
    """

    model: nn.Module
    batch_tokens: int
    profile: ModelProfile | None = None
    failed: bool = False
    _handles: list[Any] = field(default_factory=list)
    _model_handles: list[Any] = field(default_factory=list)
    _done: bool = False
    _seen: Captured = field(default_factory=Captured)
    _watch: WeightWatch | None = None
    #: Keep the window open after the forward pass until its backward pass ends (the
    #: recorder's, which closes it at the latest at the next training forward pass, the
    #: optimizer step or its stop); otherwise the window is the forward pass.
    follow_backward: bool = False
    _window: MicroBatchWindow | None = None
    #: ids of parameters wrapped by a LoRA ``ParamWrapper`` with a trainable factor.
    _lora_trains: set[int] = field(default_factory=set)
    #: Graphs torch.compile had compiled when the window opened.
    _graphs_at_start: int = 0
    #: The profiled forward pass runs as code compiled by torch.compile.
    _compiled: bool = False

    def start(self) -> Profiler:
        """Reads the configuration, registers the temporary hooks and enters the weight watch
        (a ``TorchFunctionMode`` that finds weights used outside their module)."""
        seen = self._seen
        self._graphs_at_start = internals.dynamo_graphs_compiled()
        self._compiled = self._runs_compiled()
        seen.architecture, seen.arch_reason, owner = find_architecture(self.model)
        lm_head = output_embeddings(owner)
        attention = {id(m) for m in attention_modules(self.model)}
        known: dict[int, KnownWeight] = {}
        owners: dict[int, nn.Module] = {}
        layers: dict[int, Any] = {}
        for name, module in self.model.named_modules():
            if id(module) in attention:
                self._hook_attention(module, len(seen.attention))
            layer = layers[id(module)] = classify(name, module, lm_head, seen.architecture)
            if isinstance(layer, WeightLayer):
                self._hook_linear(name, module, layer)
                if layer.kind == "lm_head":
                    seen.lm_head_name = name
                weight = getattr(module, "weight", None)
                if isinstance(weight, nn.Parameter) and id(weight) not in known:
                    known[id(weight)] = KnownWeight(name, layer.kind, weight)
                    owners[id(weight)] = module
            elif isinstance(layer, ExpertLayer):
                seen.expert_numel[name] = (layer.numel, layer.experts)
                self._hook_experts(name, module, layer)
            elif isinstance(layer, OpaqueLayer):
                self._hook_unknown(name, module, layer.numel)
        for factor in self._hook_lora_wrappers(layers):  # their products are the LoRA deltas
            known.pop(factor, None)
            owners.pop(factor, None)
        # Last, so that the layer hooks on the model itself (if any) have run before it.
        self._window = MicroBatchWindow(
            self.model,
            on_return=self._on_forward_return,
            on_raise=self._on_forward_raise,
            on_backward_end=self.finish,
            follow_backward=self.follow_backward,
        ).watch_forward()
        seen.compiled = self._compiled
        if self._compiled:
            # Compiled code passes a TorchFunctionMode by (the watch would see nothing), and a
            # mode on the stack makes dynamo resume wrongly after a graph break in the model
            # (torch 2.13: a compiled transformers Llama then fails in its forward).
            return self
        self._watch = WeightWatch(known, seen)
        for module, handle in self._watch.hook_modules(owners):
            (self._model_handles if module is self.model else self._handles).append(handle)
        self._watch.__enter__()
        return self

    def _runs_compiled(self) -> bool:
        """Whether this forward pass runs as code compiled by torch.compile (the model was
        compiled as a whole, before or after the meter was attached)."""
        return internals.compiled_module(self.model) or internals.in_compiled_module_call()

    # -- hooks ------------------------------------------------------------------
    def _hook_lora_wrappers(self, layers: dict[int, Any]) -> set[int]:
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
                self._lora_trains.add(id(wrapper.get_param()))
            self._hook_lora_wrapper(name, wrapper, modelled)
        return factor_ids

    def _guard(self, hook: Any) -> Any:
        """Wraps a hook so that an error in it is recorded, never raised into training."""

        def guarded(*args: Any) -> None:
            try:
                hook(*args)
            except Exception as exc:
                if not self._seen.errors:
                    logger.warning("flopmeter (profile): %s: %s", type(exc).__name__, exc)
                self._seen.errors.append(f"{type(exc).__name__}: {exc}")

        return guarded

    def _hook(self, module: nn.Module, hook: Any, with_kwargs: bool = False) -> None:
        handle = module.register_forward_hook(self._guard(hook), with_kwargs=with_kwargs)
        # The model's own hooks (a model that is itself a layer flopmeter reads) are removed
        # with the exit hook's: never while torch runs them after an exception.
        (self._model_handles if module is self.model else self._handles).append(handle)

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
        seen = self._seen
        if _in_backward_pass():  # recomputed by activation checkpointing
            if grad:
                seen.recomputed[name].append(record)
            return
        if not grad and first:  # a module's call counts once, however many records it makes
            seen.nograd_modules += 1
            seen.nograd_calls[name] = seen.nograd_calls.get(name, 0) + 1
        seen.calls[name].append(record)

    def _hook_linear(self, name: str, module: nn.Module, layer: WeightLayer) -> None:
        d_in, macs = layer.d_in, layer.d_in * layer.d_out

        def hook(mod: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any], out: Any) -> None:
            x = _first_tensor(args, kwargs)
            if x is None or x.dim() == 0 or x.shape[-1] != d_in:
                if not layer.strict:  # a 2-D weight not applied as a linear layer to the input
                    self._seen.unknown_ran[name] = macs
                return
            # A trainable weight gets its gradient even when this call ran without gradients
            # (reentrant checkpointing recomputes it with them).
            weight_grad = bool(getattr(getattr(mod, "weight", None), "requires_grad", False))
            self._record(name, layer.kind, macs, x.numel() // d_in, x.requires_grad, weight_grad)

        self._hook(module, hook, with_kwargs=True)

    def _hook_experts(self, name: str, module: nn.Module, layer: ExpertLayer) -> None:
        arch = self._seen.architecture

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
            top_k = index.shape[-1] if index is not None and index.dim() >= 1 else None
            if top_k is None and arch is not None:
                top_k = arch.experts_per_token
            if x is None or top_k is None:
                unknown = self._seen.unknown_ran
                unknown[name] = unknown.get(name, 0) + layer.per_expert
                return
            self._seen.top_k_seen.add(int(top_k))
            rows = (x.numel() // x.shape[-1]) * int(top_k)
            work = self._expert_work(mod, layer, x.requires_grad)
            for i, ((input_grad, weight_grad), macs) in enumerate(sorted(work.items())):
                self._record(name, "experts", macs, rows, input_grad, weight_grad, first=i == 0)

        self._hook(module, hook, with_kwargs=True)

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
            lora = id(p) in self._lora_trains and parametrize.is_parametrized(mod, pname)
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
                self._seen.unknown_ran[f"{name} (LoRA on {mod.parameter_name})"] = param.numel()
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

        self._hook(wrapper, hook)

    def _add_delta(self, record: DeltaRecord) -> None:
        """Keeps a LoRA product record. One recomputed in the backward pass (reentrant
        checkpointing) is not counted again: it gives its factor gradients to the matching
        product built without gradients in the forward pass, as that backward computes them."""
        if not _in_backward_pass():
            self._seen.lora_delta.append(record)
            return
        for earlier in self._seen.lora_delta if record.factor_grads else ():
            if earlier.name == record.name and not earlier.factor_grads:
                earlier.factor_grads = record.factor_grads
                return

    def _hook_unknown(self, name: str, module: nn.Module, numel: int) -> None:
        def hook(mod: nn.Module, args: tuple[Any, ...], out: Any) -> None:
            self._seen.unknown_ran[name] = numel

        self._hook(module, hook)

    def _hook_attention(self, module: nn.Module, position: int) -> None:
        index = getattr(module, "layer_idx", None)
        record = AttentionRecord(index=index if isinstance(index, int) else position)
        self._seen.attention.append(record)

        def on_output(attrs: tuple[str, ...]) -> Any:
            def hook(mod: nn.Module, args: tuple[Any, ...], out: Any) -> None:
                flag = _requires_grad(out)
                for attr in attrs:
                    setattr(record, attr, bool(getattr(record, attr)) or flag)

            return hook

        for child, attrs in projections(module):
            self._hook(child, on_output(attrs))

        def on_attention(mod: nn.Module, args: tuple[Any, ...], out: Any) -> None:
            record.calls += 1
            record.out = bool(record.out) or _requires_grad(out)

        self._hook(module, on_attention)

    @property
    def forward_done(self) -> bool:
        """Whether the profiled forward pass returned."""
        return self._window is not None and self._window.returned

    def _on_forward_raise(self) -> None:
        # The forward pass raised; the recorder tries again on the next micro-batch. torch is
        # iterating the model's own forward hooks (after an exception it does so without a
        # copy), so only the submodules' hooks go now; remove() does the rest.
        self._remove_submodule_hooks()
        if self._watch is not None:
            self._watch.leave()
        if not self._done:
            self._done = True
            self.failed = True

    def _on_forward_return(self, outputs: Outputs) -> None:
        self._note_compiled_functions()
        self._build()  # provisional: rebuilt with what the backward pass shows
        if not self._seen.nograd_calls:  # nothing to see recomputed: the module hooks go now
            self._remove_hooks()
        # The window stays open until the backward pass from these outputs ends: a loss path
        # after the forward may use a weight, and checkpointed layers are recomputed there.
        if outputs is not Outputs.FOLLOWED:
            self.finish()

    def _note_compiled_functions(self) -> None:
        """Marks the forward pass for a measured cross-check when torch.compile compiled a
        function inside it (cut-cross-entropy's ``impl="torch_compile"``, for one): the hooks
        and the weight watch do not see into compiled code, so its work may be missing from the
        profile. A model compiled as a whole, before or after the meter was attached, is not
        such a case: dynamo traces its module hooks in, and their records are kept."""
        if self._compiled or internals.dynamo_graphs_compiled() <= self._graphs_at_start:
            return
        self._seen.unmodelled.setdefault(
            "a function compiled by torch.compile inside the forward pass",
            "its work (for a fused linear-cross-entropy loss, the output projection) is hidden "
            "from the module hooks and the weight watch",
        )

    def finish(self) -> None:
        """Ends the window (the backward pass ended, or the next training forward pass, the
        optimizer step or the stop came first): builds the profile and removes the hooks.
        Nothing while the forward pass runs; idempotent; the weight watch leaves the stack once
        it is on top of it."""
        if self.forward_done and not self._done:
            self._done = True
            self._build()
        if self._done:
            self.remove()

    def _build(self) -> None:
        try:
            self.profile = build_profile(self._seen, self.batch_tokens)
        except Exception as exc:  # the meter never breaks training
            logger.warning("flopmeter (profile): %s: %s", type(exc).__name__, exc, exc_info=exc)
            self.profile = None
            self.failed = True

    def _remove_submodule_hooks(self) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles.clear()

    def _remove_hooks(self) -> None:
        self._remove_submodule_hooks()
        for handle in self._model_handles:
            handle.remove()
        self._model_handles.clear()

    def remove(self) -> None:
        """Removes every hook this profiler registered and stops the weight watch
        (idempotent)."""
        self._remove_hooks()
        if self._window is not None:
            self._window.close()
        if self._watch is not None and self._watch.leave():
            self._watch = None


def profile_model(model: nn.Module, *args: Any, **kwargs: Any) -> ModelProfile:
    """Profiles ``model`` by running one forward pass on the given inputs (training mode).

    For estimates before a run, e.g. on a model built on the ``meta`` device, where nothing is
    allocated. The token count is taken from ``input_ids`` (keyword or first argument).

    Raises:
        ValueError: no ``input_ids`` were given, or the profile could not be taken.
    """
    ids = kwargs.get("input_ids", args[0] if args else None)
    if not isinstance(ids, torch.Tensor):
        raise ValueError("profile_model needs input_ids (a tensor) to count tokens")
    profiler = Profiler(model, batch_tokens=ids.numel()).start()
    try:
        model(*args, **kwargs)
    finally:
        profiler.finish()
        profiler.remove()
    if profiler.profile is None:
        raise ValueError("the forward pass did not complete; no profile was taken")
    return profiler.profile
