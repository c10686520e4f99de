"""The two CPU-reachable implementations of the token statistics, on packed batches, against an
independent count: the numpy path CPU tensors take (``tokens_cpu``, per document) and the torch
operations CUDA tensors fall back to (``stats_torch_ops``), which must also read nothing on
the host."""

from __future__ import annotations

import itertools

import pytest
import torch
from hypothesis import given, settings

from flopmeter.tokens.batch import N_STATS, new_buffer, prepare_batch
from flopmeter.tokens.cpu import counts_cpu
from flopmeter.tokens.stats import accumulate_token_stats
from flopmeter.tokens.torch_ops import stats_torch_ops
from tests.support.host_syncs import record_host_syncs
from tests.support.packed_batches import packed_batches
from tests.support.token_truth import split_token_kwargs, token_batches, true_stats


def _accumulated(kwargs: dict) -> tuple[int, ...]:
    buffer = new_buffer("cpu")
    inputs, rest = split_token_kwargs(kwargs)
    accumulate_token_stats(buffer, inputs, backend="torch", **rest)
    return tuple(buffer.tolist()[:N_STATS])


def _prepared(kwargs: dict):
    inputs, rest = split_token_kwargs(kwargs)
    return prepare_batch(inputs, rest.get("pad_id"))


def _ops(kwargs: dict) -> tuple[int, ...] | None:
    b = _prepared(kwargs)
    return None if b is None else tuple(stats_torch_ops(b).tolist())


@settings(max_examples=400, deadline=None)
@given(case=packed_batches(max_rows=5, max_cols=48))
def test_cpu_path_matches_independent_count_on_packed_batches(case):
    b = _prepared(case.kwargs)
    assert b is not None
    assert counts_cpu(b) is not None, case.note  # the numpy path did count it
    assert _accumulated(case.kwargs) == true_stats(**case.kwargs), case.note


@settings(max_examples=60, deadline=None)
@given(case=packed_batches(max_rows=4, max_cols=400))
def test_cpu_path_on_long_rows_matches_independent_count(case):
    # long rows hold few documents per token: the segmented sums' one-pass branch
    assert _accumulated(case.kwargs) == true_stats(**case.kwargs), case.note


@settings(max_examples=300, deadline=None)
@given(case=packed_batches(max_rows=5, max_cols=48))
def test_torch_operations_match_independent_count_on_packed_batches(case):
    assert _ops(case.kwargs) == true_stats(**case.kwargs), case.note


@settings(max_examples=200, deadline=None)
@given(case=token_batches(max_rows=5, max_cols=48))
def test_torch_operations_match_independent_count(case):
    b = _prepared(case.kwargs)
    if b is None or b.rows * b.cols == 0:
        return
    assert _ops(case.kwargs) == true_stats(**case.kwargs), case.note


def test_long_packed_rows_agree_between_the_paths():
    g = torch.Generator().manual_seed(0)
    rows, cols = 6, 5000
    ids = torch.randint(0, 3, (rows, cols), generator=g)
    # documents of a random length per row (1 to 1999 tokens); pad id 0 opens many of them
    pos = torch.arange(cols).remainder(torch.randint(1, 2000, (rows, 1), generator=g))
    mask = torch.rand((rows, cols), generator=g) < 0.6
    cu = torch.tensor([0, 7, 2000, 2000, 1500, rows * cols // 2, rows * cols + 9])
    cases = [
        {"input_ids": ids, "pad_id": 0, "position_ids": pos},
        {"input_ids": ids, "attention_mask": mask, "position_ids": pos},
        {"input_ids": ids, "position_ids": pos[:1]},
        {"input_ids": ids.t().contiguous().t(), "pad_id": 0, "position_ids": pos},
        {"input_ids": ids, "pad_id": 0, "cu_seqlens": cu},
        {"input_ids": ids, "attention_mask": mask, "cu_seqlens": cu},
        {"input_ids": ids, "pad_id": 0},
    ]
    for kwargs in cases:
        assert _accumulated(kwargs) == _ops(kwargs)
    small = {"input_ids": ids[:, :900], "pad_id": 0, "position_ids": pos[:, :900]}
    assert _accumulated(small) == true_stats(**small)


def test_hand_checked_documents_opening_with_pads():
    # documents [0 0 5 6] [7 0] [0 0] [0 8]: real from the first non-pad on -> 2, 2, 0, 1
    ids = torch.tensor([[0, 0, 5, 6, 7, 0, 0, 0, 0, 8]])
    pos = torch.tensor([[0, 1, 2, 3, 0, 1, 0, 1, 0, 1]])
    assert _accumulated({"input_ids": ids, "pad_id": 0, "position_ids": pos}) == (5, 10, 3, 9)


@pytest.mark.parametrize(
    "kwargs",
    [
        # bfloat16 has no numpy dtype: the torch operations count it
        {
            "input_ids": torch.tensor([[5, 6, 0, 7]]),
            "attention_mask": torch.tensor([[1, 1, 0, 1]], dtype=torch.bfloat16),
            "position_ids": torch.tensor([[0, 1, 0, 1]]),
        },
        # a pad id the ids' dtype cannot hold: torch's comparison decides (it casts the pad id
        # to the dtype, 2**40 to 0 here: not a truth, the same count as the CUDA path's)
        {
            "input_ids": torch.tensor([[5, 6, 0, 7]], dtype=torch.int32),
            "pad_id": 2**40,
            "position_ids": torch.tensor([[0, 1, 0, 1]]),
        },
    ],
)
def test_what_numpy_cannot_view_is_counted_by_torch(kwargs):
    b = _prepared(kwargs)
    assert b is not None and counts_cpu(b) is None
    assert _accumulated(kwargs) == _ops(kwargs)
    if kwargs.get("pad_id") is None:
        assert _accumulated(kwargs) == true_stats(**kwargs) == (3, 4, 2, 5)


def test_a_mask_that_requires_grad_is_viewed_without_its_graph():
    ids = torch.tensor([[5, 6, 0, 7]])
    mask = torch.tensor([[1.0, 1.0, 0.0, 1.0]], requires_grad=True)
    kwargs = {
        "input_ids": ids,
        "attention_mask": mask,
        "position_ids": torch.tensor([[0, 1, 2, 0]]),
    }
    assert _accumulated(kwargs) == (3, 4, 2, 5)


def test_torch_operations_read_nothing_on_the_host():
    """On CUDA a host read is a sync: the torch operations, the CUDA fallback, make none (the
    CPU's numpy path is not this path; tests/test_no_host_sync.py runs the meter's hooks)."""
    ids = torch.tensor([[5, 0, 7, 8, 0, 0], [1, 2, 3, 0, 5, 6]])
    mask = ids != 0
    pos = torch.tensor([[0, 1, 2, 0, 1, 1], [0, 1, 0, 1, 2, 3]])
    cu = torch.tensor([0, 4, 4, 2, 13])
    batches = [
        prepare_batch(inputs, pad)
        for inputs, pad in [
            (split_token_kwargs({"input_ids": ids, "position_ids": pos})[0], 0),
            (
                split_token_kwargs({"input_ids": ids, "attention_mask": mask, "position_ids": pos})[
                    0
                ],
                None,
            ),
            (split_token_kwargs({"input_ids": ids, "position_ids": pos})[0], None),
            (split_token_kwargs({"input_ids": ids, "cu_seqlens": cu})[0], 0),
            (
                split_token_kwargs({"input_ids": ids, "attention_mask": mask, "cu_seqlens": cu})[0],
                None,
            ),
            (split_token_kwargs({"input_ids": ids})[0], 0),
        ]
    ]
    calls: list[str] = []
    with record_host_syncs(calls):
        results = [stats_torch_ops(b) for b in batches if b is not None]
    assert calls == []
    assert len(results) == 6


@settings(max_examples=200, deadline=None)
@given(case=packed_batches(max_rows=4, max_cols=30))
def test_inconsistent_offsets_are_flagged_on_the_cpu(case):
    cu = case.kwargs.get("cu_seqlens")
    if cu is None:
        return
    offsets = cu.tolist()
    total = case.kwargs["input_ids"].numel()
    expected = int(
        not offsets
        or offsets[0] < 0
        or offsets[-1] > total
        or any(b < a for a, b in itertools.pairwise(offsets))
    )
    flag = torch.zeros((), dtype=torch.int64)
    inputs, rest = split_token_kwargs(case.kwargs)
    accumulate_token_stats(new_buffer("cpu"), inputs, inconsistent=flag, **rest)
    accumulate_token_stats(new_buffer("cpu"), inputs, inconsistent=flag, **rest)
    assert flag.item() == 2 * expected, offsets
