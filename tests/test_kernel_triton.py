"""The Triton token-statistics kernel, run on the CPU by Triton's interpreter, against the torch
reference and an independent count (cases in ``tests/_triton_interpreted_cases.py``).

The cases run in a child pytest process with ``TRITON_INTERPRET=1``: Triton reads the variable
when it is first imported, so it cannot be switched on inside a session that may already have
imported Triton (torch.compile does), and the parent session's Triton stays the real one.
Skipped only where Triton is not installed.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from hypothesis import given, settings

from flopmeter.tokens.batch import N_STATS, new_buffer
from flopmeter.tokens.stats import accumulate_token_stats
from tests.support.token_truth import split_token_kwargs, token_batches, true_stats

pytest.importorskip("triton", reason="the triton package is not installed")

CASES = Path(__file__).with_name("_triton_interpreted_cases.py")


@pytest.mark.slow
def test_triton_kernel_under_the_interpreter_matches_the_reference(tmp_path):
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            str(CASES),
            "-q",
            "-p",
            "no:cacheprovider",
            f"--basetemp={tmp_path / 'child'}",
        ],
        cwd=CASES.parent.parent,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    tail = (result.stdout + result.stderr)[-6000:]
    assert result.returncode == 0, tail
    assert " passed" in result.stdout and "skipped" not in result.stdout, tail


# ----------------------------------------------------------------------------- CUDA
cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


def _on(device: str, kwargs: dict) -> dict:
    return {k: v.to(device) if isinstance(v, torch.Tensor) else v for k, v in kwargs.items()}


def _stats(kwargs: dict, backend: str) -> list[int]:
    buffer = new_buffer("cuda")
    inputs, rest = split_token_kwargs(_on("cuda", kwargs))
    accumulate_token_stats(buffer, inputs, backend=backend, **rest)
    return buffer.tolist()[:N_STATS]


@pytest.mark.gpu
@cuda
@settings(max_examples=150, deadline=None)
@given(case=token_batches(max_rows=5, max_cols=60))
def test_cuda_triton_kernel_matches_independent_count(case):
    got = _stats(case.kwargs, "triton")
    assert tuple(got) == true_stats(**case.kwargs), case.note
    assert got == _stats(case.kwargs, "torch"), case.note


@pytest.mark.gpu
@cuda
@pytest.mark.parametrize("rows,cols", [(3, 5000), (64, 8192), (1, 70000)])
def test_cuda_triton_kernel_on_long_rows(rows, cols):
    g = torch.Generator().manual_seed(rows)
    ids = torch.randint(0, 4, (rows, cols), generator=g, dtype=torch.int32)
    # documents of a random length per row (1 to 1999 tokens), so most span several blocks
    pos = torch.arange(cols).remainder(torch.randint(1, 2000, (rows, 1), generator=g))
    mask = torch.randint(0, 2, (rows, cols), generator=g, dtype=torch.bool)
    cu = torch.tensor([0, 7, 2000, 2000, rows * cols // 2, rows * cols])
    for kwargs in (
        {"input_ids": ids, "pad_id": 0},
        {"input_ids": ids, "attention_mask": mask},
        {"input_ids": ids, "pad_id": 0, "position_ids": pos},
        {"input_ids": ids.t().contiguous().t(), "pad_id": 3, "cu_seqlens": cu},
    ):
        assert _stats(kwargs, "triton") == _stats(kwargs, "torch")
    # an independent count on one case (pure Python is slow on the large ones)
    small = {"input_ids": ids[:, :3000], "pad_id": 0, "position_ids": pos[:, :3000]}
    assert tuple(_stats(small, "triton")) == true_stats(**small)
