"""Builds a :class:`~flopmeter.flops.model_profile.ModelProfile` from what the hooks recorded.

A pure function of the records (:class:`Captured`) that :mod:`flopmeter.flops.capture` fills
during one forward pass and the architecture read from the configuration: the linear groups,
the attention layers, what was not covered (notes, ``recognised``) and the inactive experts.
Which stream each call is in, and the attention of a micro-batch with more than the text
stream, are :mod:`flopmeter.flops.streams` (``ScoreRecord`` and ``stream_of`` re-exported).
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field, replace

from flopmeter.flops.architecture import Architecture
from flopmeter.flops.mixers import ScanMixerWork
from flopmeter.flops.model_profile import (
    AttentionLayerWork,
    LinearGroup,
    LoraDeltaGroup,
    ModelProfile,
    Stream,
    StreamSizes,
)
from flopmeter.flops.streams import (
    ScoreRecord,
    stream_attention_layers,
    stream_coverage,
    stream_of,
)

__all__ = [
    "AttentionRecord",
    "CallRecord",
    "Captured",
    "DeltaRecord",
    "build_profile",
]

_GROUP_ORDER = {"conv": 0, "linear": 1, "lora": 2, "router": 3, "experts": 4, "lm_head": 5}


@dataclass
class CallRecord:
    """One call of a weight matrix: ``rows`` rows of ``macs`` multiply-adds each.

    ``first`` is false for the further records of one module call (an expert module whose
    weights differ in which gradients they need makes one record per kind).
    """

    kind: str
    macs: int
    rows: int
    input_grad: bool
    weight_grad: bool
    first: bool = True


@dataclass
class DeltaRecord:
    """One LoRA ``B @ A`` product a ``ParamWrapper`` call built (one adapter, one parameter).

    Attributes:
        name: ``wrapper name:adapter``.
        macs: Multiply-adds of one evaluation (wrapped parameter's elements x rank).
        forward_products: Evaluations in the forward pass.
        factor_grads: Trainable factors whose gradient backward computes (0-2).
        lora_params: Elements of the adapter's A and B.
    """

    name: str
    macs: int
    forward_products: int
    factor_grads: int
    lora_params: int


@dataclass
class AttentionRecord:
    """One attention module: its layer index, its calls, and its outputs' gradient flags
    (``None``: that projection was not found by name)."""

    index: int
    calls: int = 0
    q: bool | None = None
    k: bool | None = None
    v: bool | None = None
    out: bool | None = None


@dataclass
class Captured:
    """What the profile's hooks saw in one forward pass.

    Attributes:
        architecture: The configuration's architecture, if read.
        arch_reason: Why there is none.
        calls: Weight-matrix calls by module name.
        unknown_ran: Weights (elements) of modules whose work could not be read, by name.
        attention: The attention modules, in model order.
        nograd_modules: Weight-matrix calls made with gradients disabled.
        top_k_seen: Experts per token the model routed to.
        expert_numel: By expert module name, ``(weights of all experts, experts)``.
        errors: Errors raised inside the hooks.
        outside: Products found by the weight outside its module, by module name.
        unmodelled: Modules whose work the profile could not model, with why.
        nograd_calls: Weight-matrix calls made with gradients disabled, by module name.
        recomputed: Calls made again, with gradients, inside the backward pass (activation
            checkpointing's recomputation), by module name.
        lora_delta: The LoRA products built by ``ParamWrapper`` calls.
        scores: The attention calls read from their projections (the stream model's attention).
        scores_unread: Attention modules that ran but whose score work could not be read from
            their projections, by name, with why.
        cross_inputs: Modules that projected a cross-attention's keys or values (their input is
            the encoder's output).
        mixers: The state-space / linear-attention mixers that ran, as ``"name (Class)"``.
        scan_mixers: The selective-scan mixers the FLOP model reads, by module name.
    """

    architecture: Architecture | None = None
    arch_reason: str | None = None
    calls: dict[str, list[CallRecord]] = field(default_factory=lambda: defaultdict(list))
    unknown_ran: dict[str, int] = field(default_factory=dict)
    attention: list[AttentionRecord] = field(default_factory=list)
    nograd_modules: int = 0
    top_k_seen: set[int] = field(default_factory=set)
    expert_numel: dict[str, tuple[int, int]] = field(default_factory=dict)
    errors: list[str] = field(default_factory=list)
    outside: dict[str, int] = field(default_factory=dict)
    #: The profiled forward ran compiled (torch.compile), without the weight watch.
    compiled: bool = False
    #: A compiled model's sampled micro-batches run eagerly (:mod:`flopmeter.flops.eager_runs`),
    #: so a dispatch-level sample can cross-check the profile of a compiled model.
    eager_samples: bool = False
    #: The output projection's module name, when the model has one.
    lm_head_name: str | None = None
    unmodelled: dict[str, str] = field(default_factory=dict)
    nograd_calls: dict[str, int] = field(default_factory=dict)
    recomputed: dict[str, list[CallRecord]] = field(default_factory=lambda: defaultdict(list))
    lora_delta: list[DeltaRecord] = field(default_factory=list)
    scores: list[ScoreRecord] = field(default_factory=list)
    scores_unread: dict[str, str] = field(default_factory=dict)
    cross_inputs: set[str] = field(default_factory=set)
    mixers: set[str] = field(default_factory=set)
    scan_mixers: dict[str, ScanMixerWork] = field(default_factory=dict)


def _lora_delta_groups(captured: Captured) -> tuple[LoraDeltaGroup, ...]:
    """The profiled micro-batch's LoRA products, grouped by what each costs per multiply-add."""
    macs: dict[tuple[int, int], int] = defaultdict(int)
    params: dict[tuple[int, int], dict[str, int]] = defaultdict(dict)
    for rec in captured.lora_delta:
        key = (rec.forward_products, rec.factor_grads)
        macs[key] += rec.macs
        params[key][rec.name] = rec.lora_params
    return tuple(
        LoraDeltaGroup(
            macs=float(macs[key]),
            forward_products=key[0],
            factor_grads=key[1],
            modules=len(params[key]),
            lora_params=sum(params[key].values()),
        )
        for key in sorted(macs)
    )


def _linear_groups(captured: Captured, sizes: StreamSizes) -> tuple[LinearGroup, ...]:
    """The weight-matrix work by (stream, kind, gradients), per unit of each stream."""
    groups: dict[tuple[str, bool, bool, Stream], list[float]] = {}
    modules_per_group: dict[tuple[str, bool, bool, Stream], set[str]] = defaultdict(set)
    for name, calls in captured.calls.items():
        cross = name in captured.cross_inputs
        for call in calls:
            stream = stream_of(name, call.rows, sizes, call.kind, cross)
            units = sizes.text_tokens if sizes.text_only else sizes.size(stream)
            key = (call.kind, call.input_grad, call.weight_grad, stream)
            groups.setdefault(key, [0.0])[0] += call.macs * call.rows / units
            modules_per_group[key].add(name)
    order = {"text": 0, "decoder": 1, "items": 2}
    return tuple(
        LinearGroup(
            kind=k[0],
            input_grad=k[1],
            weight_grad=k[2],
            macs_per_token=v[0],
            modules=len(modules_per_group[k]),
            stream=k[3],
        )
        for k, v in sorted(
            groups.items(),
            key=lambda kv: (order[kv[0][3]], _GROUP_ORDER.get(kv[0][0], 9), kv[0][:3]),
        )
    )


def _coverage(captured: Captured, notes: list[str]) -> bool:
    """Notes on hook errors, unreadable modules and no-grad calls; False when not covered."""
    recognised = True
    if captured.errors:
        recognised = False
        notes.append(f"The profile's hooks failed ({captured.errors[0]}); it may be incomplete.")
    unknown = {k: v for k, v in captured.unknown_ran.items() if v}
    if unknown:
        recognised = False
        listed = ", ".join(f"{k} ({v:,} weights)" for k, v in sorted(unknown.items())[:5])
        more = f" and {len(unknown) - 5} more" if len(unknown) > 5 else ""
        notes.append(
            f"Modules whose matmul work flopmeter cannot read ran in the forward pass: "
            f"{listed}{more}; their FLOP are not in the transformer estimate."
        )
    _nograd_notes(captured, notes)
    _outside_notes(captured, notes)
    return recognised


def _first_calls(records: list[CallRecord], calls: int) -> list[CallRecord]:
    """The records of the first ``calls`` module calls among ``records``."""
    starts = [i for i, r in enumerate(records) if r.first]
    return records[: starts[calls]] if calls < len(starts) else list(records)


def _nograd_notes(captured: Captured, notes: list[str]) -> None:
    """Charges calls run without gradients, then recomputed with them in the backward pass
    (reentrant checkpointing), as that backward computes them; notes the rest."""
    recomputed = 0
    for name, count in captured.nograd_calls.items():
        again = captured.recomputed.get(name)
        calls = captured.calls[name]
        if again and count == sum(c.first for c in calls):
            calls[:] = _first_calls(again, count)
            recomputed += count
    if recomputed:
        notes.append(
            f"{recomputed} weight-matrix calls ran with gradients disabled in the first training "
            "micro-batch and again, with gradients, in its backward pass (reentrant activation "
            "checkpointing): charged as that backward computes them (input and weight "
            "gradients); the recomputation itself is not counted (Annex A.1)."
        )
    left = captured.nograd_modules - recomputed
    if left:
        notes.append(
            f"{left} weight-matrix calls ran with gradients disabled in the first training "
            "micro-batch (a no_grad block): their input gradients are not counted (their "
            "trainable weights' gradients are); the measured estimate cross-checks this."
        )
        trainable = [
            n
            for n in captured.nograd_calls
            if n not in captured.recomputed and any(c.weight_grad for c in captured.calls[n])
        ]
        for name in trainable[:1]:
            captured.unmodelled.setdefault(
                name, "it ran with gradients disabled, its weight trains, no recomputation seen"
            )


def _outside_notes(captured: Captured, notes: list[str]) -> None:
    """Notes weights found used outside their module, and work the profile cannot model."""
    head = captured.lm_head_name
    if captured.compiled and head is not None and not captured.calls.get(head):
        captured.unmodelled.setdefault(
            head,
            "the output projection did not run as a module in a compiled model (a fused loss "
            "that uses its weight directly, as TRL's does, would be hidden by the compiled code "
            "and is not counted)",
        )
    if captured.outside:
        listed = ", ".join(f"{k} ({v} products)" for k, v in sorted(captured.outside.items()))
        notes.append(
            f"Weights used outside their module, found by the weight and counted: {listed} "
            "(e.g. a loss that multiplies by lm_head.weight directly, as TRL and fused "
            "linear-cross-entropy kernels do)."
        )
    check = "a measured sample is taken to cross-check it"
    if captured.compiled:
        check = (
            "a measured sample, run eagerly, is taken to cross-check it"
            if captured.eager_samples
            else "no measured sample can cross-check it on a compiled model, so the transformer "
            "estimate may be low"
        )
    for name, why in sorted(captured.unmodelled.items()):
        notes.append(f"The profile cannot fully model {name}: {why}; {check}.")


def _attention_layers(
    captured: Captured, arch: Architecture, notes: list[str]
) -> tuple[AttentionLayerWork, ...]:
    """The attention layers that ran, each with its window, widths and gradient flags.

    The layers are the attention modules that ran (by their ``layer_idx``): in a hybrid stack
    (Jamba, Qwen3-Next) only some layers have attention, the others a state-space or
    linear-attention mixer, and only those are billed. When no attention module is found by
    class name, or the modules' indices do not fit the configuration's layers, every layer is
    billed, with gradients wherever any weight-matrix call had them (and a note).
    """
    records = [r for r in captured.attention if r.calls > 0]
    by_index = {r.index: r for r in records}
    fits = len(by_index) == len(records) and set(by_index) <= set(range(arch.num_layers))
    any_grad = any(
        c.input_grad or c.weight_grad for calls in captured.calls.values() for c in calls
    )
    if records and not fits:
        notes.append(
            f"{len(records)} attention modules ran, the configuration has "
            f"{arch.num_layers} layers: attention backward assumed in every layer."
        )
    elif records and len(records) < arch.num_layers:
        notes.append(
            f"Attention ran in {len(records)} of the {arch.num_layers} layers (layers "
            f"{', '.join(str(i) for i in sorted(by_index))}): only those are billed attention "
            "scores."
        )
    indices = sorted(by_index) if records and fits else range(arch.num_layers)
    layers = []
    for i in indices:
        record = by_index.get(i) if records and fits else None
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
                window=arch.layer_windows[i],
                q_grad=bool(q),
                k_grad=bool(k),
                v_grad=bool(v),
                value_width=arch.value_width,
            )
        )
    return tuple(layers)


def _inactive_experts(
    captured: Captured, arch: Architecture | None, notes: list[str]
) -> int | None:
    """Expert weights (elements) a token is not routed to; notes a routing the model changed.
    ``None`` when the model has experts but how many a token is routed to is not known (no
    ``experts_per_token`` in the configuration and no routing seen)."""
    if arch is None or not arch.num_experts or not captured.expert_numel:
        return 0
    seen = captured.top_k_seen
    if not arch.experts_per_token and not seen:
        notes.append(
            "The model has experts, but neither its configuration nor the profiled forward pass "
            "says how many a token is routed to: n_active is not given."
        )
        return None
    top_k = arch.experts_per_token or min(seen)
    if seen and arch.experts_per_token not in (None, *seen):
        notes.append(
            f"The configuration routes {arch.experts_per_token} experts per token, the "
            f"model routed {sorted(seen)}: the model's routing was counted."
        )
        top_k = min(seen)
    return sum(
        numel - numel * top_k // experts for numel, experts in captured.expert_numel.values()
    )


def build_profile(
    captured: Captured, batch_tokens: int, streams: StreamSizes | None = None
) -> ModelProfile:
    """The profile of one forward pass (a pure function of its records).

    Args:
        captured: What the hooks recorded.
        batch_tokens: Tokens of the micro-batch, padding included (the rows a dense layer saw).
        streams: The micro-batch's size in each stream; None: a text-only micro-batch of
            ``batch_tokens`` tokens (every call scaled by the text tokens).
    """
    sizes = streams if streams is not None else StreamSizes(text_tokens=batch_tokens)
    notes: list[str] = []
    arch = captured.architecture
    # A copy: the recomputed calls replace no-grad ones, and the records stay as the hooks left
    # them (the profile is built after the forward pass and again after its backward).
    captured = replace(
        captured,
        calls=defaultdict(list, {k: list(v) for k, v in captured.calls.items()}),
        unmodelled=dict(captured.unmodelled),
    )
    recognised = _coverage(captured, notes)  # first: it applies the recomputed calls
    linear = _linear_groups(captured, sizes)
    attention: tuple[AttentionLayerWork, ...] = ()
    if not sizes.text_only:
        attention = stream_attention_layers(
            captured.scores, captured.scores_unread, captured.unmodelled, sizes, notes
        )
        recognised = stream_coverage(captured.unmodelled, linear, notes) and recognised
    elif arch is not None:
        attention = _attention_layers(captured, arch, notes)
    elif captured.attention:
        recognised = False
        notes.append(
            f"The model has {len(captured.attention)} attention modules but no configuration "
            f"flopmeter reads ({captured.arch_reason}): the attention-score FLOP (QK^T, AV) "
            "are not in the transformer estimate."
        )
    else:
        ran = sum(len(c) > 0 for c in captured.calls.values())
        notes.append(
            f"No configuration ({captured.arch_reason}) and no attention module: the "
            f"transformer estimate is the model's {ran} weight-matrix modules, read from the "
            "modules themselves."
        )
    if not linear:
        recognised = False
        notes.append("No weight-matrix module ran in the first training micro-batch.")
    inactive = _inactive_experts(captured, arch, notes)
    return ModelProfile(
        linear=linear,
        attention=attention,
        architecture=arch,
        recognised=recognised,
        notes=tuple(notes),
        inactive_expert_params=inactive,
        batch_tokens=batch_tokens,
        cross_check=tuple(sorted(captured.unmodelled)),
        mixers=tuple(sorted(captured.mixers)),
        scan_mixers=tuple(captured.scan_mixers.values()),
        lora_delta=_lora_delta_groups(captured),
        streams=sizes,
    )
