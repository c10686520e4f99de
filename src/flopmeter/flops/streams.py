"""Which stream a module call's work scales with, and the stream model's attention layers.

For a micro-batch with more than the text stream (an encoder-decoder's decoder positions, the
images or clips of a vision or audio tower): :func:`stream_of` puts each call in the stream its
rows scale with, and the attention calls read from their projections' shapes
(:class:`ScoreRecord`) become the stream model's attention layers. Pure functions, used by
:mod:`flopmeter.flops.build`.
"""

from __future__ import annotations

from dataclasses import dataclass

from flopmeter.flops.model_profile import AttentionLayerWork, LinearGroup, Stream, StreamSizes

__all__ = ["ScoreRecord", "stream_attention_layers", "stream_coverage", "stream_of"]

#: Module path parts that hold work per image or audio clip (the tie-break when a call's rows
#: fit a token stream too).
_ITEM_PATHS = frozenset(
    {
        "vision_tower",
        "vision_model",
        "audio_tower",
        "multi_modal_projector",
        "visual",
        "vision_encoder",
        "image_encoder",
        "audio_encoder",
    }
)


@dataclass(frozen=True)
class ScoreRecord:
    """One call of an attention module, read from its query, key and value projections.

    Attributes:
        name: The attention module's qualified name.
        batch: Sequences (or items) in the call, the projections' first dimension.
        queries: Query positions per sequence.
        keys: Key (and value) positions per sequence.
        query_width: The query projection's output width (heads x head_dim), elements.
        value_width: The value width repeated to the query heads (value projection width x
            query width / key width), elements.
        cross: The keys were projected from another tensor than the queries (cross-attention).
        q_grad: The queries require a gradient.
        k_grad: The keys require a gradient.
        v_grad: The values require a gradient.
    """

    name: str
    batch: int
    queries: int
    keys: int
    query_width: int
    value_width: int
    cross: bool
    q_grad: bool
    k_grad: bool
    v_grad: bool


def stream_of(
    name: str, rows: int, sizes: StreamSizes, kind: str = "linear", cross_input: bool = False
) -> Stream:
    """The stream a module call's work scales with (a pure function).

    A call whose rows are the micro-batch's text tokens (or decoder positions) is in that
    stream; one whose rows fit neither does work per item (an image's patches, a clip's
    frames, pooled rows). Ties are broken by the module: a cross-attention's key and value
    projections and a module under ``encoder`` read the encoder's stream, an output
    projection of an encoder-decoder model and a module under ``decoder`` the decoder's, a
    module under a vision or audio tower (``vision_tower``, ``vision_model``, ...) the items.

    Args:
        name: The module's qualified name.
        rows: The rows of its input in this call (positions, for a convolution).
        sizes: The profiled micro-batch's stream sizes.
        kind: The layer's kind ("linear", "lm_head", "experts", "conv"...).
        cross_input: The module projected a cross-attention's keys or values.
    """
    if sizes.text_only:
        return "text"
    parts = set(name.split("."))
    items_path = bool(parts & _ITEM_PATHS) or ("encoder" in parts and not sizes.text_tokens)
    fits: list[Stream] = [s for s in ("text", "decoder") if sizes.size(s) and rows == sizes.size(s)]
    if kind == "experts" and not fits and sizes.text_tokens and rows % sizes.text_tokens == 0:
        fits = ["text"]  # routed rows: tokens x top-k
    if not fits or items_path:
        return "items"
    if len(fits) == 1:
        return fits[0]
    if cross_input or "encoder" in parts:
        return "text"
    return "decoder" if kind == "lm_head" or "decoder" in parts else "text"


def _score_layer(rec: ScoreRecord, sizes: StreamSizes) -> AttentionLayerWork | str:
    """One attention call as a layer of the stream model, or why it cannot be one."""
    queries = stream_of(rec.name, rec.batch * rec.queries, sizes, "attention")
    flags = {"q_grad": rec.q_grad, "k_grad": rec.k_grad, "v_grad": rec.v_grad}
    if rec.value_width != rec.query_width:
        return (
            f"its value width ({rec.value_width}) differs from its query width ({rec.query_width})"
        )
    per_item = rec.batch * rec.queries * rec.keys / max(sizes.items, 1)
    if not rec.cross:
        if rec.queries != rec.keys:
            return f"{rec.queries} queries attend to {rec.keys} keys of the same input"
        pairs = per_item if queries == "items" else 0.0
        encoder = queries == "text" and sizes.decoder_tokens > 0  # an encoder-decoder's encoder
        return AttentionLayerWork(
            rec.query_width,
            None,
            **flags,
            stream=queries,
            pairs_per_unit=pairs,
            bidirectional=encoder,
        )
    keys = stream_of(rec.name, rec.batch * rec.keys, sizes, "attention", cross_input=True)
    if keys == "items":  # a fixed number of keys per query (an image's, a clip's)
        pairs = per_item if queries == "items" else float(rec.keys)
        return AttentionLayerWork(
            rec.query_width, None, **flags, stream=queries, pairs_per_unit=pairs
        )
    if queries == "decoder" and keys == "text":
        return AttentionLayerWork(rec.query_width, None, **flags, stream="cross")
    return f"its queries are in the {queries} stream and its keys in the {keys} stream"


def stream_attention_layers(
    scores: list[ScoreRecord],
    scores_unread: dict[str, str],
    unmodelled: dict[str, str],
    sizes: StreamSizes,
    notes: list[str],
) -> tuple[AttentionLayerWork, ...]:
    """The attention layers of a micro-batch with more than the text stream, one per attention
    call read from its projections; calls that cannot be read are marked unmodelled.

    Args:
        scores: The attention calls read from their projections.
        scores_unread: Attention modules whose score work could not be read, with why.
        unmodelled: Modules the profile cannot model, with why; extended in place.
        sizes: The profiled micro-batch's stream sizes.
        notes: The profile's notes; extended in place.
    """
    layers = []
    for rec in scores:
        layer = _score_layer(rec, sizes)
        if isinstance(layer, str):
            unmodelled.setdefault(rec.name, f"attention not modelled: {layer}")
        else:
            layers.append(layer)
    for name, why in scores_unread.items():
        unmodelled.setdefault(name, why)
    if layers:
        streams = sorted({layer.stream for layer in layers})
        notes.append(
            f"Attention read from the projections of {len(layers)} attention calls "
            f"(streams: {', '.join(streams)}); encoder, cross-attention and per-item attention "
            "are counted as the full square."
        )
    return tuple(layers)


def stream_coverage(
    unmodelled: dict[str, str], linear: tuple[LinearGroup, ...], notes: list[str]
) -> bool:
    """Whether a micro-batch with more than the text stream is fully modelled: no module whose
    work could not be modelled (``unmodelled``, named with why in the notes by
    :mod:`flopmeter.flops.build`); notes the streams found (appended to ``notes``)."""
    streams = sorted({g.stream for g in linear})
    notes.append(
        "Work scaled by stream: "
        + ", ".join(streams)
        + " (text: encoder or text tokens; decoder: decoder tokens; items: work per image, "
        "clip or latent at the profiled input shape)."
    )
    if unmodelled:
        listed = "; ".join(f"{k}: {v}" for k, v in sorted(unmodelled.items())[:3])
        notes.append(f"Not recognised: work the profile does not model exactly ({listed}).")
        return False
    return True
