"""The ``per_item`` rule of the ``measured`` estimate (pure functions): per shape key, the
sampled FLOP per item times the run's items of that key.

Micro-batches of one shape key (the inputs' shapes without the batch dimension) do the same
work per item, padding included, so the rule gives the work the kernels computed over the
run's batches: with padding, the positions computed (:data:`PADDED`), not the non-padding work
the text rule and the ``transformer`` estimate count (:data:`NON_PADDING`). Which of the two a
figure follows is its ``inputs.padding_convention`` (:mod:`flopmeter.flops.scaling`).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Any, Literal

from flopmeter.flops.rule_check import RULE_TOLERANCE
from flopmeter.types import TokenTotals

if TYPE_CHECKING:
    from flopmeter.flops.scaling import MeasuredSample

__all__ = [
    "NON_PADDING",
    "PADDED",
    "Convention",
    "padded_text_flops",
    "per_item_flops",
    "per_item_padding",
    "per_item_uncovered",
]

#: Which positions a figure counts (an estimate's ``inputs.padding_convention``).
Convention = Literal["non_padding", "padded"]
#: The work on the non-padding tokens (docs/methodology.md, "Conventions"): the text rule's
#: figure, the ``transformer`` estimate's, and a per-item figure of batches without padding.
NON_PADDING: Convention = "non_padding"
#: The positions the kernels computed, padding included: a per-item figure of padded batches
#: (PyTorch's dispatch count of the run's batches as they ran).
PADDED: Convention = "padded"


def per_item_flops(
    samples: Iterable[MeasuredSample], totals: TokenTotals
) -> tuple[float | None, list[dict[str, Any]], list[str]]:
    """The per-item rule (a pure function): per shape key, the sampled FLOP per item times the
    run's items of that key, plus the per-micro-batch work times the run's micro-batches.

    Only samples of one key (:attr:`MeasuredSample.key`) give a key's FLOP per item; every
    sample gives the per-micro-batch work.

    Returns:
        ``(flops, per_key, unsampled)``: the figure in FLOP (None when a key the run saw was
        not sampled, a key was dropped, or the run recorded no key), each of the run's keys
        with its sampled FLOP and items and the run's items, and the run's keys no sample
        covers.
    """
    samples = list(samples)
    sampled: dict[str, list[int]] = {}
    for s in samples:
        key = s.key
        if key is not None:
            acc = sampled.setdefault(key, [0, 0])
            acc[0] += s.scaled_flops
            acc[1] += s.items
    per_key: list[dict[str, Any]] = []
    unsampled: list[str] = []
    total = 0.0
    for shape in totals.input_shapes:
        row: dict[str, Any] = {
            "key": shape.key,
            "micro_batches": shape.micro_batches,
            "items": shape.items,
        }
        if shape.key in sampled:
            flops, items = sampled[shape.key]
            row.update(sample_flops=flops, sample_items=items)
            total += shape.items * flops / items
        else:
            unsampled.append(shape.key)
        per_key.append(row)
    batches = sum(s.micro_batches for s in samples)
    if unsampled or totals.input_shapes_dropped or not totals.input_shapes or batches <= 0:
        return None, per_key, unsampled
    per_batch = sum(s.per_micro_batch_flops for s in samples)
    return total + totals.micro_batches * per_batch / batches, per_key, unsampled


def per_item_padding(samples: Iterable[MeasuredSample], totals: TokenTotals) -> str | None:
    """How much of the per-item figure's positions are padding, or None when none are.

    A key's samples count every position of their calls, padding included (``tokens`` and
    ``decoder_tokens`` are the padded shapes); the run's totals count non-padding tokens. The
    positions the sampled keys imply for the run (per key: positions per item x the run's
    items) against the tokens the run counted tell whether there was padding. With padding the
    per-item figure is the work the kernels computed, padding included (:data:`PADDED`): sound
    as that, and named so, never as the non-padding work.

    Returns:
        A phrase for the estimate's note (``N of M input positions``, and the decoder's), or
        None: no padding, or a key no sample covers (said by the per-item rule itself).
    """
    per_key: dict[str, list[int]] = {}
    for s in samples:
        if s.key is not None:
            acc = per_key.setdefault(s.key, [0, 0, 0])
            acc[0] += s.tokens
            acc[1] += s.decoder_tokens
            acc[2] += s.items
    text = decoder = 0.0
    for shape in totals.input_shapes:
        acc = per_key.get(shape.key)
        if acc is None or acc[2] <= 0:
            return None
        text += shape.items * acc[0] / acc[2]
        decoder += shape.items * acc[1] / acc[2]
    parts = []
    if text > totals.tokens_processed * (1 + 1e-9):
        parts.append(f"{text - totals.tokens_processed:.0f} of {text:.0f} input positions")
    if decoder > totals.decoder_tokens * (1 + 1e-9):
        parts.append(f"{decoder - totals.decoder_tokens:.0f} of {decoder:.0f} decoder positions")
    return " and ".join(parts) or None


def per_item_uncovered(totals: TokenTotals, unsampled: list[str]) -> str:
    """Why the per-item rule does not cover the run (its figure is None)."""
    parts = []
    if not totals.input_shapes:
        parts.append("the run recorded no input shapes")
    if unsampled:
        batches = sum(s.micro_batches for s in totals.input_shapes if s.key in set(unsampled))
        parts.append(
            f"{len(unsampled)} of the run's {len(totals.input_shapes)} shape keys "
            f"({batches} micro-batches) were not sampled"
        )
    if totals.input_shapes_dropped:
        parts.append(
            f"{totals.input_shapes_dropped} micro-batches had shape keys beyond the "
            f"{len(totals.input_shapes)} kept"
        )
    return "; ".join(parts) or "the samples had no items to scale by"


def _fit(samples: list[MeasuredSample]) -> tuple[float, float, float] | None:
    """``(a, b, worst)``: the least-squares fit (each sample weighted by its count) of each
    sample's scaled FLOP (its per-micro-batch work aside) to ``a x tokens + b x squared
    lengths``, and the worst ``|fit / counted - 1|`` over the samples; None when singular."""
    rows = [(s.tokens, s.sum_sq_len, s.scaled_flops) for s in samples if s.scaled_flops > 0]
    w = [(t / f, q / f) for t, q, f in rows]  # relative: the residuals are fractions of each
    tt, tq, qq = (sum(x * x for x, _ in w), sum(x * y for x, y in w), sum(y * y for _, y in w))
    ty, qy = sum(x for x, _ in w), sum(y for _, y in w)
    det = tt * qq - tq * tq
    if len(rows) < len(samples) or det <= 1e-12 * tt * qq:
        return None
    a, b = (ty * qq - qy * tq) / det, (qy * tt - ty * tq) / det
    return a, b, max(abs((a * t + b * q) / f - 1.0) for t, q, f in rows)


def padded_text_flops(
    samples: Iterable[MeasuredSample], totals: TokenTotals
) -> tuple[float | None, str]:
    """The padded text rule (a pure function): the text rule on the positions computed, each
    sample's linear work by the run's tokens with padding (``tokens_seen``), its attention work
    by the run's padded squared lengths (``sum_sq_seq_len_seen``), its per-micro-batch work by
    the run's micro-batches. The samples' own tokens and squared lengths are their padded
    shapes, so sample and run count the same quantities, padding included.

    Sound only when every micro-batch of the run was one text-token stream
    (``non_text_micro_batches == 0``: samples marked not text by a state-space mixer only), the
    run's padded squared lengths are known, the samples have at least three padded widths,
    and a least-squares fit of each sample's count to ``a x positions + b x squared lengths``
    (:func:`_fit`) predicts every sample within :data:`RULE_TOLERANCE`: work that grows
    otherwise (a per-sequence term, a chunked scan whose work steps with the chunks) misses,
    and the figure is withheld. The fit, not the counter's linear/attention split, because a
    state-space scan is filed with attention although it grows with the length.

    Returns:
        ``(flops, why)``: the figure in FLOP, or None with why the rule does not hold.
    """
    samples = [s for s in samples if s.tokens > 0 and s.sum_sq_len > 0 and s.micro_batches > 0]
    seen_sq = totals.sum_sq_seq_len_seen
    if totals.non_text_micro_batches:
        return None, "the run had micro-batches not all in one text-token stream"
    if seen_sq is None:
        return None, "a restored state did not keep the run's padded squared lengths"
    fit = _fit(samples)
    if len({s.sum_sq_len * 10**6 // s.tokens for s in samples}) < 3 or fit is None:
        return None, "the samples have fewer than three padded widths to fit and check it on"
    a, b, worst = fit
    if worst > RULE_TOLERANCE:
        return None, (
            f"the samples do not fit work linear in the positions plus work in their squared "
            f"lengths (the fit misses a sample by {worst:.2%}, over {RULE_TOLERANCE:.1%})"
        )
    per_batch = sum(s.per_micro_batch_flops for s in samples) / sum(
        s.micro_batches for s in samples
    )
    return a * totals.tokens_seen + b * seen_sq + totals.micro_batches * per_batch, ""
