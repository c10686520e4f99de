"""Item 3 of the overhead benchmark: token statistics of one batch, from 8 x 512 to 64 x 8192,
counted by flopmeter's function and by the expressions it replaces.

On a CPU flopmeter's function counts with numpy on views of the tensors (per document for
packed batches: ``flopmeter.tokens.cpu``); the Triton kernel needs CUDA
(``benchmarks/gpu_overhead.py`` times it on a GPU). Run with ``make bench``.
"""

from __future__ import annotations

import pytest
import torch

from _workloads import PAD_ID, configure_threads, machine
from flopmeter.tokens.batch import TokenInputs, new_buffer
from flopmeter.tokens.stats import accumulate_token_stats

SHAPES = [(8, 512), (16, 2048), (32, 4096), (64, 8192)]


def make_ids(rows: int, cols: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(0)
    lengths = torch.randint(cols // 4, cols + 1, (rows,), generator=g)
    ids = torch.randint(1, 32000, (rows, cols), generator=g)
    return ids.masked_fill(torch.arange(cols) >= lengths[:, None], PAD_ID)


def packed_positions(rows: int, cols: int) -> torch.Tensor:
    """Documents of 1 to 1024 tokens packed into every row."""
    g = torch.Generator().manual_seed(1)
    pos = torch.empty(rows, cols, dtype=torch.int64)
    for r in range(rows):
        t = 0
        while t < cols:
            n = int(torch.randint(1, 1025, (1,), generator=g))
            n = min(n, cols - t)
            pos[r, t : t + n] = torch.arange(n)
            t += n
    return pos


def document_offsets(pos: torch.Tensor) -> torch.Tensor:
    """The packed documents of ``pos`` as ``cu_seqlens`` (offsets into the flattened batch)."""
    rows, cols = pos.shape
    starts = torch.ones(rows, cols, dtype=torch.bool)
    starts[:, 1:] = pos[:, 1:] != pos[:, :-1] + 1
    total = torch.tensor([rows * cols])
    return torch.cat((starts.reshape(-1).nonzero()[:, 0], total)).to(torch.int32)


def flopmeter_stats(buffer, ids, pos):
    accumulate_token_stats(buffer, TokenInputs(input_ids=ids), pad_id=PAD_ID)


def flopmeter_packed(buffer, ids, pos):
    accumulate_token_stats(buffer, TokenInputs(input_ids=ids, position_ids=pos), pad_id=PAD_ID)


def flopmeter_cu_seqlens(buffer, ids, cu):
    accumulate_token_stats(buffer, TokenInputs(input_ids=ids, cu_seqlens=cu), pad_id=PAD_ID)


def naive_torch(buffer, ids, pos):
    """The four statistics as separate eager expressions (device-side, no host read)."""
    real = ids != PAD_ID
    lengths = real.sum(-1)
    buffer[0] += real.sum()
    buffer[1] += real.numel()
    buffer[2] += (lengths > 0).sum()
    buffer[3] += (lengths * lengths).sum()


def aws_style(buffer, ids, pos):
    """The AWS callback's count: a host copy of the ids and ``.item()`` (tokens only)."""
    buffer[0] += (ids.cpu() != PAD_ID).sum().item()


IMPLEMENTATIONS = {
    "flopmeter": flopmeter_stats,
    "flopmeter_packed": flopmeter_packed,
    "flopmeter_cu_seqlens": flopmeter_cu_seqlens,
    "naive_torch": naive_torch,
    "aws_style": aws_style,
}


@pytest.fixture(scope="module", autouse=True)
def _threads():
    configure_threads()


@pytest.mark.parametrize("shape", SHAPES, ids=[f"{r}x{c}" for r, c in SHAPES])
@pytest.mark.parametrize("impl", list(IMPLEMENTATIONS))
def test_token_stats_throughput(benchmark, impl, shape):
    rows, cols = shape
    ids = make_ids(rows, cols)
    pos = None
    if impl in ("flopmeter_packed", "flopmeter_cu_seqlens"):
        # Packed rows carry no padding: every slot belongs to a document.
        ids = ids.masked_fill(ids == PAD_ID, 1)
        pos = packed_positions(rows, cols)
        if impl == "flopmeter_cu_seqlens":  # the same documents, as flash-attention offsets
            pos = document_offsets(pos)
    buffer = new_buffer("cpu")
    fn = IMPLEMENTATIONS[impl]
    fn(buffer, ids, pos)  # the result is right before it is timed
    expected_tokens = int((ids != PAD_ID).sum())
    assert int(buffer[0]) == expected_tokens
    benchmark.group = f"token statistics {rows}x{cols}"
    benchmark.extra_info.update(
        {
            "kind": "token_stats",
            "impl": impl,
            "rows": rows,
            "cols": cols,
            "tokens": rows * cols,
            "device": "cpu",
            "machine": machine(),
        }
    )
    benchmark(fn, buffer, ids, pos)
