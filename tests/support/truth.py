"""PyTorch's own FLOP counts (``FlopCounterMode``) of training rows: the truth the tests hold
flopmeter's figures to, with no formula of flopmeter's involved."""

from __future__ import annotations

import torch
from torch.utils.flop_counter import FlopCounterMode

from tests.support.models import eager_llama

#: Rows of one micro-batch (padded to 12) that cost the same every step.
STEP_ROWS = [12, 9, 5]


def sequence_truth(model: torch.nn.Module, rows: list[list[int]]) -> int:
    """PyTorch's own count (``FlopCounterMode``) of one forward+backward pass over each row on
    its own (no padding), summed: the training FLOP of those rows."""
    total = 0
    for row in rows:
        ids = torch.tensor([row])
        with FlopCounterMode(display=False) as counter:
            model(input_ids=ids, labels=ids).loss.backward()
        total += counter.get_total_flops()
        model.zero_grad()
    return total


def rows_truth(rows: list[int], seed: int = 0) -> int:
    """FlopCounterMode's training FLOP (forward + backward) of ``eager_llama`` rows of these
    lengths, each on its own (no padding): what one micro-batch of ``padded_batch(rows, ...)``
    costs."""
    model = eager_llama()
    total = 0
    for n in rows:
        ids = torch.randint(1, 97, (1, n), generator=torch.Generator().manual_seed(seed))
        with FlopCounterMode(display=False) as counter:
            model(input_ids=ids, labels=ids).loss.backward()
        total += counter.get_total_flops()
    return total
