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

Three implementations give the same results: a fused Triton kernel (one launch, each token read
once; :mod:`flopmeter.tokens.triton_kernel`), used for CUDA tensors when Triton is
installed; for CPU tensors, numpy on views of their memory, per document where the batch is
packed (:mod:`flopmeter.tokens.cpu`); and the torch operations of
:func:`~flopmeter.tokens.torch_ops.stats_torch_ops`, used everywhere else (no host sync). All
three are reached through :func:`accumulate_token_stats` (and :func:`token_stats_torch`, the
two without the kernel).
"""

from __future__ import annotations

import logging
from typing import Any, Literal

import numpy as np
import torch

from flopmeter.errors import MissingExtraError
from flopmeter.tokens.batch import (
    N_STATS,
    PreparedBatch,
    TokenInputs,
    monotone_offsets,
    prepare_batch,
)
from flopmeter.tokens.cpu import counts_cpu, cpu_view
from flopmeter.tokens.torch_ops import stats_torch_ops

logger = logging.getLogger("flopmeter")

__all__ = [
    "Backend",
    "accumulate_token_stats",
    "counts_without_kernel",
    "token_stats_torch",
]

Backend = Literal["auto", "torch", "triton"]
_BACKENDS = ("auto", "torch", "triton")

#: ``None``: not probed yet; ``False``: unavailable (not installed, or failed once); else the
#: kernel module.
_triton_kernels: Any = None


def _load_triton() -> Any:
    """The Triton kernel module, imported once; ``False`` when Triton is not installed."""
    global _triton_kernels
    if _triton_kernels is None:
        try:
            from flopmeter.tokens import triton_kernel as triton_token_stats
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


def _counts(b: PreparedBatch) -> np.ndarray | torch.Tensor:
    """One prepared micro-batch's counts without the Triton kernel: CPU tensors with numpy
    (:func:`flopmeter.tokens.cpu.counts_cpu`, per document; an int64 array), any other device
    (or a CPU batch numpy cannot view) with torch operations
    (:func:`flopmeter.tokens.torch_ops.stats_torch_ops`; a tensor on the batch's device); both
    give the same counts. The one place the backend is chosen besides the kernel's."""
    if b.device.type == "cpu" and b.rows * b.cols:
        counted = counts_cpu(b)
        if counted is not None:
            return counted
    return stats_torch_ops(b)


def counts_without_kernel(b: PreparedBatch) -> torch.Tensor:
    """One prepared micro-batch's counts without the Triton kernel (:func:`_counts`), a new
    int64 ``[N_STATS]`` tensor on its device."""
    counted = _counts(b)
    return torch.from_numpy(counted) if isinstance(counted, np.ndarray) else counted


def _add_without_kernel(buffer: torch.Tensor, b: PreparedBatch) -> None:
    """Adds :func:`_counts` into ``buffer`` (on the batch's device); numpy counts of a CPU
    batch straight into the buffer's memory (no tensor made for them)."""
    counted = _counts(b)
    if isinstance(counted, np.ndarray):
        view = cpu_view(buffer)
        if view is not None:
            np.add(view, counted, out=view)
            return
        counted = torch.from_numpy(counted)
    buffer.add_(counted)


def token_stats_torch(inputs: TokenInputs, pad_id: int | None = None) -> torch.Tensor | None:
    """The torch reference: one micro-batch's counts as a new int64 ``[N_STATS]`` tensor.

    Arguments as :func:`accumulate_token_stats`. The result is on the batch's device and is not
    read on the host.

    Returns:
        The statistics in ``SLOT_*`` order, or ``None`` when there is nothing to count.
    """
    batch = prepare_batch(inputs, pad_id)
    return None if batch is None else counts_without_kernel(batch)


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
        bad = _offsets_inconsistent(batch)
        if not isinstance(bad, int) or bad:
            inconsistent.add_(bad)
    if backend == "torch" or (backend == "auto" and not _triton_device(batch.device)):
        _add_without_kernel(buffer, batch)
        return shape
    kernels = _load_triton()
    if kernels is False:
        if backend == "triton":
            raise MissingExtraError("triton", "triton", "The fused token-statistics kernel")
        _add_without_kernel(buffer, batch)
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
        _add_without_kernel(buffer, batch)
    return shape


def _offsets_inconsistent(b: PreparedBatch) -> torch.Tensor | int:
    """1 (int64, on the device, not read) when the document offsets decrease, start below 0 or
    run past the batch's tokens, else 0 (a host integer for CPU offsets numpy can view)."""
    cu = b.cu_seqlens
    assert cu is not None
    if cu.device.type == "cpu":
        offsets = cpu_view(cu)
        if offsets is not None:
            if offsets.size == 0:
                return 1
            tokens = b.rows * b.cols
            bad = (
                offsets[0] < 0
                or offsets[-1] > tokens
                or np.count_nonzero(offsets[1:] < offsets[:-1])
            )
            return int(bad)
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
        cu_seqlens=None if b.cu_seqlens is None else monotone_offsets(b.cu_seqlens),
    )
