"""The sample guard counts forward passes (issue 33): a sample whose backward pass does more than
twice its forward pass's work is kept when every training forward pass before it had had its
backward (or an optimizer step): its backward holds its own forward passes only, however long
(the gated delta rule's chunked backward). When an earlier forward pass was still waiting for
its backward, the long backward may hold it, and the sample is dropped with that reason.

The figures are held to PyTorch's own count (``FlopCounterMode``) of the same training.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch import nn
from torch.utils.flop_counter import FlopCounterMode

from flopmeter import FlopMeter
from flopmeter.flops.aten_ops import measured_formulas
from tests.support.models import eager_llama

VOCAB = 64
WIDTH = 32


class _ThreeTimesBackward(torch.autograd.Function):
    """``x @ w`` forward; its backward computes each gradient twice over (as a chunked scan's
    backward recomputes its states): 4 products where plain gradients take 2."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(x, w)
        return x @ w

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        x, w = ctx.saved_tensors
        # (products of other operand shapes than the forward's: not a recomputation of it)
        wide = w.expand(grad.shape[0], -1, -1)
        grad_x = torch.bmm(wide, grad.transpose(1, 2)).transpose(1, 2)
        grad_x = (grad_x + torch.bmm(wide, grad.transpose(1, 2)).transpose(1, 2)) / 2
        grad_w = (x.transpose(-1, -2) @ grad + x.transpose(-1, -2) @ grad).sum(0) / 2
        return grad_x, grad_w


class LongBackward(nn.Module):
    """Embeddings, a mixer whose backward does 4 products per forward product, a head."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.embed = nn.Embedding(VOCAB, WIDTH)
        self.mix = nn.Parameter(torch.randn(WIDTH, WIDTH) / WIDTH**0.5)
        self.head = nn.Linear(WIDTH, VOCAB, bias=False)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        h = _ThreeTimesBackward.apply(self.embed(input_ids), self.mix)
        for _ in range(4):  # the mixer's share of the work: its backward past 2x the forward's
            h = _ThreeTimesBackward.apply(h, self.mix)
        return self.head(h).float().logsumexp(-1).mean()


BATCHES = [torch.randint(0, VOCAB, (2, 8), generator=torch.Generator().manual_seed(i)) for i in (0, 1, 2)]  # fmt: skip


def _truth(model: nn.Module, batches: list[torch.Tensor]) -> int:
    with FlopCounterMode(display=False, custom_mapping=measured_formulas()) as counter:
        for ids in batches:
            model(ids).backward()
    return counter.get_total_flops()


def test_a_long_backward_of_the_samples_own_forward_is_kept() -> None:
    model = LongBackward().train()
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
    with FlopMeter(model, output=None, nvml=False, measure_every=1) as meter:
        for ids in BATCHES:
            model(ids).backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
    report = meter.report()
    measured = report.compute.estimates["measured"]
    assert measured.inputs["samples"] == 3  # none dropped by the guard
    with torch.no_grad(), FlopCounterMode(display=False) as counter:
        model(BATCHES[0])
    forward = counter.get_total_flops()
    backward = _truth(LongBackward().train(), BATCHES[:1]) - forward
    assert backward > 2.5 * forward  # past the 2x of plain gradients
    assert measured.flops == pytest.approx(_truth(LongBackward().train(), BATCHES), rel=1e-9)
    assert any("3 sample(s) whose backward pass did more than twice" in n for n in measured.notes)


def test_a_long_backward_is_kept_before_the_first_step() -> None:
    """The first micro-batch has no forward pass before it: its sample is kept at once."""
    model = LongBackward().train()
    with FlopMeter(model, output=None, nvml=False, measure_every=1) as meter:
        model(BATCHES[0]).backward()
    assert meter.report().compute.estimates["measured"].inputs["samples"] == 1


def test_a_long_backward_under_gradient_accumulation_is_kept() -> None:
    """Two micro-batches per optimizer step: the second of each window opens after the first's
    backward (gradients accumulate, no step between), so every sample is kept."""
    model = LongBackward().train()
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
    batches = [*BATCHES, BATCHES[0]]
    with FlopMeter(model, output=None, nvml=False, measure_every=1) as meter:
        for i, ids in enumerate(batches, start=1):
            (model(ids) / 2).backward()
            if i % 2 == 0:
                optimizer.step()
                optimizer.zero_grad(set_to_none=True)
    report = meter.report()
    measured = report.compute.estimates["measured"]
    assert (report.tokens.optimizer_steps, report.tokens.micro_batches) == (2, 4)
    assert measured.inputs["samples"] == 4  # none dropped by the guard
    assert measured.flops == pytest.approx(_truth(LongBackward().train(), batches), rel=1e-9)


@pytest.mark.slow
def test_a_backward_that_holds_an_earlier_forward_is_dropped() -> None:
    """Micro-batch 4 (sampled at measure_every=4) opens while micro-batch 3's forward waits for
    its backward; one backward runs over both: the sample is dropped, the two before it kept."""
    model = eager_llama().train()
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
    ids = [torch.randint(1, 97, (2, 8), generator=torch.Generator().manual_seed(i)) for i in range(4)]  # fmt: skip
    with FlopMeter(model, output=None, nvml=False, measure_every=4) as meter:
        for batch in ids[:2]:
            model(input_ids=batch, labels=batch).loss.backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
        held = model(input_ids=ids[2], labels=ids[2]).loss
        (held + model(input_ids=ids[3], labels=ids[3]).loss).backward()
        optimizer.step()
    measured = meter.report().compute.estimates["measured"]
    assert measured.inputs["samples"] == 2
    assert any("earlier forward passes' backward not yet run" in n for n in measured.notes)
