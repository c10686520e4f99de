"""Cases for the Triton token-statistics kernel under Triton's CPU interpreter.

Run by ``tests/test_kernel_triton.py`` in a child pytest process with ``TRITON_INTERPRET=1``
(not collected by the default run: the file name does not start with ``test_``). Triton reads
the variable when its ``@triton.jit`` functions are decorated, its own standard library's
included, so it must be set before ``triton`` is first imported in the process; a child process
guarantees that and keeps the interpreter out of the parent session (where a CUDA test may use
the real kernel). The kernels run with a 16-token block so that rows span several blocks (the
carries between blocks are tested) and the interpreter stays quick.
"""

from __future__ import annotations

import os
import sys

os.environ.setdefault("TRITON_INTERPRET", "1")
if os.environ["TRITON_INTERPRET"] != "1" or "triton" in sys.modules:
    raise RuntimeError(
        "These cases need TRITON_INTERPRET=1 before triton is imported; run them through "
        "tests/test_kernel_triton.py."
    )

import pytest
import torch
from hypothesis import given, settings

from flopmeter.tokens import batch
from flopmeter.tokens import triton_kernel as kernels
from flopmeter.tokens.batch import N_STATS, TokenInputs, new_buffer, prepare_batch
from flopmeter.tokens.stats import accumulate_token_stats
from flopmeter.tokens.torch_ops import stats_torch_ops
from tests.support.packed_batches import packed_batches
from tests.support.token_truth import split_token_kwargs, token_batches, true_stats

kernels.DEFAULT_BLOCK = 16


def _triton(**kwargs) -> list[int]:
    buffer = new_buffer("cpu")
    inputs, rest = split_token_kwargs(kwargs)
    accumulate_token_stats(buffer, inputs, backend="triton", **rest)
    return buffer.tolist()[:N_STATS]


def _torch(**kwargs) -> list[int]:
    buffer = new_buffer("cpu")
    inputs, rest = split_token_kwargs(kwargs)
    accumulate_token_stats(buffer, inputs, backend="torch", **rest)
    return buffer.tolist()[:N_STATS]


def test_kernels_are_interpreted_and_share_the_modes():
    assert type(kernels._row_stats_kernel).__name__ == "InterpretedFunction"
    assert type(kernels._doc_stats_kernel).__name__ == "InterpretedFunction"
    assert (kernels.MODE_MASK, kernels.MODE_IDS, kernels.MODE_ALL) == (
        batch.MODE_MASK,
        batch.MODE_IDS,
        batch.MODE_ALL,
    )


def test_hand_checked_batches():
    ids = torch.tensor([[5, 6, 7, 0, 0], [8, 0, 0, 0, 0]])
    assert _triton(input_ids=ids, pad_id=0) == [4, 10, 2, 10]  # 3^2 + 1^2
    assert _triton(input_ids=ids) == [10, 10, 2, 50]  # every token: 5^2 + 5^2
    mask = torch.tensor([[1, 1, 1, 1, 0], [1, 1, 0, 0, 0]], dtype=torch.bool)
    assert _triton(input_ids=ids, attention_mask=mask, pad_id=0) == [6, 10, 2, 20]
    packed = torch.tensor([[5, 6, 7, 8, 9, 1, 2]])
    pos = torch.tensor([[0, 1, 2, 0, 1, 0, 1]])
    assert _triton(input_ids=packed, position_ids=pos) == [7, 7, 3, 17]  # 9 + 4 + 4
    cu = torch.tensor([0, 3, 5, 7], dtype=torch.int32)
    assert _triton(input_ids=packed, cu_seqlens=cu) == [7, 7, 3, 17]
    eos = torch.tensor([[5, 9, 2, 7, 4, 8, 2]])  # pad id 2 is the EOS closing each document
    pos = torch.tensor([[0, 1, 2, 0, 1, 2, 3]])
    assert _triton(input_ids=eos, pad_id=2, position_ids=pos) == [7, 7, 2, 25]  # 9 + 16
    padded = torch.tensor([[0, 0, 7, 8, 9], [5, 6, 0, 0, 0]])
    pos = torch.tensor([[1, 1, 0, 1, 2], [0, 1, 1, 1, 1]])  # Hugging Face's pad positions
    assert _triton(input_ids=padded, pad_id=0, position_ids=pos) == [5, 10, 2, 13]
    cu = torch.tensor([0, 3, 7])
    assert _triton(input_ids=eos, pad_id=2, cu_seqlens=cu) == [7, 7, 2, 25]


def test_long_packed_row_spans_many_blocks():
    # documents of 40, 1, 23 and 36 tokens over 100 positions: 16-token blocks cut them all
    lengths = [40, 1, 23, 36]
    pos = torch.cat([torch.arange(n) for n in lengths]).unsqueeze(0)
    ids = torch.ones_like(pos)
    ids[0, 10] = 0  # a pad id inside the first document continues it: real
    ids[0, 41:50] = 0  # the third document (from 41) opens with 9 pad ids, across a block
    ids[0, 78:83] = 0  # pad ids inside the fourth document, across a block: real
    expected = [91, 100, 4, 40**2 + 1 + 14**2 + 36**2]
    assert _triton(input_ids=ids, pad_id=0, position_ids=pos) == expected
    assert _torch(input_ids=ids, pad_id=0, position_ids=pos) == expected


def test_long_cu_seqlens_documents_span_many_blocks():
    ids = torch.ones(2, 60, dtype=torch.int32)
    ids[1, 5:] = 0
    cu = torch.tensor([0, 50, 67, 120])  # documents cross the row boundary at 60
    # masked: [0, 50) = 50, [50, 67) = 10 + 5 = 15, [67, 120) = 0 -> 2500 + 225
    assert _triton(input_ids=ids, attention_mask=ids, cu_seqlens=cu) == [65, 120, 2, 2725]
    # ids only: every token of a document is real, whatever its id -> 2500 + 289 + 2809
    assert _triton(input_ids=ids, pad_id=0, cu_seqlens=cu) == [120, 120, 3, 5598]


def test_accumulates_into_an_existing_buffer():
    buffer = torch.tensor([1, 2, 3, 4])
    accumulate_token_stats(
        buffer, TokenInputs(input_ids=torch.tensor([[5, 0]])), pad_id=0, backend="triton"
    )
    assert buffer.tolist() == [2, 4, 4, 5]


@settings(max_examples=150, deadline=None)
@given(case=token_batches(max_rows=4, max_cols=40))
def test_triton_matches_torch_reference_and_independent_count(case):
    got = _triton(**case.kwargs)
    assert got == _torch(**case.kwargs), case.note
    assert tuple(got) == true_stats(**case.kwargs), case.note


def _torch_ops(**kwargs) -> list[int]:
    """The torch operations alone (what CUDA tensors fall back to without the kernel)."""
    inputs, rest = split_token_kwargs(kwargs)
    b = prepare_batch(inputs, rest.get("pad_id"))
    assert b is not None
    return stats_torch_ops(b).tolist()


@settings(max_examples=150, deadline=None)
@given(case=packed_batches(max_rows=4, max_cols=40))
def test_triton_packed_path_matches_torch_on_packed_batches(case):
    got = _triton(**case.kwargs)
    assert got == _torch(**case.kwargs), case.note
    assert got == _torch_ops(**case.kwargs), case.note
    assert tuple(got) == true_stats(**case.kwargs), case.note


@pytest.mark.parametrize("block", [16, 64])
def test_block_size_does_not_change_results(block):
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, 3, (3, 150), generator=g)
    pos = torch.randint(0, 3, (3, 150), generator=g)
    b = prepare_batch(TokenInputs(input_ids=ids, position_ids=pos), pad_id=0)
    assert b is not None
    buffer = new_buffer("cpu")
    kernels.launch(
        buffer,
        b.data,
        mode=b.mode,
        pad_id=b.pad_id,
        rows=b.rows,
        cols=b.cols,
        position_ids=b.position_ids,
        block=block,
    )
    assert tuple(buffer.tolist()[:4]) == true_stats(input_ids=ids, pad_id=0, position_ids=pos)
