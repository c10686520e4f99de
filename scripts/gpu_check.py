#!/usr/bin/env python
"""Checks flopmeter's hardware readings on a real GPU (CI never runs it).

Fine-tunes a Llama-style model built from a config (no download) on ``cuda:0`` for a short
while under :class:`flopmeter.FlopMeter` with NVML on, then prints the device name, the peak
found in the table, the energy read, the utilisation, the MFU, and every reading that is
missing. As an independent check it measures one step's FLOP with torch's FlopCounterMode and
compares the MFU that gives with the meter's. Then (unless ``--skip-overhead``) it runs
benchmarks/gpu_overhead.py: a training loop under ``torch.cuda.set_sync_debug_mode("error")``,
the step overhead on a ~1B-parameter model, and the fused token-statistics kernel against the
naive expression. Whole run: about three to four minutes.

Without a CUDA GPU (or with ``--dry-run``) it says so and exits 0.

Usage::

    python scripts/gpu_check.py                 # three to four minutes on a GPU
    python scripts/gpu_check.py --seconds 20 --dtype bf16
    python scripts/gpu_check.py --dry-run

Exit status: 0 when every hardware reading exists (or there is no GPU), 1 when one is missing.
"""

from __future__ import annotations

import argparse
import sys
import time

HARDWARE_FIELDS = (
    "gpu_name",
    "gpu_count",
    "peak_flops_per_second",
    "bound_flops",
    "utilization_weighted_bound_flops",
    "mfu",
    "energy_joules",
    "energy_kwh",
    "average_power_watts",
)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dry-run", action="store_true", help="check nothing, exit 0")
    parser.add_argument("--seconds", type=float, default=45.0, help="training time, s")
    parser.add_argument("--interval", type=float, default=0.5, help="NVML sampling interval, s")
    parser.add_argument("--dtype", default="bf16", choices=["bf16", "fp16"], help="autocast dtype")
    parser.add_argument("--hidden", type=int, default=2048, help="hidden size")
    parser.add_argument("--layers", type=int, default=8, help="decoder layers")
    parser.add_argument("--batch", type=int, default=8, help="sequences per step")
    parser.add_argument("--seq", type=int, default=1024, help="tokens per sequence")
    parser.add_argument(
        "--skip-overhead",
        action="store_true",
        help="skip benchmarks/gpu_overhead.py (sync-debug check, 1B step overhead, kernel time)",
    )
    return parser.parse_args(argv)


def run_overhead_checks() -> dict:
    """benchmarks/gpu_overhead.py's checks: sync-debug mode, ~1B-parameter step overhead, and
    the fused kernel against the naive expression (about two minutes)."""
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[1] / "benchmarks" / "gpu_overhead.py"
    spec = importlib.util.spec_from_file_location("gpu_overhead", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.run_gpu_checks()


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    import torch

    if args.dry_run or not torch.cuda.is_available():
        why = "--dry-run" if args.dry_run else "torch sees no CUDA GPU"
        print(f"gpu_check: no GPU check ({why}); nothing to do.")
        return 0

    from torch.utils.flop_counter import FlopCounterMode
    from transformers import LlamaConfig, LlamaForCausalLM

    from flopmeter import FlopMeter
    from flopmeter.hardware import peak_entry, peak_flops

    torch.backends.cuda.matmul.allow_tf32 = True
    device = torch.device("cuda", 0)
    torch.cuda.set_device(device)
    amp_dtype = torch.bfloat16 if args.dtype == "bf16" else torch.float16
    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=32000,
        hidden_size=args.hidden,
        intermediate_size=int(args.hidden * 8 / 3) // 64 * 64,
        num_hidden_layers=args.layers,
        num_attention_heads=args.hidden // 128,
        num_key_value_heads=max(1, args.hidden // 512),
        max_position_embeddings=args.seq,
    )
    model = LlamaForCausalLM(config).to(device)
    model.train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=True)
    scaler = torch.amp.GradScaler("cuda", enabled=amp_dtype == torch.float16)

    def step() -> None:
        ids = torch.randint(1, config.vocab_size, (args.batch, args.seq), device=device)
        with torch.autocast("cuda", dtype=amp_dtype):
            loss = model(input_ids=ids, labels=ids).loss
        scaler.scale(loss).backward()
        scaler.step(optimizer)
        scaler.update()
        optimizer.zero_grad(set_to_none=True)

    step()  # warm-up (allocations, kernels), outside the meter
    counter = FlopCounterMode(display=False)
    with counter:
        step()
    flop_per_step = counter.get_total_flops()
    torch.cuda.synchronize()

    torch_name = torch.cuda.get_device_name(device)
    torch_uuid = str(getattr(torch.cuda.get_device_properties(device), "uuid", "?"))
    steps = 0
    with FlopMeter(
        model, model_name="gpu_check/llama", dtype=args.dtype, nvml_interval_seconds=args.interval
    ) as meter:
        start = time.monotonic()
        while time.monotonic() - start < args.seconds:
            step()
            steps += 1
        torch.cuda.synchronize()  # the GPU work is inside the window
    report = meter.report()

    entry = peak_entry(report.hardware.gpu_name)
    table_peak = peak_flops(report.hardware.gpu_name, args.dtype)
    print(f"torch device        {torch_name} (uuid {torch_uuid})")
    print(f"NVML device         {report.hardware.gpu_name} x {report.hardware.gpu_count}")
    print(
        f"peak ({args.dtype})         "
        + (f"{table_peak:.4e} FLOP/s ({entry.product}; {entry.source})" if entry else "not found")
    )
    print(f"training            {steps} steps in {report.run.training_duration_seconds:.1f} s")
    print(
        f"energy              {report.hardware.energy_joules} J, {report.hardware.energy_kwh} kWh"
    )
    print(f"average power       {report.hardware.average_power_watts} W")
    if report.hardware.bound_flops and report.hardware.utilization_weighted_bound_flops is not None:
        util = report.hardware.utilization_weighted_bound_flops / report.hardware.bound_flops
        print(f"mean utilisation    {util:.1%} (NVML: share of time a kernel ran)")
    else:
        print("mean utilisation    missing")
    print(f"flops_architecture  {report.compute.primary_flops} ({report.compute.primary_estimate})")
    print(f"bound_flops         {report.hardware.bound_flops}")
    print(f"MFU (meter)         {report.hardware.mfu}")
    if report.hardware.bound_flops:
        measured = steps * flop_per_step
        print(
            f"MFU (FlopCounter)   {measured / report.hardware.bound_flops:.4f} "
            f"({flop_per_step:.3e} FLOP per step measured)"
        )
    missing = [name for name in HARDWARE_FIELDS if getattr(report.hardware, name) is None]
    print(f"missing readings    {', '.join(missing) if missing else 'none'}")
    for note in report.hardware.notes:
        print(f"note                {note}")
    status = 1 if missing else 0
    if report.hardware.gpu_count != 1:
        print("UNEXPECTED: the meter should monitor exactly the one GPU this process uses")
        status = 1
    if not args.skip_overhead:
        del model, optimizer
        torch.cuda.empty_cache()
        print("---- overhead (benchmarks/gpu_overhead.py)")
        try:
            run_overhead_checks()
        except Exception as exc:  # report it, keep the NVML results above
            print(f"overhead checks failed: {type(exc).__name__}: {exc}")
            status = 1
    return status


if __name__ == "__main__":
    sys.exit(main())
