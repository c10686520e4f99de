"""The profile's capture: temporary hooks that record one training micro-batch, then go.

Taken during the first training micro-batch: the :class:`Profiler` puts a forward hook on every
module :mod:`flopmeter.flops.classify` reads (:class:`~flopmeter.flops.layer_hooks.LayerHooks`:
what each kind of layer records) and enters the weight watch (:mod:`flopmeter.flops.outside`),
over one :class:`~flopmeter.flops.window.MicroBatchWindow`: the forward pass, and for the
recorder the backward pass from its outputs. It removes them all as soon as the window closes
(no cost afterwards). Everything is read from shapes and ``requires_grad`` flags: no host
synchronisation. :func:`~flopmeter.flops.build.build_profile` turns the records into the
profile.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from flopmeter import internals
from flopmeter.flops.build import Captured, build_profile
from flopmeter.flops.classify import (
    ExpertLayer,
    OpaqueLayer,
    WeightLayer,
    attention_modules,
    classify,
    find_architecture,
    output_embeddings,
)
from flopmeter.flops.layer_hooks import LayerHooks
from flopmeter.flops.model_profile import ModelProfile
from flopmeter.flops.outside import KnownWeight, WeightWatch
from flopmeter.flops.window import MicroBatchWindow, Outputs, runs_compiled

logger = logging.getLogger("flopmeter")

__all__ = ["Profiler", "profile_model"]


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
    _done: bool = False
    _seen: Captured = field(default_factory=Captured)
    _hooks: LayerHooks = field(init=False)
    _watch: WeightWatch | None = None
    #: Keep the window open after the forward pass until its backward pass ends (the
    #: recorder's, which closes it at the latest at the next training forward pass, the
    #: optimizer step or its stop); otherwise the window is the forward pass.
    follow_backward: bool = False
    _window: MicroBatchWindow | None = None
    #: Graphs torch.compile had compiled when the window opened.
    _graphs_at_start: int = 0
    #: The profiled forward pass runs as code compiled by torch.compile.
    _compiled: bool = False

    def __post_init__(self) -> None:
        self._hooks = LayerHooks(self.model, self._seen)

    def start(self) -> Profiler:
        """Reads the configuration, registers the temporary hooks and enters the weight watch
        (a ``TorchFunctionMode`` that finds weights used outside their module)."""
        seen, hooks = self._seen, self._hooks
        self._graphs_at_start = internals.dynamo_graphs_compiled()
        self._compiled = runs_compiled(self.model)
        seen.architecture, seen.arch_reason, owner = find_architecture(self.model)
        lm_head = output_embeddings(owner)
        attention = {id(m) for m in attention_modules(self.model)}
        known: dict[int, KnownWeight] = {}
        owners: dict[int, nn.Module] = {}
        layers: dict[int, Any] = {}
        for name, module in self.model.named_modules():
            if id(module) in attention:
                hooks.attention(module, len(seen.attention))
            layer = layers[id(module)] = classify(name, module, lm_head, seen.architecture)
            if isinstance(layer, WeightLayer):
                hooks.linear(name, module, layer)
                if layer.kind == "lm_head":
                    seen.lm_head_name = name
                weight = getattr(module, "weight", None)
                if isinstance(weight, nn.Parameter) and id(weight) not in known:
                    known[id(weight)] = KnownWeight(name, layer.kind, weight)
                    owners[id(weight)] = module
            elif isinstance(layer, ExpertLayer):
                seen.expert_numel[name] = (layer.numel, layer.experts)
                hooks.experts(name, module, layer)
            elif isinstance(layer, OpaqueLayer):
                hooks.unknown(name, module, layer.numel)
        for factor in hooks.lora_wrappers(layers):  # their products are the LoRA deltas
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
            hooks.keep(module, handle)
        self._watch.__enter__()
        return self

    @property
    def forward_done(self) -> bool:
        """Whether the profiled forward pass returned."""
        return self._window is not None and self._window.returned

    def _on_forward_raise(self) -> None:
        # The forward pass raised; the recorder tries again on the next micro-batch. torch is
        # iterating the model's own forward hooks (after an exception it does so without a
        # copy), so only the submodules' hooks go now; remove() does the rest.
        self._hooks.remove_submodule_hooks()
        if self._watch is not None:
            self._watch.leave()
        if not self._done:
            self._done = True
            self.failed = True

    def _on_forward_return(self, outputs: Outputs) -> None:
        self._note_compiled_functions()
        self._build()  # provisional: rebuilt with what the backward pass shows
        if not self._seen.nograd_calls:  # nothing to see recomputed: the module hooks go now
            self._hooks.remove()
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

    def remove(self) -> None:
        """Removes every hook this profiler registered and stops the weight watch
        (idempotent)."""
        self._hooks.remove()
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
