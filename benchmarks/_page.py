"""Sections of docs/benchmarks.md written by benchmarks/write_table.py: the end-to-end added
time, the scaling table, the memory the meter holds and the planner's timings.

Each takes the pytest-benchmark JSON of one run and returns the section's lines; a section whose
benchmark did not run in that run says so, never a number.
"""

from __future__ import annotations

from typing import Any

#: The end-to-end goal: at most this many microseconds of host time per micro-batch.
GOAL_US = 10.0
#: FlopMeter's added time over the one-copy floor's (``one_read``), at most (issue 32).
FLOOR_RATIO_GOAL = 1.5
PLANNER_FILE = "benchmarks/test_planner_speed.py"
E2E_LABELS = {
    "flopmeter": "FlopMeter",
    "empty_hooks": "empty hooks (torch's hook dispatch: the floor)",
    "one_read": "empty hooks + one copy of the mask (the least a counting hook does)",
    "aws_style": "AWS-style per-micro-batch count",
    "busy_5us": "empty hooks + 5 us busy-wait (validation)",
    "busy_20us": "empty hooks + 20 us busy-wait (validation)",
}


def _entries(data: dict[str, Any], kind: str) -> list[dict[str, Any]]:
    return [b for b in data["benchmarks"] if b.get("extra_info", {}).get("kind") == kind]


def _ci(v: dict[str, Any]) -> str:
    return f"{v['added_us']:.1f} ({v['ci_low_us']:.1f} to {v['ci_high_us']:.1f})"


def e2e_section(data: dict[str, Any]) -> list[str]:
    """The end-to-end added time per micro-batch, beside the isolated hook cost."""
    lines = ["## End-to-end added time per micro-batch", ""]
    found = _entries(data, "e2e_overhead")
    if not found:
        return [
            *lines,
            "Not run in this run (benchmarks/test_e2e_overhead.py failed or was deselected).",
        ]
    e = found[0]["extra_info"]
    cpu, wall = e["cpu"], e["wall"]
    lines += [
        f"What a training loop pays for the meter, end to end: {e['workload']}, one training "
        "step (forward, backward, SGD step) per micro-batch, one torch thread. Bare and "
        "counted steps alternate one by one in one process, in adjacent pairs (ABBA order), "
        "the hooks switched between steps outside the timed step (the meter and every variant "
        "registered once, their hooks swapped in and out of torch's hook dictionaries, so the "
        "bare step runs torch's hook-free path); every step is timed alone, by this thread's "
        "CPU time and by the wall clock. A pair's difference is the counted step's time minus "
        "the bare step's; the figure is the median of a variant's differences, with its "
        "bootstrap 95% interval in brackets. On this kind of virtual machine blocks of 200 "
        "identical steps differ by up to 30%, so timing blocks against blocks cannot resolve "
        "10 us on a ~1 ms step; adjacent single steps share the machine's state of the moment. "
        f"{e['rounds']} rounds x {e['pairs_per_round']} pairs = {e['pairs']} pairs per variant, "
        f"{e['seconds']:.0f} s in all. The CPU-time figure leaves out time the thread waited "
        "while another process held the CPU, so it is the steadier one on a shared machine; "
        "it does not count work the meter does on other threads.",
        "",
        f"Bare step: {cpu['bare_step_us']:.0f} us of CPU time, {wall['bare_step_us']:.0f} us "
        "wall clock (medians).",
        "",
        "| counting | added per micro-batch, CPU time (us) | added, wall clock (us) "
        "| step, CPU time (us) |",
        "| --- | ---: | ---: | ---: |",
    ]
    for name, v in cpu["variants"].items():
        lines.append(
            f"| {E2E_LABELS.get(name, name)} | {_ci(v)} | {_ci(wall['variants'][name])} "
            f"| {v['step_us']:.0f} |"
        )
    lines += ["", *[f"- {E2E_LABELS.get(n, n)}: {d}." for n, d in e["descriptions"].items()]]
    fm, empty = cpu["variants"]["flopmeter"], cpu["variants"]["empty_hooks"]
    if fm["ci_high_us"] <= GOAL_US:
        verdict = "**met**"
    elif fm["ci_low_us"] > GOAL_US:
        verdict = "**not met**"
    else:
        verdict = "**not shown** (the interval straddles it)"
    lines += [
        "",
        f"Goal: at most {GOAL_US:.0f} us of host time per micro-batch: {verdict} in this run "
        f"(FlopMeter {_ci(fm)} us of the training thread's CPU time; "
        f"{fm['added_us'] - empty['added_us']:.1f} us above the empty hooks' "
        f"{empty['added_us']:.1f} us).",
    ]
    least = cpu["variants"].get("one_read")
    if least is not None:
        lines[-1] += (
            f" The least a meter that reads what the model is fed pays (empty hooks + one copy "
            f"of the mask) is {_ci(least)} us in the same run."
        )
        ratio = fm["added_us"] / least["added_us"]
        met = "**met**" if ratio <= FLOOR_RATIO_GOAL else "**not met**"
        lines += [
            "",
            f"Goal against that floor: FlopMeter's added time at most {FLOOR_RATIO_GOAL}x the "
            f"one copy's in the same run: {met} ({ratio:.2f}x, the ratio of the medians).",
        ]
    hook = _entries(data, "hook_cost")
    if hook:
        lines += [
            "",
            f"Beside it, the meter's own work timed alone (its hooks called in a loop on the "
            f"step benchmark's model, above): {hook[0]['stats']['median'] * 1e6:.1f} us. The "
            "end-to-end figure also holds what the hooks cost the rest of the step (caches, "
            "torch's hook dispatch, the allocator).",
        ]
    return [*lines, "", *_validation(cpu, wall, e.get("spins", {}))]


def _validation(cpu: dict[str, Any], wall: dict[str, Any], spins: dict[str, Any]) -> list[str]:
    lines = [
        "### The instrument's validation",
        "",
        "Known costs measured by the same protocol in the same run: the empty hooks with a "
        "busy-wait of about 5 and of about 20 us in the forward pre-hook (a pure-Python loop, "
        "calibrated before the run; its cost, timed alone before and after the run, is the "
        "known cost: on a shared machine it drifts). The excess of each over the empty hooks "
        "must be that cost.",
        "",
        "| busy-wait | known cost (us; before, after) | measured excess, CPU time (us) "
        "| measured excess, wall clock (us) | known cost inside the CPU-time interval |",
        "| --- | ---: | ---: | ---: | --- |",
    ]
    for c, w in zip(cpu["validation"], wall["validation"], strict=True):
        spin = spins.get(str(c["busy_us"]), {})
        lines.append(
            f"| about {c['busy_us']} us ({spin.get('iterations', '?')} iterations) "
            f"| {c['known_us']:.1f} ({spin.get('before_us', float('nan')):.1f}, "
            f"{spin.get('after_us', float('nan')):.1f}) "
            f"| {c['measured_us']:.1f} ({c['ci_low_us']:.1f} to "
            f"{c['ci_high_us']:.1f}) | {w['measured_us']:.1f} ({w['ci_low_us']:.1f} to "
            f"{w['ci_high_us']:.1f}) | {'yes' if c['inside'] else 'no'} |"
        )
    if all(c["resolved"] for c in cpu["validation"]):
        verdict = (
            "both known costs lie inside intervals at most 5 us wide: in this run the instrument "
            "resolves a 10 us cost (tells it from 0 and from 20 us)."
        )
    else:
        widest = max(c["ci_high_us"] - c["ci_low_us"] for c in cpu["validation"])
        verdict = (
            f"**not resolved in this run**: the widest interval is {widest:.1f} us (each known "
            "cost must lie inside an interval at most 5 us wide); the machine was too noisy "
            "for this run's size (see its load above): more pairs (`FLOPMETER_E2E_ROUNDS`) "
            "or a quieter machine."
        )
    return [*lines, "", f"Validation: {verdict}"]


def scaling_section(data: dict[str, Any]) -> list[str]:
    """The meter's cost per micro-batch against layers, sequence length and batch size."""
    lines = ["## The meter's cost against the model's size and the batch's shape", ""]
    found = _entries(data, "scaling")
    if not found:
        return [
            *lines,
            "Not run in this run (benchmarks/test_scaling.py failed or was deselected).",
        ]
    lines += [
        "A real FlopMeter (`pad_id=0, measure_every=0`) attached to a Hugging Face "
        "`LlamaForCausalLM` of the given depth (hidden size 32: the meter does not read the "
        "weights, and an 80-layer model builds in a second); its forward pre-hook and "
        "optimizer-step hook, found in torch's hook dictionaries, called as a training step "
        "calls them, on right-padded int64 ids with an attention mask. Median and fastest "
        "call of pytest-benchmark's rounds, microseconds per micro-batch. The hook reads the "
        "ids' shape and counts their tokens: its cost follows the tokens, not the layers.",
        "",
        "| layers | parameters | batch (rows x tokens) | tokens | median (us) | fastest (us) "
        "| rounds |",
        "| ---: | ---: | --- | ---: | ---: | ---: | ---: |",
    ]
    rows = sorted(
        found,
        key=lambda b: (
            b["extra_info"]["rows"] * b["extra_info"]["cols"] != 4096,  # the depth rows first
            b["extra_info"]["layers"],
            b["extra_info"]["rows"] * b["extra_info"]["cols"],
        ),
    )
    for b in rows:
        e, s = b["extra_info"], b["stats"]
        lines.append(
            f"| {e['layers']} | {e['parameters']:,} | {e['rows']} x {e['cols']} "
            f"| {e['rows'] * e['cols']:,} | {s['median'] * 1e6:.1f} | {s['min'] * 1e6:.1f} "
            f"| {s['rounds']} |"
        )
    return lines


def memory_section(data: dict[str, Any]) -> list[str]:
    """What the meter holds after many micro-batches."""
    lines = ["## The memory the meter holds", ""]
    found = _entries(data, "meter_memory")
    if not found:
        return [
            *lines,
            "Not run in this run (benchmarks/test_scaling.py::test_meter_memory "
            "failed or was deselected).",
        ]
    e = found[0]["extra_info"]
    lines += [
        "A FlopMeter on the 2-layer model of the scaling table, its hooks called on many "
        "micro-batches: one 4 x 48 shape repeated, and a new shape each micro-batch (1 x 16, "
        "1 x 17, ...). Tensor bytes: the storages of the tensors reachable from the meter "
        "(its device buffers; the model's parameters, buffers and gradients left out). Host: "
        "the Python objects reachable from it (`sys.getsizeof`), and the Python memory "
        "allocated since the meter was made and still held (tracemalloc; it also holds what "
        "torch and Python cache for themselves on first use).",
        "",
        "| micro-batches | distinct shapes | tensor bytes | host objects | host bytes "
        "| held since the meter was made (tracemalloc, bytes) |",
        "| ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for mode in ("same_shape", "new_shape_each"):
        for r in e.get(mode, []):
            lines.append(
                f"| {r['micro_batches']:,} | {r['distinct_shapes']:,} | {r['tensor_bytes']:,} "
                f"| {r['host_objects']:,} | {r['host_bytes']:,} | {r['traced_bytes']:,} |"
            )
    return lines


def planner_section(data: dict[str, Any]) -> list[str]:
    """The planner's timings: every pytest-benchmark entry of ``PLANNER_FILE``."""
    lines = ["## Planner timings", ""]
    found = [b for b in data["benchmarks"] if b.get("fullname", "").startswith(PLANNER_FILE)]
    if not found:
        return [*lines, f"Not run in this run ({PLANNER_FILE} absent, failed or deselected)."]
    lines += [
        f"`flopmeter estimate` timed by {PLANNER_FILE} (median and fastest of the rounds, "
        "seconds).",
        "",
        "| benchmark | what | median (s) | fastest (s) | rounds |",
        "| --- | --- | ---: | ---: | ---: |",
    ]
    for b in found:
        e = b.get("extra_info", {})
        what = e.get("description") or e.get("command") or e.get("what") or ""
        if isinstance(what, list):
            what = " ".join(map(str, what))
        s = b["stats"]
        lines.append(
            f"| {b['name']} | {what} | {s['median']:.3f} | {s['min']:.3f} | {s['rounds']} |"
        )
    return lines
