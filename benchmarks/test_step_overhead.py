"""Items 1, 2 and 4 of the overhead benchmark: a small transformer's training step, bare and
counted, in alternating blocks in one process; the ratio counted / bare per round.

Run with ``make bench`` (which writes docs/benchmarks.md), not by the default test run.
"""

from __future__ import annotations

import pytest

from _workloads import (
    PAD_ID,
    Trainer,
    alternate,
    configure_threads,
    env_int,
    machine,
    real_tokens,
    variants,
)
from flopmeter import FlopMeter
from flopmeter.flops.forwards import DISCOVERY_STEPS

VARIANTS = variants()


@pytest.fixture(scope="module")
def trainer() -> Trainer:
    configure_threads()
    return Trainer()


@pytest.mark.parametrize("name", list(VARIANTS))
def test_step_overhead(benchmark, trainer, name):
    variant, description = VARIANTS[name]
    benchmark.group = "step overhead"
    benchmark.extra_info.update({"kind": "step_overhead", "variant": name})
    benchmark.extra_info["description"] = description
    benchmark.extra_info["machine"] = machine()
    rounds = env_int("FLOPMETER_BENCH_ROUNDS", 150)
    steps = env_int("FLOPMETER_BENCH_STEPS", 10)
    result = benchmark.pedantic(
        alternate,
        args=(trainer, variant),
        kwargs={"rounds": rounds, "steps": steps},
        rounds=1,
        iterations=1,
    )
    benchmark.extra_info.update(result, available=True)
    benchmark.extra_info["machine_after"] = machine()


def test_meter_hook_cost(benchmark, trainer):
    """The meter's own work per training step, timed alone: its forward pre-hook on one
    micro-batch and its optimizer-step hook (a steadier figure than the step ratio on a busy
    machine)."""
    benchmark.group = "meter hook cost"
    benchmark.extra_info.update({"kind": "hook_cost", "machine": machine()})
    model, optimizer = trainer.model, trainer.optimizer
    batch = trainer.batches[0]
    with FlopMeter(model, pad_id=PAD_ID, measure_every=0) as meter:
        forward_hook = next(iter(model._forward_pre_hooks.values()))
        # Real steps first: the census, the call's plan and its hot path, the first full
        # optimizer steps; what is timed is then the steady state's path
        first = trainer._i
        for _ in range(DISCOVERY_STEPS + 2):
            trainer.step()
        seen = [trainer.batches[i % len(trainer.batches)] for i in range(first, trainer._i)]
        assert meter._run.hooks.counters.planned.take((), batch) is not None  # the hot path
        step_hook = meter._run.hooks.on_any_step

        def per_step() -> None:
            forward_hook(model, (), batch)
            step_hook(optimizer, (), {})

        benchmark(per_step)
    report = meter.report()
    hot_calls = report.tokens.micro_batches - len(seen)  # the timed calls, and take()'s
    assert report.tokens.tokens_processed == real_tokens(seen) + hot_calls * real_tokens([batch])
