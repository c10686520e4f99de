"""The model profile: which weights a token passes through and what backward computes for them.

Taken once, during the first training micro-batch, by temporary forward hooks that the
:class:`Profiler` removes as soon as that forward pass ends (no cost afterwards). For every
weight matrix that runs (``nn.Linear`` and its subclasses, so LoRA's A and B and quantized
layers too; transformers' ``Conv1D``; mixture-of-experts modules whose experts are 3-D
parameters; other modules that apply a 2-D ``weight`` to their input, such as MoE routers) it
records the multiply-adds per row, the rows that passed, whether autograd will compute the
gradient of its input (the input requires a gradient), and whether its weight trains. For every
attention module it records whether the query, key and value projections' outputs require a
gradient. The attention geometry and the routing come from the configuration
(:mod:`flopmeter.flops.architecture`).

Everything is read from shapes and ``requires_grad`` flags: no host synchronisation.
"""

from __future__ import annotations

import logging
import re
from collections import defaultdict
from dataclasses import asdict, dataclass, field
from typing import Any

import torch
from torch import nn

from flopmeter.flops._exit_hook import register_exit_hook
from flopmeter.flops.architecture import Architecture, read_architecture

logger = logging.getLogger("flopmeter")

__all__ = [
    "AttentionLayerWork",
    "LinearGroup",
    "ModelProfile",
    "Profiler",
    "profile_model",
]

_ATTENTION_CLASS = re.compile(r"(Attention|Attn)\d*$")
_Q_NAMES = ("q_proj", "query", "wq", "q_lin", "q")
_K_NAMES = ("k_proj", "key", "wk", "k_lin", "k")
_V_NAMES = ("v_proj", "value", "wv", "v_lin", "v")
_QKV_NAMES = ("c_attn", "qkv_proj", "query_key_value", "Wqkv", "qkv", "W_pack", "in_proj")


@dataclass(frozen=True)
class LinearGroup:
    """Weight matrices that cost the same per multiply-add.

    Attributes:
        kind: "linear", "lm_head", "lora", "experts" (routed expert weights) or "router".
        input_grad: Autograd computes the gradient of their input (2 FLOP per MAC).
        weight_grad: Their weights train (2 FLOP per MAC for the weight gradient).
        macs_per_token: Multiply-adds per training token (experts: top-k of them).
        modules: How many modules the group holds.
    """

    kind: str
    input_grad: bool
    weight_grad: bool
    macs_per_token: float
    modules: int

    @property
    def flops_per_mac(self) -> int:
        """2 forward, + 2 for the input gradient, + 2 for the weight gradient."""
        return 2 + 2 * self.input_grad + 2 * self.weight_grad


@dataclass(frozen=True)
class AttentionLayerWork:
    """One self-attention layer's score work (``QK^T`` and ``AV``).

    Attributes:
        query_width: Query heads x head_dim (key/value heads are repeated to match).
        value_width: Query heads x value head_dim.
        window: Sliding-window length, None for full attention.
        q_grad: The queries require a gradient.
        k_grad: The keys require a gradient.
        v_grad: The values require a gradient.
    """

    query_width: int
    value_width: int
    window: int | None
    q_grad: bool
    k_grad: bool
    v_grad: bool

    @property
    def backward_matmuls(self) -> tuple[int, int]:
        """Backward matmuls over ``(query_width, value_width)``: ``dQ = dS K`` and ``dK = dS^T Q``
        over the query width when the queries / keys need gradients; ``dP = dO V^T`` (when
        either does) and ``dV = P^T dO`` (when the values do) over the value width."""
        qk = int(self.q_grad) + int(self.k_grad)
        v = int(self.q_grad or self.k_grad) + int(self.v_grad)
        return qk, v


@dataclass(frozen=True)
class ModelProfile:
    """What the ``transformer`` estimate needs to know about a model beyond its token counts.

    Attributes:
        linear: Weight-matrix work, grouped by what backward computes.
        attention: Per self-attention layer, its score work; empty for a model without one.
        architecture: The configuration's numbers, when it has a configuration flopmeter reads.
        recognised: Whether the estimate covers all the model's matmul work (else ``seed``
            stays the primary figure).
        notes: What was and was not counted, and why.
        inactive_expert_params: Expert parameters a token does not pass through
            (``n_active = n_total - inactive_expert_params``).
        batch_tokens: Tokens (padding included) of the micro-batch profiled.
    """

    linear: tuple[LinearGroup, ...]
    attention: tuple[AttentionLayerWork, ...]
    architecture: Architecture | None
    recognised: bool
    notes: tuple[str, ...] = ()
    inactive_expert_params: int = 0
    batch_tokens: int = 0

    def to_dict(self) -> dict[str, Any]:
        """The profile as plain data (for a report's ``inputs``), attention layers grouped."""
        groups: dict[tuple[Any, ...], int] = defaultdict(int)
        for layer in self.attention:
            groups[astuple_layer(layer)] += 1
        attention = [
            {
                "layers": count,
                "query_width": key[0],
                "value_width": key[1],
                "window": key[2],
                "q_grad": key[3],
                "k_grad": key[4],
                "v_grad": key[5],
            }
            for key, count in groups.items()
        ]
        return {
            "linear_groups": [asdict(g) for g in self.linear],
            "attention_layers": attention,
            "architecture": self.architecture.to_dict() if self.architecture else None,
            "profiled_batch_tokens": self.batch_tokens,
        }


def astuple_layer(layer: AttentionLayerWork) -> tuple[Any, ...]:
    return (
        layer.query_width,
        layer.value_width,
        layer.window,
        layer.q_grad,
        layer.k_grad,
        layer.v_grad,
    )


# ----------------------------------------------------------------------------- capture
def _first_tensor(args: tuple[Any, ...], kwargs: dict[str, Any]) -> torch.Tensor | None:
    for value in (*args, *kwargs.values()):
        if isinstance(value, torch.Tensor):
            return value
    return None


def _is_conv1d(module: nn.Module) -> bool:
    weight = getattr(module, "weight", None)
    return (
        type(module).__name__ == "Conv1D"
        and hasattr(module, "nf")
        and isinstance(weight, torch.Tensor)
        and weight.dim() == 2
    )


def _expert_params(module: nn.Module, num_experts: int | None) -> list[nn.Parameter]:
    if isinstance(module, nn.modules.conv._ConvNd):
        return []
    params = [p for p in module.parameters(recurse=False) if p.dim() == 3]
    if not params:
        return []
    count = num_experts or getattr(module, "num_experts", None)
    if not isinstance(count, int) or any(p.shape[0] != count for p in params):
        return []
    return params


@dataclass
class _Call:
    kind: str
    macs: int  # per row
    rows: int
    input_grad: bool
    weight_grad: bool


@dataclass
class _Attention:
    index: int
    calls: int = 0
    q: bool | None = None
    k: bool | None = None
    v: bool | None = None
    out: bool | None = None


def _output_tensor(out: Any) -> torch.Tensor | None:
    if isinstance(out, torch.Tensor):
        return out
    if isinstance(out, (tuple, list)):
        return _first_tensor(tuple(out), {})
    return None


def _find_architecture(model: nn.Module) -> tuple[Architecture | None, str | None, nn.Module]:
    """The architecture from the model's configuration, or from the first submodule that has
    one (a model wrapped by DDP, FSDP, a Lightning module or PEFT)."""
    arch, reason = read_architecture(getattr(model, "config", None))
    if arch is not None:
        return arch, None, model
    for module in model.modules():
        config = getattr(module, "config", None)
        if module is model or config is None:
            continue
        found, _ = read_architecture(config)
        if found is not None:
            return found, None, module
    return None, reason, model


@dataclass
class Profiler:
    """Captures a :class:`ModelProfile` during one forward pass (then removes its hooks).

    Use :meth:`start` before the forward pass; the profile is in :attr:`profile` once that
    pass has returned (or :attr:`failed` is set when it raised).

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
    _calls: dict[str, list[_Call]] = field(default_factory=lambda: defaultdict(list))
    _unknown_ran: dict[str, int] = field(default_factory=dict)
    _attention: list[_Attention] = field(default_factory=list)
    _notes: list[str] = field(default_factory=list)
    _architecture: Architecture | None = None
    _arch_reason: str | None = None
    _nograd_modules: int = 0
    _top_k_seen: set[int] = field(default_factory=set)
    _expert_numel: dict[str, tuple[int, int]] = field(default_factory=dict)
    _errors: list[str] = field(default_factory=list)

    def start(self) -> Profiler:
        """Reads the configuration and registers the temporary hooks."""
        self._architecture, self._arch_reason, owner = _find_architecture(self.model)
        arch = self._architecture
        lm_head = None
        get_out = getattr(owner, "get_output_embeddings", None)
        if callable(get_out):
            try:
                lm_head = get_out()
            except Exception:  # pragma: no cover - models without one raise here
                lm_head = None
        attention_seen: list[str] = []
        for name, module in self.model.named_modules():
            if isinstance(module, nn.Embedding):
                continue
            if _ATTENTION_CLASS.search(type(module).__name__) and not any(
                name.startswith(prefix + ".") for prefix in attention_seen
            ):
                attention_seen.append(name)
                self._hook_attention(module, len(self._attention))
            kind = "lm_head" if module is lm_head else "lora" if "lora_" in name else "linear"
            if isinstance(module, nn.Linear):
                self._hook_linear(name, module, kind, module.in_features, module.out_features)
            elif _is_conv1d(module):
                weight = module.weight
                self._hook_linear(name, module, kind, weight.shape[0], int(module.nf))
            elif params := _expert_params(module, arch.num_experts if arch else None):
                experts = params[0].shape[0]
                per_expert = sum(p.numel() for p in params) // experts
                self._expert_numel[name] = (sum(p.numel() for p in params), experts)
                self._hook_experts(name, module, per_expert, params)
            elif any(p.dim() >= 2 for p in module.parameters(recurse=False)):
                weight = getattr(module, "weight", None)
                if (
                    isinstance(weight, nn.Parameter)
                    and weight.dim() == 2
                    and not isinstance(module, nn.modules.conv._ConvNd)
                    and sum(1 for p in module.parameters(recurse=False) if p.dim() >= 2) == 1
                ):
                    router = "router" if arch and arch.num_experts else "linear"
                    self._hook_linear(
                        name, module, router, weight.shape[1], weight.shape[0], strict=False
                    )
                else:
                    self._hook_unknown(name, module)
        # Last, so that the layer hooks on the model itself (if any) have run before it.
        self._model_handles.extend(register_exit_hook(self.model, self._on_model_exit))
        return self

    # -- hooks ------------------------------------------------------------------
    def _guard(self, hook: Any) -> Any:
        """Wraps a hook so that an error in it is recorded, never raised into training."""

        def guarded(*args: Any) -> None:
            try:
                hook(*args)
            except Exception as exc:
                if not self._errors:
                    logger.warning("flopmeter (profile): %s: %s", type(exc).__name__, exc)
                self._errors.append(f"{type(exc).__name__}: {exc}")

        return guarded

    def _hook(self, module: nn.Module, hook: Any, with_kwargs: bool = False) -> None:
        handle = module.register_forward_hook(self._guard(hook), with_kwargs=with_kwargs)
        # The model's own hooks (a model that is itself a layer flopmeter reads) are removed
        # with the exit hook's: never while torch runs them after an exception.
        (self._model_handles if module is self.model else self._handles).append(handle)

    def _hook_linear(
        self, name: str, module: nn.Module, kind: str, d_in: int, d_out: int, strict: bool = True
    ) -> None:
        def hook(mod: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any], out: Any) -> None:
            x = _first_tensor(args, kwargs)
            if x is None or x.dim() == 0 or x.shape[-1] != d_in:
                if not strict:  # a 2-D weight not applied as a linear layer to the input
                    self._unknown_ran[name] = d_in * d_out
                return
            grad = torch.is_grad_enabled()
            if not grad:
                self._nograd_modules += 1
            weight = getattr(mod, "weight", None)
            self._calls[name].append(
                _Call(
                    kind=kind,
                    macs=d_in * d_out,
                    rows=x.numel() // d_in,
                    input_grad=grad and x.requires_grad,
                    # A trainable weight gets its gradient even when this call ran without
                    # gradients (reentrant checkpointing recomputes it with them).
                    weight_grad=bool(getattr(weight, "requires_grad", False)),
                )
            )

        self._hook(module, hook, with_kwargs=True)

    def _hook_experts(
        self, name: str, module: nn.Module, per_expert: int, params: list[nn.Parameter]
    ) -> None:
        arch = self._architecture

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
                self._unknown_ran[name] = self._unknown_ran.get(name, 0) + per_expert
                return
            self._top_k_seen.add(int(top_k))
            grad = torch.is_grad_enabled()
            if not grad:
                self._nograd_modules += 1
            self._calls[name].append(
                _Call(
                    kind="experts",
                    macs=per_expert,
                    rows=(x.numel() // x.shape[-1]) * int(top_k),
                    input_grad=grad and x.requires_grad,
                    weight_grad=any(p.requires_grad for p in params),
                )
            )

        self._hook(module, hook, with_kwargs=True)

    def _hook_unknown(self, name: str, module: nn.Module) -> None:
        numel = sum(p.numel() for p in module.parameters(recurse=False) if p.dim() >= 2)

        def hook(mod: nn.Module, args: tuple[Any, ...], out: Any) -> None:
            self._unknown_ran[name] = numel

        self._hook(module, hook)

    def _hook_attention(self, module: nn.Module, position: int) -> None:
        index = getattr(module, "layer_idx", None)
        record = _Attention(index=index if isinstance(index, int) else position)
        self._attention.append(record)

        def on_output(attrs: tuple[str, ...]) -> Any:
            def hook(mod: nn.Module, args: tuple[Any, ...], out: Any) -> None:
                t = _output_tensor(out)
                flag = bool(t is not None and t.requires_grad)
                for attr in attrs:
                    setattr(record, attr, bool(getattr(record, attr)) or flag)

            return hook

        children = dict(module.named_children())
        for names, attrs in (
            (_Q_NAMES, ("q",)),
            (_K_NAMES, ("k",)),
            (_V_NAMES, ("v",)),
            (_QKV_NAMES, ("q", "k", "v")),
        ):
            child = next((children[n] for n in names if n in children), None)
            if child is not None:
                self._hook(child, on_output(attrs))

        def on_attention(mod: nn.Module, args: tuple[Any, ...], out: Any) -> None:
            record.calls += 1
            t = _output_tensor(out)
            record.out = bool(record.out) or bool(t is not None and t.requires_grad)

        self._hook(module, on_attention)

    def _on_model_exit(
        self,
        module: nn.Module,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        output: Any,
        returned: bool,
    ) -> None:
        if not returned:  # the forward pass raised; try again on the next micro-batch
            # torch is iterating the model's own forward hooks (after an exception it does so
            # without a copy), so only the submodules' hooks go now; remove() does the rest.
            self._remove_submodule_hooks()
            if not self._done:
                self._done = True
                self.failed = True
            return
        self.remove()
        if self._done:  # a later call of hooks not yet removed after a failure
            return
        self._done = True
        try:
            self.profile = self._build()
        except Exception as exc:  # the meter never breaks training
            logger.warning("flopmeter (profile): %s: %s", type(exc).__name__, exc, exc_info=exc)
            self.failed = True

    def _remove_submodule_hooks(self) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles.clear()

    def remove(self) -> None:
        """Removes every hook this profiler registered (idempotent)."""
        self._remove_submodule_hooks()
        for handle in self._model_handles:
            handle.remove()
        self._model_handles.clear()

    # -- result -----------------------------------------------------------------
    def _build(self) -> ModelProfile:
        notes: list[str] = []
        arch = self._architecture
        tokens = self.batch_tokens
        groups: dict[tuple[str, bool, bool], list[float]] = {}
        modules_per_group: dict[tuple[str, bool, bool], set[str]] = defaultdict(set)
        for name, calls in self._calls.items():
            for call in calls:
                key = (call.kind, call.input_grad, call.weight_grad)
                groups.setdefault(key, [0.0])[0] += call.macs * call.rows / tokens
                modules_per_group[key].add(name)
        order = {"linear": 0, "lora": 1, "router": 2, "experts": 3, "lm_head": 4}
        linear = tuple(
            LinearGroup(
                kind=k[0],
                input_grad=k[1],
                weight_grad=k[2],
                macs_per_token=v[0],
                modules=len(modules_per_group[k]),
            )
            for k, v in sorted(groups.items(), key=lambda kv: (order.get(kv[0][0], 9), kv[0]))
        )
        recognised = True
        if self._errors:
            recognised = False
            notes.append(f"The profile's hooks failed ({self._errors[0]}); it may be incomplete.")
        unknown = {k: v for k, v in self._unknown_ran.items() if v}
        if unknown:
            recognised = False
            listed = ", ".join(f"{k} ({v:,} weights)" for k, v in sorted(unknown.items())[:5])
            more = f" and {len(unknown) - 5} more" if len(unknown) > 5 else ""
            notes.append(
                f"Modules whose matmul work flopmeter cannot read ran in the forward pass: "
                f"{listed}{more}; their FLOP are not in the transformer estimate."
            )
        if self._nograd_modules:
            notes.append(
                f"{self._nograd_modules} weight-matrix calls ran with gradients disabled in the "
                "first training micro-batch (a no_grad block, or reentrant activation "
                "checkpointing): their input gradients are not counted (their trainable "
                "weights' gradients are); the measured estimate cross-checks this."
            )
        attention: tuple[AttentionLayerWork, ...] = ()
        if arch is not None:
            attention = self._attention_layers(arch, notes)
        elif self._attention:
            recognised = False
            notes.append(
                f"The model has {len(self._attention)} attention modules but no configuration "
                f"flopmeter reads ({self._arch_reason}): the attention-score FLOP (QK^T, AV) "
                "are not in the transformer estimate."
            )
        else:
            notes.append(
                f"No configuration ({self._arch_reason}) and no attention module: the "
                f"transformer estimate is the model's {sum(len(c) > 0 for c in self._calls.values())} "
                "weight-matrix modules, read from the modules themselves."
            )
        if not linear:
            recognised = False
            notes.append("No weight-matrix module ran in the first training micro-batch.")
        inactive = 0
        if arch is not None and arch.num_experts and self._expert_numel:
            top_k = arch.experts_per_token or (min(self._top_k_seen) if self._top_k_seen else 0)
            if self._top_k_seen and arch.experts_per_token not in (None, *self._top_k_seen):
                notes.append(
                    f"The configuration routes {arch.experts_per_token} experts per token, the "
                    f"model routed {sorted(self._top_k_seen)}: the model's routing was counted."
                )
                top_k = min(self._top_k_seen)
            for numel, experts in self._expert_numel.values():
                inactive += numel - numel * top_k // experts
        return ModelProfile(
            linear=linear,
            attention=attention,
            architecture=arch,
            recognised=recognised,
            notes=tuple(notes),
            inactive_expert_params=inactive,
            batch_tokens=tokens,
        )

    def _attention_layers(
        self, arch: Architecture, notes: list[str]
    ) -> tuple[AttentionLayerWork, ...]:
        records = [r for r in self._attention if r.calls > 0]
        by_index = {r.index: r for r in records}
        matched = len(records) == arch.num_layers and set(by_index) == set(range(arch.num_layers))
        if records and not matched:
            notes.append(
                f"{len(records)} attention modules ran, the configuration has "
                f"{arch.num_layers} layers: attention backward assumed in every layer."
            )
        any_grad = any(
            c.input_grad or c.weight_grad for calls in self._calls.values() for c in calls
        )
        layers = []
        for i, window in enumerate(arch.layer_windows):
            record = by_index.get(i) if matched else None
            if record is None:
                q = k = v = any_grad
            else:  # projections not found by name: the attention output's flag stands in
                out = bool(record.out)
                q = record.q if record.q is not None else out
                k = record.k if record.k is not None else out
                v = record.v if record.v is not None else out
            layers.append(
                AttentionLayerWork(
                    query_width=arch.query_width,
                    value_width=arch.query_width,
                    window=window,
                    q_grad=bool(q),
                    k_grad=bool(k),
                    v_grad=bool(v),
                )
            )
        return tuple(layers)


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
        profiler.remove()
    if profiler.profile is None:
        raise ValueError("the forward pass did not complete; no profile was taken")
    return profiler.profile
