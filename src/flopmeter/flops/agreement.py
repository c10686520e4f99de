"""The FLOP model checked on the sampled micro-batches themselves (pure functions).

The ``measured`` estimate is the dispatch count scaled to the run; when its scaling is not
sound for a run (padding the per-item rule cannot take out, several streams), the FLOP model
can still be checked directly: the ``transformer`` estimate of each sampled micro-batch, from
that micro-batch's own (padded) shapes, against the dispatch count of the same micro-batch.
Both then count the same positions, padding included, so they must agree to the FLOP where the
model knows the architecture; the run's figure is the model's, over the run's non-padding
totals.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from flopmeter.flops.model_profile import ModelProfile
from flopmeter.flops.scaling import MeasuredSample
from flopmeter.flops.transformer import AttentionConvention, transformer_estimate
from flopmeter.types import InputShapeCount, TokenTotals

__all__ = ["SampleCheck", "sample_check", "sample_totals"]


@dataclass(frozen=True)
class SampleCheck:
    """The FLOP model against the dispatch count, sample by sample.

    Attributes:
        samples: Samples compared.
        worst_ratio: The sample whose ``dispatch / transformer`` is farthest from 1.
        dispatch_flops: The samples' dispatch counts summed, FLOP (recomputation excluded).
        transformer_flops: The transformer estimates of the same samples summed, FLOP.
        non_text_samples: Samples whose calls were not all text (a decoder stream, images...).
    """

    samples: int
    worst_ratio: float
    dispatch_flops: int
    transformer_flops: float
    non_text_samples: int = 0

    def to_dict(self) -> dict[str, float | int]:
        """The check as plain data (the transformer estimate's ``inputs.sample_check``)."""
        return {
            "samples": self.samples,
            "worst_ratio": self.worst_ratio,
            "dispatch_flops": self.dispatch_flops,
            "transformer_flops": self.transformer_flops,
            "non_text_samples": self.non_text_samples,
        }


def sample_totals(sample: MeasuredSample) -> TokenTotals:
    """One sample's own totals: every position of its calls a token (their padded shapes)."""
    shapes = ()
    if sample.key is not None:
        shapes = (
            InputShapeCount(key=sample.key, micro_batches=sample.micro_batches, items=sample.items),
        )
    return TokenTotals(
        tokens_processed=sample.tokens,
        tokens_seen=sample.tokens,
        sequences=sample.sequences,
        sum_sq_seq_len=sample.sum_sq_len,
        micro_batches=sample.micro_batches,
        decoder_tokens=sample.decoder_tokens,
        decoder_sum_sq_len=sample.decoder_sum_sq_len,
        cross_pairs=sample.cross_pairs,
        items=sample.items,
        non_text_micro_batches=0 if sample.text else sample.micro_batches,
        input_shapes=shapes,
    )


def sample_check(
    profile: ModelProfile | None,
    samples: Iterable[MeasuredSample],
    attention: AttentionConvention = "full",
) -> SampleCheck | None:
    """The transformer estimate of each sample against its dispatch count.

    Returns:
        The check; None without a recognised profile, without samples, or when the estimate
        of any sample cannot be made (a stream or an input shape the profile does not cover).
    """
    samples = list(samples)
    if profile is None or not profile.recognised or not samples:
        return None
    worst = 1.0
    dispatch_total = 0
    model_total = 0.0
    for s in samples:
        model = transformer_estimate(profile, sample_totals(s), attention=attention).flops
        dispatch = s.linear_flops + s.attention_flops + s.per_micro_batch_flops
        if not model or dispatch <= 0:
            return None
        ratio = dispatch / model
        if abs(ratio - 1.0) > abs(worst - 1.0):
            worst = ratio
        dispatch_total += dispatch
        model_total += model
    non_text = sum(1 for s in samples if not s.text)
    return SampleCheck(len(samples), worst, dispatch_total, model_total, non_text)
