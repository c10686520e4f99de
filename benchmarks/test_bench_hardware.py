"""Cost of the NVML monitor, with the fake ``pynvml`` of tests/fake_nvml (no GPU here).

What these measure is flopmeter's own Python work per sampling round and per meter start/stop
(the fake answers instantly; the real NVML calls go through ctypes, which releases the GIL while
the driver answers). Run: ``.venv/bin/python -m pytest benchmarks/test_bench_hardware.py``.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

from flopmeter import FlopMeter
from flopmeter.hardware.monitor import NvmlMonitor

FAKE_DIR = Path(__file__).parents[1] / "tests" / "fake_nvml"


@pytest.fixture
def nvml(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.syspath_prepend(str(FAKE_DIR))
    monkeypatch.delitem(sys.modules, "pynvml", raising=False)
    for var in ("CUDA_VISIBLE_DEVICES", "LOCAL_RANK", "FLOPMETER_NVML"):
        monkeypatch.delenv(var, raising=False)
    import pynvml

    pynvml.state.reset()
    return pynvml


@pytest.mark.parametrize("n_gpus", [1, 8])
def test_one_sampling_round(benchmark, nvml, n_gpus):
    gpus = nvml.state.eight_gpus()[:n_gpus]
    nvml.state.reset(gpus)
    monitor = NvmlMonitor(interval_seconds=3600)  # the thread waits; the benchmark samples
    assert monitor.start()
    try:
        benchmark(monitor.sampler.sample)
    finally:
        monitor.stop()


def test_meter_start_stop_with_monitor(benchmark, nvml):
    nvml.state.reset([nvml.FakeGpu(name="NVIDIA H200")])
    model = torch.nn.Linear(8, 8)

    def run() -> None:
        with FlopMeter(model, nvml_interval_seconds=3600):
            pass

    benchmark(run)


def test_meter_start_stop_without_monitor(benchmark):
    model = torch.nn.Linear(8, 8)

    def run() -> None:
        with FlopMeter(model, nvml=False):
            pass

    benchmark(run)
