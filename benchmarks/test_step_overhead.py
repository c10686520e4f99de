"""Items 1, 2 and 4 of the overhead benchmark: a small transformer's training step, bare and
counted, in alternating blocks in one process; the ratio counted / bare per round.

Run with ``make bench`` (which writes docs/benchmarks.md), not by the default test run.
"""

from __future__ import annotations

import pytest

from _workloads import PAD_ID, Trainer, alternate, configure_threads, env_int, machine, variants
from flopmeter import FlopMeter

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
        forward_hook(model, (), batch)  # the first call takes the census: once per run
        step_hook = meter._run.hooks.on_any_step

        def per_step() -> None:
            forward_hook(model, (), batch)
            step_hook(optimizer, (), {})

        benchmark(per_step)
    calls = meter.report().tokens.micro_batches
    assert meter.report().tokens.tokens_processed == calls * int(batch["attention_mask"].sum())
