"""The ``measured`` estimate: sampled dispatch-level counts scaled to the run (pure functions).

Each sample's linear work is scaled by the run's tokens, its attention-score work by the run's
sum of squared sequence lengths, its per-micro-batch work (LoRA's ``B @ A`` for wrapped
mixture-of-experts weights) by the run's micro-batches. The consistency ratio ``measured / transformer`` is computed
here, once, for the estimate's inputs and notes and for the report.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from flopmeter.types import Estimate, TokenTotals

__all__ = ["RATIO_WARNING", "MeasuredSample", "consistency_ratio", "measured_estimate"]

#: ``measured / transformer`` beyond 1 +- this is a warning in the report.
RATIO_WARNING = 0.10

FORMULA = (
    "tokens_processed * linear_flops / sample_tokens "
    "+ sum_sq_seq_len * attention_flops / sample_sum_sq_len "
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
    """

    linear_flops: int
    attention_flops: int
    recompute_flops: int
    tokens: int
    sum_sq_len: int
    sequences: int
    per_micro_batch_flops: int = 0
    micro_batches: int = 1


def consistency_ratio(
    measured_flops: float | None, transformer_flops: float | None
) -> float | None:
    """``measured / transformer`` (dimensionless), or None when either is missing or zero."""
    if measured_flops is None or not transformer_flops:
        return None
    return measured_flops / transformer_flops


def _notes(samples: int, recompute: int, unknown_ops: Iterable[str]) -> list[str]:
    notes = [
        f"Dispatch-level count (torch.utils.flop_counter.FlopCounterMode) of {samples} "
        "sampled micro-batches, forward and backward, scaled by the run's tokens (linear work), "
        "sum of squared sequence lengths (attention scores) and micro-batches (LoRA's B @ A "
        "for wrapped parameters).",
        "Fused-attention backward counted as 4 matmuls (score recomputation not counted); "
        "CPU SDPA and grouped-mm mixture-of-experts matmuls counted with flopmeter's formulas.",
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


def measured_estimate(
    samples: Iterable[MeasuredSample],
    totals: TokenTotals,
    *,
    transformer_flops: float | None = None,
    reason: str | None = None,
    unknown_ops: Iterable[str] = (),
) -> Estimate:
    """Scales sampled dispatch-level counts to the run (a pure function).

    ``flops = tokens_processed * sum(linear_flops) / sum(tokens)
    + sum_sq_seq_len * sum(attention_flops) / sum(sum_sq_len)
    + micro_batches * sum(per_micro_batch_flops) / sum(micro_batches)``, the sums over samples.

    Args:
        samples: Complete forward+backward samples.
        totals: The run's token statistics.
        transformer_flops: The ``transformer`` estimate, FLOP, for the consistency ratio.
        reason: Why there are no samples, when there are none.
        unknown_ops: Compute-like operators seen in samples that had no FLOP formula.

    Returns:
        The ``measured`` estimate, FLOP; ``flops`` is null (with a reason) without samples.
    """
    samples = list(samples)
    if not samples:
        return Estimate(
            flops=None,
            method="measured",
            formula=FORMULA,
            inputs={"samples": 0},
            notes=[reason or "No training micro-batch was sampled."],
        )
    linear = sum(s.linear_flops for s in samples)
    attention = sum(s.attention_flops for s in samples)
    recompute = sum(s.recompute_flops for s in samples)
    tokens = sum(s.tokens for s in samples)
    sum_sq = sum(s.sum_sq_len for s in samples)
    per_batch = sum(s.per_micro_batch_flops for s in samples)
    batches = sum(s.micro_batches for s in samples)
    flops: float | None = None
    if tokens > 0 and sum_sq > 0 and batches > 0:
        flops = (
            totals.tokens_processed * linear / tokens
            + totals.sum_sq_seq_len * attention / sum_sq
            + totals.micro_batches * per_batch / batches
        )
    notes = _notes(len(samples), recompute, unknown_ops)
    if flops is None:
        notes.insert(2, "The samples had no tokens to scale by.")
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
    ratio = consistency_ratio(flops, transformer_flops)
    if ratio is not None:
        inputs["ratio_to_transformer"] = ratio
        if abs(ratio - 1.0) > RATIO_WARNING:
            notes.append(
                f"Warning: measured / transformer = {ratio:.3f}, beyond the {RATIO_WARNING:.0%} "
                "the two should agree within: the model runs work the architecture reading "
                "does not see (or the reverse); check the unknown operators and custom kernels."
            )
    return Estimate(flops=flops, method="measured", formula=FORMULA, inputs=inputs, notes=notes)
