"""How a forward call ended, told apart from what it returned (``None`` is a return)."""

from __future__ import annotations

import threading
from typing import Any

import pytest
import torch
from torch import nn

from flopmeter.flops._exit_hook import register_exit_hook


class Step(nn.Module):
    """Returns what ``plan`` says for each call: "none", "tensor", "raise" or "nested" (calls
    itself, catching the inner call's error, then returns None)."""

    def __init__(self, plan: list[str], barrier: threading.Barrier | None = None) -> None:
        super().__init__()
        self.plan = plan
        self.barrier = barrier
        self.lock = threading.Lock()

    def forward(self, x: torch.Tensor) -> Any:
        with self.lock:
            what = self.plan.pop(0)
        if self.barrier is not None:
            self.barrier.wait()
        if what == "raise":
            raise RuntimeError("simulated")
        if what == "nested":
            with pytest.raises(RuntimeError):
                self(x)
            return None
        return x * 2 if what == "tensor" else None


def record(module: nn.Module) -> tuple[list[tuple[Any, bool]], tuple[Any, Any]]:
    seen: list[tuple[Any, bool]] = []
    lock = threading.Lock()

    def hook(mod: nn.Module, args: Any, kwargs: Any, output: Any, returned: bool) -> None:
        with lock:
            seen.append((output, returned))

    return seen, register_exit_hook(module, hook)


def test_none_is_a_return_and_an_exception_is_not() -> None:
    module = Step(["none", "raise", "tensor", "none"])
    seen, handles = record(module)
    x = torch.ones(2)
    assert module(x) is None  # the hooks leave the output alone
    with pytest.raises(RuntimeError, match="simulated"):  # the original error reaches the caller
        module(x)
    assert torch.equal(module(x), x * 2)
    assert module(x) is None
    assert [r for _, r in seen] == [True, False, True, True]
    assert [o is None for o, _ in seen] == [True, True, False, True]
    for handle in handles:
        handle.remove()
    assert not module._forward_hooks


def test_nested_call_that_raises_inside_one_that_returns() -> None:
    module = Step(["nested", "raise"])
    seen, _ = record(module)
    assert module(torch.ones(2)) is None
    assert [r for _, r in seen] == [False, True]  # inner raised, outer returned None


def test_threads_sharing_the_hooks_each_get_their_own_ending() -> None:
    barrier = threading.Barrier(2)
    module = Step(["raise", "none"], barrier)
    seen, _ = record(module)
    errors: list[BaseException] = []

    def call() -> None:
        try:
            module(torch.ones(2))
        except RuntimeError as exc:
            errors.append(exc)

    threads = [threading.Thread(target=call) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=10)
    assert len(errors) == 1
    assert sorted(r for _, r in seen) == [False, True]
