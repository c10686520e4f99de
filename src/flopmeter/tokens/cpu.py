"""The token statistics of a micro-batch of CPU tensors, with numpy on zero-copy views.

:func:`counts_cpu` counts a batch :func:`~flopmeter.tokens.batch.prepare_batch` has normalised
(what is counted: :mod:`flopmeter.tokens.stats`), with the same results as the torch operations of
:func:`flopmeter.tokens.torch_ops.stats_torch_ops`, for CPU tensors only. It works per document
where the batch is packed, not per token: the document starts (a data-dependent ``flatnonzero``,
which on the CPU reads nothing that is not already on the host) and their lengths by a
segmented sum, so that a packed batch costs about one pass over its positions. Numpy is used
because its element-wise comparisons run several times faster than torch's on one thread.

Nothing here may run for a CUDA tensor: ``numpy()`` there would be a copy and a host sync.
:func:`flopmeter.tokens.stats` calls it only for CPU tensors.
"""

from __future__ import annotations

import threading

import numpy as np
import torch

from flopmeter.tokens.batch import MODE_ALL, MODE_IDS, MODE_MASK, PreparedBatch

__all__ = ["counts_cpu", "cpu_view", "row_lengths", "unpacked_lengths"]

#: Offsets and segment sums in int32 while the batch's tokens fit (halves the memory traffic).
_INT32_LIMIT = 2**31 - 1


def cpu_view(t: torch.Tensor) -> np.ndarray | None:
    """A numpy view of a CPU tensor, or ``None`` where numpy has no such dtype (bfloat16, ...)
    or the tensor is not a plain one (the torch operations count those)."""
    if t.requires_grad:
        t = t.detach()
    try:
        return t.numpy()  # a view of the CPU tensor's memory: no copy, no device read
    except (TypeError, RuntimeError, ValueError):
        return None


def counts_cpu(b: PreparedBatch) -> np.ndarray | None:
    """One prepared micro-batch of CPU tensors' counts, a new int64 ``[N_STATS]`` array.

    Args:
        b: A batch from :func:`~flopmeter.tokens.batch.prepare_batch` whose tensors are on the
            CPU and hold at least one token.

    Returns:
        The statistics in ``SLOT_*`` order, or ``None`` when a tensor has no numpy view (the
        caller counts those with the torch operations).
    """
    rows, cols = b.rows, b.cols
    seen = rows * cols
    data = None
    if b.data is not None:
        data = _countable_view(b.data, b.mode, b.pad_id)
        if data is None:
            return None
    if b.position_ids is not None:
        pos = cpu_view(b.position_ids)
        if pos is None:
            return None
        starts = _position_starts(pos, rows, cols)
        if (
            b.mode == MODE_ALL
            or data is None
            or (b.mode == MODE_IDS and not np.count_nonzero(_at(data, starts, cols) == b.pad_id))
        ):  # every token real: each document is a sequence of its full length
            lengths = _tiling_lengths(starts, seen)
            return np.array((seen, seen, lengths.size, np.dot(lengths, lengths)), dtype=np.int64)
        ends = starts + _tiling_lengths(starts, seen)
        if b.mode == MODE_IDS:
            lengths = _ids_document_lengths(data, b.pad_id, starts, ends, cols)
        else:
            lengths = _segment_sums(_real(data, b.mode, b.pad_id), starts, ends)
    elif b.cu_seqlens is not None:
        cu = cpu_view(b.cu_seqlens)
        if cu is None:
            return None
        # Offsets that go back never reopen a document (their running maximum), clamped.
        offsets = np.maximum.accumulate(cu.astype(np.int64))  # a copy: clamped in place
        np.minimum(offsets, seen, out=offsets)
        np.maximum(offsets, 0, out=offsets)
        starts, ends = offsets[:-1], offsets[1:]
        if data is None:
            lengths = ends - starts
            if not lengths.size:
                return np.array((0, seen, 0, 0), dtype=np.int64)
            return np.array(
                (
                    offsets[-1] - offsets[0],
                    seen,
                    np.count_nonzero(lengths),
                    np.dot(lengths, lengths),
                ),
                dtype=np.int64,
            )
        lengths = _range_sums(_real(data, b.mode, b.pad_id), starts, ends, seen)
    elif data is None:
        return np.array((seen, seen, rows, seen * cols), dtype=np.int64)
    else:
        lengths = row_lengths(data, b.mode, b.pad_id)
    lengths = lengths.astype(np.int64, copy=False)
    return np.array(
        (np.add.reduce(lengths), seen, np.count_nonzero(lengths), np.dot(lengths, lengths)),
        dtype=np.int64,
    )


def _tiling_lengths(starts: np.ndarray, seen: int) -> np.ndarray:
    """The lengths of the segments that start at ``starts`` (ascending, the first at 0) and
    tile ``seen`` tokens: each to the next start, the last to the end."""
    lengths = np.empty_like(starts)
    np.subtract(starts[1:], starts[:-1], out=lengths[:-1])
    lengths[-1] = seen - starts[-1]
    return lengths


def row_lengths(data: np.ndarray, mode: int, pad_id: int) -> np.ndarray:
    """The real tokens of each row of an unpacked ``[rows, cols]`` batch (its mask, or its ids
    with ``pad_id``), int32 (int64 for rows of 2^31 tokens or more)."""
    acc = np.int32 if data.shape[-1] <= _INT32_LIMIT else np.int64
    return np.add.reduce(_real(data, mode, pad_id).view(np.uint8), axis=1, dtype=acc)


def unpacked_lengths(t: torch.Tensor, mode: int, pad_id: int, cols: int) -> torch.Tensor | None:
    """The row lengths (int64, one per row of ``cols`` tokens) of an unpacked CPU micro-batch's
    mask or ids, read now; ``None`` where :func:`counts_cpu` would leave the batch to the torch
    operations (no numpy view, or a pad id outside the ids' dtype)."""
    data = _countable_view(t, mode, pad_id)
    if data is None:
        return None
    lengths = row_lengths(data.reshape(-1, cols), mode, pad_id)
    return torch.from_numpy(lengths.astype(np.int64, copy=False))


def _countable_view(t: torch.Tensor, mode: int, pad_id: int) -> np.ndarray | None:
    """A numpy view of a batch's mask or ids that numpy counts as torch does; ``None`` without
    a view, or for ids with a pad id outside their dtype (torch's comparison rules decide)."""
    data = cpu_view(t)
    if data is None or (mode == MODE_IDS and not _fits(data.dtype, pad_id)):
        return None
    return data


#: The value range of each integer dtype seen (``np.iinfo`` is slow to build).
_RANGES: dict[np.dtype, tuple[int, int]] = {}


def _fits(dtype: np.dtype, value: int) -> bool:
    if dtype.kind not in "iu":
        return True  # bool ids (every value compared as torch and numpy both do)
    bounds = _RANGES.get(dtype)
    if bounds is None:
        info = np.iinfo(dtype)
        bounds = _RANGES[dtype] = (int(info.min), int(info.max))
    return bounds[0] <= value <= bounds[1]


def _real(data: np.ndarray, mode: int, pad_id: int) -> np.ndarray:
    """The real-token mask, ``[rows, cols]`` bool (the mask itself where it is bool)."""
    if mode == MODE_MASK:
        return data if data.dtype == np.bool_ else data != 0
    return data != pad_id


def _position_starts(pos: np.ndarray, rows: int, cols: int) -> np.ndarray:
    """The flat indices of the documents' first tokens, ascending: each row's first token and
    wherever ``pos[t] != pos[t - 1] + 1`` (compared as a difference, which wraps alike)."""
    if rows > 1 and pos.strides[0] == 0:  # one row of positions broadcast over the batch
        in_row = _position_starts(pos[:1], 1, cols)
        return (np.arange(0, rows * cols, cols, dtype=np.int64)[:, None] + in_row).reshape(-1)
    if pos.flags.c_contiguous:  # flat: numpy is several times faster on 1-D operands
        flat = pos.reshape(-1)
        steps, starts = _scratch(flat.size, flat.dtype)
        np.subtract(flat[1:], flat[:-1], out=steps)
        np.not_equal(steps, 1, out=starts[1:])
        starts[::cols] = True  # each row's first token (also across the rows' boundaries)
        return starts.nonzero()[0]
    starts = np.empty((rows, cols), dtype=np.bool_)
    starts[:, 0] = True
    np.not_equal(pos[:, 1:] - pos[:, :-1], 1, out=starts[:, 1:])
    return starts.reshape(-1).nonzero()[0]


#: Per thread, the scratch arrays of :func:`_scratch` by size and dtype.
_scratch_arrays = threading.local()
#: Positions up to this many get kept scratch arrays (above it, allocating is a small part of a
#: pass over them); at most :data:`_SCRATCH_KEPT` sizes are kept per thread.
_SCRATCH_MAX = 1 << 16
_SCRATCH_KEPT = 4


def _scratch(n: int, dtype: np.dtype) -> tuple[np.ndarray, np.ndarray]:
    """Two arrays to overwrite, for ``n`` positions of ``dtype``: their ``n - 1`` steps (in
    ``dtype``, so a difference wraps as the other implementations' does) and ``n`` flags; kept
    per thread for small batches (a micro-batch's fixed cost), new ones for large."""
    if n > _SCRATCH_MAX:
        return np.empty(n - 1, dtype=dtype), np.empty(n, dtype=np.bool_)
    kept = getattr(_scratch_arrays, "by_size", None)
    if kept is None:
        kept = _scratch_arrays.by_size = {}
    pair = kept.get((n, dtype))
    if pair is None:
        if len(kept) >= _SCRATCH_KEPT:
            kept.clear()
        pair = kept[n, dtype] = (np.empty(n - 1, dtype=dtype), np.empty(n, dtype=np.bool_))
    return pair


def _at(a: np.ndarray, flat: np.ndarray, cols: int) -> np.ndarray:
    """``a.reshape(-1)[flat]`` without copying a non-contiguous ``a``."""
    if a.flags.c_contiguous:
        return a.reshape(-1)[flat]
    r, c = np.divmod(flat, cols)
    return a[r, c]


def _ids_document_lengths(
    ids: np.ndarray, pad_id: int, starts: np.ndarray, ends: np.ndarray, cols: int
) -> np.ndarray:
    """Documents' real lengths when the ids decide: from the first token that is not
    ``pad_id`` to the document's end (0 when there is none)."""
    lengths = ends - starts
    opens_with_pad = _at(ids, starts, cols) == pad_id
    nonpad = (ids != pad_id).reshape(-1)
    held = _segment_sums(nonpad, starts, ends)  # non-pad tokens per document
    lengths[held == 0] = 0  # only pads: no real token
    mixed = np.flatnonzero(opens_with_pad & (held > 0))
    if mixed.size:
        # Pads, then a non-pad token inside the document: that token opens a run of non-pad
        # tokens, and the runs' starts are far fewer than the tokens.
        runs = np.flatnonzero(nonpad[1:] > nonpad[:-1]) + 1
        s, e = starts[mixed], ends[mixed]
        lengths[mixed] = e - runs[np.searchsorted(runs, s, side="left")]
    return lengths


def _flat_u8(real: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(real).reshape(-1).view(np.uint8)


def _segment_sums(real: np.ndarray, starts: np.ndarray, ends: np.ndarray) -> np.ndarray:
    """Real tokens of the segments ``[starts[i], ends[i])`` that tile the batch (``starts``
    strictly increasing from 0, ``ends[i] == starts[i + 1]``, the last to the end)."""
    flat = _flat_u8(real)
    acc = np.int32 if flat.size <= _INT32_LIMIT else np.int64
    if starts.size * 64 <= flat.size:  # few segments: one segmented pass
        return np.add.reduceat(flat, starts, dtype=acc)
    # Many short segments (each pad a "document" of its own): reduceat's cost per segment
    # exceeds a prefix sum's per token; the segments' sums are differences of the prefix.
    before = np.zeros(flat.size + 1, dtype=acc)
    np.cumsum(flat, dtype=acc, out=before[1:])
    return before[ends] - before[starts]


def _range_sums(real: np.ndarray, starts: np.ndarray, ends: np.ndarray, seen: int) -> np.ndarray:
    """Real tokens of the ranges ``[starts[i], ends[i])`` (ascending, not overlapping, inside
    the batch); the empty ranges are left out (they add nothing to any count)."""
    keep = ends > starts
    s, e = starts[keep], ends[keep]
    if s.size == 0:
        return s
    bounds = np.empty(2 * s.size, dtype=np.int64)
    bounds[0::2] = s
    bounds[1::2] = e
    if bounds[-1] == seen:  # only the last range can end at the batch's end: sum to the end
        bounds = bounds[:-1]
    acc = np.int32 if seen <= _INT32_LIMIT else np.int64
    return np.add.reduceat(_flat_u8(real), bounds, dtype=acc)[0::2]
