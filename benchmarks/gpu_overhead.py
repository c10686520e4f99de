"""flopmeter's hot path on a CUDA GPU: sync-debug check, step overhead on a ~1B-parameter model,
and the fused token-statistics kernel against the naive torch expression.

Call :func:`run_gpu_checks` (``scripts/gpu_check.py`` does, where a GPU is lent) or run
``python benchmarks/gpu_overhead.py``. It prints one line per result and returns them as a dict.
It takes about two minutes on an H100-class GPU (most of it the 1B model's steps) and refuses
to run without CUDA.

Importing it from elsewhere::

    import importlib.util, pathlib
    path = pathlib.Path("benchmarks/gpu_overhead.py")
    spec = importlib.util.spec_from_file_location("gpu_overhead", path)
    module = importlib.util.module_from_spec(spec); spec.loader.exec_module(module)
    results = module.run_gpu_checks()
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _workloads import PAD_ID, Trainer, alternate, make_batches, variants
from flopmeter import FlopMeter
from flopmeter.tokens import stats as tokens
from flopmeter.tokens.batch import TokenInputs, new_buffer
from flopmeter.tokens.stats import accumulate_token_stats

#: A TinyLlama-shaped model: about 1.1e9 parameters.
ONE_B = {
    "vocab_size": 32000,
    "hidden_size": 2048,
    "intermediate_size": 5632,
    "num_hidden_layers": 22,
    "num_attention_heads": 32,
    "num_key_value_heads": 4,
    "max_position_embeddings": 2048,
}
KERNEL_SHAPES = [(8, 512), (16, 2048), (32, 4096), (64, 8192)]


# --------------------------------------------------------------------------- 1. sync debug
class _TinyLM(nn.Module):
    def __init__(self, vocab: int = 64, hidden: int = 32) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, hidden)
        self.embed.weight.requires_grad_(False)  # dense embedding backward is not the meter's
        self.head = nn.Linear(hidden, vocab)

    def forward(self, input_ids, attention_mask=None, labels=None, **kwargs: Any):
        logits = self.head(torch.tanh(self.embed(input_ids)))
        return F.cross_entropy(logits.flatten(0, -2), labels.flatten(), ignore_index=-100)


def _sync_batches(device: torch.device) -> list[dict[str, torch.Tensor]]:
    """Padded batches with and without masks, int32 and int64 ids, packed batches."""
    g = torch.Generator().manual_seed(0)
    out = []
    for i in range(6):
        lengths = torch.randint(1, 17, (4,), generator=g)
        mask = (torch.arange(16) < lengths[:, None]).long()
        ids = (torch.randint(1, 64, (4, 16), generator=g) * mask).to(
            torch.int32 if i % 2 else torch.int64
        )
        batch = {"input_ids": ids, "labels": ids.long().masked_fill(mask == 0, -100)}
        if i % 3:
            batch["attention_mask"] = mask
        out.append(batch)
    packed = torch.randint(1, 64, (1, 20), generator=g)
    docs = [6, 9, 5]
    out.append(
        {
            "input_ids": packed,
            "labels": packed,
            "position_ids": torch.cat([torch.arange(n) for n in docs]).unsqueeze(0),
        }
    )
    out.append(
        {"input_ids": packed, "labels": packed, "cu_seq_lens_q": torch.tensor([0, 6, 15, 20])}
    )
    return [{k: v.to(device) for k, v in b.items()} for b in out]


def sync_debug_check(device: torch.device, backend: str) -> dict[str, Any]:
    """A training loop under the meter with ``torch.cuda.set_sync_debug_mode("error")``.

    Every kind of batch runs once first (census, Triton compilation), then again in error mode.
    ``backend="torch"`` forces the torch fallback (as without Triton).
    """
    saved = tokens._triton_kernels
    if backend == "torch":
        tokens._triton_kernels = False
    try:
        torch.manual_seed(0)
        model = _TinyLM().to(device)
        optimizer = torch.optim.SGD(
            [p for p in model.parameters() if p.requires_grad], lr=0.1, momentum=0.9
        )
        batches = _sync_batches(device)

        def run() -> None:
            for batch in batches:
                model(**batch).backward()
                optimizer.step()
                optimizer.zero_grad()

        model.train()
        run()
        torch.cuda.synchronize()
        torch.cuda.set_sync_debug_mode("error")
        try:
            run()  # the bare loop must be sync-free for the check to mean anything
        except RuntimeError as exc:
            return {"ok": False, "backend": backend, "error": f"control (bare loop): {exc}"}
        finally:
            torch.cuda.set_sync_debug_mode(0)
        with FlopMeter(model, pad_id=PAD_ID) as meter:
            run()
            torch.cuda.synchronize()
            torch.cuda.set_sync_debug_mode("error")
            try:
                run()
                error = None
            except RuntimeError as exc:
                error = f"{type(exc).__name__}: {exc}"
            finally:
                torch.cuda.set_sync_debug_mode(0)
        used = "triton" if tokens._triton_kernels not in (None, False) else "torch"
        hook_errors = dict(meter.problems)
        report = meter.report()
        expected = 2 * sum(
            int(b["attention_mask"].sum())
            if "attention_mask" in b
            else int((b["input_ids"] != PAD_ID).sum())
            for b in batches
        )
        ok = error is None and not hook_errors and report.tokens.tokens_processed == expected
        return {
            "ok": ok,
            "backend": used,
            "error": error,
            "hook_errors": hook_errors,
            "tokens_processed": report.tokens.tokens_processed,
            "tokens_expected": expected,
        }
    finally:
        tokens._triton_kernels = saved


# --------------------------------------------------------------------------- 2. 1B step
def step_overhead_1b(device: torch.device, *, rounds: int = 6, steps: int = 5) -> dict[str, Any]:
    """Bare vs FlopMeter steps of a ~1.1B-parameter Llama (bf16, AdamW, 4 x 1024 batches)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(pad_token_id=PAD_ID, **ONE_B)
    config._attn_implementation = "sdpa"
    with torch.device(device):
        model = LlamaForCausalLM(config).to(torch.bfloat16)
    n_params = sum(p.numel() for p in model.parameters())
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-5, fused=True)
    batches = [
        {k: v.to(device) for k, v in b.items()}
        for b in make_batches(4, rows=4, cols=1024, vocab=ONE_B["vocab_size"])
    ]
    trainer = Trainer(model, batches, optimizer)
    variant = variants()["flopmeter"][0]
    assert variant is not None
    result = alternate(
        trainer, variant, rounds=rounds, steps=steps, synchronize=torch.cuda.synchronize
    )
    result["parameters"] = n_params
    del trainer, model, optimizer
    torch.cuda.empty_cache()
    return result


# --------------------------------------------------------------------------- 3. kernel
def _cuda_time_us(fn: Callable[[], None], iters: int = 200) -> float:
    for _ in range(10):
        fn()
    torch.cuda.synchronize()
    start = torch.cuda.Event(enable_timing=True)
    end = torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(iters):
        fn()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / iters * 1e3


def kernel_timing(device: torch.device) -> list[dict[str, Any]]:
    """Microseconds per batch (launch included) of the token statistics, by implementation."""
    have_triton = tokens._load_triton() is not False
    return [_time_shape(device, rows, cols, have_triton) for rows, cols in KERNEL_SHAPES]


def _time_shape(device: torch.device, rows: int, cols: int, have_triton: bool) -> dict[str, Any]:
    g = torch.Generator().manual_seed(0)
    lengths = torch.randint(cols // 4, cols + 1, (rows,), generator=g)
    ids = torch.randint(1, 32000, (rows, cols), generator=g)
    ids = ids.masked_fill(torch.arange(cols) >= lengths[:, None], PAD_ID).to(device)
    pos = torch.arange(cols).remainder(777).expand(rows, cols).contiguous().to(device)
    buffer = new_buffer(device)

    def naive() -> None:
        real = ids != PAD_ID
        n = real.sum(-1)
        buffer[0] += real.sum()
        buffer[1] += real.numel()
        buffer[2] += (n > 0).sum()
        buffer[3] += (n * n).sum()

    def ours(backend: str, packed: bool = False) -> Callable[[], None]:
        inputs = TokenInputs(input_ids=ids, position_ids=pos if packed else None)
        return lambda: accumulate_token_stats(buffer, inputs, pad_id=PAD_ID, backend=backend)

    row: dict[str, Any] = {"batch": f"{rows}x{cols}", "naive_us": _cuda_time_us(naive)}
    row["torch_us"] = _cuda_time_us(ours("torch"))
    if not have_triton:
        row["triton_us"] = None
        row["note"] = "Triton not installed: the fused kernel is not available"
        return row
    row["triton_us"] = _cuda_time_us(ours("triton"))
    row["triton_packed_us"] = _cuda_time_us(ours("triton", packed=True))
    # the kernel and the torch reference agree on this batch
    a, b = new_buffer(device), new_buffer(device)
    accumulate_token_stats(
        a, TokenInputs(input_ids=ids, position_ids=pos), pad_id=PAD_ID, backend="triton"
    )
    accumulate_token_stats(
        b, TokenInputs(input_ids=ids, position_ids=pos), pad_id=PAD_ID, backend="torch"
    )
    row["agree"] = a.tolist() == b.tolist()
    return row


# --------------------------------------------------------------------------- all
def run_gpu_checks(print_fn: Callable[[str], None] = print) -> dict[str, Any]:
    """Runs the three GPU checks and prints their results.

    Returns:
        ``{"sync_debug": {...}, "step_overhead_1b": {...}, "kernel": [...]}``.

    Raises:
        RuntimeError: CUDA is not available.
    """
    if not torch.cuda.is_available():
        raise RuntimeError("benchmarks/gpu_overhead.py needs a CUDA GPU")
    device = torch.device("cuda", torch.cuda.current_device())
    t0 = time.perf_counter()
    print_fn(
        f"flopmeter GPU checks on {torch.cuda.get_device_name(device)}, torch {torch.__version__}"
    )
    results: dict[str, Any] = {"sync_debug": {}}
    for backend in ("triton", "torch"):
        r = sync_debug_check(device, backend)
        results["sync_debug"][backend] = r
        verdict = "PASS" if r["ok"] else "FAIL"
        print_fn(
            f"sync-debug ({backend} requested, {r['backend']} used): {verdict}"
            + ("" if r["ok"] else f" ({r.get('error') or r.get('hook_errors') or 'miscount'})")
        )
    r = step_overhead_1b(device)
    results["step_overhead_1b"] = r
    print_fn(
        f"1B step overhead ({r['parameters'] / 1e9:.2f}e9 parameters, bf16, 4x1024): median ratio "
        f"{r['median_ratio']:.4f} (quartiles {r['ratio_q1']:.4f} to {r['ratio_q3']:.4f}), bare "
        f"{r['bare_step_ms']:.1f} ms, metered {r['counted_step_ms']:.1f} ms, "
        f"{r['rounds']} x {r['steps_per_block']} steps"
    )
    rows = kernel_timing(device)
    results["kernel"] = rows
    for row in rows:
        triton = (
            f"fused Triton {row['triton_us']:.1f} us, packed {row['triton_packed_us']:.1f} us, "
            f"agrees with torch: {row['agree']}"
            if row["triton_us"] is not None
            else row["note"]
        )
        print_fn(
            f"token stats {row['batch']}: {triton}; naive torch {row['naive_us']:.1f} us; "
            f"torch path {row['torch_us']:.1f} us"
        )
    print_fn(f"GPU checks took {time.perf_counter() - t0:.0f} s")
    return results


if __name__ == "__main__":
    run_gpu_checks()
