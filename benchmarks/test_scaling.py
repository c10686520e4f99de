"""The meter's cost per micro-batch against layers (2 to 80), sequence length (128 to 32k) and
batch size, and the memory it holds after many micro-batches (see benchmarks/_scaling.py).

Run with ``make bench`` (which writes docs/benchmarks.md), not by the default test run.
"""

from __future__ import annotations

import functools

import pytest

import _scaling
from _workloads import configure_threads, machine


@functools.cache
def _model(layers: int):
    return _scaling.make_model(layers)


@pytest.mark.parametrize(("layers", "rows", "cols"), _scaling.CASES)
def test_meter_cost_scaling(benchmark, layers, rows, cols):
    configure_threads()
    benchmark.group = "meter cost scaling"
    model = _model(layers)
    batch = _scaling.make_batch(rows, cols)
    attached = _scaling.AttachedMeter(model)
    try:
        attached.per_micro_batch(batch)  # the census: once per run
        benchmark(attached.per_micro_batch, batch)
        report = attached.meter.report()
    finally:
        attached.close()
    assert report.tokens.tokens_processed == report.tokens.micro_batches * int(
        batch["attention_mask"].sum()
    )
    benchmark.extra_info.update(
        {
            "kind": "scaling",
            "layers": layers,
            "rows": rows,
            "cols": cols,
            "parameters": sum(p.numel() for p in model.parameters()),
            "machine": machine(),
        }
    )


def test_meter_memory(benchmark):
    configure_threads()
    benchmark.group = "meter memory"
    result = benchmark.pedantic(_scaling.memory_growth, rounds=1, iterations=1)
    benchmark.extra_info.update({"kind": "meter_memory", "machine": machine(), **result})
