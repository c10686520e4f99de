"""The ``transformer`` estimate: linear work from the model's own layers plus attention scores.

A pure function of a :class:`~flopmeter.flops.model_profile.ModelProfile` and the run's token
statistics. Conventions (docs/methodology.md):

* 2 FLOP per multiply-add (MAC). Each weight matrix is counted by the tokens that pass through
  it: forward 2 per MAC; backward 2 more for the input gradient where autograd computes one
  (the input requires a gradient) and 2 more for the weight gradient of trainable weights. Full
  fine-tuning gives 6, a frozen layer that gradients flow through 4, a layer below the first
  trainable parameter 2 (forward only). Embedding lookups cost nothing; the output projection
  is a matmul (tied or not, counted once). Routed experts count by the tokens routed to them
  (top-k of every token); the router in full.
* Attention scores: per layer ``QK^T`` and ``AV``, ``2 * width`` FLOP per (query, key) pair
  each, where width is query heads x head_dim (grouped-query attention repeats keys and values
  to the query heads). Backward adds ``dQ``, ``dK``, ``dP = dO V^T`` and ``dV`` where the
  queries, keys and values need gradients. Pairs per sequence: the full square ``L^2`` (eager
  and math attention compute it and PyTorch's counter counts it; sliding windows are masked,
  not skipped), or with ``attention="causal"`` the ``L (L + 1) / 2`` pairs a causal flash kernel
  computes, at most ``window * L`` in sliding-window layers.
* LoRA on single parameters (peft's ``ParamWrapper``: mixture-of-experts weights under
  ``target_modules="all-linear"`` or ``target_parameters``): the wrapped weight is
  ``W + B @ A``, so its gradient is computed (6 FLOP per MAC through the experts, not 4), and
  each ``B @ A`` is built per micro-batch, not per token: ``micro_batches * sum(macs * 2 *
  (forward_products + factor_grads))``.
* Streams: each linear group and attention layer scales with its own stream (see
  :data:`~flopmeter.flops.model_profile.Stream`): text (encoder) tokens, decoder tokens of an
  encoder-decoder model, cross-attention pairs, or items (images, audio clips, latents: work
  constant per item at the profiled input shape, such as a convolution or a vision tower).
  An encoder-decoder's encoder, cross-attention and item-stream attention count the full
  square (they are not causal); the ``attention`` convention applies to text and decoder
  self-attention. When the
  profile has work in a stream the run's totals did not count (no decoder tokens, no items),
  or items of an input shape other than the profiled one, the estimate is null with the reason.
* Activation-checkpoint recomputation is not counted (Commission guidelines, Annex A.1).
* Selective-scan mixers (Mamba's, Jamba's): their short convolution over ``L + k - 1``
  positions per sequence and their scan's products per token (:mod:`flopmeter.flops.mixers`).
  Other state-space and linear-attention mixers (Mamba2's chunked scan, Falcon-H1's, gated
  delta-nets): no formula, so a profile with any has no figure (null, with the reason:
  :func:`mixer_reason`); the ``measured`` estimate counts them.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Literal

from flopmeter.flops.mixers import scan_mixer_flops
from flopmeter.flops.model_profile import (
    AttentionLayerWork,
    LinearGroup,
    LoraDeltaGroup,
    ModelProfile,
)
from flopmeter.flops.per_item import NON_PADDING
from flopmeter.types import Estimate, TokenTotals

__all__ = [
    "ATTENTION_CONVENTIONS",
    "AttentionConvention",
    "attention_flops",
    "attention_pairs",
    "linear_flops",
    "lora_delta_flops",
    "mixer_reason",
    "stream_attention_flops",
    "stream_linear_flops",
    "stream_units",
    "transformer_estimate",
]

AttentionConvention = Literal["full", "causal"]
ATTENTION_CONVENTIONS: tuple[str, ...] = ("full", "causal")

FORMULA = (
    "sum(units[stream] * macs_per_token * (2 + 2*input_grad + 2*weight_grad)) "
    "+ sum(layers * pairs[stream] * 2 * (query_width * (1 + q_grad + k_grad) "
    "+ value_width * (1 + (q_grad or k_grad) + v_grad))) "
    "+ micro_batches * sum(lora_delta.macs * 2 * (forward_products + factor_grads)) "
    "+ sum(scan_mixers: 2 * inner * kernel * (tokens_processed + sequences * (kernel - 1)) "
    "* (1 + conv_grads) + 2 * inner * state * tokens_processed * (1 + scan_grads)); "
    "units: text = tokens_processed, decoder = decoder_tokens, items = items; "
    "pairs: cross = cross_pairs; with pairs_per_unit: units[stream] * pairs_per_unit (items: "
    "an item's queries x keys; a fixed number of keys per token); else the stream's squared "
    "lengths (text: sum_sq_seq_len, decoder: decoder_sum_sq_len)"
)
_PAIRS = {
    "full": "pairs = sum_sq_seq_len",
    "causal": "pairs = min((sum_sq_seq_len + tokens_processed) / 2, window * tokens_processed)",
}


def linear_flops(groups: Iterable[LinearGroup], tokens: int) -> float:
    """FLOP of the weight matrices over ``tokens`` training tokens.

    Args:
        groups: The profile's linear groups.
        tokens: Non-padding training tokens.

    Returns:
        ``tokens * sum(macs_per_token * (2 + 2 * input_grad + 2 * weight_grad))``, FLOP.
    """
    return float(tokens * sum(g.macs_per_token * g.flops_per_mac for g in groups))


def stream_units(totals: TokenTotals) -> dict[str, int]:
    """The run's units per stream: text tokens, decoder tokens, items (non-padding counts)."""
    return {
        "text": totals.tokens_processed,
        "decoder": totals.decoder_tokens,
        "items": totals.items,
    }


def stream_linear_flops(groups: Iterable[LinearGroup], totals: TokenTotals) -> float:
    """FLOP of the weight matrices over a run, each group scaled by its stream's units.

    Args:
        groups: The profile's linear groups.
        totals: The run's token statistics (``tokens_processed``, ``decoder_tokens``,
            ``items``).

    Returns:
        ``sum(units[stream] * macs_per_token * (2 + 2 * input_grad + 2 * weight_grad))``, FLOP.
    """
    units = stream_units(totals)
    return float(sum(units.get(g.stream, 0) * g.macs_per_token * g.flops_per_mac for g in groups))


def _layer_pairs(
    layer: AttentionLayerWork, totals: TokenTotals, attention: AttentionConvention
) -> float:
    if layer.stream == "cross":
        return float(totals.cross_pairs)
    if layer.stream == "items" or layer.pairs_per_unit:  # a fixed number of pairs per unit
        return stream_units(totals).get(layer.stream, 0) * layer.pairs_per_unit
    if layer.stream == "decoder":
        return attention_pairs(
            totals.decoder_sum_sq_len, totals.decoder_tokens, layer.window, attention
        )
    convention: AttentionConvention = "full" if layer.bidirectional else attention
    return attention_pairs(totals.sum_sq_seq_len, totals.tokens_processed, layer.window, convention)


def stream_attention_flops(
    layers: Iterable[AttentionLayerWork],
    totals: TokenTotals,
    attention: AttentionConvention = "full",
) -> float:
    """FLOP of the attention scores over a run, each layer's pairs from its stream.

    Returns:
        ``sum over layers of pairs[stream] * 2 * (query_width * (1 + q_grad + k_grad)
        + value_width * (1 + (q_grad or k_grad) + v_grad))``, FLOP; pairs: text and decoder
        self-attention from the squared lengths (by ``attention``), cross-attention
        ``cross_pairs``, items ``items * pairs_per_unit``.
    """
    total = 0.0
    for layer in layers:
        qk, v = layer.backward_matmuls
        per_pair = 2 * (layer.query_width * (1 + qk) + layer.value_width * (1 + v))
        total += per_pair * _layer_pairs(layer, totals, attention)
    return total


def _missing_streams(profile: ModelProfile, totals: TokenTotals) -> str | None:
    """Why the run's totals cannot scale the profile's streams, or None when they can."""
    ran = bool(
        totals.micro_batches or totals.tokens_processed or totals.decoder_tokens or totals.items
    )
    counted = {
        "text": totals.tokens_processed,
        "decoder": totals.decoder_tokens,
        "cross": totals.cross_pairs,
        "items": totals.items,
    }
    what = {
        "text": "text tokens (tokens_processed)",
        "decoder": "decoder tokens (decoder_tokens)",
        "cross": "cross-attention pairs (cross_pairs)",
        "items": "items (images, clips or latents: items)",
    }
    # a text-only profile's text stream keeps today's rule (its totals may be built by hand)
    streams = [s for s in what if s != "text" or not profile.streams.text_only]
    missing = [what[s] for s in streams if ran and profile.uses(s) and not counted[s]]
    if missing:
        return (
            "The profile has work that scales with "
            + ", ".join(missing)
            + ", which the run's token statistics did not count: no transformer estimate."
        )
    key = profile.streams.item_key
    if not profile.uses("items") or not key or not totals.input_shapes:
        return None
    parts = set(key.split(";"))
    other = [s.key for s in totals.input_shapes if not parts <= set(s.key.split(";"))]
    if other or totals.input_shapes_dropped:
        return (
            f"The per-item work was profiled at input shape {key!r}; the run also had "
            f"micro-batches of other shapes ({', '.join(other[:3]) or 'keys beyond those kept'}"
            "): the per-item work does not hold for them, so no transformer estimate."
        )
    return None


def lora_delta_flops(groups: Iterable[LoraDeltaGroup], micro_batches: int) -> float:
    """FLOP of LoRA's ``B @ A`` products over ``micro_batches`` training forward passes.

    Args:
        groups: The profile's LoRA product groups (per micro-batch).
        micro_batches: Training forward passes of the run.

    Returns:
        ``micro_batches * sum(macs * 2 * (forward_products + factor_grads))``, FLOP.
    """
    return float(micro_batches * sum(g.macs * g.flops_per_mac for g in groups))


def attention_pairs(
    sum_sq_seq_len: int,
    tokens: int,
    window: int | None = None,
    attention: AttentionConvention = "full",
) -> float:
    """(query, key) pairs one layer computes scores for, summed over sequences.

    Args:
        sum_sq_seq_len: Sum over sequences of length^2.
        tokens: Sum over sequences of length.
        window: Sliding-window length of the layer, None for full attention.
        attention: ``"full"`` (the square) or ``"causal"`` (the lower triangle with diagonal).

    Returns:
        Pairs. ``"causal"`` with a window is exact when no sequence is longer than the window
        and an upper bound when some are (the statistics keep sums, not each length).
    """
    if attention == "full":
        return float(sum_sq_seq_len)
    if attention != "causal":
        raise ValueError(f"attention must be one of {ATTENTION_CONVENTIONS}, got {attention!r}")
    pairs = (sum_sq_seq_len + tokens) / 2
    if window is not None:
        pairs = min(pairs, float(window * tokens))
    return pairs


def attention_flops(
    layers: Iterable[AttentionLayerWork],
    sum_sq_seq_len: int,
    tokens: int,
    attention: AttentionConvention = "full",
) -> float:
    """FLOP of the attention scores (``QK^T``, ``AV`` and their gradients) over all layers.

    Returns:
        ``sum over layers of pairs * 2 * (query_width * (1 + q_grad + k_grad)
        + value_width * (1 + (q_grad or k_grad) + v_grad))``, FLOP.
    """
    total = 0.0
    for layer in layers:
        qk, v = layer.backward_matmuls
        per_pair = 2 * (layer.query_width * (1 + qk) + layer.value_width * (1 + v))
        total += per_pair * attention_pairs(sum_sq_seq_len, tokens, layer.window, attention)
    return total


def transformer_estimate(
    profile: ModelProfile | None,
    totals: TokenTotals,
    *,
    attention: AttentionConvention = "full",
    reason: str | None = None,
) -> Estimate:
    """The ``transformer`` estimate of a run (a pure function).

    Args:
        profile: The model profile; None when none could be taken.
        totals: The run's token statistics (``tokens_processed``, ``sum_sq_seq_len``, and
            for the other streams ``decoder_tokens``, ``decoder_sum_sq_len``, ``cross_pairs``,
            ``items``, ``input_shapes``).
        attention: Pair-counting convention, ``"full"`` (default) or ``"causal"``.
        reason: Why there is no profile, when there is none.

    Returns:
        The estimate, with the profile's numbers in ``inputs`` so that it can be recomputed;
        ``flops`` is null (with the reason in ``notes``) without a profile.
    """
    if attention not in ATTENTION_CONVENTIONS:
        raise ValueError(f"attention must be one of {ATTENTION_CONVENTIONS}, got {attention!r}")
    if profile is None:
        return Estimate(
            flops=None,
            method="transformer",
            formula=FORMULA,
            inputs={"tokens_processed": totals.tokens_processed},
            notes=[reason or "No model profile was taken."],
        )
    tokens = totals.tokens_processed
    missing = _missing_streams(profile, totals)
    if missing is not None:
        return _unscaled_estimate(profile, totals, missing)
    linear = stream_linear_flops(profile.linear, totals)
    scores = stream_attention_flops(profile.attention, totals, attention)
    delta = lora_delta_flops(profile.lora_delta, totals.micro_batches)
    mixed = scan_mixer_flops(profile.scan_mixers, totals)
    if profile.mixers:  # never a plausible figure that leaves the mixers' work out
        estimate = _unscaled_estimate(profile, totals, mixer_reason(profile.mixers))
        estimate.inputs.update(linear_flops=linear, attention_flops=scores)
        return estimate
    return Estimate(
        flops=linear + scores + delta + mixed,
        method="transformer",
        formula=f"{FORMULA}; {_PAIRS[attention]}",
        inputs={
            "tokens_processed": tokens,
            "sum_sq_seq_len": totals.sum_sq_seq_len,
            "sequences": totals.sequences,
            "decoder_tokens": totals.decoder_tokens,
            "decoder_sum_sq_len": totals.decoder_sum_sq_len,
            "cross_pairs": totals.cross_pairs,
            "items": totals.items,
            "attention_convention": attention,
            "padding_convention": NON_PADDING,  # scaled by the run's non-padding totals
            "micro_batches": totals.micro_batches,
            "linear_flops": linear,
            "attention_flops": scores,
            "lora_delta_flops": delta,
            "mixer_flops": mixed,
            **profile.to_dict(),
        },
        notes=_figure_notes(profile, attention),
    )


def mixer_reason(mixers: tuple[str, ...]) -> str:
    """Why a model with state-space / linear-attention mixers has no ``transformer`` figure.

    Args:
        mixers: The mixers that ran, ``"name (Class)"``.
    """
    shown = ", ".join(mixers[:2]) + (f" and {len(mixers) - 2} more" if len(mixers) > 2 else "")
    return (
        f"The model has {len(mixers)} state-space / linear-attention mixers ({shown}): their "
        "short convolution and their scan (per chunk, over each sequence padded to whole "
        "chunks) run outside the modules flopmeter reads, and the FLOP model has no formula "
        "for them (it has one for Mamba's and Jamba's selective scan only), so no transformer "
        "estimate (linear_flops and attention_flops in its inputs are the work it does read; "
        "the measured estimate counts the mixers)."
    )


def _unscaled_estimate(profile: ModelProfile, totals: TokenTotals, missing: str) -> Estimate:
    """The estimate without a figure when the run's totals cannot scale the profile's streams
    (``missing``: why, from :func:`_missing_streams`), with the run's units per stream (tokens,
    items) and the profile in its inputs."""
    return Estimate(
        flops=None,
        method="transformer",
        formula=FORMULA,
        inputs={
            "tokens_processed": totals.tokens_processed,
            "decoder_tokens": totals.decoder_tokens,
            "cross_pairs": totals.cross_pairs,
            "items": totals.items,
            **profile.to_dict(),
        },
        notes=[missing, *profile.notes],
    )


def _figure_notes(profile: ModelProfile, attention: AttentionConvention) -> list[str]:
    """The notes of an estimate with a figure: what is not counted, how attention pairs are
    counted (by ``attention``), the profile's own notes, and LoRA's per-micro-batch products."""
    notes = [
        "Activation-checkpoint recomputation is not counted (Commission guidelines, Annex A.1).",
        "Attention pairs: "
        + (
            "the full square L^2 per sequence (as eager and math attention compute)."
            if attention == "full"
            else "the causal half L(L+1)/2 per sequence (as causal flash kernels compute)."
        ),
        *profile.notes,
    ]
    if profile.lora_delta:
        notes.append(
            "LoRA on single parameters (peft ParamWrapper, e.g. mixture-of-experts weights): "
            "the wrapped weights' gradients are counted, and B @ A per micro-batch "
            "(lora_delta_flops)."
        )
    return notes
