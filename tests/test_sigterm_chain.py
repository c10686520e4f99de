"""Meters that stop in another order than they started leave no chain of stale SIGTERM handlers
(each would keep its meter and its model alive), and a SIGTERM still reaches every running meter
and then the handler that was there before them."""

from __future__ import annotations

import gc
import json
import os
import signal
import weakref

import torch
from torch import nn

from flopmeter import FlopMeter


def _meter(tmp_path, i):
    model = nn.Linear(4, 4)
    meter = FlopMeter(model, pad_id=None, output=tmp_path / f"r{i}.json", ledger=None)
    return model, meter


def _step(model):
    model(torch.ones(2, 4)).sum().backward()


def test_meters_stopped_in_the_order_they_started_leave_no_handler_behind(tmp_path):
    before = signal.getsignal(signal.SIGTERM)
    modes = torch._C._len_torch_function_stack()
    refs, meters = [], []
    for i in range(6):
        model, meter = _meter(tmp_path, i)
        meter.__enter__()
        _step(model)
        refs.append(weakref.ref(model))
        meters.append(meter)
        del model
    for meter in meters:  # the order they started: each leaves while a later one is on top
        meter.__exit__(None, None, None)
    del meters, meter
    gc.collect()
    assert signal.getsignal(signal.SIGTERM) is before
    assert [r() is None for r in refs] == [True] * 6  # no handler keeps a model alive
    # Each profile's weight watch (a TorchFunctionMode) was open when its meter stopped: the
    # earlier ones, under a later one, leave once on top (5 stayed on the stack for good,
    # and the process's every torch call went through them)
    assert torch._C._len_torch_function_stack() == modes


def test_a_sigterm_reaches_the_running_meters_past_a_stopped_one(tmp_path):
    seen = []
    modes = torch._C._len_torch_function_stack()
    previous = signal.signal(signal.SIGTERM, lambda signum, frame: seen.append(signum))
    try:
        model_a, a = _meter(tmp_path, "a")
        model_b, b = _meter(tmp_path, "b")
        model_c, c = _meter(tmp_path, "c")
        for model, meter in ((model_a, a), (model_b, b), (model_c, c)):
            meter.__enter__()
            _step(model)
        b.__exit__(None, None, None)  # the middle one leaves first
        os.kill(os.getpid(), signal.SIGTERM)
        assert seen == [signal.SIGTERM]  # the earlier handler, once
        for name in ("a", "c"):
            report = json.loads((tmp_path / f"r{name}.json").read_text())
            assert report["run"]["status"] == "interrupted", name
        assert json.loads((tmp_path / "rb.json").read_text())["run"]["status"] == "completed"
        c.__exit__(None, None, None)
        a.__exit__(None, None, None)
        assert signal.getsignal(signal.SIGTERM) is not None
        assert signal.getsignal(signal.SIGTERM).__name__ == "<lambda>"
        assert torch._C._len_torch_function_stack() == modes  # every watch left
    finally:
        signal.signal(signal.SIGTERM, previous)
