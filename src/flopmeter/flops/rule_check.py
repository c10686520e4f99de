"""The text rule checked on the samples themselves: each sample predicted from the first
(a pure function).

The text rule scales a sample's linear work by tokens, its attention-score work by squared
sequence lengths and its per-micro-batch work by micro-batches. When two samples have different
shapes, the rule applied to the first predicts the second's count; where the split of the work
is wrong (a product filed with the wrong kind, work that grows with the sequences rather than the
tokens, a weight sliced to the sequence length), the prediction misses, and the rule must not
scale the samples to the run (:mod:`flopmeter.flops.scaling` then falls back to per-shape
figures, or to none). Samples of one shape say nothing of the rule and always pass.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from flopmeter.flops.scaling import MeasuredSample

__all__ = ["CONTRADICTION", "RULE_TOLERANCE", "text_rule_contradiction"]

#: How the reason :func:`text_rule_contradiction` gives begins.
CONTRADICTION = "the samples contradict the text rule"

#: ``|predicted / counted - 1|`` at most this (0.5%) for every sample: the text rule holds.
#: Half the 1% agreement. A split that files work with the wrong kind misses by far more (15% to
#: 500% on the probes of docs/methodology.md); work that is only nearly proportional to the
#: squared lengths (attention formulas of the form ``L (L - 1)``, 0.25% off between 13 and 16
#: tokens on a tiny Llama with LoRA under TRL's defaults) stays inside it.
RULE_TOLERANCE = 5e-3


def _counted(sample: MeasuredSample) -> int:
    """The sample's FLOP the rule scales (recomputation aside)."""
    return sample.linear_flops + sample.attention_flops + sample.per_micro_batch_flops


def _predicted(reference: MeasuredSample, sample: MeasuredSample) -> float:
    """The text rule from ``reference`` applied to ``sample``'s shapes, FLOP."""
    return (
        sample.tokens * reference.linear_flops / reference.tokens
        + sample.sum_sq_len * reference.attention_flops / reference.sum_sq_len
        + sample.micro_batches * reference.per_micro_batch_flops / reference.micro_batches
    )


def text_rule_contradiction(samples: Iterable[MeasuredSample]) -> str | None:
    """Why the samples contradict the text rule, or None when it predicts every sample from
    the first within :data:`RULE_TOLERANCE` (or there is no second sample to predict).

    Returns:
        The reason, naming the sample the rule missed worst: its tokens and squared lengths,
        its count and the rule's prediction (FLOP), as a phrase for the estimate's note.
    """
    samples = [s for s in samples if s.tokens > 0 and s.sum_sq_len > 0 and s.micro_batches > 0]
    if len(samples) < 2:
        return None
    reference = samples[0]
    worst: tuple[float, MeasuredSample, float] | None = None
    for sample in samples[1:]:
        counted = _counted(sample)
        predicted = _predicted(reference, sample)
        if counted <= 0:
            off = 0.0 if predicted <= 0 else float("inf")
        else:
            off = abs(predicted / counted - 1.0)
        if off > RULE_TOLERANCE and (worst is None or off > worst[0]):
            worst = (off, sample, predicted)
    if worst is None:
        return None
    off, sample, predicted = worst
    return (
        f"{CONTRADICTION}: a sampled micro-batch of {sample.tokens} tokens "
        f"({sample.sum_sq_len} tokens^2) counted {_counted(sample):.6g} FLOP where the rule "
        f"from the first sample ({reference.tokens} tokens, {reference.sum_sq_len} tokens^2) "
        f"predicts {predicted:.6g} ({off:.2%} off): its work does not grow with tokens and "
        "squared lengths as the rule's split assumes"
    )
