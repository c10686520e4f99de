"""The budget guard's host-side step bounds: steps that grow or vary stop before the budget.

Each micro-batch's padded shape is known on the host; with the FLOP model's rates it bounds the
step's compute from above, so the guard reads the counts as the bound nears the budget, and
decides on the exact total plus the largest step bound seen. The truth every test compares with
is PyTorch's own count (``FlopCounterMode``) of each micro-batch, never the meter's figure.
"""

from __future__ import annotations

import random
from functools import cache

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

from flopmeter import FlopMeter
from flopmeter.budget.guard import BudgetGuard
from flopmeter.budget.rates import StepRates
from flopmeter.budget.resolve import Budget
from tests.support.batches import PAD_ID
from tests.support.models import tiny_llama

ROWS = 2  # sequences per micro-batch, none padded: the shape bound is then exact
ACCUMULATE = 2  # micro-batches per optimizer step


def llama():
    return tiny_llama(attn_implementation="eager")  # attention as FlopCounterMode counts it


@cache
def micro_batch_truth(length: int) -> int:
    """FlopCounterMode's training FLOP (forward + backward) of ROWS sequences of ``length``."""
    model = llama()
    ids = torch.randint(1, 97, (ROWS, length), generator=torch.Generator().manual_seed(length))
    with FlopCounterMode(display=False) as counter:
        model(input_ids=ids, labels=ids).loss.backward()
    return counter.get_total_flops()


def batch(length: int, seed: int) -> dict[str, torch.Tensor]:
    ids = torch.randint(1, 97, (ROWS, length), generator=torch.Generator().manual_seed(seed))
    return {"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": ids}


def run_until_stopped(budget: float, step_lengths: list[list[int]]) -> tuple[FlopMeter, int]:
    """A raw loop with gradient accumulation over micro-batches of the given lengths (one list
    per optimizer step); stops at ``should_stop``. Returns the meter and the steps made."""
    model = llama()
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
    steps = 0
    with FlopMeter(model, PAD_ID, budget=budget) as meter:
        for lengths in step_lengths:
            for i, length in enumerate(lengths):
                (model(**batch(length, seed=steps * 10 + i)).loss / len(lengths)).backward()
            optimizer.step()
            optimizer.zero_grad()
            steps += 1
            if meter.should_stop:
                break
    return meter, steps


def step_truths(step_lengths: list[list[int]]) -> list[int]:
    return [sum(micro_batch_truth(n) for n in lengths) for lengths in step_lengths]


@pytest.mark.slow
def test_lengths_growing_12_to_60_stop_before_the_budget():
    # the review's case: sequence length growing 12 -> 60 with 2-micro-batch accumulation,
    # budget = 40 x the first step (it stopped at 1.75 x the budget before)
    lengths = [min(60, 12 + 2 * s) for s in range(60)]
    step_lengths = [[n, n] for n in lengths]
    truths = step_truths(step_lengths)
    budget = 40 * truths[0]
    meter, steps = run_until_stopped(budget, step_lengths)
    report = meter.report()
    done = sum(truths[:steps])
    assert report.budget.stopped_by_budget and report.tokens.optimizer_steps == steps
    assert report.compute.primary_flops == pytest.approx(done, rel=1e-9)  # the meter counts right
    assert done <= budget < done + truths[steps]  # within it, and the next step would cross
    assert report.budget.flops_at_stop == pytest.approx(done, rel=1e-9)


@pytest.mark.slow
@pytest.mark.parametrize("seed", [0, 1, 2, 3])
def test_random_lengths_stop_at_or_below_the_budget(seed):
    rng = random.Random(seed)
    step_lengths = [[rng.randint(6, 60) for _ in range(ACCUMULATE)] for _ in range(120)]
    truths = step_truths(step_lengths)
    budget = 30.0 * sum(truths) / len(truths)
    meter, steps = run_until_stopped(budget, step_lengths)
    report = meter.report()
    done = sum(truths[:steps])
    assert report.budget.stopped_by_budget
    assert report.compute.primary_flops == pytest.approx(done, rel=1e-9)
    # The guarantee: the total stays within the budget, except when the last step was larger
    # than every step before it, and then by no more than its excess over the largest before.
    excess = max(0, truths[steps - 1] - max(truths[: steps - 1]))
    assert done <= budget + excess
    # and not early by more than the largest step seen: the prediction the guard uses
    assert done + max(truths[:steps]) > budget


def simulate_bounded(budget: float, step_tokens: list[list[int]]) -> tuple[int, float, int]:
    """The guard alone over steps of micro-batches of ``[1, n]`` tokens at 1 FLOP per token
    (the bound exact); returns the stop step, the total there and the readings made."""
    guard = BudgetGuard(Budget(budget, "argument"))
    guard.start()
    guard.use_rates(StepRates(token_flops=1.0))
    total, reads = 0.0, 0
    for step, micro in enumerate(step_tokens, start=1):
        for n in micro:
            guard.add_shape(1, n)
        total += sum(micro)
        guard.close_step()
        if guard.needs_reading(step):
            reads += 1
            if guard.on_reading(step, total).stop:
                return step, total, reads
    return len(step_tokens), total, reads


@pytest.mark.parametrize("growth", [1, 10, 1000])
def test_linear_growth_never_crosses_and_reads_rarely(growth):
    steps = [[100 + growth * s, 100 + growth * s] for s in range(100_000)]
    budget = 5e4 * 200.0
    stop, total, reads = simulate_bounded(budget, steps)
    assert total <= budget < total + sum(steps[stop])  # the next step would cross
    assert reads <= 3 + 3 + 4  # the first step, three warning levels, the last steps


@pytest.mark.slow
def test_random_steps_from_one_range_do_not_cross_in_200_runs():
    # the largest step seen soon covers the range; no run of these 200 crosses
    for seed in range(200):
        rng = random.Random(seed)
        steps = [[rng.randint(1, 1000)] for _ in range(5000)]
        budget = rng.uniform(1e4, 1e6)
        _, total, _ = simulate_bounded(budget, steps)
        assert total <= budget


def test_a_step_larger_than_any_before_crosses_by_its_excess_only():
    # the honest limit: the prediction is the largest step seen, so one larger step can cross
    steps = [[10]] * 50 + [[500]] + [[10]] * 50
    stop, total, _ = simulate_bounded(700.0, steps)
    assert stop == 51 and total == 1000.0  # 500 + 500 ran 300 over: the jump's excess at most
    assert total - 700.0 <= 500 - 10


def test_without_a_recognised_architecture_the_bound_takes_the_sampled_rates_not_seed():
    """An unrecognised model is judged on its dispatch count, which can be far above the seed
    formula (a convolution's work per token): the step bound's rates are the samples' then."""
    from flopmeter.budget.rates import step_rates
    from flopmeter.counting.census import Census
    from flopmeter.flops.recorder import FlopObservations
    from flopmeter.flops.scaling import MeasuredSample

    census = Census(n_total=100, n_trainable=100, n_frozen=0, n_embedding=0)
    sample = MeasuredSample(
        linear_flops=60_000,
        attention_flops=8_000,
        recompute_flops=0,
        tokens=10,
        sum_sq_len=50,
        sequences=2,
        per_micro_batch_flops=30,
    )
    before = step_rates(FlopObservations(profile=None, samples=()), census)
    assert before.token_flops == 4 * 100 + 2 * 100 and before.pair_flops == 0
    rates = step_rates(FlopObservations(profile=None, samples=(sample,)), census)
    assert (rates.token_flops, rates.pair_flops, rates.micro_batch_flops) == (6000, 160, 30)
    # the sampled micro-batch's own shape is bounded by its dispatch count
    assert rates.bound_flops(10, 50, 1) == 60_000 + 8_000 + 30
