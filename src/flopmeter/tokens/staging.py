"""Token statistics of unpacked CPU micro-batches, counted in batches of micro-batches.

On CPU tensors the cost of the statistics of a small micro-batch is the fixed cost of each
torch operation (a few microseconds for a reduction along a dimension), not its tokens. The
meter's hot path (:mod:`flopmeter.counting.call_plan`) therefore hands the ids or mask of an unpacked
CPU micro-batch of at most :data:`STAGE_BYTES_MAX` bytes to :class:`StagedTokens`, which
copies it into a staging area of micro-batches of its shape (one copy, no reduction) and
counts a full staging area at once. A larger micro-batch, or one of a shape beyond
:data:`MAX_STAGES` areas, is reduced to its row lengths at once by the CPU statistics' own
reduction (:func:`flopmeter.tokens.cpu.unpacked_lengths`: its one pass over the data costs
more than the fixed cost then), and the lengths wait with the staged ones.

The values are read when the micro-batch is handed over (the copy), so a loop that refills
the same input tensor in place is counted right. :meth:`StagedTokens.fold` adds the staged
micro-batches into its own totals, whenever a staging area fills and before the counters read
them (:meth:`StagedTokens.totals`). What is counted is :mod:`flopmeter.tokens.stats`'s rule for a
batch without ``position_ids`` or ``cu_seqlens``: with a mask, its non-zero elements; with ids
and a pad id, the ids that are not the pad id; a sequence is a row with at least one real token.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import torch

from flopmeter.tokens.batch import MODE_IDS
from flopmeter.tokens.cpu import unpacked_lengths

__all__ = ["STAGE_BYTES_MAX", "FastText", "StagedTokens", "TokenStage"]

#: Micro-batches of at most this many bytes of ids or mask are staged (copied, counted later).
STAGE_BYTES_MAX = 16 * 1024
#: Bytes of one staging area (its depth: this over the micro-batch's bytes, at most
#: :data:`STAGE_DEPTH_MAX`).
STAGE_BYTES = 256 * 1024
#: Micro-batches a staging area holds at most.
STAGE_DEPTH_MAX = 256
#: Staging areas at most (the others' micro-batches are counted at once): with
#: :data:`STAGE_BYTES`, at most 2 MiB staged.
MAX_STAGES = 8
#: Row lengths kept before they are folded into the totals.
MAX_PENDING = 256


class TokenStage:
    """The staging area of one micro-batch shape (mask or ids, one dtype).

    Args:
        shape: The micro-batch's tensor shape.
        dtype: Its dtype.
        mode: :data:`~flopmeter.tokens.batch.MODE_MASK` or :data:`~flopmeter.tokens.batch.
            MODE_IDS`.
        pad_id: The pad id (``MODE_IDS``).
        cols: The length of a row (the last dimension).
    """

    __slots__ = ("cols", "data", "depth", "filled", "mode", "pad_id", "slots")

    def __init__(
        self, shape: tuple[int, ...], dtype: torch.dtype, mode: int, pad_id: int, cols: int
    ) -> None:
        nbytes = max(1, torch.Size(shape).numel() * torch.empty((), dtype=dtype).element_size())
        depth = max(1, min(STAGE_DEPTH_MAX, STAGE_BYTES // nbytes))
        self.data = torch.empty((depth, *shape), dtype=dtype)
        #: The area's micro-batch slots, views made once (a ``copy_`` per micro-batch), and
        #: how many there are.
        self.slots = list(self.data.unbind(0))
        self.depth = depth
        #: Slots holding a micro-batch (the first ``filled``).
        self.filled = 0
        self.mode, self.pad_id, self.cols = mode, pad_id, cols

    def lengths(self) -> torch.Tensor:
        """The staged micro-batches' row lengths (int64), and the area emptied.

        One ``count_nonzero`` along the rows (of the mask itself, or of the ids that are not
        the pad id): on torch 2.13's CPU about 40% faster than the matrix-vector product of
        the real tokens in float64 with ones that it replaces, at every staged shape timed
        (rows of 8 to 512 tokens), and exact in int64."""
        rows = self.data[: self.filled].reshape(-1, self.cols)
        self.filled = 0
        return torch.count_nonzero(rows.ne(self.pad_id) if self.mode == MODE_IDS else rows, dim=1)


class FastText(NamedTuple):
    """How an unpacked text call on CPU tensors is counted without the full path (a call
    plan's part for :meth:`flopmeter.counting.counters.RunCounters.add_fast`).

    Attributes:
        source: The place of the tensor counted (the mask, or the ids): a keyword's name or a
            positional index; unused when every token is real.
        mode: ``MODE_MASK``, ``MODE_IDS`` or ``MODE_ALL`` (:mod:`flopmeter.tokens.batch`).
        pad_id: The pad id (``MODE_IDS``).
        rows: Rows as counted (leading dimensions folded).
        cols: Tokens per row, padding included.
    """

    source: Any
    mode: int
    pad_id: int
    rows: int
    cols: int


class StagedTokens:
    """Pending token statistics of unpacked CPU micro-batches (see the module docstring)."""

    def __init__(self) -> None:
        self._stages: dict[tuple[tuple[int, ...], torch.dtype, int, int], TokenStage] = {}
        self._lengths: list[torch.Tensor] = []
        self._totals = torch.zeros(3, dtype=torch.int64)  # tokens, sequences, squared lengths

    def stage_for(
        self, source: torch.Tensor, mode: int, pad_id: int, cols: int
    ) -> TokenStage | bool:
        """The staging area for micro-batches like ``source``; ``False`` when they are too
        large to stage, or :data:`MAX_STAGES` areas exist (they are counted at once)."""
        if source.numel() * source.element_size() > STAGE_BYTES_MAX:
            return False
        key = (tuple(source.shape), source.dtype, mode, pad_id)
        stage = self._stages.get(key)
        if stage is None and len(self._stages) < MAX_STAGES:
            stage = self._stages[key] = TokenStage(key[0], source.dtype, mode, pad_id, cols)
        return stage or False

    def stage(self, stage: TokenStage, source: torch.Tensor) -> None:
        """Copies one micro-batch into its staging area (a full area is counted first); the
        planned calls' and their hot path's copy (:mod:`flopmeter.counting.planned`)."""
        if stage.filled == stage.depth:
            self.flush(stage)
        stage.slots[stage.filled].copy_(source)
        stage.filled += 1

    def flush(self, stage: TokenStage) -> None:
        """Reduces a staging area's micro-batches to their row lengths, and empties it."""
        self._lengths.append(stage.lengths())
        if len(self._lengths) >= MAX_PENDING:
            self.fold()

    def count_now(self, source: torch.Tensor, mode: int, pad_id: int, cols: int) -> bool:
        """Reduces one micro-batch too large to stage (or beyond the areas) to its row lengths
        now; ``False`` when the CPU statistics leave it to the torch operations (the caller
        counts it by the general path)."""
        lengths = unpacked_lengths(source, mode, pad_id, cols)
        if lengths is None:
            return False
        self._lengths.append(lengths)
        if len(self._lengths) >= MAX_PENDING:
            self.fold()
        return True

    def fold(self) -> None:
        """Adds every pending micro-batch into the totals: tokens, sequences and squared
        lengths (tokens seen are the owner's, from the shapes)."""
        for stage in self._stages.values():
            if stage.filled:
                self._lengths.append(stage.lengths())
        if not self._lengths:
            return
        lengths = torch.cat(self._lengths) if len(self._lengths) > 1 else self._lengths[0]
        self._lengths.clear()
        self._totals.add_(
            torch.stack((lengths.sum(), torch.count_nonzero(lengths), lengths.mul(lengths).sum()))
        )

    def totals(self) -> tuple[int, int, int]:
        """Every micro-batch handed over so far (pending ones folded first): ``(tokens,
        sequences, sum of squared lengths)``, host integers (CPU tensors: no device read)."""
        self.fold()
        tokens, sequences, squares = self._totals.tolist()
        return tokens, sequences, squares
