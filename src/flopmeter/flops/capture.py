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
import re
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from flopmeter import internals
from flopmeter.counting.work_units import ShapeUnits
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
from flopmeter.flops.eager_runs import why_not_eager
from flopmeter.flops.layer_hooks import LayerHooks
from flopmeter.flops.mixers import ScanMixerLayer
from flopmeter.flops.model_profile import ModelProfile, StreamSizes
from flopmeter.flops.outside import KnownWeight, WeightWatch, sweep_stranded
from flopmeter.flops.score_projections import score_projections
from flopmeter.flops.streams import ScoreRecord
from flopmeter.flops.window import MicroBatchWindow, Outputs, runs_compiled

logger = logging.getLogger("flopmeter")

__all__ = ["Profiler", "profile_model", "stream_sizes"]

#: Inputs that belong to the text (or decoder) token streams, not to the items' shape.
_TOKEN_INPUTS = frozenset(
    {
        "input_ids",
        "attention_mask",
        "labels",
        "position_ids",
        "token_type_ids",
        "inputs_embeds",
        "decoder_input_ids",
        "decoder_attention_mask",
        "decoder_position_ids",
        "decoder_inputs_embeds",
        "cache_position",
        "mm_token_type_ids",
    }
)


def _key_part(name: str, value: torch.Tensor, batch: int) -> str:
    dims = tuple(value.shape[1:]) if value.dim() and value.shape[0] == batch else value.shape
    return f"{name}:{'x'.join(str(d) for d in dims)}"


def stream_sizes(
    batch_tokens: int, units: ShapeUnits | None = None, item_key: str = ""
) -> StreamSizes:
    """The profiled micro-batch's stream sizes from its token count and shape units.

    Args:
        batch_tokens: Text token positions of the micro-batch (token ids' elements), or 0.
        units: The call's shape units (:func:`flopmeter.counting.inputs.shape_units`); None: a
            text-only micro-batch.
        item_key: The shape-key parts the per-item work depends on; default: the parts of
            ``units.key`` that are no token input.
    """
    if units is None:
        return StreamSizes(text_tokens=batch_tokens)
    if not item_key:
        parts = [p for p in units.key.split(";") if p and p.split(":")[0] not in _TOKEN_INPUTS]
        item_key = ";".join(parts)
    return StreamSizes(
        text_tokens=batch_tokens,
        decoder_tokens=units.decoder_tokens,
        items=units.items,
        text_only=units.text,
        item_key=item_key,
    )


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
        streams: Its size in each stream (:func:`stream_sizes`); None: a text-only micro-batch
            of ``batch_tokens`` tokens.
    """

    model: nn.Module
    batch_tokens: int
    streams: StreamSizes | None = None
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
                self._hook_scores(name, module)
            if _contrastive(module):
                seen.unmodelled.setdefault(
                    name or type(module).__name__,
                    f"{type(module).__name__}: its contrastive logits (text x image embeddings, "
                    "a matmul of no module) are not modelled",
                )
            if internals.is_convolution(module):
                self._hook_conv(name, module)
                continue
            if _additive(module):  # class and position embeddings: added, no matmul work
                continue
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
            elif isinstance(layer, ScanMixerLayer | OpaqueLayer):
                hooks.unread(name, module, layer)
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
        seen.eager_samples = why_not_eager() is None
        if self._compiled:
            # Compiled code passes a TorchFunctionMode by (the watch would see nothing), and a
            # mode on the stack makes dynamo resume wrongly after a graph break in the model
            # (torch 2.13: a compiled transformers Llama then fails in its forward).
            return self
        sweep_stranded()  # an earlier meter's watch now on top leaves first
        self._watch = WeightWatch(known, seen)
        for module, handle in self._watch.hook_modules(owners):
            hooks.keep(module, handle)
        self._watch.__enter__()
        return self

    def _hook_conv(self, name: str, module: nn.Module) -> None:
        """Hooks a torch convolution: per call ``weight.numel()`` multiply-adds per output
        position (``out_channels x in_channels/groups x kernel``; a transposed one: per input
        position), as weight work (its gradients cost the same again each). In a text-only
        micro-batch, a convolution whose output positions are not the tokens is work the
        profile cannot read (as before: a causal convolution's padding)."""
        hooks = self._hooks
        transposed = bool(getattr(module, "transposed", False))
        text_only = self.streams is None or self.streams.text_only

        def hook(mod: nn.Module, args: tuple[Any, ...], out: Any) -> None:
            x = args[0] if args and isinstance(args[0], torch.Tensor) else None
            weight = getattr(mod, "weight", None)
            if x is None or not isinstance(out, torch.Tensor) or weight is None:
                self._seen.unknown_ran[name] = int(weight.numel()) if weight is not None else 0
                return
            batched = x.dim() == weight.dim()
            ref = x if transposed else out
            channels = ref.shape[1 if batched else 0]
            rows = ref.numel() // max(int(channels), 1)
            if text_only and rows != self.batch_tokens:  # positions that are not the tokens
                self._seen.unknown_ran[name] = int(weight.numel())
                return
            hooks._record(
                name, "conv", int(weight.numel()), rows, x.requires_grad, weight.requires_grad
            )

        hooks.keep_hook(module, hook)

    def _hook_scores(self, name: str, module: nn.Module) -> None:
        """Hooks an attention module's query, key and value projections (found by name anywhere
        under it) to read each call's score work from their outputs' shapes."""
        found, names = score_projections(name, module)
        cls = type(module).__name__
        seen, hooks = self._seen, self._hooks
        state: dict[str, tuple[Any, torch.Size, bool]] = {}

        def on_projection(role: str) -> Any:
            def hook(mod: nn.Module, args: tuple[Any, ...], out: Any) -> None:
                if not torch.compiler.is_compiling() and isinstance(out, torch.Tensor) and args:
                    state[role] = (args[0], out.shape, out.requires_grad)

            return hook

        for role, child in found.items():
            hooks.keep_hook(child, on_projection(role))

        def on_attention(mod: nn.Module, args: tuple[Any, ...], out: Any) -> None:
            if torch.compiler.is_compiling():
                seen.scores_unread.setdefault(
                    name, f"{cls}: it ran compiled (torch.compile); its projections were not read"
                )
                return
            if internals.in_backward_pass():  # recomputed by activation checkpointing
                state.clear()
                return
            if len(state) < 3:
                seen.scores_unread.setdefault(
                    name,
                    f"{cls}: its query, key and value projections were not found by name "
                    "(a fused or unnamed projection)",
                )
                state.clear()
                return
            (q_in, q, qg), (k_in, k, kg), (_, v, vg) = state["q"], state["k"], state["v"]
            state.clear()
            if len(q) != 3 or len(k) != 3 or len(v) != 3 or k[:2] != v[:2] or q[0] != k[0]:
                seen.scores_unread.setdefault(
                    name,
                    f"{cls}: its projections' outputs are not [batch, length, width] of one "
                    "batch (packed or windowed sequences)",
                )
                return
            cross = k_in is not q_in
            if cross:
                seen.cross_inputs.update({names["k"], names["v"]})
            seen.scores.append(
                ScoreRecord(
                    name=name,
                    batch=int(q[0]),
                    queries=int(q[1]),
                    keys=int(k[1]),
                    query_width=int(q[2]),
                    value_width=int(v[2]) * int(q[2]) // max(int(k[2]), 1),
                    cross=cross,
                    q_grad=qg,
                    k_grad=kg,
                    v_grad=vg,
                )
            )

        hooks.keep_hook(module, on_attention)

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
            self.profile = build_profile(self._seen, self.batch_tokens, self.streams)
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


#: Own parameters of an embeddings module that are added or concatenated to the activations,
#: never multiplied (ViT's and Whisper's ``position_embeddings``, ``cls_token``...).
_ADDITIVE = re.compile(r"(^|_)(cls_token|mask_token|dist_token|position_embeddings?|pos_embed)$")


def _additive(module: nn.Module) -> bool:
    """An embeddings module (``...Embeddings``) whose own matrices are only class tokens and
    position embeddings, which it adds or concatenates (no matmul work of its own)."""
    own = [n for n, p in module.named_parameters(recurse=False) if p.dim() >= 2]
    return (
        bool(own)
        and type(module).__name__.endswith(("Embeddings", "Embedding"))
        and not isinstance(module, nn.Embedding)
        and all(_ADDITIVE.search(n) for n in own)
    )


def _contrastive(module: nn.Module) -> bool:
    """A contrastive model (CLIP, SigLIP): its logits multiply two embeddings, no weight."""
    scale = getattr(module, "logit_scale", None)
    return isinstance(scale, nn.Parameter) and getattr(module, "config", None) is not None


def _profiled_streams(
    model: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> StreamSizes:
    """The stream sizes of a forward call's inputs (for :func:`profile_model`)."""
    ids = kwargs.get("input_ids", args[0] if args else None)
    ids = ids if isinstance(ids, torch.Tensor) and not ids.is_floating_point() else None
    named = {f"arg{i}": v for i, v in enumerate(args)} | kwargs
    tensors = {k: v for k, v in named.items() if isinstance(v, torch.Tensor) and v.dim()}
    if ids is not None:
        tensors.pop("arg0", None)
        tensors["input_ids"] = ids
    if not tensors:
        raise ValueError("profile_model needs tensor inputs (input_ids, pixel_values...)")
    batch = int(ids.shape[0] if ids is not None else next(iter(tensors.values())).shape[0])
    config = getattr(model, "config", None)
    decoder = 0
    if getattr(config, "is_encoder_decoder", False):
        target = tensors.get("decoder_input_ids", tensors.get("labels"))
        decoder = int(target.numel()) if target is not None else 0
    others = {k: v for k, v in tensors.items() if k not in _TOKEN_INPUTS}
    text_only = ids is not None and not decoder and not others
    return StreamSizes(
        text_tokens=int(ids.numel()) if ids is not None else 0,
        decoder_tokens=decoder,
        items=batch,
        text_only=text_only,
        item_key=";".join(_key_part(k, v, batch) for k, v in sorted(others.items())),
    )


def profile_model(model: nn.Module, *args: Any, **kwargs: Any) -> ModelProfile:
    """Profiles ``model`` by running one forward pass on the given inputs (training mode).

    For estimates before a run, e.g. on a model built on the ``meta`` device, where nothing is
    allocated, and for tests. The streams are read from the inputs: text tokens from
    ``input_ids`` (keyword or first argument), decoder positions from ``decoder_input_ids``
    or ``labels`` of an encoder-decoder model, items from the batch dimension; any input
    beside the token ids (``pixel_values``, ``input_features``, a diffusion ``sample``...)
    makes the micro-batch more than text, whose work is then scaled by stream.

    Raises:
        ValueError: no tensor input was given, or the profile could not be taken.
    """
    streams = _profiled_streams(model, args, kwargs)
    profiler = Profiler(model, batch_tokens=streams.text_tokens, streams=streams).start()
    try:
        model(*args, **kwargs)
    finally:
        profiler.finish()
        profiler.remove()
    if profiler.profile is None:
        raise ValueError("the forward pass did not complete; no profile was taken")
    return profiler.profile
