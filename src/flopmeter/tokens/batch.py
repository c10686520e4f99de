"""A micro-batch's token inputs, normalised for counting: shapes and dtypes only, no value read.

:class:`TokenInputs` says where a forward call carries its tokens; :func:`prepare_batch` checks
them against each other and normalises them to ``[rows, cols]`` (a :class:`PreparedBatch`, the
arguments of both implementations of the statistics); :func:`shape_stats` gives upper bounds of
the counts from the shapes alone. The statistics buffer's slots (``SLOT_*``) and the data modes
(``MODE_*``, shared with the Triton kernel) are defined here. What is counted:
:mod:`flopmeter.tokens.stats`.
"""

from __future__ import annotations

import math
from typing import Literal, NamedTuple

import torch

__all__ = [
    "MODE_ALL",
    "MODE_IDS",
    "MODE_MASK",
    "N_STATS",
    "SLOT_SEQUENCES",
    "SLOT_SUM_SQ_LEN",
    "SLOT_TOKENS",
    "SLOT_TOKENS_SEEN",
    "PreparedBatch",
    "TokenInputError",
    "TokenInputs",
    "monotone_offsets",
    "new_buffer",
    "prepare_batch",
    "shape_stats",
]

#: Non-padding tokens.
SLOT_TOKENS = 0
#: Tokens including padding (the elements of the ids or mask).
SLOT_TOKENS_SEEN = 1
#: Sequences with at least one real token (rows; documents of a packed batch).
SLOT_SEQUENCES = 2
#: Sum over sequences of (non-padding length)^2, tokens^2, which the attention FLOP term needs.
SLOT_SUM_SQ_LEN = 3
#: Slots of a statistics buffer: the four counts above.
N_STATS = 4

#: The data modes, shared with the Triton kernel.
MODE_MASK = 0
MODE_IDS = 1
MODE_ALL = 2


class TokenInputError(ValueError):
    """A micro-batch's token inputs that cannot be counted as they are.

    Attributes:
        kind: ``"unread"`` (the tokens cannot be read: a 0-d tensor, offsets that are not a
            1-D integer tensor) or ``"inconsistent"`` (the inputs contradict each other: a
            mask of another shape than the ids, positions that do not fit the batch).
    """

    def __init__(self, kind: Literal["unread", "inconsistent"], message: str) -> None:
        super().__init__(message)
        self.kind = kind


class TokenInputs(NamedTuple):
    """Where one micro-batch's tokens are: the tensors a forward call carries them in.

    A named tuple (made on every training micro-batch, so as cheap as possible).

    Attributes:
        input_ids: Token ids, ``[T]`` or ``[B, T]`` (more leading dimensions fold into rows); a
            floating tensor here stands for ``inputs_embeds`` (every position a token).
        attention_mask: Same shape as the ids; non-zero (or True) marks a real token.
        position_ids: Positions of a packed batch (``[T]``, ``[1, T]`` or ``[B, T]``):
            documents start where the positions restart.
        cu_seqlens: Offsets of a packed batch's documents into the flattened tokens
            (``[n_docs + 1]``), used only without ``position_ids``.
    """

    input_ids: torch.Tensor | None = None
    attention_mask: torch.Tensor | None = None
    position_ids: torch.Tensor | None = None
    cu_seqlens: torch.Tensor | None = None

    @property
    def ref(self) -> torch.Tensor | None:
        """The tensor whose shape is the batch's: the ids, else the mask, else ``None``."""
        return self.input_ids if self.input_ids is not None else self.attention_mask


class PreparedBatch(NamedTuple):
    """A micro-batch normalised for counting (device tensors, views where possible)."""

    data: torch.Tensor | None
    """Mask or ids, ``[rows, cols]``; ``None`` when every token is real."""
    mode: int
    """:data:`MODE_MASK`, :data:`MODE_IDS` or :data:`MODE_ALL`."""
    pad_id: int
    rows: int
    cols: int
    position_ids: torch.Tensor | None
    """``[rows, cols]`` (possibly an expanded view), for packed batches."""
    cu_seqlens: torch.Tensor | None
    """1-D document offsets, used only without ``position_ids``."""
    device: torch.device


def new_buffer(device: torch.device | str) -> torch.Tensor:
    """A zeroed statistics buffer on ``device``."""
    return torch.zeros(N_STATS, dtype=torch.int64, device=device)


def _as_2d(t: torch.Tensor) -> torch.Tensor:
    if t.dim() == 2:
        return t
    if t.dim() == 1:
        return t.unsqueeze(0)
    if t.dim() == 0:
        raise TokenInputError(
            "unread", "token inputs must have at least one dimension, got a 0-d tensor"
        )
    return t.reshape(math.prod(t.shape[:-1]), t.shape[-1])


def prepare_batch(inputs: TokenInputs, pad_id: int | None = None) -> PreparedBatch | None:
    """Normalises a micro-batch's token inputs (shapes and dtypes only: no tensor is read).

    Arguments as :func:`accumulate_token_stats`. ``position_ids`` and ``cu_seqlens`` on
    another device than the batch are copied to it (asynchronously).

    Returns:
        The prepared batch, or ``None`` when there is nothing to count (no ids and no usable
        mask).

    Raises:
        TokenInputError: the inputs cannot be read, or contradict each other (a mask of
            another shape than the ids; ``position_ids`` or ``cu_seqlens`` that do not fit).
    """
    input_ids, attention_mask = inputs.input_ids, inputs.attention_mask
    position_ids, cu_seqlens = inputs.position_ids, inputs.cu_seqlens
    if attention_mask is not None and 1 <= attention_mask.dim() <= 2:
        if input_ids is not None and input_ids.shape != attention_mask.shape:
            raise TokenInputError(
                "inconsistent",
                f"attention_mask of shape {tuple(attention_mask.shape)} does not match "
                f"input_ids of shape {tuple(input_ids.shape)}",
            )
        source, mode = attention_mask, MODE_MASK
    elif input_ids is not None:
        source = input_ids
        exact = not (input_ids.is_floating_point() or input_ids.is_complex())
        mode = MODE_IDS if pad_id is not None and exact else MODE_ALL
    else:
        return None
    data = _as_2d(source)
    rows, cols = data.shape
    device = source.device
    pos = None
    if position_ids is not None:
        pos = _as_2d(position_ids) if position_ids.shape == source.shape else position_ids
        if pos.dim() == 1:
            pos = pos.unsqueeze(0)
        if pos.dim() != 2 or pos.shape[1] != cols or pos.shape[0] not in (1, rows):
            raise TokenInputError(
                "inconsistent",
                f"position_ids of shape {tuple(position_ids.shape)} do not fit a batch of "
                f"shape {tuple(source.shape)}",
            )
        if pos.is_floating_point() or pos.is_complex() or pos.dtype == torch.bool:
            raise TokenInputError("unread", f"position_ids must be integers, got {pos.dtype}")
        if pos.shape[0] != rows:
            pos = pos.expand(rows, cols)
        if pos.device != device:  # a copy queued on the device, not a host sync
            pos = pos.to(device, non_blocking=True)
    cu = None
    if cu_seqlens is not None and pos is None:
        if cu_seqlens.dim() != 1 or cu_seqlens.is_floating_point() or cu_seqlens.is_complex():
            raise TokenInputError(
                "unread",
                f"cu_seqlens must be a 1-D integer tensor of offsets, got shape "
                f"{tuple(cu_seqlens.shape)} and dtype {cu_seqlens.dtype}",
            )
        cu = cu_seqlens
        if cu.device != device:
            cu = cu.to(device, non_blocking=True)
        if mode == MODE_IDS:  # explicit documents: every token inside one is real
            mode = MODE_ALL
    return PreparedBatch(
        data=None if mode == MODE_ALL else data,
        mode=mode,
        pad_id=0 if pad_id is None else int(pad_id),
        rows=rows,
        cols=cols,
        position_ids=pos,
        cu_seqlens=cu,
        device=device,
    )


def shape_stats(inputs: TokenInputs, pad_id: int | None = None) -> tuple[int, int, int, int]:
    """A micro-batch's counts from its shapes alone, for tensors that hold no values (``meta``).

    Every position counts as a real token and every row as one sequence of the full width, so
    each count is an upper bound of what the values would give: padding is included, and a
    packed row's documents count as one sequence (its square is at least the sum of theirs).

    Args:
        inputs: The micro-batch's token inputs (only shapes are read).
        pad_id: As :func:`accumulate_token_stats` (it cannot be applied without values).

    Returns:
        ``(tokens, tokens_seen, sequences, sum_sq_seq_len)`` in ``SLOT_*`` order; zeros when
        there is nothing to count.

    Raises:
        TokenInputError: The inputs' shapes cannot be read or contradict each other.
    """
    batch = prepare_batch(inputs, pad_id)
    if batch is None or batch.rows * batch.cols == 0:
        return (0, 0, 0, 0)
    seen = batch.rows * batch.cols
    return (seen, seen, batch.rows, seen * batch.cols)


def monotone_offsets(cu_seqlens: torch.Tensor) -> torch.Tensor:
    """Document offsets that never go back (their running maximum, on the device, no host read).

    Offsets that decrease would make documents overlap and count a token twice (more real
    tokens than the batch holds); with them no document starts before the previous one ends.
    Such a batch is counted as inconsistent all the same, and the run's compute withheld.
    """
    if cu_seqlens.numel() == 0:
        return cu_seqlens
    return torch.cummax(cu_seqlens, 0).values
