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
import traceback
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

import flopmeter.counters
from _token_truth import true_stats
from flopmeter import FlopMeter, tokens
from flopmeter.hooks import TrainingHooks

TENSOR_METHODS = (
    "item",
    "tolist",
    "cpu",
    "numpy",
    "__bool__",
    "__int__",
    "__float__",
    "__index__",
    "__array__",
    "__repr__",
    "__format__",
    "nonzero",
    "argwhere",
    "unique",
    "unique_consecutive",
    "masked_select",
    "bincount",
    "equal",
    "is_nonzero",
)
TORCH_FUNCTIONS = (
    "nonzero",
    "argwhere",
    "unique",
    "unique_consecutive",
    "masked_select",
    "bincount",
    "equal",
    "is_nonzero",
)
COLLECTIVES = (
    "all_reduce",
    "all_gather",
    "all_gather_into_tensor",
    "all_gather_object",
    "reduce",
    "reduce_scatter_tensor",
    "broadcast",
    "barrier",
    "gather",
    "scatter",
    "all_to_all_single",
)


def _is_cpu(value: Any) -> bool:
    return (isinstance(value, str) and value.startswith("cpu")) or (
        isinstance(value, torch.device) and value.type == "cpu"
    )


@contextlib.contextmanager
def record_host_syncs(calls: list[str]) -> Iterator[None]:
    """Records (in ``calls``) every host read, host copy and collective made inside the block."""
    saved: list[tuple[Any, str, Any]] = []

    def patch(owner: Any, name: str, check: Callable[..., bool] | None = None) -> None:
        original = getattr(owner, name)

        @functools.wraps(original)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            if check is None or check(*args, **kwargs):
                where = traceback.extract_stack(limit=3)[0]
                calls.append(f"{name} at {where.filename}:{where.lineno}")
            return original(*args, **kwargs)

        saved.append((owner, name, original))
        setattr(owner, name, wrapper)

    def to_cpu(*args: Any, **kwargs: Any) -> bool:
        return any(_is_cpu(a) for a in (*args[1:], kwargs.get("device")))

    try:
        for name in TENSOR_METHODS:
            patch(torch.Tensor, name)
        for name in TORCH_FUNCTIONS:
            patch(torch, name)
        for name in COLLECTIVES:
            patch(dist, name)
        patch(torch.Tensor, "to", to_cpu)
        yield
    finally:
        for owner, name, original in reversed(saved):
            setattr(owner, name, original)


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


class TinyLM(nn.Module):
    """A causal LM head over embeddings; accepts (and ignores) packing arguments like Hugging
    Face models do."""

    def __init__(self, vocab: int = 64, hidden: int = 16) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, hidden)
        self.mix = nn.Linear(hidden, hidden)
        self.head = nn.Linear(hidden, vocab)

    def forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        labels: torch.Tensor | None = None,
        **kwargs: Any,
    ) -> torch.Tensor:
        logits = self.head(torch.tanh(self.mix(self.embed(input_ids))))
        assert labels is not None
        return F.cross_entropy(logits.flatten(0, -2), labels.flatten(), ignore_index=-100)


def _batches(device: str = "cpu") -> list[dict[str, torch.Tensor]]:
    """Right- and left-padded batches with masks, ids-only batches, and packed batches."""
    g = torch.Generator().manual_seed(0)
    out = []
    for i in range(8):
        rows, cols = 3 + i % 2, 10 + i
        lengths = torch.randint(1, cols + 1, (rows,), generator=g)
        ids = torch.zeros((rows, cols), dtype=torch.int64 if i % 2 else torch.int32)
        for r, n in enumerate(lengths.tolist()):
            values = torch.randint(1, 64, (n,), generator=g)
            if i % 4 < 2:
                ids[r, :n] = values  # right padding
            else:
                ids[r, cols - n :] = values  # left padding
        batch = {"input_ids": ids, "labels": ids.long().masked_fill(ids == 0, -100)}
        if i % 3 != 2:
            batch["attention_mask"] = (ids != 0).long()
        out.append(batch)
    docs = [4, 7, 1, 5]
    packed = torch.randint(1, 64, (1, sum(docs)), generator=g)
    position_ids = torch.cat([torch.arange(n) for n in docs]).unsqueeze(0)
    cu = torch.tensor([0, *torch.tensor(docs).cumsum(0).tolist()], dtype=torch.int32)
    out.append({"input_ids": packed, "labels": packed, "position_ids": position_ids})
    out.append({"input_ids": packed, "labels": packed, "cu_seq_lens_q": cu})
    return [{k: v.to(device) for k, v in b.items()} for b in out]


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


@pytest.mark.parametrize("own_optimizer", [False, True])
def test_hot_path_makes_no_host_read_copy_or_collective(guard, own_optimizer):
    torch.manual_seed(0)
    model = TinyLM()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    batches = _batches()
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


def test_guard_catches_a_sync_added_to_the_hot_path(guard, monkeypatch):
    real = flopmeter.counters.accumulate_token_stats

    def aws_style(buffer, inputs, **kwargs):
        (inputs.input_ids.cpu() != 0).sum().item()  # what the AWS callback does per batch
        real(buffer, inputs, **kwargs)

    monkeypatch.setattr(flopmeter.counters, "accumulate_token_stats", aws_style)
    model = TinyLM()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    _train({}, _batches()[:3], model, optimizer)
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
    batches = _batches("cuda")

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
