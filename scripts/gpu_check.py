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

One command from a fresh copy of the repository: ``python3 scripts/gpu_check.py`` with any
Python that has torch (and transformers; triton and nvidia-ml-py for the kernel and the
readings). When ``flopmeter`` is not installed, the copy's ``src/`` is used, so no install is
needed; flopmeter's own dependencies (pydantic, numpy) must be importable: on a machine without
network, carry their wheels (``pydantic``, ``pydantic-core``, ``annotated-types``,
``typing-inspection``, ``typing-extensions``) and put them on ``PYTHONPATH``.

Its results are written as JSON to ``--json PATH``, or to ``$OUT/gpu_check.json`` when the
``OUT`` variable is set (whatever happens: a check that fails or a missing GPU is recorded with
its reason), and a summary is printed at the end.

Usage::

    python3 scripts/gpu_check.py                 # three to four minutes on a GPU
    python3 scripts/gpu_check.py --seconds 20 --dtype bf16 --json results.json
    python3 scripts/gpu_check.py --dry-run       # imports and arguments only, no GPU needed

Exit status: 0 when every check passed and every hardware reading exists (or ``--dry-run``),
1 when a check failed or a reading is missing, 2 when torch sees no CUDA GPU.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import sys
import time
import traceback
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
#: Exit status when torch sees no CUDA GPU (a GPU check that checked nothing is no success).
NO_GPU = 2

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
    parser.add_argument(
        "--dry-run",
        action="store_true",
        help="check the imports and the arguments only (no GPU needed), exit 0",
    )
    parser.add_argument(
        "--json",
        type=Path,
        default=None,
        help="write the results here as JSON (default: $OUT/gpu_check.json when OUT is set)",
    )
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
    args = parser.parse_args(argv)
    for name in ("seconds", "interval"):
        if getattr(args, name) <= 0:
            parser.error(f"--{name} must be positive")
    for name in ("hidden", "layers", "batch", "seq"):
        if getattr(args, name) < 1:
            parser.error(f"--{name} must be at least 1")
    if args.hidden % 128:
        parser.error("--hidden must be a multiple of 128 (heads of 128)")
    return args


def json_path(args: argparse.Namespace, environ: dict[str, str] | None = None) -> Path | None:
    """Where the results go: ``--json``, else ``$OUT/gpu_check.json``, else nowhere."""
    env = os.environ if environ is None else environ
    if args.json is not None:
        return args.json
    return Path(env["OUT"]) / "gpu_check.json" if env.get("OUT") else None


def ensure_flopmeter() -> str:
    """Makes ``flopmeter`` importable (the copy's ``src/`` when it is not installed) and
    returns where it was imported from."""
    try:
        import flopmeter
    except ModuleNotFoundError as exc:
        if exc.name != "flopmeter":
            raise
        sys.path.insert(0, str(ROOT / "src"))
        import flopmeter
    return str(Path(flopmeter.__file__).parent)


def load_overhead_module() -> Any:
    """benchmarks/gpu_overhead.py, imported (it needs no GPU to import)."""
    import importlib.util

    path = ROOT / "benchmarks" / "gpu_overhead.py"
    spec = importlib.util.spec_from_file_location("gpu_overhead", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def run_overhead_checks() -> dict[str, Any]:
    """benchmarks/gpu_overhead.py's checks: sync-debug mode, ~1B-parameter step overhead, and
    the fused kernel against the naive expression (about two minutes)."""
    return load_overhead_module().run_gpu_checks()


def hardware_check(args: argparse.Namespace) -> dict[str, Any]:
    """Fine-tunes the Llama-style model under the meter with NVML on; prints and returns the
    readings (``missing`` lists the hardware fields the report left empty)."""
    import torch
    from torch.utils.flop_counter import FlopCounterMode
    from transformers import LlamaConfig, LlamaForCausalLM

    from flopmeter import FlopMeter
    from flopmeter.hardware.peaks import peak_entry, peak_flops

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
    hw = report.hardware

    entry = peak_entry(hw.gpu_name)
    table_peak = peak_flops(hw.gpu_name, args.dtype)
    out: dict[str, Any] = {
        "torch_device": torch_name,
        "torch_uuid": torch_uuid,
        "steps": steps,
        "training_seconds": report.run.training_duration_seconds,
        "flop_per_step_flop_counter": flop_per_step,
        "peak_flops_per_second_table": table_peak,
        "peak_source": f"{entry.product}; {entry.source}" if entry else None,
        "primary_flops": report.compute.primary_flops,
        "primary_estimate": report.compute.primary_estimate,
        **{name: getattr(hw, name) for name in HARDWARE_FIELDS},
        "notes": list(hw.notes),
    }
    print(f"torch device        {torch_name} (uuid {torch_uuid})")
    print(f"NVML device         {hw.gpu_name} x {hw.gpu_count}")
    print(
        f"peak ({args.dtype})         "
        + (f"{table_peak:.4e} FLOP/s ({entry.product}; {entry.source})" if entry else "not found")
    )
    print(f"training            {steps} steps in {report.run.training_duration_seconds:.1f} s")
    print(f"energy              {hw.energy_joules} J, {hw.energy_kwh} kWh")
    print(f"average power       {hw.average_power_watts} W")
    if hw.bound_flops and hw.utilization_weighted_bound_flops is not None:
        out["mean_utilization"] = hw.utilization_weighted_bound_flops / hw.bound_flops
        print(
            f"mean utilisation    {out['mean_utilization']:.1%} (NVML: share of time a kernel ran)"
        )
    else:
        out["mean_utilization"] = None
        print("mean utilisation    missing")
    print(f"flops_architecture  {report.compute.primary_flops} ({report.compute.primary_estimate})")
    print(f"bound_flops         {hw.bound_flops}")
    print(f"MFU (meter)         {hw.mfu}")
    out["mfu_flop_counter"] = None
    if hw.bound_flops:
        out["mfu_flop_counter"] = steps * flop_per_step / hw.bound_flops
        print(
            f"MFU (FlopCounter)   {out['mfu_flop_counter']:.4f} "
            f"({flop_per_step:.3e} FLOP per step measured)"
        )
    out["missing"] = [name for name in HARDWARE_FIELDS if getattr(hw, name) is None]
    print(f"missing readings    {', '.join(out['missing']) if out['missing'] else 'none'}")
    for note in hw.notes:
        print(f"note                {note}")
    out["ok"] = not out["missing"] and hw.gpu_count == 1
    if hw.gpu_count != 1:
        print("UNEXPECTED: the meter should monitor exactly the one GPU this process uses")
    return out


def summary(results: dict[str, Any]) -> list[str]:
    """The results in a few lines (what the JSON holds, shortened)."""
    if not results.get("ran"):
        return [f"gpu_check: nothing checked ({results.get('reason')})"]
    lines = [f"gpu_check on {results.get('device')}, torch {results.get('torch')}"]
    hw = results.get("hardware")
    if hw is not None:
        missing = hw.get("missing") or hw.get("error") or "none"
        lines.append(
            f"  hardware readings: {'ok' if hw.get('ok') else 'NOT OK'} (missing: {missing})"
        )
    over = results.get("overhead")
    if over is not None and "error" in over:
        lines.append(f"  overhead checks FAILED: {over['error']}")
    elif over is not None:
        for backend, r in over.get("sync_debug", {}).items():
            lines.append(f"  sync-debug ({backend}): {'PASS' if r.get('ok') else 'FAIL'}")
        r = over.get("step_overhead_1b") or {}
        if r:
            lines.append(
                f"  1B step ratio: {r['median_ratio']:.4f} (bare {r['bare_step_ms']:.1f} ms)"
            )
        for row in over.get("kernel", []):
            lines.append(
                f"  token stats {row['batch']}: triton {row.get('triton_us')} us, "
                f"naive {row['naive_us']:.1f} us"
            )
    lines.append(f"  exit status {results.get('status')}")
    return lines


def _overhead_ok(over: dict[str, Any]) -> bool:
    sync_ok = all(r.get("ok") for r in over.get("sync_debug", {}).values())
    agree = all(row.get("agree", True) for row in over.get("kernel", []))
    return "error" not in over and sync_ok and agree


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    results: dict[str, Any] = {
        "ran": False,
        "started": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "argv": sys.argv[1:] if argv is None else list(argv),
    }
    path = json_path(args)
    status = 1
    try:
        results["flopmeter_from"] = ensure_flopmeter()
        import torch

        results["torch"] = torch.__version__
        results["torch_cuda"] = torch.version.cuda
        if args.dry_run:
            import transformers

            results["transformers"] = transformers.__version__
            load_overhead_module()
            results["reason"] = "--dry-run: imports and arguments checked, nothing run"
            status = 0
        elif not torch.cuda.is_available():
            results["reason"] = (
                f"torch sees no CUDA GPU (torch {torch.__version__}, built for CUDA "
                f"{torch.version.cuda or 'none: a CPU-only build'})"
            )
            print(f"gpu_check: ERROR: {results['reason']}; nothing checked.", file=sys.stderr)
            status = NO_GPU
        else:
            results["ran"] = True
            results["device"] = torch.cuda.get_device_name(0)
            try:
                results["hardware"] = hardware_check(args)
            except Exception as exc:  # record it, go on to the overhead checks
                traceback.print_exc()
                results["hardware"] = {"ok": False, "error": f"{type(exc).__name__}: {exc}"}
            torch.cuda.empty_cache()
            ok = results["hardware"]["ok"]
            if not args.skip_overhead:
                print("---- overhead (benchmarks/gpu_overhead.py)")
                try:
                    results["overhead"] = run_overhead_checks()
                except Exception as exc:  # report it, keep the NVML results above
                    traceback.print_exc()
                    results["overhead"] = {"error": f"{type(exc).__name__}: {exc}"}
                ok = ok and _overhead_ok(results["overhead"])
            status = 0 if ok else 1
    except Exception as exc:
        traceback.print_exc()
        results["error"] = f"{type(exc).__name__}: {exc}"
        status = 1
    finally:
        results["status"] = status
        results["finished"] = datetime.datetime.now(datetime.timezone.utc).isoformat(
            timespec="seconds"
        )
        if path is not None:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(json.dumps(results, indent=2, default=str) + "\n")
        for line in summary(results):
            print(line)
        if path is not None:
            print(f"gpu_check: results written to {path}")
    return status


if __name__ == "__main__":
    sys.exit(main())
