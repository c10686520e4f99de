"""Token statistics of a micro-batch, accumulated into a device buffer without a host sync.

The buffer is a 1-D int64 tensor of :data:`N_STATS` slots on the batch's device (see the
``SLOT_*`` indices). :func:`accumulate_token_stats` adds one micro-batch into it with device
work only: no ``.item()``, ``.cpu()``, ``.tolist()``, host copy or branching on tensor values.
The totals are read once, when a report is made.

What is counted, for a batch normalised to ``[R, T]`` (a 1-D batch is one row; more dimensions
fold into rows):

* documents: a row is one sequence, unless the batch is packed. A packed batch marks its
  documents by ``position_ids`` (a document starts at a row's first token and wherever
  ``position_ids[t] != position_ids[t - 1] + 1``, i.e. where positions restart, whatever their
  first value) or, without ``position_ids``, by ``cu_seqlens`` (document ``i`` is
  ``[cu_seqlens[i], cu_seqlens[i + 1])`` of the row-major flattened batch, offsets clamped to
  it);
* real tokens, in this order of precedence:

  - with a 1-D or 2-D ``attention_mask``: ``attention_mask != 0`` (and, with ``cu_seqlens``,
    inside a document);
  - with ``cu_seqlens`` (and no ``position_ids``): every token inside a document, whatever its
    id (the documents are explicit, so a closing EOS that is also the pad id is real); tokens
    outside every document are not real;
  - with ``position_ids`` and ``pad_id``: a token is real when its id is not ``pad_id``, or when
    it *continues a document whose earlier token is real*: it is not a document start (above)
    and the token before it in the row is real. Equivalently, a document's tokens are real from
    its first token that is not ``pad_id`` on; its leading ``pad_id`` tokens are padding. So a
    packed document's closing EOS is counted where the pad id is the EOS id, while padding
    stays padding: pad positions that repeat (Hugging Face fills them with 1), are 0, or do not
    go on from the previous token start a new "document" that holds no real token. Cases the
    ids and positions cannot tell apart: a document whose first token (at its starting
    position) is ``pad_id`` counts that token as padding; a padded row whose single real token
    at position 0 is followed by a pad at position 1 (Hugging Face's positions for
    ``[x, pad, ...]`` with ``attention_mask`` ``[1, 0, ...]``) counts that first pad as real,
    exactly as it would the closing EOS of a packed two-token document; and right padding
    whose positions go on from the last real token (``arange(T)`` over a padded row) counts as
    real. Pass the ``attention_mask`` where those matter;
  - with ``pad_id`` only: ``input_ids != pad_id``;
  - otherwise (no mask, no ``pad_id``, or floating "ids" standing in for ``inputs_embeds``):
    every token;
* :data:`SLOT_TOKENS`: real tokens; :data:`SLOT_TOKENS_SEEN`: all ``R * T`` tokens;
* a sequence (row or document) has the length of its real tokens; :data:`SLOT_SEQUENCES`
  counts sequences with at least one real token, and :data:`SLOT_SUM_SQ_LEN` sums their
  squared lengths.

Two implementations give the same results: a fused Triton kernel (one launch, each token read
once; :mod:`flopmeter.kernels.triton_token_stats`), used for CUDA tensors when Triton is
installed, and the torch reference :func:`token_stats_torch`, used everywhere else.
"""

from __future__ import annotations

import logging
import math
from typing import Any, Literal, NamedTuple

import torch

from flopmeter.errors import MissingExtraError

logger = logging.getLogger("flopmeter")

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
#: The same: what :func:`token_stats_torch` returns and the kernel adds.
N_COUNTS = N_STATS

#: The data modes, shared with the Triton kernel.
MODE_MASK = 0
MODE_IDS = 1
MODE_ALL = 2

Backend = Literal["auto", "torch", "triton"]
_BACKENDS = ("auto", "torch", "triton")

#: ``None``: not probed yet; ``False``: unavailable (not installed, or failed once); else the
#: kernel module.
_triton_kernels: Any = None


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
        pos = pos.expand(rows, cols)
        if pos.device != source.device:  # a copy queued on the device, not a host sync
            pos = pos.to(source.device, non_blocking=True)
    cu = None
    if cu_seqlens is not None and pos is None:
        if cu_seqlens.dim() != 1 or cu_seqlens.is_floating_point() or cu_seqlens.is_complex():
            raise TokenInputError(
                "unread",
                f"cu_seqlens must be a 1-D integer tensor of offsets, got shape "
                f"{tuple(cu_seqlens.shape)} and dtype {cu_seqlens.dtype}",
            )
        cu = cu_seqlens
        if cu.device != source.device:
            cu = cu.to(source.device, non_blocking=True)
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
        device=source.device,
    )


def token_stats_torch(inputs: TokenInputs, pad_id: int | None = None) -> torch.Tensor | None:
    """The torch reference: one micro-batch's counts as a new int64 ``[N_COUNTS]`` tensor.

    Arguments as :func:`accumulate_token_stats`. The result is on the batch's device and is not
    read on the host.

    Returns:
        The statistics in ``SLOT_*`` order, or ``None`` when there is nothing to count.
    """
    batch = prepare_batch(inputs, pad_id)
    return None if batch is None else _stats_torch(batch)


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


def _host_vector(values: tuple[int, int, int, int], device: torch.device) -> torch.Tensor:
    """A statistics vector known on the host, on ``device`` without a host-to-device copy."""
    if device.type == "cpu":
        return torch.tensor(values, dtype=torch.int64)
    # torch.tensor(values, device=...) would be a blocking copy that waits for the stream;
    # fills take their value as a kernel argument.
    return torch.stack([torch.full((), v, dtype=torch.int64, device=device) for v in values])


def _stats_torch(b: PreparedBatch) -> torch.Tensor:
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
        flat = real.reshape(-1) if real is not None else None
        prefix = torch.zeros(seen + 1, dtype=torch.int64, device=b.device)
        if flat is None:
            prefix[1:] = torch.arange(1, seen + 1, device=b.device)
        else:
            prefix[1:] = flat.cumsum(0)
        cu = b.cu_seqlens.to(torch.int64).clamp(0, seen)
        starts = cu[:-1]
        ends = torch.maximum(cu[1:], starts)
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


def _load_triton() -> Any:
    """The Triton kernel module, imported once; ``False`` when Triton is not installed."""
    global _triton_kernels
    if _triton_kernels is None:
        try:
            from flopmeter.kernels import triton_token_stats
        except ImportError as exc:
            logger.info("flopmeter: Triton unavailable (%s); token statistics use torch", exc)
            _triton_kernels = False
        except Exception:  # an installed but broken Triton must not stop the counting
            logger.warning(
                "flopmeter: Triton failed to import; token statistics use torch", exc_info=True
            )
            _triton_kernels = False
        else:
            _triton_kernels = triton_token_stats
    return _triton_kernels


def accumulate_token_stats(
    buffer: torch.Tensor,
    inputs: TokenInputs,
    *,
    pad_id: int | None = None,
    backend: Backend = "auto",
    inconsistent: torch.Tensor | None = None,
) -> tuple[int, int] | None:
    """Adds one micro-batch's token statistics into ``buffer`` (in place, no host sync).

    See the module docstring for what is counted. Only shapes and dtypes are inspected on the
    host; every value is read on the device.

    Args:
        buffer: A buffer from :func:`new_buffer`, on the same device as the inputs.
        inputs: The micro-batch's ids, mask and packing tensors (ids int32 or int64).
        pad_id: The padding token id, used only without a usable mask (and not with
            ``cu_seqlens``, whose documents are real whatever their ids). With
            ``position_ids``, a ``pad_id`` token that continues a document with a real token
            before it is real (see the module docstring).
        inconsistent: A 0-d int64 tensor on the batch's device, to which 1 is added when the
            batch's document offsets (``cu_seqlens``) decrease, start below 0 or run past the
            batch (device work only; read with the counts at report time).
        backend: ``"auto"``: the Triton kernel for CUDA tensors when Triton is installed,
            else torch; ``"torch"``; or ``"triton"`` (CUDA tensors, or CPU tensors under
            ``TRITON_INTERPRET=1``).

    Returns:
        ``(rows, cols)``: the batch's shape as counted (host integers from the shapes; leading
        dimensions fold into rows, ``[T]`` is one row), or ``None`` when there was nothing to
        count (no ids and no ``[T]`` or ``[B, T]`` mask).

    Raises:
        ValueError: The buffer, ``position_ids`` or ``cu_seqlens`` do not fit, or an unknown
            backend.
        MissingExtraError: ``backend="triton"`` without Triton installed.
    """
    if (
        buffer.dtype != torch.int64
        or buffer.dim() != 1
        or buffer.shape[0] != N_STATS
        or not buffer.is_contiguous()
    ):
        raise ValueError(
            f"buffer must be a contiguous int64 tensor of {N_STATS} slots (see new_buffer), got "
            f"{buffer.dtype} of shape {tuple(buffer.shape)}"
        )
    if backend not in _BACKENDS:
        raise ValueError(f"backend must be one of {_BACKENDS}, got {backend!r}")
    batch = prepare_batch(inputs, pad_id)
    if batch is None:
        return None
    shape = batch.rows, batch.cols
    if batch.rows * batch.cols == 0:
        return shape
    if batch.device != buffer.device:
        raise ValueError(f"buffer is on {buffer.device}, the batch on {batch.device}")
    if batch.cu_seqlens is not None and inconsistent is not None:
        inconsistent.add_(_offsets_inconsistent(batch))
    if backend == "torch" or (backend == "auto" and not _triton_device(batch.device)):
        buffer.add_(_stats_torch(batch))
        return shape
    kernels = _load_triton()
    if kernels is False:
        if backend == "triton":
            raise MissingExtraError("triton", "triton", "The fused token-statistics kernel")
        buffer.add_(_stats_torch(batch))
        return shape
    if backend == "triton":
        _launch(kernels, buffer, batch)
        return shape
    try:
        _launch(kernels, buffer, batch)
    except Exception:
        global _triton_kernels
        _triton_kernels = False
        logger.warning(
            "flopmeter: the Triton token-statistics kernel failed; counting with torch from now on",
            exc_info=True,
        )
        buffer.add_(_stats_torch(batch))
    return shape


def _offsets_inconsistent(b: PreparedBatch) -> torch.Tensor:
    """1 (int64, on the device, not read) when the document offsets decrease, start below 0 or
    run past the batch's tokens, else 0."""
    cu = b.cu_seqlens
    assert cu is not None
    if cu.numel() == 0:
        return torch.ones((), dtype=torch.int64, device=cu.device)
    bad = (cu[1:] < cu[:-1]).any() | (cu[0] < 0) | (cu[-1] > b.rows * b.cols)
    return bad.to(torch.int64)


def _triton_device(device: torch.device) -> bool:
    """Whether ``backend="auto"`` tries the Triton kernel for a batch on ``device``."""
    return device.type == "cuda"


def _launch(kernels: Any, buffer: torch.Tensor, b: PreparedBatch) -> None:
    kernels.launch(
        buffer,
        b.data,
        mode=b.mode,
        pad_id=b.pad_id,
        rows=b.rows,
        cols=b.cols,
        position_ids=b.position_ids,
        cu_seqlens=b.cu_seqlens,
    )
