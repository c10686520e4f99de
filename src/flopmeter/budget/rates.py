"""The FLOP model's rates, for an upper bound of a micro-batch's compute from its padded shape
(pure; see :mod:`flopmeter.budget.guard`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from flopmeter.flops.formulas import seed_flops
from flopmeter.flops.transformer import attention_flops, linear_flops, lora_delta_flops

if TYPE_CHECKING:
    from flopmeter.counting.census import Census
    from flopmeter.flops.recorder import FlopObservations

__all__ = ["StepRates", "step_rates"]


@dataclass(frozen=True)
class StepRates:
    """The FLOP model's rates, for an upper bound of a micro-batch's compute from its shape.

    Attributes:
        token_flops: FLOP per token (every weight matrix a token passes through), FLOP.
        pair_flops: FLOP per (query, key) pair of attention scores, summed over layers, FLOP.
        micro_batch_flops: FLOP per micro-batch (LoRA's ``B @ A`` products), FLOP.
    """

    token_flops: float
    pair_flops: float = 0.0
    micro_batch_flops: float = 0.0

    def bound_flops(self, tokens: int, sum_sq_len: int, micro_batches: int) -> float:
        """The compute of ``micro_batches`` micro-batches of ``tokens`` padded tokens whose
        padded row lengths squared sum to ``sum_sq_len``, FLOP: an upper bound of what the
        report will count for them (real tokens and real lengths never exceed the padded)."""
        return (
            tokens * self.token_flops
            + sum_sq_len * self.pair_flops
            + micro_batches * self.micro_batch_flops
        )


def step_rates(observations: FlopObservations, census: Census | None) -> StepRates | None:
    """The rates of the estimate the report would take as primary, as an upper bound.

    With a recognised profile the primary figure is ``transformer`` or ``measured``: the
    larger rate of the two is taken for each term (the primary may change between readings).
    Without one it is ``measured``: the samples' rates (at least the seed formula's
    ``4 * n_total + 2 * n_trainable`` per token), or the seed's alone before any sample. The
    rates are per token of the micro-batch's reference shape (text tokens, or the patches,
    frames or items of a call without them); for a model with several streams (an
    encoder-decoder) they hold at the sampled ratio between the streams.

    Returns:
        The rates, or ``None`` when neither a profile nor a census is known yet.
    """
    profile = observations.profile
    samples = observations.samples
    tokens = sum(s.tokens for s in samples)
    sum_sq = sum(s.sum_sq_len for s in samples)
    batches = sum(s.micro_batches for s in samples)
    sampled = tokens > 0 and sum_sq > 0 and batches > 0
    if profile is None or not profile.recognised:
        if census is None:
            return None
        token = seed_flops(census.n_total, census.n_trainable, 1)
        if not sampled:
            return StepRates(token)
        # the dispatch count is what the report judges then (never the seed formula, which is
        # far below the work of a convolution or a diffusion model): its rates, or the seed's
        return StepRates(
            max(token, sum(s.linear_flops for s in samples) / tokens),
            sum(s.attention_flops for s in samples) / sum_sq,
            sum(s.per_micro_batch_flops for s in samples) / batches,
        )
    # a selective-scan mixer's convolution at its most per token (each token a sequence)
    token = linear_flops(profile.linear, 1) + sum(m.flops(1, 1) for m in profile.scan_mixers)
    pair = attention_flops(profile.attention, 1, 1, "full")  # the square: the larger count
    micro = lora_delta_flops(profile.lora_delta, 1)
    if sampled:  # the measured estimate's own rates
        token = max(token, sum(s.linear_flops for s in samples) / tokens)
        pair = max(pair, sum(s.attention_flops for s in samples) / sum_sq)
        micro = max(micro, sum(s.per_micro_batch_flops for s in samples) / batches)
    return StepRates(token, pair, micro)
