"""The model profile's data: what the ``transformer`` estimate knows about a model.

Plain frozen values, built by :mod:`flopmeter.flops.build` from what the hooks of
:mod:`flopmeter.flops.capture` saw in the first training micro-batch.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import asdict, dataclass
from typing import Any, Literal

from flopmeter.flops.architecture import Architecture
from flopmeter.flops.mixers import ScanMixerWork

__all__ = [
    "STREAMS",
    "AttentionLayerWork",
    "LinearGroup",
    "LoraDeltaGroup",
    "ModelProfile",
    "Stream",
    "StreamSizes",
]

#: What a piece of work scales with over the run (see :class:`StreamSizes`):
#:
#: * ``"text"``: the text (or encoder) tokens: ``TokenTotals.tokens_processed``, squared
#:   lengths ``sum_sq_seq_len``;
#: * ``"decoder"``: the decoder tokens of an encoder-decoder model: ``decoder_tokens``,
#:   ``decoder_sum_sq_len``;
#: * ``"cross"``: cross-attention's query-key pairs over text encoder and decoder lengths:
#:   ``cross_pairs`` (attention only);
#: * ``"items"``: work constant per item at the profiled input shape (per image, audio clip,
#:   latent): ``items``.
Stream = Literal["text", "decoder", "cross", "items"]
STREAMS: tuple[str, ...] = ("text", "decoder", "cross", "items")


@dataclass(frozen=True)
class StreamSizes:
    """The profiled micro-batch's size in each stream (padding included: the rows its layers
    saw), the denominators of the profile's per-unit work.

    Attributes:
        text_tokens: Text (encoder) token positions, ``batch x length`` of the token ids; 0
            without token ids.
        decoder_tokens: Decoder positions of an encoder-decoder model; 0 without a decoder.
        items: Items in the batch dimension (sequences, images, clips, latents).
        text_only: All the micro-batch's work is in the one text stream (token ids with only
            masks, labels and positions beside them): every call is then scaled by the text
            tokens, as a decoder-only or encoder-only text model's are.
        item_key: The shapes, without the batch dimension, of the inputs the items' work
            depends on (``name:d1xd2`` joined by ``;``, as in a shape key), or ``""``: the
            per-item work holds only for micro-batches whose shape key has these parts.
    """

    text_tokens: int = 0
    decoder_tokens: int = 0
    items: int = 0
    text_only: bool = True
    item_key: str = ""

    def size(self, stream: str) -> int:
        """The micro-batch's units in ``stream`` (0 for ``"cross"``, which has no rows)."""
        return {"text": self.text_tokens, "decoder": self.decoder_tokens, "items": self.items}.get(
            stream, 0
        )


@dataclass(frozen=True)
class LinearGroup:
    """Weight matrices that cost the same per multiply-add.

    Attributes:
        kind: "linear", "lm_head", "lora", "experts" (routed expert weights), "router" or
            "conv" (a torch convolution: ``out positions x in_channels/groups x kernel x
            out_channels`` multiply-adds per call, the same again for each gradient).
        input_grad: Autograd computes the gradient of their input (2 FLOP per MAC).
        weight_grad: Their weights train (2 FLOP per MAC for the weight gradient).
        macs_per_token: Multiply-adds per unit of the group's stream: per training token
            (text; experts: top-k of them), per decoder token, or per item (a convolution's
            or a vision tower's work per image at the profiled shape).
        modules: How many modules the group holds.
        stream: What the work scales with over the run (see :data:`Stream`).
    """

    kind: str
    input_grad: bool
    weight_grad: bool
    macs_per_token: float
    modules: int
    stream: Stream = "text"

    @property
    def flops_per_mac(self) -> int:
        """FLOP per multiply-add: 2 forward, + 2 for the input gradient, + 2 for the weight's."""
        return 2 + 2 * self.input_grad + 2 * self.weight_grad


@dataclass(frozen=True)
class LoraDeltaGroup:
    """LoRA products ``delta_W = B @ A`` built once per micro-batch, not per token.

    peft's ``ParamWrapper`` (``target_parameters``, or ``target_modules="all-linear"`` on
    mixture-of-experts models) adds ``B @ A`` to a wrapped parameter (3-D experts, or a 2-D
    router weight) on every forward call: its cost is the parameter's elements times the rank,
    whatever the tokens.

    Attributes:
        macs: Multiply-adds of one evaluation of the products, per micro-batch
            (``sum(param.numel() * r)`` over the group's wrapped parameters and calls).
        forward_products: Evaluations of each product in the forward pass (peft's folded
            single-adapter path evaluates it twice: its parametrization check, then the use).
        factor_grads: Trainable factors (0, 1 or 2 of A and B) whose gradient backward computes,
            ``macs`` multiply-adds each.
        modules: Wrapped parameters in the group.
        lora_params: Elements of their A and B factors.
    """

    macs: float
    forward_products: int
    factor_grads: int
    modules: int
    lora_params: int

    @property
    def flops_per_mac(self) -> int:
        """FLOP per multiply-add: 2 per forward evaluation, + 2 per trainable factor."""
        return 2 * (self.forward_products + self.factor_grads)


@dataclass(frozen=True)
class AttentionLayerWork:
    """One self-attention layer's score work (``QK^T`` and ``AV``).

    Attributes:
        query_width: Query heads x query/key head width (key/value heads are repeated to
            match), elements: the width of ``QK^T``, ``dQ`` and ``dK``.
        window: Sliding-window length in tokens, None for full attention.
        q_grad: The queries require a gradient.
        k_grad: The keys require a gradient.
        v_grad: The values require a gradient.
        value_width: Query heads x value head width, elements: the width of ``AV``,
            ``dP = dO V^T`` and ``dV``. None given: :attr:`query_width` (one ``head_dim`` for
            queries, keys and values); multi-head latent attention differs (DeepSeek-V3:
            ``qk_nope_head_dim + qk_rope_head_dim`` against ``v_head_dim``).
        stream: What the layer's (query, key) pairs scale with: ``"text"`` (per sequence
            ``L^2`` over the text tokens), ``"decoder"`` (the decoder's self-attention, or with
            ``pairs_per_unit`` a decoder attending to a fixed number of keys), ``"cross"``
            (cross-attention over text encoder x decoder lengths) or ``"items"``.
        pairs_per_unit: When positive, the pairs are this many per unit of the stream: per
            item (its queries x keys at the profiled shape), or per decoder token (the keys of
            an audio encoder's fixed-length output); 0: the pairs come from the run's squared
            lengths.
        bidirectional: The layer attends in both directions (an encoder-decoder's encoder):
            its pairs are the full square whatever the ``attention`` convention.
    """

    query_width: int
    window: int | None
    q_grad: bool
    k_grad: bool
    v_grad: bool
    value_width: int | None = None
    stream: Stream = "text"
    pairs_per_unit: float = 0.0
    bidirectional: bool = False

    def __post_init__(self) -> None:
        if self.value_width is None:
            object.__setattr__(self, "value_width", self.query_width)

    @property
    def backward_matmuls(self) -> tuple[int, int]:
        """Backward matmuls over ``(query_width, value_width)``: ``dQ = dS K`` and ``dK = dS^T Q``
        over the query width when the queries / keys need gradients; ``dP = dO V^T`` (when
        either does) and ``dV = P^T dO`` (when the values do) over the value width."""
        qk = int(self.q_grad) + int(self.k_grad)
        v = int(self.q_grad or self.k_grad) + int(self.v_grad)
        return qk, v

    def to_dict(self) -> dict[str, Any]:
        """The layer as plain data (the report's keys, ``value_width`` included)."""
        return {
            "query_width": self.query_width,
            "value_width": self.value_width,
            "window": self.window,
            "q_grad": self.q_grad,
            "k_grad": self.k_grad,
            "v_grad": self.v_grad,
            "stream": self.stream,
            "pairs_per_unit": self.pairs_per_unit,
            "bidirectional": self.bidirectional,
        }


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
            (``n_active = n_total - inactive_expert_params``), elements; ``None`` when the
            routing is not known.
        batch_tokens: Tokens (padding included) of the micro-batch profiled.
        cross_check: Modules whose work the profile could not fully model; a measured sample
            is forced when any (the recorder's).
        lora_delta: LoRA products built per micro-batch (wrapped expert or router weights).
        streams: The profiled micro-batch's size in each stream (the per-unit work's
            denominators).
        mixers: The state-space / linear-attention mixers that ran (``"name (Class)"``): the
            FLOP model has no formula for their convolution and scan, so the ``transformer``
            estimate of a profile with any is null.
        scan_mixers: The selective-scan mixers the FLOP model reads (Mamba's, Jamba's): their
            convolution and scan, per text token (:mod:`flopmeter.flops.mixers`).
    """

    linear: tuple[LinearGroup, ...]
    attention: tuple[AttentionLayerWork, ...]
    architecture: Architecture | None
    recognised: bool
    notes: tuple[str, ...] = ()
    inactive_expert_params: int | None = 0
    batch_tokens: int = 0
    cross_check: tuple[str, ...] = ()
    lora_delta: tuple[LoraDeltaGroup, ...] = ()
    streams: StreamSizes = StreamSizes()
    mixers: tuple[str, ...] = ()
    scan_mixers: tuple[ScanMixerWork, ...] = ()

    def uses(self, stream: str) -> bool:
        """Whether any of the profile's work scales with ``stream``."""
        return (
            any(g.stream == stream for g in self.linear)
            or any(a.stream == stream for a in self.attention)
            or (stream == "text" and bool(self.scan_mixers))
        )

    def to_dict(self) -> dict[str, Any]:
        """The profile as plain data (for a report's ``inputs``), attention layers grouped."""
        groups: dict[tuple[Any, ...], int] = defaultdict(int)
        for layer in self.attention:
            groups[tuple(layer.to_dict().items())] += 1
        attention = [{"layers": count, **dict(key)} for key, count in groups.items()]
        return {
            "linear_groups": [asdict(g) for g in self.linear],
            "attention_layers": attention,
            "architecture": self.architecture.to_dict() if self.architecture else None,
            "profiled_batch_tokens": self.batch_tokens,
            "profiled_streams": asdict(self.streams),
            "lora_delta_groups": [asdict(g) for g in self.lora_delta],
            "scan_mixers": _grouped(asdict(m) | {"name": None} for m in self.scan_mixers),
        }


def _grouped(rows: Any) -> list[dict[str, Any]]:
    """Equal rows once each, with how many there were (``count``), names left out."""
    counts: dict[tuple[Any, ...], int] = defaultdict(int)
    for row in rows:
        counts[tuple((k, v) for k, v in row.items() if k != "name")] += 1
    return [{**dict(key), "count": n} for key, n in counts.items()]
