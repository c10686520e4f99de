"""The ``measured`` estimate: sampled dispatch-level counts scaled to the run (pure functions).

A sample is scaled to the run by what its work depends on, by one of two rules, and the
estimate says which (``inputs.scaling``) and whether that is sound for this run
(``inputs.scaling_sound``, with a note when it is not):

* ``text``: each sample's linear work by the run's tokens, its attention-score work by the
  run's sum of squared sequence lengths, its per-micro-batch work (LoRA's ``B @ A`` for wrapped
  mixture-of-experts weights) by the run's micro-batches. Sound only when every sampled
  micro-batch's work is in one text-token stream (:attr:`ShapeUnits.text
  <flopmeter.counting.work_units.ShapeUnits.text>`), so was every micro-batch of the run
  (``TokenTotals.non_text_micro_batches == 0``), and the rule predicts each sample from the
  first (:mod:`flopmeter.flops.rule_check`: samples of other shapes that it misses contradict
  it).
* ``per_item`` (:mod:`flopmeter.flops.per_item`): per shape key (the inputs' shapes without the
  batch dimension), the sampled FLOP per item of that key times the run's items of that key
  (``TokenTotals.input_shapes``), plus the per-micro-batch work times the run's micro-batches.
  Used whenever the text rule is not sound; sound only when every key the run saw was sampled
  and no key was dropped (``TokenTotals.input_shapes_dropped == 0``). Micro-batches with one
  key do the same work per item, padding included: this rule counts the padded work the
  kernels compute.

Each figure says which positions it counts (``inputs.padding_convention``): the text rule's are the
non-padding tokens (``non_padding``, the convention of the ``transformer`` estimate); a per-item
figure of padded batches counts the positions computed, padding included (``padded``: the
dispatch count of the run's batches as they ran), and says how many positions were padding.

The consistency ratio ``measured / transformer`` is computed here, once, for the estimate's
inputs and notes and for the report; :data:`AGREEMENT` is how close the two must be for the
``transformer`` estimate to be the primary figure (:mod:`flopmeter.flops`).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, Literal

from flopmeter.flops.per_item import (
    NON_PADDING,
    PADDED,
    padded_text_flops,
    per_item_flops,
    per_item_padding,
    per_item_uncovered,
)
from flopmeter.flops.rule_check import CONTRADICTION, text_rule_contradiction
from flopmeter.types import Estimate, TokenTotals

__all__ = [
    "AGREEMENT",
    "RATIO_WARNING",
    "MeasuredSample",
    "Scaling",
    "consistency_ratio",
    "measured_estimate",
    "text_rule_unsound",
    "unsound_reason",
]

#: ``|measured / transformer - 1|`` at most this (1%): the two agree, and the ``transformer``
#: estimate of a recognised architecture may be the primary figure. The one tolerance of the
#: invariant (docs/methodology.md, "Why the primary figure is primary").
AGREEMENT = 0.01

#: ``measured / transformer`` beyond 1 +- this is a warning in the report (far apart, not just
#: disagreeing: the architecture reading misses work, or the samples do).
RATIO_WARNING = 0.10

#: How the ``measured`` estimate scaled its samples to the run (``inputs.scaling``).
Scaling = Literal["text", "per_item", "padded_text"]

FORMULA = (
    "tokens_processed * linear_flops / sample_tokens "
    "+ sum_sq_seq_len * attention_flops / sample_sum_sq_len "
    "+ micro_batches * per_micro_batch_flops / sample_micro_batches"
)
#: How the note that says why the scaling is not sound begins (:func:`unsound_reason`).
UNSOUND = "Not sound for this run, so never the primary figure: "
_TEXT_FIGURE = "The figure is the text rule's, for comparison only."

PADDED_FORMULA = (
    "tokens_seen * linear_flops / sample_tokens "
    "+ sum_sq_seq_len_seen * attention_flops / sample_sum_sq_len "
    "+ micro_batches * per_micro_batch_flops / sample_micro_batches"
)

PER_ITEM_FORMULA = (
    "sum over shape keys of items[key] * sample_flops[key] / sample_items[key] "
    "+ micro_batches * per_micro_batch_flops / sample_micro_batches"
)


@dataclass(frozen=True)
class MeasuredSample:
    """The dispatch-level count of one sampled micro-batch (forward and backward).

    Attributes:
        linear_flops: FLOP of matmuls that scale with tokens (linear layers, experts, lm_head).
        attention_flops: FLOP of attention-score matmuls (``QK^T``, ``AV`` and their gradients).
        recompute_flops: FLOP of forward passes run again during backward (activation
            checkpointing), not part of the estimate.
        tokens: Tokens the micro-batch computed on, padding included (``B * T``).
        sum_sq_len: Sum over its sequences of the padded length squared (``B * T^2``), tokens^2.
        sequences: Its sequences (``B``).
        per_micro_batch_flops: FLOP of work that is the same in every micro-batch (LoRA's
            ``B @ A`` products for wrapped parameters, forward and backward).
        micro_batches: Training forward passes the sample spans.
        text: Whether every forward call of the sample had its work in one text-token stream
            (``ShapeUnits.text``; a call without units counts as text).
        keys: The distinct shape keys of the sample's forward calls (``ShapeUnits.key``), in
            the order first seen; empty when no call had units.
        items: Items (batch dimension) of the sample's forward calls, summed
            (``ShapeUnits.items``); 0 when no call had units.
        decoder_tokens: Decoder positions of the sample's calls (padded), 0 without a decoder.
        decoder_sum_sq_len: Sum of the decoder lengths squared (padded), tokens^2.
        cross_pairs: Cross-attention query-key pairs (padded), tokens^2.
    """

    linear_flops: int
    attention_flops: int
    recompute_flops: int
    tokens: int
    sum_sq_len: int
    sequences: int
    per_micro_batch_flops: int = 0
    micro_batches: int = 1
    text: bool = True
    keys: tuple[str, ...] = ()
    items: int = 0
    decoder_tokens: int = 0
    decoder_sum_sq_len: int = 0
    cross_pairs: int = 0

    @property
    def key(self) -> str | None:
        """The sample's one shape key, or None when its calls had none or several (its FLOP
        cannot then be told apart by key)."""
        return self.keys[0] if len(self.keys) == 1 and self.items > 0 else None

    @property
    def scaled_flops(self) -> int:
        """The FLOP that scale with the micro-batch's size: linear and attention-score work."""
        return self.linear_flops + self.attention_flops


def unsound_reason(estimate: Estimate) -> str | None:
    """Why a ``measured`` estimate's scaling is not sound for its run (from its note), or None
    when it is sound or says nothing."""
    for note in estimate.notes:
        if note.startswith(UNSOUND):
            return note[len(UNSOUND) :].removesuffix(_TEXT_FIGURE).strip().removesuffix(".")
    return None


def consistency_ratio(
    measured_flops: float | None, transformer_flops: float | None
) -> float | None:
    """``measured / transformer`` (dimensionless), or None when either is missing or zero."""
    if measured_flops is None or not transformer_flops:
        return None
    return measured_flops / transformer_flops


def _notes(samples: int, recompute: int, unknown_ops: Iterable[str], scaling: Scaling) -> list[str]:
    if scaling == "text":
        how = (
            "scaled by the run's tokens (linear work), sum of squared sequence lengths "
            "(attention scores) and micro-batches (LoRA's B @ A for wrapped parameters)."
        )
    elif scaling == "padded_text":
        how = (
            "scaled by the run's tokens with padding (linear work), padded squared lengths "
            "(attention scores) and micro-batches: the positions computed, as in the samples."
        )
    else:
        how = (
            "scaled per shape key: the sampled FLOP per item of a key times the run's items of "
            "that key (padding included, as the kernels compute it), plus the per-micro-batch "
            "work (LoRA's B @ A for wrapped parameters) times the run's micro-batches."
        )
    notes = [
        f"Dispatch-level count (torch.utils.flop_counter.FlopCounterMode) of {samples} "
        f"sampled micro-batches, forward and backward, {how}",
        "Fused-attention backward counted as 4 matmuls (score recomputation not counted); "
        "CPU SDPA and grouped-mm mixture-of-experts matmuls counted with flopmeter's formulas. "
        "Attention is counted as the square the kernels are asked for: where a kernel computes "
        "only the causal half or a band (FlashAttention's window, flex attention), this figure "
        "is the cautious upper value.",
    ]
    if recompute:
        notes.append(
            f"{recompute:.3g} FLOP of activation-checkpoint recomputation in the samples were "
            "not counted (Commission guidelines, Annex A.1)."
        )
    unknown = sorted(set(unknown_ops))
    if unknown:
        notes.append("Operators without a FLOP formula (counted as 0): " + ", ".join(unknown) + ".")
    return notes


def text_rule_unsound(samples: Iterable[MeasuredSample], totals: TokenTotals) -> str | None:
    """Why the text rule (tokens, squared lengths, micro-batches) does not hold for this run,
    or None when it does: every sample's calls and every micro-batch of the run had their work
    in one text-token stream, and the rule predicts each sample from the first
    (:func:`~flopmeter.flops.rule_check.text_rule_contradiction`)."""
    samples = list(samples)
    mixed = sum(1 for s in samples if not s.text)
    if mixed:
        return (
            f"{mixed} of the {len(samples)} samples had inputs whose work is not all in one "
            "text-token stream (a decoder stream, images, audio or float inputs), or ran a "
            "state-space / linear-attention mixer whose scan grows with the length, not its "
            "square"
        )
    if totals.non_text_micro_batches:
        return (
            f"{totals.non_text_micro_batches} of the run's {totals.micro_batches} micro-batches "
            "had inputs whose work is not all in one text-token stream"
        )
    return text_rule_contradiction(samples)


def _text_rule(
    samples: list[MeasuredSample], totals: TokenTotals
) -> tuple[float | None, dict[str, Any]]:
    """The text rule's figure and the estimate's inputs it is computed from (the samples'
    sums beside the run's totals).

    Returns:
        ``(flops, inputs)``: the figure in FLOP, None when the samples had no tokens, squared
        lengths or micro-batches to scale by; and the inputs (FLOP, tokens, tokens^2, counts).
    """
    linear = sum(s.linear_flops for s in samples)
    attention = sum(s.attention_flops for s in samples)
    recompute = sum(s.recompute_flops for s in samples)
    tokens = sum(s.tokens for s in samples)
    sum_sq = sum(s.sum_sq_len for s in samples)
    per_batch = sum(s.per_micro_batch_flops for s in samples)
    batches = sum(s.micro_batches for s in samples)
    text_flops: float | None = None
    if tokens > 0 and sum_sq > 0 and batches > 0:
        text_flops = (
            totals.tokens_processed * linear / tokens
            + totals.sum_sq_seq_len * attention / sum_sq
            + totals.micro_batches * per_batch / batches
        )
    inputs: dict[str, Any] = {
        "samples": len(samples),
        "linear_flops": linear,
        "attention_flops": attention,
        "recompute_flops_excluded": recompute,
        "sample_tokens": tokens,
        "sample_sum_sq_len": sum_sq,
        "sample_sequences": sum(s.sequences for s in samples),
        "tokens_processed": totals.tokens_processed,
        "sum_sq_seq_len": totals.sum_sq_seq_len,
        "per_micro_batch_flops": per_batch,
        "sample_micro_batches": batches,
        "micro_batches": totals.micro_batches,
    }
    return text_flops, inputs


def _scaling_rule(
    samples: list[MeasuredSample],
    totals: TokenTotals,
    text_flops: float | None,
    inputs: dict[str, Any],
) -> tuple[Scaling, str, float | None, str | None]:
    """Which rule scales the samples to the run, and whether it is sound: the text rule when
    it holds; else (the per-item rule's inputs added to ``inputs``) the per-item rule when it
    covers the run, or the text rule's figure (``text_flops``, FLOP) with why neither is sound.
    Sets ``inputs["padding_convention"]`` (and ``inputs["padding"]``, the padded positions of a
    per-item figure of padded batches).

    Returns:
        ``(scaling, formula, flops, unsound)``: the rule, its formula, the figure in FLOP (None
        without one) and why it is not sound for the run (None when it is).
    """
    inputs["padding_convention"] = NON_PADDING
    unsound = text_rule_unsound(samples, totals)
    if unsound is not None:
        item_flops, per_key, unsampled = per_item_flops(samples, totals)
        inputs.update(
            per_item=per_key,
            sample_items=sum(s.items for s in samples),
            items=totals.items,
            input_shapes_dropped=totals.input_shapes_dropped,
        )
        if item_flops is not None:
            if unsound.startswith(CONTRADICTION):
                inputs["text_rule_contradicted"] = unsound
            padding = per_item_padding(samples, totals)
            if padding is not None:  # the positions the kernels computed, and named so
                inputs.update(padding_convention=PADDED, padding=padding)
            return "per_item", PER_ITEM_FORMULA, item_flops, None
        unsound += "; and per-item scaling cannot cover the run: " + per_item_uncovered(
            totals, unsampled
        )
        padded, why = padded_text_flops(samples, totals)
        inputs.update(
            tokens_seen=totals.tokens_seen, sum_sq_seq_len_seen=totals.sum_sq_seq_len_seen
        )
        if padded is not None:
            inputs["text_rule_unsound"] = unsound
            if totals.tokens_seen > totals.tokens_processed:  # the positions computed, named so
                seen = totals.tokens_seen
                padding = f"{seen - totals.tokens_processed} of {seen} input positions"
                inputs.update(padding_convention=PADDED, padding=padding)
            return "padded_text", PADDED_FORMULA, padded, None
        unsound += "; and the padded text rule does not hold: " + why
    elif text_flops is None:
        unsound = "the samples had no tokens to scale by"
    return "text", FORMULA, text_flops, unsound


def _convention_note(inputs: dict[str, Any]) -> str:
    """Which positions the figure counts (``inputs.padding_convention``), for its notes."""
    if inputs["padding_convention"] == PADDED:
        return (
            "Convention: scaled by the positions computed, padding included: the run's batches "
            f"have padding ({inputs['padding']}), whose work the sampled counts include, so "
            "this figure is the work the kernels computed over the run's batches as they ran "
            "(PyTorch's dispatch count of them), above the non-padding work the transformer "
            "estimate counts."
        )
    return "Convention: the work on the non-padding tokens (padding's work not counted)."


def measured_estimate(
    samples: Iterable[MeasuredSample],
    totals: TokenTotals,
    *,
    transformer_flops: float | None = None,
    reason: str | None = None,
    unknown_ops: Iterable[str] = (),
) -> Estimate:
    """Scales sampled dispatch-level counts to the run (a pure function).

    The text rule, ``flops = tokens_processed * sum(linear_flops) / sum(tokens)
    + sum_sq_seq_len * sum(attention_flops) / sum(sum_sq_len)
    + micro_batches * sum(per_micro_batch_flops) / sum(micro_batches)`` (the sums over
    samples), when it is sound (:func:`text_rule_unsound`); else the per-item rule
    (:func:`per_item_flops`) when that covers every key the run saw. When neither is sound the
    figure is the text rule's, with ``inputs.scaling_sound`` false and a note why: such a
    figure is never the primary one (:mod:`flopmeter.flops`).

    Args:
        samples: Complete forward+backward samples.
        totals: The run's token statistics.
        transformer_flops: The ``transformer`` estimate, FLOP, for the consistency ratio.
        reason: Why there are no samples, when there are none.
        unknown_ops: Compute-like operators seen in samples that had no FLOP formula.

    Returns:
        The ``measured`` estimate, FLOP, with ``inputs.scaling`` (``text`` or ``per_item``)
        and ``inputs.scaling_sound``; ``flops`` is null (with a reason) without samples.
    """
    samples = list(samples)
    if not samples:
        return Estimate(
            flops=None,
            method="measured",
            formula=FORMULA,
            inputs={"samples": 0, "scaling": None, "scaling_sound": False},
            notes=[reason or "No training micro-batch was sampled."],
        )
    text_flops, inputs = _text_rule(samples, totals)
    scaling, formula, flops, unsound = _scaling_rule(samples, totals, text_flops, inputs)
    inputs["scaling"] = scaling
    inputs["scaling_sound"] = unsound is None
    notes = _notes(len(samples), inputs["recompute_flops_excluded"], unknown_ops, scaling)
    notes.insert(1, _convention_note(inputs))
    if unsound is not None:
        shown = f" {_TEXT_FIGURE}" if flops and scaling == "text" else ""
        notes.insert(2, f"{UNSOUND}{unsound}.{shown}")
    if "text_rule_unsound" in inputs:
        notes.insert(2, f"Scaled by the padded text rule instead: {inputs['text_rule_unsound']}.")
    if "text_rule_contradicted" in inputs:
        notes.insert(2, f"Scaled per shape key instead: {inputs['text_rule_contradicted']}.")
    ratio = consistency_ratio(flops, transformer_flops)
    if ratio is not None:
        inputs["ratio_to_transformer"] = ratio
        if inputs["padding_convention"] == PADDED:
            notes.append(
                f"measured / transformer = {ratio:.3f} compares two conventions: this figure "
                "counts the padding's work, the transformer estimate the non-padding tokens "
                "only; the transformer estimate is checked on each sample's own padded shapes "
                "instead (its inputs.sample_check)."
            )
        elif abs(ratio - 1.0) > RATIO_WARNING:
            notes.append(
                f"Warning: measured / transformer = {ratio:.3f}, beyond the {RATIO_WARNING:.0%} "
                "the two should agree within: the model runs work the architecture reading "
                "does not see (or the reverse); check the unknown operators and custom kernels."
            )
    return Estimate(flops=flops, method="measured", formula=formula, inputs=inputs, notes=notes)
