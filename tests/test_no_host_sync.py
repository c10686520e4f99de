"""The meter's per-micro-batch path makes no host synchronisation and no collective.

On the CPU there is nothing to synchronise with, so the guard looks at what the hot path calls:
while the meter's hooks run (and only then: training itself is untouched), the tensor methods
and torch functions that read device values on the host (``.item()``, ``.tolist()``,
``.cpu()``, ``bool(t)``, ``nonzero``, ...) and the torch.distributed collectives are wrapped to
record their callers. The first training micro-batch takes the parameter census, once per run,
and is not guarded; every later one is. On a CUDA machine the ``gpu`` test runs a training loop
under ``torch.cuda.set_sync_debug_mode("error")``, which makes any synchronising CUDA call
raise.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable
from typing import Any

import pytest
import torch
import torch.distributed as dist

import flopmeter.counting.counters
from flopmeter import FlopMeter
from flopmeter.run.hooks import TrainingHooks
from flopmeter.tokens import stats as tokens
from tests.support.batches import mixed_batches
from tests.support.host_syncs import record_host_syncs
from tests.support.models import TinyLM
from tests.support.token_truth import true_stats


class _Guard:
    """Wraps the meter's hooks so that every call after the first runs under the recorder."""

    def __init__(self) -> None:
        self.calls: list[str] = []
        self.guarded_hook_calls = 0
        self._seen_first = False

    def wrap(self, hook: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(hook)
        def guarded(meter: FlopMeter, *args: Any, **kwargs: Any) -> Any:
            if hook.__name__ == "on_forward_pre" and not self._seen_first:
                self._seen_first = True  # the census micro-batch
                return hook(meter, *args, **kwargs)
            self.guarded_hook_calls += 1
            with record_host_syncs(self.calls):
                return hook(meter, *args, **kwargs)

        return guarded


@pytest.fixture
def guard(monkeypatch) -> _Guard:
    g = _Guard()
    for name in ("on_forward_pre", "on_any_step", "on_own_step"):
        monkeypatch.setattr(TrainingHooks, name, g.wrap(getattr(TrainingHooks, name)))
    return g


def _truth(batches: list[dict[str, torch.Tensor]], pad_id: int) -> tuple[int, int, int, int]:
    total = [0, 0, 0, 0]
    for b in batches:
        stats = true_stats(
            input_ids=b["input_ids"].cpu(),
            attention_mask=b["attention_mask"].cpu() if "attention_mask" in b else None,
            pad_id=pad_id,
            position_ids=b["position_ids"].cpu() if "position_ids" in b else None,
            cu_seqlens=b["cu_seq_lens_q"].cpu() if "cu_seq_lens_q" in b else None,
        )
        total = [a + s for a, s in zip(total, stats, strict=True)]
    return tuple(total)  # type: ignore[return-value]


def _train(meter_kwargs: dict[str, Any], batches, model, optimizer) -> FlopMeter:
    with FlopMeter(model, pad_id=0, **meter_kwargs) as meter:
        model.train()
        for batch in batches:
            model(**batch).backward()
            optimizer.step()
            optimizer.zero_grad()
    return meter


def _counts(meter: FlopMeter) -> tuple[int, int, int, int]:
    r = meter.report()
    return (
        r.tokens.tokens_processed,
        r.tokens.tokens_seen,
        r.tokens.sequences,
        r.tokens.sum_sq_seq_len,
    )


@pytest.mark.slow
@pytest.mark.parametrize("own_optimizer", [False, True])
def test_hot_path_makes_no_host_read_copy_or_collective(guard, own_optimizer):
    torch.manual_seed(0)
    model = TinyLM()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    batches = mixed_batches()
    kwargs = {"optimizer": optimizer} if own_optimizer else {}
    meter = _train(kwargs, batches, model, optimizer)
    assert guard.calls == []
    # the guard did cover the path: every later micro-batch and every optimizer step
    assert guard.guarded_hook_calls == 2 * len(batches) - 1
    assert meter.problems == {}
    assert _counts(meter) == _truth(batches, pad_id=0)
    assert meter.report().tokens.micro_batches == len(batches)


def test_guard_records_every_kind_of_host_read():
    calls: list[str] = []
    t = torch.tensor([1, 0, 2])
    with record_host_syncs(calls):
        t.sum().item()
        t.tolist()
        t.cpu()
        t.to("cpu")
        bool(t[0])
        int(t[0])
        t.nonzero()
        torch.unique(t)
        with contextlib.suppress(Exception):
            dist.all_reduce(t)  # not initialised: raises after being recorded
        t.to(torch.float32)  # a dtype conversion is not a host read
    names = [c.split(" ")[0] for c in calls]
    assert names == [
        "item",
        "tolist",
        "cpu",
        "to",
        "__bool__",
        "__int__",
        "nonzero",
        "unique",
        "all_reduce",
    ]
    assert t.item.__name__ == "item" and not hasattr(t.item, "__wrapped__")  # restored


@pytest.mark.slow
def test_guard_catches_a_sync_added_to_the_hot_path(guard, monkeypatch):
    real = flopmeter.counting.counters.accumulate_token_stats

    def aws_style(buffer, inputs, **kwargs):
        (inputs.input_ids.cpu() != 0).sum().item()  # what the AWS callback does per batch
        real(buffer, inputs, **kwargs)

    monkeypatch.setattr(flopmeter.counting.counters, "accumulate_token_stats", aws_style)
    model = TinyLM()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    _train({}, mixed_batches()[:3], model, optimizer)
    assert [c.split(" ")[0] for c in guard.calls] == ["cpu", "item"] * 2


# ----------------------------------------------------------------------------- CUDA
@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("backend", ["triton", "torch"])
def test_cuda_training_under_the_meter_passes_sync_debug_mode_error(backend, monkeypatch):
    if backend == "triton":
        pytest.importorskip("triton", reason="the triton package is not installed")
    else:
        monkeypatch.setattr(tokens, "_triton_kernels", False)  # the torch fallback on CUDA
    torch.manual_seed(0)
    model = TinyLM().cuda()
    model.embed.weight.requires_grad_(False)  # embedding backward may sync; not the meter's
    optimizer = torch.optim.SGD(
        [p for p in model.parameters() if p.requires_grad], lr=0.1, momentum=0.9
    )
    batches = mixed_batches("cuda")

    def run() -> None:
        for batch in batches:
            model(**batch).backward()
            optimizer.step()
            optimizer.zero_grad()

    model.train()
    run()  # bare warm-up
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        run()  # the bare loop is sync-free: any error below is the meter's
    finally:
        torch.cuda.set_sync_debug_mode(0)
    with FlopMeter(model, pad_id=0) as meter:
        run()  # every kind of batch once, unguarded: census, Triton compilation
        torch.cuda.synchronize()
        torch.cuda.set_sync_debug_mode("error")
        try:
            run()
        finally:
            torch.cuda.set_sync_debug_mode(0)
    assert torch.cuda.get_sync_debug_mode() == 0
    assert meter.problems == {}, meter.problems
    truth = _truth(batches, pad_id=0)
    assert _counts(meter) == tuple(2 * v for v in truth)
    # the mode does catch a host read (a control for the check above)
    torch.cuda.set_sync_debug_mode("error")
    try:
        with pytest.raises(RuntimeError, match="synchroniz"):
            batches[0]["input_ids"].sum().item()
    finally:
        torch.cuda.set_sync_debug_mode(0)
