"""An Accelerate loop with its own gradient accumulation, under the meter."""

import pytest
import torch

from flopmeter import FlopMeter
from tests.support.batches import PAD_ID, Truth, padded_batch
from tests.support.models import tiny_llama


@pytest.mark.slow
def test_accelerate_loop_counts_micro_batches_and_real_optimizer_steps():
    from accelerate import Accelerator
    from accelerate.state import AcceleratorState, GradientState

    # Accelerate's states are process-wide singletons: a Trainer run earlier in this process
    # (the adapter tests) would otherwise keep its accumulation settings (accelerate's own
    # tests reset them the same way).
    AcceleratorState._reset_state(reset_partial_state=True)
    GradientState._reset_state()

    accelerator = Accelerator(cpu=True, gradient_accumulation_steps=3)
    model = tiny_llama()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    model, optimizer = accelerator.prepare(model, optimizer)
    truth = Truth()
    lengths = [[5, 16], [2, 2], [9, 11], [16, 1], [3, 8], [7, 7]]
    with FlopMeter(model, PAD_ID) as meter:
        for i, rows in enumerate(lengths):
            with accelerator.accumulate(model):
                loss = model(**padded_batch(rows, 16, seed=i)).loss
                accelerator.backward(loss)
                optimizer.step()  # Accelerate skips the real step until the 3rd micro-batch
                optimizer.zero_grad()
            truth.add(rows, 16)
    report = meter.report()
    assert report.tokens.tokens_processed == truth.tokens == 87
    assert report.tokens.micro_batches == 6
    assert report.tokens.optimizer_steps == 2  # 6 micro-batches / 3
