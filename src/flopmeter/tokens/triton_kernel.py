"""The fused token-statistics kernels, in Triton: one launch per micro-batch.

Imported only when a CUDA batch is counted with Triton installed (or when a caller asks for the
Triton backend explicitly, e.g. tests under ``TRITON_INTERPRET=1`` on the CPU): importing this
module imports ``triton``. The semantics are those of :func:`flopmeter.tokens.stats.token_stats_torch`,
the torch reference; :mod:`flopmeter.tokens.stats` prepares the arguments.

Two kernels add into the meter's int64 buffer with atomics, reading each token once. They write
the slots by their literal indices, in the order of :mod:`flopmeter.tokens.stats` (``SLOT_TOKENS`` 0,
``SLOT_TOKENS_SEEN`` 1, ``SLOT_SEQUENCES`` 2, ``SLOT_SUM_SQ_LEN`` 3); the interpreted tests
compare whole buffers with the torch reference, which indexes them by name. Inside the kernels
the data modes are literals too (``MODE == 1``: ids, ``MODE == 2``: every token).

* ``_row_stats_kernel``: one program per row of a ``[R, T]`` batch, looping over the row in
  blocks. Without ``position_ids`` a row is one sequence of ``L`` real tokens (adds ``L``,
  ``L > 0`` and ``L**2``). With ``position_ids`` a row holds several documents; a document
  starts at the row's first token and wherever ``position_ids[t] != position_ids[t-1] + 1``.
  The squared document lengths are summed token by token: the ``k``-th real token (from 0) of
  a document adds ``2k + 1``, and ``1 + 3 + ... + (2L - 1) = L**2``; ``k`` comes from a prefix
  sum of real tokens minus its value at the document's start (a running maximum, since the
  prefix sum never decreases), with carries between blocks. With ids (``MODE_IDS``), a token
  is real from its document's first non-pad token on (a pad-id token continuing a document is
  real): the same prefix-sum-minus-running-maximum, over non-pad tokens, gives the non-pad
  tokens from the document's start up to each token, and the token is real when that is
  positive.
* ``_doc_stats_kernel``: one program per document of a ``cu_seqlens`` batch (offsets into the
  flattened tokens), counting the real tokens in ``[cu[i], cu[i + 1])``
  (:func:`flopmeter.tokens.stats.prepare_batch` passes ids-only batches as ``MODE_ALL`` here: every
  token of a document is real).

Shape-derived counts (tokens with padding) travel as kernel arguments: no host-to-device copy.
Sizes and the pad id are not specialised on, so a new batch shape does not compile a new kernel.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

#: Data modes, equal to flopmeter.tokens.stats' MODE_* (tests/_triton_interpreted_cases.py checks):
#: real tokens are ``x != 0`` (a mask), ``x != pad_id`` (ids; with positions, also pad-id
#: tokens that continue a document, see above), or every token.
MODE_MASK = 0
MODE_IDS = 1
MODE_ALL = 2

#: Tokens per block and loop iteration.
DEFAULT_BLOCK = 1024


@triton.jit
def _max_combine(a, b):
    return tl.maximum(a, b)


@triton.jit
def _is_real(x_ptr, row, offs, inb, stride_r, stride_c, pad_id, MODE: tl.constexpr):
    if MODE == 2:
        real = inb
    else:
        x = tl.load(x_ptr + row * stride_r + offs * stride_c, mask=inb, other=0)
        real = (x != pad_id) & inb  # a mask comes with pad_id 0
    return real


@triton.jit
def _packed_row_stats(
    x_ptr,
    pos_ptr,
    row,
    lanes,
    n_cols,
    stride_r,
    stride_c,
    stride_pr,
    stride_pc,
    pad_id,
    MODE: tl.constexpr,
    BLOCK: tl.constexpr,
):
    """(tokens, sequences, sum of squared lengths) of one packed row: documents start where the
    positions restart."""
    tokens_acc = tl.zeros([BLOCK], dtype=tl.int64)
    sq_acc = tl.zeros([BLOCK], dtype=tl.int64)
    seq_acc = tl.zeros([BLOCK], dtype=tl.int64)
    carry_count = tl.zeros([], dtype=tl.int64)  # real tokens of the row before this block
    carry_base = tl.zeros([], dtype=tl.int64)  # the prefix count where the document began
    carry_np = tl.zeros([], dtype=tl.int64)  # the same two over non-pad tokens (MODE_IDS)
    carry_np_base = tl.zeros([], dtype=tl.int64)
    for start in range(0, n_cols, BLOCK):
        offs = start + lanes
        inb = offs < n_cols
        real = _is_real(x_ptr, row, offs, inb, stride_r, stride_c, pad_id, MODE)
        pos = tl.load(pos_ptr + row * stride_pr + offs * stride_pc, mask=inb, other=0)
        prev = tl.load(
            pos_ptr + row * stride_pr + (offs - 1) * stride_pc, mask=inb & (offs > 0), other=0
        )
        doc_start = inb & ((offs == 0) | (pos.to(tl.int64) != prev.to(tl.int64) + 1))
        if MODE == 1:
            # real from the document's first non-pad token on
            ni = real.to(tl.int64)
            upto = tl.cumsum(ni, 0) + carry_np  # non-pad tokens of the row up to this one
            np_base = tl.associative_scan(tl.where(doc_start, upto - ni, 0), 0, _max_combine)
            np_base = tl.maximum(np_base, carry_np_base)
            real = inb & (upto > np_base)
            carry_np += tl.sum(ni, 0)
            carry_np_base = tl.max(np_base, 0)
        ri = real.to(tl.int64)
        before = tl.cumsum(ri, 0) - ri + carry_count
        base = tl.associative_scan(tl.where(doc_start, before, 0), 0, _max_combine)
        base = tl.maximum(base, carry_base)
        rank = before - base
        sq_acc += tl.where(real, 2 * rank + 1, 0)
        seq_acc += (real & (rank == 0)).to(tl.int64)
        tokens_acc += ri
        carry_count += tl.sum(ri, 0)
        carry_base = tl.max(base, 0)
    return tl.sum(tokens_acc, 0), tl.sum(seq_acc, 0), tl.sum(sq_acc, 0)


@triton.jit
def _plain_row_tokens(
    x_ptr,
    row,
    lanes,
    n_cols,
    stride_r,
    stride_c,
    pad_id,
    MODE: tl.constexpr,
    BLOCK: tl.constexpr,
):
    """Real tokens of one row (one sequence)."""
    tokens_acc = tl.zeros([BLOCK], dtype=tl.int64)
    for start in range(0, n_cols, BLOCK):
        offs = start + lanes
        inb = offs < n_cols
        real = _is_real(x_ptr, row, offs, inb, stride_r, stride_c, pad_id, MODE)
        tokens_acc += real.to(tl.int64)
    return tl.sum(tokens_acc, 0)


@triton.jit(do_not_specialize=["n_cols", "stride_r", "stride_pr", "pad_id", "seen"])
def _row_stats_kernel(
    buf_ptr,
    x_ptr,
    pos_ptr,
    n_cols,
    stride_r,
    stride_c,
    stride_pr,
    stride_pc,
    pad_id,
    seen,
    MODE: tl.constexpr,
    PACKED: tl.constexpr,
    BLOCK: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    lanes = tl.arange(0, BLOCK).to(tl.int64)
    if PACKED:
        tokens, sequences, sum_sq = _packed_row_stats(
            x_ptr,
            pos_ptr,
            row,
            lanes,
            n_cols,
            stride_r,
            stride_c,
            stride_pr,
            stride_pc,
            pad_id,
            MODE,
            BLOCK,
        )
    else:
        if MODE == 2:
            tokens = n_cols.to(tl.int64)
        else:
            tokens = _plain_row_tokens(
                x_ptr, row, lanes, n_cols, stride_r, stride_c, pad_id, MODE, BLOCK
            )
        sequences = (tokens > 0).to(tl.int64)
        sum_sq = tokens * tokens
    tl.atomic_add(buf_ptr + 0, tokens)
    tl.atomic_add(buf_ptr + 2, sequences)
    tl.atomic_add(buf_ptr + 3, sum_sq)
    if row == 0:
        tl.atomic_add(buf_ptr + 1, seen.to(tl.int64))


@triton.jit(do_not_specialize=["n_docs", "n_total", "n_cols", "stride_r", "pad_id", "seen"])
def _doc_stats_kernel(
    buf_ptr,
    x_ptr,
    cu_ptr,
    n_docs,
    n_total,
    n_cols,
    stride_r,
    stride_c,
    pad_id,
    seen,
    MODE: tl.constexpr,
    BLOCK: tl.constexpr,
):
    doc = tl.program_id(0).to(tl.int64)
    if doc == 0:
        tl.atomic_add(buf_ptr + 1, seen.to(tl.int64))
    if doc < n_docs:
        total = n_total.to(tl.int64)
        first = tl.minimum(tl.maximum(tl.load(cu_ptr + doc).to(tl.int64), 0), total)
        end = tl.minimum(tl.maximum(tl.load(cu_ptr + doc + 1).to(tl.int64), first), total)
        lanes = tl.arange(0, BLOCK).to(tl.int64)
        acc = tl.zeros([BLOCK], dtype=tl.int64)
        for start in range(first, end, BLOCK):
            flat = start + lanes
            inb = flat < end
            row = flat // n_cols
            col = flat % n_cols
            if MODE == 2:
                real = inb
            else:
                x = tl.load(x_ptr + row * stride_r + col * stride_c, mask=inb, other=0)
                real = (x != pad_id) & inb  # a mask comes with pad_id 0
            acc += real.to(tl.int64)
        length = tl.sum(acc, 0)
        tl.atomic_add(buf_ptr + 0, length)
        tl.atomic_add(buf_ptr + 2, (length > 0).to(tl.int64))
        tl.atomic_add(buf_ptr + 3, length * length)


def launch(
    buffer: torch.Tensor,
    data: torch.Tensor | None,
    *,
    mode: int,
    pad_id: int,
    rows: int,
    cols: int,
    position_ids: torch.Tensor | None = None,
    cu_seqlens: torch.Tensor | None = None,
    block: int | None = None,
) -> None:
    """Adds one micro-batch's statistics into ``buffer`` with one kernel launch.

    The caller (:func:`flopmeter.tokens.stats.accumulate_token_stats`) has normalised the inputs:
    ``data`` is a ``[rows, cols]`` view (any strides) or ``None`` with ``mode == MODE_ALL``,
    ``position_ids`` a ``[rows, cols]`` view, ``cu_seqlens`` a 1-D integer tensor, and
    ``rows * cols > 0``.

    Args:
        buffer: The int64 statistics buffer, on the batch's device.
        data: The mask or ids, ``[rows, cols]``.
        mode: ``MODE_MASK``, ``MODE_IDS`` or ``MODE_ALL``.
        pad_id: Padding id for ``MODE_IDS`` (ignored otherwise).
        rows: Rows of the batch.
        cols: Tokens per row.
        position_ids: Packed-batch positions, ``[rows, cols]``.
        cu_seqlens: Document offsets into the flattened batch (used when ``position_ids`` is
            ``None``).
        block: Tokens per block (a power of two); default :data:`DEFAULT_BLOCK`.
    """
    block = block or DEFAULT_BLOCK
    pad_id = 0 if mode == MODE_MASK else pad_id  # real tokens are x != pad_id in both modes
    x = data if data is not None else buffer  # never read in MODE_ALL
    stride_r, stride_c = (data.stride(0), data.stride(1)) if data is not None else (0, 0)
    seen = rows * cols
    if position_ids is None and cu_seqlens is not None:
        n_docs = cu_seqlens.shape[0] - 1
        _doc_stats_kernel[(max(n_docs, 1),)](
            buffer, x, cu_seqlens, n_docs, seen, cols, stride_r, stride_c, pad_id, seen,
            MODE=mode, BLOCK=block,
        )  # fmt: skip
        return
    pos = position_ids if position_ids is not None else buffer  # never read unpacked
    stride_pr, stride_pc = (
        (position_ids.stride(0), position_ids.stride(1)) if position_ids is not None else (0, 0)
    )
    _row_stats_kernel[(rows,)](
        buffer, x, pos, cols, stride_r, stride_c, stride_pr, stride_pc, pad_id, seen,
        MODE=mode, PACKED=position_ids is not None, BLOCK=block,
    )  # fmt: skip
