"""The meter's model profile when training forward passes fail: retried a few times, then given
up, never restarted (walking and hooking every module) on every micro-batch."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.utils.flop_counter import FlopCounterMode

from flopmeter import FlopMeter
from flopmeter.flops import capture as profile
from flopmeter.flops.recorder import MAX_PROFILE_ATTEMPTS
from tests.support.models import Flaky

VOCAB = 64


@pytest.fixture
def started(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    count = [0]
    start = profile.Profiler.start

    def counting(profiler: profile.Profiler) -> profile.Profiler:
        count[0] += 1
        return start(profiler)

    monkeypatch.setattr(profile.Profiler, "start", counting)
    return count


def train(model: Flaky, steps: int) -> FlopMeter:
    """A loop that skips micro-batches whose forward pass raised (as OOM-retry loops do)."""
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
    ids = torch.randint(1, VOCAB, (2, 5), generator=torch.Generator().manual_seed(1))
    with FlopMeter(model, measure_every=0) as meter:
        for _ in range(steps):
            try:
                model(ids).sum().backward()
            except RuntimeError:
                continue
            optimizer.step()
            optimizer.zero_grad()
    return meter


def hooks_left(model: nn.Module) -> int:
    return sum(len(m._forward_hooks) for m in model.modules() if m is not model)


def test_a_profile_that_keeps_failing_is_given_up(started: list[int]) -> None:
    model = Flaky(failures=10)
    meter = train(model, steps=12)  # 10 raise, then 2 complete
    assert started[0] == MAX_PROFILE_ATTEMPTS == 3
    assert hooks_left(model) == 0  # the failed profilers' hooks are all gone
    report = meter.report()
    assert report.tokens.micro_batches == 12
    assert report.compute.estimates["transformer"].flops is None
    assert any("given up" in n for n in report.compute.estimates["transformer"].notes)
    assert report.compute.primary_estimate is None  # unsampled: no figure judged, never seed
    assert report.compute.estimates["seed"].flops is not None


def test_a_profile_that_fails_a_few_times_is_taken_on_a_later_micro_batch(
    started: list[int],
) -> None:
    model = Flaky(failures=MAX_PROFILE_ATTEMPTS - 1)
    meter = train(model, steps=5)  # 2 raise, then 3 complete
    assert started[0] == MAX_PROFILE_ATTEMPTS
    assert hooks_left(model) == 0
    report = meter.report()
    assert report.compute.primary_estimate is None  # recognised, but unsampled: not judged
    # 3 completed micro-batches of 10 tokens, each one forward and backward
    ids = torch.randint(1, VOCAB, (2, 5))
    with FlopCounterMode(display=False) as counter:
        model(ids).sum().backward()
    completed = 3 * counter.get_total_flops()
    # every micro-batch's tokens are counted (the failed ones too): 5 of them
    assert report.tokens.tokens_processed == 5 * 10
    transformer = report.compute.estimates["transformer"]
    assert transformer.flops == pytest.approx(completed * 5 / 3, rel=1e-12)


class FlakyWithOwnWeight(Flaky):
    """Flaky, with a 2-D weight of its own: the profiler hooks the model itself as a layer."""

    def __init__(self, failures: int) -> None:
        super().__init__(failures)
        self.weight = nn.Parameter(torch.randn(VOCAB, VOCAB) * 0.1)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        return super().forward(input_ids) @ self.weight


def test_a_failure_leaves_hooks_on_the_model_itself_until_later() -> None:
    """After an exception torch runs the model's always-call hooks without copying its hook
    dict: the profiler's hooks on the model itself go later, and the error reaches the caller."""
    model = FlakyWithOwnWeight(failures=1)
    ids = torch.randint(1, VOCAB, (2, 5))
    profiler = profile.Profiler(model, batch_tokens=ids.numel()).start()
    calls: list[int] = []
    # a hook after the profiler's: torch's loop over the model's hooks goes on past them
    handle = model.register_forward_hook(lambda *a: calls.append(1), always_call=True)
    with pytest.raises(RuntimeError, match="simulated out of memory"):
        model(ids)
    assert profiler.failed and profiler.profile is None and calls == [1]
    assert hooks_left(model) == 0  # the submodules' hooks went at once
    profiler.remove()
    assert list(model._forward_hooks) == [handle.id]
    profiler = profile.Profiler(model, batch_tokens=ids.numel()).start()
    model(ids)
    assert profiler.profile is not None and not profiler.failed and calls == [1, 1]
    assert list(model._forward_hooks) == [handle.id] and hooks_left(model) == 0
    handle.remove()
