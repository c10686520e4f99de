"""The torch implementation of the token statistics: the reference the Triton kernel matches.

:func:`stats_torch_ops` counts one prepared micro-batch (what is counted:
:mod:`flopmeter.tokens.stats`) with tensor operations on the batch's device: no ``.item()``,
``.cpu()``, host copy or branching on tensor values. Which implementation counts a batch is
chosen in one place, :mod:`flopmeter.tokens.stats`.
"""

from __future__ import annotations

import torch

from flopmeter.tokens.batch import (
    MODE_IDS,
    MODE_MASK,
    PreparedBatch,
    monotone_offsets,
)

__all__ = ["stats_torch_ops"]


def _host_vector(values: tuple[int, int, int, int], device: torch.device) -> torch.Tensor:
    """A statistics vector known on the host, on ``device`` without a host-to-device copy."""
    if device.type == "cpu":
        return torch.tensor(values, dtype=torch.int64)
    # torch.tensor(values, device=...) would be a blocking copy that waits for the stream;
    # fills take their value as a kernel argument.
    return torch.stack([torch.full((), v, dtype=torch.int64, device=device) for v in values])


def stats_torch_ops(b: PreparedBatch) -> torch.Tensor:
    """One prepared micro-batch's counts with torch operations only, a new int64 ``[N_STATS]``
    tensor on its device: no host read or sync (the kernel's fallback off CUDA's kernel path,
    and the reference it matches)."""
    rows, cols = b.rows, b.cols
    seen = rows * cols
    if seen == 0:
        return _host_vector((0, 0, 0, 0), b.device)
    if b.data is None:
        real = None
    elif b.mode == MODE_MASK:
        real = b.data != 0
    else:
        real = b.data != b.pad_id
    if b.position_ids is not None:
        pos = b.position_ids
        starts = torch.ones((rows, cols), dtype=torch.bool, device=b.device)
        torch.ne(pos[:, 1:], pos[:, :-1] + 1, out=starts[:, 1:])
        # Each token's document start: the latest start at or before it, a running maximum.
        cols_i = torch.arange(cols, dtype=torch.int32, device=b.device)
        start = torch.where(starts, cols_i, 0).cummax(-1).values.long()
        # int32 within a row (a row is far shorter than 2^31 tokens); sums in int64.
        if real is None:
            real = torch.ones((rows, cols), dtype=torch.bool, device=b.device)
        elif b.mode == MODE_IDS:
            # Real from the document's first non-pad token on: the non-pad tokens from the
            # document's start up to this one (inclusive) are more than none.
            nonpad = real.to(torch.int32)
            upto = nonpad.cumsum(-1, dtype=torch.int32)
            real = upto > upto.sub(nonpad).gather(-1, start)
        count = real.to(torch.int32)
        before = count.cumsum(-1, dtype=torch.int32).sub_(count)  # real tokens before each
        base = before.gather(-1, start)  # the real tokens before this token's document
        rank = before.sub_(base)  # this token's index among its document's real tokens
        tokens = count.sum(dtype=torch.int64)
        first = torch.count_nonzero(rank.eq(0).logical_and_(real))
        # The k-th real token of a document adds 2k + 1: 1 + 3 + ... + (2L - 1) = L^2.
        squares = rank.mul_(count).sum(dtype=torch.int64) * 2 + tokens
        seen_t = torch.full((), seen, dtype=torch.int64, device=b.device)
        return torch.stack((tokens, seen_t, first, squares))
    if b.cu_seqlens is not None:
        cu = monotone_offsets(b.cu_seqlens.to(torch.int64)).clamp(0, seen)
        starts = cu[:-1]
        ends = torch.maximum(cu[1:], starts)
        if real is None:  # every token of a document is real: no pass over the tokens
            lengths = ends - starts
        else:
            prefix = torch.zeros(seen + 1, dtype=torch.int64, device=b.device)
            prefix[1:] = real.reshape(-1).cumsum(0)
            lengths = prefix[ends] - prefix[starts]
        return torch.stack(
            (
                lengths.sum(),
                torch.full((), seen, dtype=torch.int64, device=b.device),
                lengths.clamp(max=1).sum(),
                (lengths * lengths).sum(),
            )
        )
    if real is None:
        return _host_vector((seen, seen, rows, rows * cols * cols), b.device)
    lengths = real.sum(-1, dtype=torch.int64)
    # Columns: tokens, tokens seen (cols per row), sequences (non-empty rows), squared lengths.
    per_row = torch.stack(
        (lengths, torch.full_like(lengths, cols), lengths.clamp(max=1), lengths * lengths)
    )
    return per_row.sum(-1)
