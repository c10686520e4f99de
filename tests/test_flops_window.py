"""The micro-batch observation window on its own, against real autograd: it sees the forward
pass and knows when the backward pass from its outputs has finished, tells a forward that
raised from one that returned, and calls nothing once closed (by the next forward pass, say)."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch import nn

from flopmeter.flops.window import MicroBatchWindow, Outputs, output_tensors


class Tiny(nn.Module):
    """Two linear layers; ``mode`` picks what the forward pass returns (or that it raises)."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.up = nn.Linear(4, 8)
        self.down = nn.Linear(8, 3)
        self.mode = "tensor"

    def forward(self, x: torch.Tensor) -> Any:
        hidden = torch.relu(self.up(x))
        if self.mode == "raise":
            raise RuntimeError("simulated out of memory")
        out = self.down(hidden)
        if self.mode == "none":
            self.kept = out  # the loss lives elsewhere (a Lightning manual-optimisation step)
            return None
        if self.mode == "dict":
            return {"logits": out, "extra": (hidden.detach(), [out * 2])}
        return out


class Events:
    """Records the window's calls, and what autograd had done when each came."""

    def __init__(self, model: Tiny) -> None:
        self.model = model
        self.calls: list[Any] = []

    def window(self, **kwargs: Any) -> MicroBatchWindow:
        return MicroBatchWindow(
            self.model,
            on_return=lambda outputs: self.calls.append(("return", outputs)),
            on_raise=lambda: self.calls.append("raise"),
            on_backward_start=lambda: self.calls.append(("start", self._grads())),
            on_backward_end=lambda: self.calls.append(("end", self._grads())),
            **kwargs,
        )

    def _grads(self) -> int:
        """Parameters whose gradient autograd has written so far."""
        return sum(p.grad is not None for p in self.model.parameters())


def hooks_on(model: nn.Module) -> int:
    return len(model._forward_hooks)


def test_the_window_sees_the_forward_and_knows_when_its_backward_has_finished() -> None:
    model = Tiny()
    events = Events(model)
    window = events.window().watch_forward()
    assert hooks_on(model) == 2 and window.holds_hooks
    out = model(torch.randn(5, 4))
    assert events.calls == [("return", Outputs.FOLLOWED)]
    assert window.returned and not window.backward_seen and not window.blind
    assert hooks_on(model) == 0  # the exit hook goes once the forward returned
    out.sum().backward()
    # started before any parameter had its gradient, ended after all four had theirs
    assert events.calls[1:] == [("start", 0), ("end", 4)]
    assert window.backward_seen and not window.closed  # closing is the owner's decision
    window.close()
    model.zero_grad()
    model(torch.randn(5, 4)).sum().backward()  # a later micro-batch: the window calls nothing
    assert len(events.calls) == 3


def test_several_forwards_before_one_backward_end_once_after_it() -> None:
    model = Tiny()
    events = Events(model)
    window = events.window().watch_forward()
    first = model(torch.randn(2, 4))
    window.watch_forward()
    model.mode = "dict"
    second = model(torch.randn(3, 4))
    assert events.calls == [("return", Outputs.FOLLOWED)] * 2
    (first.sum() + second["logits"].sum()).backward()
    assert events.calls[2:] == [("start", 0), ("end", 4)]


def test_a_forward_that_raises_closes_the_window_and_its_hooks_go_later() -> None:
    model = Tiny()
    model.mode = "raise"
    events = Events(model)
    window = events.window().watch_forward()
    after: list[int] = []
    # a hook registered after the window's: torch's loop over the model's hooks goes on to it
    handle = model.register_forward_hook(lambda *a: after.append(1), always_call=True)
    with pytest.raises(RuntimeError, match="simulated out of memory"):
        model(torch.randn(5, 4))
    assert events.calls == ["raise"] and after == [1]
    assert window.closed and not window.returned
    assert hooks_on(model) == 3 and window.holds_hooks  # torch was iterating them: not yet
    window.close()
    assert list(model._forward_hooks) == [handle.id] and not window.holds_hooks
    handle.remove()


def test_a_window_closed_by_the_next_forward_calls_nothing_after() -> None:
    model = Tiny()
    model.mode = "none"
    events = Events(model)
    window = events.window().watch_forward()
    model(torch.randn(5, 4))
    assert events.calls == [("return", Outputs.NO_TENSOR)] and window.blind
    kept = model.kept
    # The owner closes a blind window at the next training forward pass (its pre-hook).
    handle = model.register_forward_pre_hook(lambda *a: window.close())
    model.mode = "tensor"
    out = model(torch.randn(5, 4))
    handle.remove()
    (kept.sum() + out.sum()).backward()
    assert events.calls == [("return", Outputs.NO_TENSOR)]  # no backward events after the close
    assert window.closed and hooks_on(model) == 0


def test_a_window_closed_during_the_forward_never_sees_it_return() -> None:
    model = Tiny()
    events = Events(model)
    window = events.window().watch_forward()
    handle = model.up.register_forward_hook(lambda *a: window.close())
    model(torch.randn(5, 4)).sum().backward()
    handle.remove()
    assert events.calls == [] and hooks_on(model) == 0


def test_outputs_without_a_gradient_and_a_window_that_ends_with_the_forward() -> None:
    model = Tiny()
    events = Events(model)
    events.window().watch_forward()
    with torch.no_grad():
        model(torch.randn(5, 4))
    events.window(follow_backward=False).watch_forward()
    model(torch.randn(5, 4)).sum().backward()  # not followed: no backward events
    assert events.calls == [("return", Outputs.NO_GRAD), ("return", Outputs.NOT_FOLLOWED)]


def test_output_tensors_reads_two_levels_into_containers() -> None:
    a, b, c, d = (torch.tensor(float(i)) for i in range(4))
    found = list(output_tensors({"x": a, "y": (b, [c, {"too deep": d}]), "n": None}))
    assert [t.item() for t in found] == [0.0, 1.0]
    assert list(output_tensors(None)) == [] and list(output_tensors(object())) == []
