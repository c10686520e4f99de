"""Token statistics of a micro-batch, accumulated into a device buffer without a host sync.

The buffer is a 1-D int64 tensor of :data:`N_STATS` slots on the batch's device (see the
``SLOT_*`` indices). The per-micro-batch path launches device work only: no ``.item()``,
``.cpu()``, ``.tolist()`` or branching on tensor values. The totals are read once, when a report
is made.
"""

from __future__ import annotations

import torch

#: Non-padding tokens.
SLOT_TOKENS = 0
#: Tokens including padding (the elements of the ids or mask).
SLOT_TOKENS_SEEN = 1
#: Sequences (rows of a 2-D batch; a 1-D batch is one sequence).
SLOT_SEQUENCES = 2
#: Sum over sequences of (non-padding length)^2, which the attention FLOP term needs.
SLOT_SUM_SQ_LEN = 3
N_STATS = 4


def new_buffer(device: torch.device | str) -> torch.Tensor:
    """A zeroed statistics buffer on ``device``."""
    return torch.zeros(N_STATS, dtype=torch.int64, device=device)


def _as_2d(t: torch.Tensor) -> torch.Tensor:
    return t.unsqueeze(0) if t.dim() == 1 else t.reshape(-1, t.shape[-1])


def accumulate_token_stats(
    buffer: torch.Tensor,
    *,
    input_ids: torch.Tensor | None = None,
    attention_mask: torch.Tensor | None = None,
    pad_id: int | None = None,
) -> None:
    """Adds one micro-batch's token statistics into ``buffer`` (in place, no host sync).

    Non-padding tokens come from ``attention_mask`` (non-zero entries) when it is a 1-D or 2-D
    mask, else from ``input_ids != pad_id``; with ``pad_id=None`` and no mask, every token counts.

    Args:
        buffer: A buffer from :func:`new_buffer`, on the same device as the inputs.
        input_ids: Token ids, shape ``[T]`` or ``[B, T]`` (int32 or int64).
        attention_mask: Mask of the same shape; 1 (or True) marks a real token.
        pad_id: The padding token id, used only without a usable mask.
    """
    if attention_mask is not None and attention_mask.dim() <= 2:
        real = _as_2d(attention_mask) != 0
    elif input_ids is not None:
        ids = _as_2d(input_ids)
        real = ids != pad_id if pad_id is not None else None
        if real is None:
            rows, cols = ids.shape
            lengths = torch.full((rows,), cols, dtype=torch.int64, device=buffer.device)
            _add(buffer, lengths, rows * cols, rows)
            return
    else:
        return
    lengths = real.sum(dim=-1, dtype=torch.int64)
    _add(buffer, lengths, real.numel(), real.shape[0])


def _add(buffer: torch.Tensor, lengths: torch.Tensor, seen: int, rows: int) -> None:
    stats = torch.stack(
        (
            lengths.sum(),
            lengths.new_tensor(seen),
            lengths.new_tensor(rows),
            (lengths * lengths).sum(),
        )
    )
    buffer.add_(stats)
