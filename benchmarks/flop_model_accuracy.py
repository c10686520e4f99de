"""How accurate is each FLOP formula? Prints the tables of docs/methodology.md.

Table 1 (small configurations, real tensors on the CPU): for seven architectures (Llama,
Qwen2 with GQA and tied embeddings, Mistral with a sliding window, Mixtral MoE, Gemma with
head_dim != hidden/heads, GPT-2 with Conv1D, Phi), full fine-tuning, LoRA (peft, r=8) and the
bottom half frozen, at 128 and 2048 tokens: the ``transformer`` estimate, PyTorch's
dispatch-level count (FlopCounterMode, eager attention and eager experts, PyTorch's formulas
only), their ratio, the ``measured`` count of the default implementations (SDPA, grouped-mm
experts) with flopmeter's formulas, and the seed formula and 6ND beside them.

Table 2 (bundled real configurations, built on the ``meta`` device: no memory, no download):
Llama-3.2-3B, Llama-3.1-8B, Qwen2.5-7B and Mixtral-8x7B at 4k and 32k tokens, full fine-tuning
and LoRA, the same columns (the dispatch count runs on meta tensors; Mixtral's experts through
grouped-mm with flopmeter's formula, since eager experts need real routing).

Run: ``.venv/bin/python benchmarks/flop_model_accuracy.py`` (a few minutes on 2 CPU cores);
``--table 1`` or ``--table 2`` for one of them, ``--table cost`` for the wall time of a sampled
training step against an unsampled one. Not part of the test run.
"""

from __future__ import annotations

import argparse
import platform
import time
from collections.abc import Callable
from typing import Any

import torch
from torch import nn
from torch.utils.flop_counter import FlopCounterMode

from flopmeter.counting.census import take_census
from flopmeter.flops.architecture import bundled_config
from flopmeter.flops.aten_ops import measured_formulas
from flopmeter.flops.capture import profile_model
from flopmeter.flops.estimates import n_active
from flopmeter.flops.formulas import seed_flops, six_nd_flops
from flopmeter.flops.transformer import transformer_estimate
from flopmeter.types import TokenTotals

VOCAB = 8192
SMALL = {
    "vocab_size": VOCAB,
    "hidden_size": 256,
    "intermediate_size": 688,
    "num_hidden_layers": 4,
    "num_attention_heads": 8,
}


def small_configs() -> dict[str, Any]:
    import transformers as t

    return {
        "Llama": t.LlamaConfig(**SMALL, num_key_value_heads=8),
        "Qwen2 (GQA, tied)": t.Qwen2Config(
            **SMALL, num_key_value_heads=2, tie_word_embeddings=True
        ),
        "Mistral (window 512)": t.MistralConfig(**SMALL, num_key_value_heads=2, sliding_window=512),
        "Mixtral (8 experts, top-2)": t.MixtralConfig(
            **SMALL, num_key_value_heads=2, num_local_experts=8, num_experts_per_tok=2
        ),
        "Gemma (head_dim 64)": t.GemmaConfig(**SMALL, num_key_value_heads=1, head_dim=64),
        "GPT-2 (Conv1D)": t.GPT2Config(
            vocab_size=VOCAB, n_embd=256, n_layer=4, n_head=8, n_positions=2048
        ),
        "Phi": t.PhiConfig(**SMALL, num_key_value_heads=8),
    }


def build(
    config: Any, mode: str, *, eager: bool, device: str = "cpu", lora: dict[str, Any] | None = None
) -> nn.Module:
    """A causal LM from ``config`` in ``mode`` (``full``, ``lora`` or ``frozen``), in training.

    Args:
        config: A transformers configuration.
        mode: ``full`` fine-tuning, ``lora`` (peft) or ``frozen`` (the bottom half).
        eager: Eager attention (and eager experts for Mixtral-style ``num_local_experts``).
        device: Where the weights are made (``meta``: nothing allocated).
        lora: ``peft.LoraConfig`` arguments; default r=8 on ``q_proj``/``v_proj`` (GPT-2
            ``c_attn``).
    """
    import peft
    import transformers as t

    torch.manual_seed(0)
    kwargs: dict[str, Any] = {}
    if eager:
        kwargs["attn_implementation"] = "eager"
        if getattr(config, "num_local_experts", None):
            kwargs["experts_implementation"] = "eager"
    with torch.device(device):
        model = t.AutoModelForCausalLM.from_config(config, **kwargs)
    if mode == "frozen":
        blocks = model.transformer.h if hasattr(model, "transformer") else model.model.layers
        model.get_input_embeddings().requires_grad_(False)
        for block in blocks[: len(blocks) // 2]:
            block.requires_grad_(False)
        if hasattr(model, "transformer"):
            model.transformer.wpe.requires_grad_(False)
    elif mode == "lora":
        gpt2 = config.model_type == "gpt2"
        targets = ["c_attn"] if gpt2 else ["q_proj", "v_proj"]
        arguments = lora or {"r": 8, "target_modules": targets}
        model = peft.get_peft_model(model, peft.LoraConfig(**arguments))
    return model.train()


def count(model: nn.Module, ids: torch.Tensor, mapping: dict | None = None) -> int:
    with FlopCounterMode(display=False, custom_mapping=mapping or {}) as counter:
        model(input_ids=ids, labels=ids).loss.backward()
    model.zero_grad(set_to_none=True)
    return counter.get_total_flops()


def pct(x: float, truth: float) -> str:
    return f"{100 * (x / truth - 1):+.1f}%"


def row(cells: list[str]) -> str:
    return "| " + " | ".join(cells) + " |"


def table_one(lengths: list[int], modes: list[str]) -> list[float]:
    print(
        row(
            [
                "architecture",
                "mode",
                "tokens",
                "transformer",
                "dispatch count",
                "transformer / count",
                "measured (sdpa, grouped-mm)",
                "seed",
                "6ND",
            ]
        )
    )
    print(row(["---"] * 3 + ["---:"] * 6))
    ratios = []
    for name, config in small_configs().items():
        for mode in modes:
            for length in lengths:
                eager = build(config, mode, eager=True)
                ids = torch.randint(0, VOCAB, (1, length))
                profile = profile_model(eager, input_ids=ids, labels=ids)
                totals = TokenTotals(
                    tokens_processed=length, sum_sq_seq_len=length * length, sequences=1
                )
                est = transformer_estimate(profile, totals).flops or 0.0
                truth = count(eager, ids)
                default = build(config, mode, eager=False)
                measured = count(default, ids, measured_formulas())
                census = take_census(eager)
                seed = seed_flops(census.n_total, census.n_trainable, length)
                six = six_nd_flops(census.n_total, length)
                ratios.append(est / truth)
                print(
                    row(
                        [
                            name,
                            mode,
                            f"{length:,}",
                            f"{est:.3e}",
                            f"{truth:.3e}",
                            f"{est / truth:.4f}",
                            f"{measured:.3e} ({pct(measured, truth)})",
                            f"{seed:.3e} ({pct(seed, truth)})",
                            f"{six:.3e} ({pct(six, truth)})",
                        ]
                    ),
                    flush=True,
                )
    return ratios


def table_two(lengths: list[int], modes: list[str]) -> list[float]:
    import transformers as t

    print(
        row(
            [
                "model",
                "mode",
                "tokens",
                "n_total / n_active",
                "transformer",
                "dispatch count (meta)",
                "transformer / count",
                "causal convention",
                "seed",
                "6ND",
            ]
        )
    )
    print(row(["---"] * 3 + ["---:"] * 7))
    ratios = []
    names = {
        "llama-3.2-3b": "Llama-3.2-3B",
        "llama-3.1-8b": "Llama-3.1-8B",
        "qwen2.5-7b": "Qwen2.5-7B",
        "mixtral-8x7b": "Mixtral-8x7B",
    }
    for key, name in names.items():
        config = t.AutoConfig.for_model(**bundled_config(key))
        for mode in modes:
            for length in lengths:
                model = build(config, mode, eager=config.model_type != "mixtral", device="meta")
                if config.model_type == "mixtral":  # eager experts route on values: not on meta
                    model.config._attn_implementation = "eager"
                ids = torch.zeros((1, length), dtype=torch.long, device="meta")
                profile = profile_model(model, input_ids=ids, labels=ids)
                totals = TokenTotals(
                    tokens_processed=length, sum_sq_seq_len=length * length, sequences=1
                )
                est = transformer_estimate(profile, totals).flops or 0.0
                causal = transformer_estimate(profile, totals, attention="causal").flops or 0.0
                truth = count(model, ids, measured_formulas())
                census = take_census(model)
                active = n_active(census, profile)
                seed = seed_flops(census.n_total, census.n_trainable, length)
                six = six_nd_flops(census.n_total, length)
                ratios.append(est / truth)
                print(
                    row(
                        [
                            name,
                            mode,
                            f"{length:,}",
                            f"{census.n_total / 1e9:.2f}B / "
                            + ("n/a" if active is None else f"{active / 1e9:.2f}B"),
                            f"{est:.3e}",
                            f"{truth:.3e}",
                            f"{est / truth:.4f}",
                            f"{causal:.3e} ({pct(causal, est)})",
                            f"{seed:.3e} ({pct(seed, est)})",
                            f"{six:.3e} ({pct(six, est)})",
                        ]
                    ),
                    flush=True,
                )
    return ratios


def sampling_cost(steps: int = 12, length: int = 512) -> None:
    """Wall time of a training step with and without a sampled (counted) micro-batch."""
    import statistics

    from flopmeter import FlopMeter

    config = small_configs()["Llama"]
    ids = torch.randint(0, VOCAB, (1, length))

    def timed(every: int | None) -> list[float]:
        model = build(config, "full", eager=False)
        optimizer = torch.optim.SGD(model.parameters(), lr=1e-4)
        meter = FlopMeter(model, measure_every=every).start() if every is not None else None
        times = []
        for _ in range(steps):
            start = time.perf_counter()
            model(input_ids=ids, labels=ids).loss.backward()
            optimizer.step()
            optimizer.zero_grad()
            times.append(time.perf_counter() - start)
        if meter is not None:
            meter.stop()
        return times[3:]  # after warm-up (micro-batches 1 and 2 are sampled in both)

    plain = statistics.median(timed(None))
    unsampled = statistics.median(timed(0))
    sampled = statistics.median(timed(1))
    print(f"Llama small config, 1 x {length} tokens, SGD step, median of {steps - 3} steps:")
    print(f"  no meter                  {1e3 * plain:8.1f} ms")
    print(f"  meter, step not sampled   {1e3 * unsampled:8.1f} ms")
    print(f"  meter, step sampled       {1e3 * sampled:8.1f} ms  ({sampled / unsampled:.2f}x)")
    extra = (sampled - unsampled) / 256 / unsampled
    print(f"  amortised at 1 in 256:    {100 * extra:+.2f}% per step")

    model = build(config, "full", eager=False)
    meter = FlopMeter(model).start()
    model(input_ids=ids, labels=ids).loss.backward()  # profile taken
    meter.flop_model.on_optimizer_step()
    n = 100_000
    start = time.perf_counter()
    for _ in range(n):
        meter.flop_model.on_training_forward(ids, 3)  # micro-batch 3: not due for a sample
    per_call = (time.perf_counter() - start) / n
    meter.stop()
    print(f"  FLOP-model work in the forward pre-hook, unsampled: {1e9 * per_call:.0f} ns")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--table", choices=["1", "2", "both", "cost"], default="both")
    args = parser.parse_args()
    print(
        f"machine: {platform.machine()}, {torch.get_num_threads()} threads, Python "
        f"{platform.python_version()}, torch {torch.__version__}\n"
    )
    runs: list[tuple[str, Callable[[], list[float]]]] = []
    if args.table in ("1", "both"):
        runs.append(("1", lambda: table_one([128, 2048], ["full", "lora", "frozen"])))
    if args.table in ("2", "both"):
        runs.append(("2", lambda: table_two([4096, 32768], ["full", "lora"])))
    if args.table == "cost":
        sampling_cost()
    for name, fn in runs:
        start = time.perf_counter()
        ratios = fn()
        worst = max(abs(r - 1) for r in ratios)
        print(
            f"\nTable {name}: {len(ratios)} rows, transformer within {100 * worst:.1e}% of the "
            f"dispatch count everywhere (goal 3%); {time.perf_counter() - start:.0f} s\n",
            flush=True,
        )


if __name__ == "__main__":
    main()
