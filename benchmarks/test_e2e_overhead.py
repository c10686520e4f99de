"""The end-to-end added time per micro-batch (issue 22's workload; see benchmarks/_e2e.py):
bare and metered training steps alternating one by one in one process, with the empty-hooks
floor, the AWS-style count, and the busy-wait variants that validate the instrument.

Run with ``make bench`` (which writes docs/benchmarks.md). Size: ``FLOPMETER_E2E_ROUNDS``
(default 100) rounds of ``FLOPMETER_E2E_PAIRS`` (40) pairs of steps per variant.
"""

from __future__ import annotations

import _e2e
from _workloads import configure_threads, env_int, machine


def test_e2e_added_time(benchmark):
    configure_threads()
    benchmark.group = "end-to-end added time"
    benchmark.extra_info.update({"kind": "e2e_overhead", "machine": machine()})
    loop = _e2e.TinyLoop()
    spins = _e2e.busy_spins(_e2e.spin_iterations_per_us())
    before = {us: _e2e.spin_cost_us(n) for us, n in spins.items()}
    variants = _e2e.variants(spins)
    named = {name: variant for name, (variant, _) in variants.items()}
    result = benchmark.pedantic(
        _e2e.measure,
        args=(loop, named),
        kwargs={
            "rounds": env_int("FLOPMETER_E2E_ROUNDS", 100),
            "pairs": env_int("FLOPMETER_E2E_PAIRS", 40),
        },
        rounds=1,
        iterations=1,
    )
    after = {us: _e2e.spin_cost_us(n) for us, n in spins.items()}
    # the busy-waits' own cost, timed alone before and after (it drifts with the machine)
    known = {us: (before[us] + after[us]) / 2 for us in spins}
    result["spins"] = {
        str(us): {"iterations": n, "before_us": before[us], "after_us": after[us]}
        for us, n in spins.items()
    }
    for clock in _e2e.CLOCKS:
        result[clock]["validation"] = _e2e.validation(result[clock], known)
        for v in result[clock]["variants"].values():
            del v["differences_us"]  # thousands of numbers: the JSON keeps the estimates
    result["descriptions"] = {name: d for name, (_, d) in variants.items()}
    result["workload"] = (
        f"nn.Embedding({_e2e.VOCAB}, {_e2e.HIDDEN}) + nn.Linear({_e2e.HIDDEN}, {_e2e.VOCAB}), "
        f"right-padded ids of {_e2e.ROWS} x {_e2e.COLS} with an attention mask, SGD"
    )
    benchmark.extra_info.update(result)
    benchmark.extra_info["machine_after"] = machine()
