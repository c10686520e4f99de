"""The full-size accuracy table of docs/methodology.md: every method against the dispatch count.

Twelve published models, built from their ``config.json`` values (written below, nothing
downloaded) on the ``meta`` device, so nothing is allocated and no arithmetic runs; full
fine-tuning and LoRA (peft, ``target_modules="all-linear"``, r=16); one sequence of 512 and of
4096 tokens, no padding. For each row:

* **truth**: PyTorch's dispatch count (``FlopCounterMode``) of one training step, forward and
  backward, eager attention (PyTorch's own formulas); mixture-of-experts layers through
  ``grouped_mm`` with flopmeter's formula (eager experts route on values, which meta tensors do
  not have). Printed per token. Mixture-of-experts models are built in bfloat16 (``grouped_mm``'s
  meta kernel takes nothing else) and run with :func:`meta_autocast` (peft's LoRA on 3-D expert
  weights enters a disabled ``torch.autocast`` on the weight's device, which has no meta
  backend); neither changes a FLOP count, and truth and estimates share the model;
* flopmeter's estimates, read from ``report.compute.estimates`` of a ``FlopMeter`` around one training
  step of the model as a user runs it (default attention, SDPA), as ratios to the truth;
* the peers (calflops, ptflops, fvcore, DeepSpeed's flops profiler), as ratios to the truth;
  ``n/a (why)`` where one is not installed or cannot run on meta tensors. Peers that count a
  forward pass only are converted as users do: training = 3 x forward, forward = 2 x MACs.

Run: ``.venv/bin/python benchmarks/full_size_table.py`` (peers from ``pip install -e .[bench]``);
``--no-peers`` for flopmeter's columns only, ``--json FILE`` to keep the rows. Not part of the
test run (``tests/test_full_size_table.py`` runs two small rows).
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import platform
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

from flop_model_accuracy import build, count, row  # benchmarks/ (the script's folder)
from flopmeter import FlopMeter
from flopmeter.flops import bundled_config
from flopmeter.flops.aten_ops import measured_formulas
from flopmeter.planner.build import _MetaAutocast, meta_autocast  # noqa: F401 (tests read it)

LENGTHS = (512, 4096)
MODES = ("full", "lora")
LORA = {"r": 16, "target_modules": "all-linear"}
ESTIMATES = ("transformer", "measured", "seed", "six_nd")

# The published config.json values (the geometry; tokenizer ids and dtypes left out).
_QWEN_VOCAB = 151936
MODELS: dict[str, dict[str, Any] | str] = {
    "Llama-3-8B": {
        "model_type": "llama",
        "vocab_size": 128256,
        "hidden_size": 4096,
        "intermediate_size": 14336,
        "num_hidden_layers": 32,
        "num_attention_heads": 32,
        "num_key_value_heads": 8,
        "max_position_embeddings": 8192,
        "rope_theta": 500000.0,
        "rms_norm_eps": 1e-5,
        "tie_word_embeddings": False,
    },
    "Mistral-7B-v0.1": {
        "model_type": "mistral",
        "vocab_size": 32000,
        "hidden_size": 4096,
        "intermediate_size": 14336,
        "num_hidden_layers": 32,
        "num_attention_heads": 32,
        "num_key_value_heads": 8,
        "max_position_embeddings": 32768,
        "sliding_window": 4096,
        "rope_theta": 10000.0,
        "tie_word_embeddings": False,
    },
    "Qwen2.5-7B": "qwen2.5-7b",  # bundled: src/flopmeter/data/configs/
    "Qwen2.5-0.5B": {
        "model_type": "qwen2",
        "vocab_size": _QWEN_VOCAB,
        "hidden_size": 896,
        "intermediate_size": 4864,
        "num_hidden_layers": 24,
        "num_attention_heads": 14,
        "num_key_value_heads": 2,
        "max_position_embeddings": 32768,
        "max_window_layers": 24,
        "sliding_window": 32768,
        "use_sliding_window": False,
        "rope_theta": 1000000.0,
        "tie_word_embeddings": True,
    },
    "Qwen3-8B": {
        "model_type": "qwen3",
        "vocab_size": _QWEN_VOCAB,
        "hidden_size": 4096,
        "intermediate_size": 12288,
        "num_hidden_layers": 36,
        "num_attention_heads": 32,
        "num_key_value_heads": 8,
        "head_dim": 128,
        "max_position_embeddings": 40960,
        "rope_theta": 1000000.0,
        "tie_word_embeddings": False,
    },
    "Gemma-2-9B": {
        "model_type": "gemma2",
        "vocab_size": 256000,
        "hidden_size": 3584,
        "intermediate_size": 14336,
        "num_hidden_layers": 42,
        "num_attention_heads": 16,
        "num_key_value_heads": 8,
        "head_dim": 256,
        "max_position_embeddings": 8192,
        "sliding_window": 4096,
        "query_pre_attn_scalar": 256,
        "attn_logit_softcapping": 50.0,
        "final_logit_softcapping": 30.0,
        "tie_word_embeddings": True,
    },
    "Phi-3-mini-4k": {
        "model_type": "phi3",
        "vocab_size": 32064,
        "hidden_size": 3072,
        "intermediate_size": 8192,
        "num_hidden_layers": 32,
        "num_attention_heads": 32,
        "num_key_value_heads": 32,
        "max_position_embeddings": 4096,
        "sliding_window": 2047,
        "tie_word_embeddings": False,
    },
    "GPT-2": {
        "model_type": "gpt2",
        "vocab_size": 50257,
        "n_embd": 768,
        "n_layer": 12,
        "n_head": 12,
        "n_positions": 1024,
    },
    "Pythia-1.4B": {
        "model_type": "gpt_neox",
        "vocab_size": 50304,
        "hidden_size": 2048,
        "intermediate_size": 8192,
        "num_hidden_layers": 24,
        "num_attention_heads": 16,
        "max_position_embeddings": 2048,
        "rotary_pct": 0.25,
        "use_parallel_residual": True,
        "tie_word_embeddings": False,
    },
    "Mixtral-8x7B": "mixtral-8x7b",  # bundled
    "Qwen3-30B-A3B": {
        "model_type": "qwen3_moe",
        "vocab_size": _QWEN_VOCAB,
        "hidden_size": 2048,
        "intermediate_size": 6144,
        "moe_intermediate_size": 768,
        "num_hidden_layers": 48,
        "num_attention_heads": 32,
        "num_key_value_heads": 4,
        "head_dim": 128,
        "num_experts": 128,
        "num_experts_per_tok": 8,
        "decoder_sparse_step": 1,
        "mlp_only_layers": [],
        "norm_topk_prob": True,
        "max_position_embeddings": 40960,
        "rope_theta": 1000000.0,
        "tie_word_embeddings": False,
    },
    "OLMoE-1B-7B": {
        "model_type": "olmoe",
        "vocab_size": 50304,
        "hidden_size": 2048,
        "intermediate_size": 1024,
        "num_hidden_layers": 16,
        "num_attention_heads": 16,
        "num_key_value_heads": 16,
        "num_experts": 64,
        "num_experts_per_tok": 8,
        "norm_topk_prob": False,
        "max_position_embeddings": 4096,
        "tie_word_embeddings": False,
    },
}


@dataclass
class Row:
    """One model, mode and length: the truth and every method's ratio to it.

    Attributes:
        model: The model's name (a key of :data:`MODELS`).
        mode: ``full`` or ``lora``.
        tokens: Tokens of the one sequence.
        truth: The dispatch count of one training step, FLOP (``None`` when not run).
        ratios: Method name to its figure over the truth, or ``"n/a (why)"``.
    """

    model: str
    mode: str
    tokens: int
    truth: float | None = None
    ratios: dict[str, float | str] = field(default_factory=dict)


def model_config(name: str) -> Any:
    """The transformers configuration of ``MODELS[name]``.

    Mixture-of-experts models are built in bfloat16 (their published dtype): their experts run
    through ``torch._grouped_mm``, whose meta kernel accepts bfloat16 only. The dtype changes no
    FLOP count, and the truth and the estimates are taken on the same model.
    """
    import transformers

    values = MODELS[name]
    values = bundled_config(values) if isinstance(values, str) else values
    config = transformers.AutoConfig.for_model(**values)
    if is_moe(config):
        config.dtype = torch.bfloat16
    return config


def is_moe(config: Any) -> bool:
    """Whether the model has routed experts (Mixtral's ``num_local_experts``, ``num_experts``)."""
    return bool(getattr(config, "num_local_experts", None) or getattr(config, "num_experts", None))


def context_limit(config: Any) -> int | None:
    """Tokens a learned position table allows (GPT-2's ``n_positions``), else ``None``."""
    return getattr(config, "n_positions", None)


def meta_model(config: Any, mode: str) -> nn.Module:
    """The model on meta, default implementations (SDPA attention, grouped-mm experts)."""
    return build(config, mode, eager=False, device="meta", lora=LORA)


def meter_estimates(model: nn.Module, ids: torch.Tensor) -> dict[str, float | None]:
    """flopmeter's estimates of one training step, from a ``FlopMeter`` run's report."""
    optimizer = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=0.0)
    with FlopMeter(model, optimizer=optimizer, nvml=False) as meter:
        model(input_ids=ids, labels=ids).loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    estimates = meter.report().compute.estimates
    return {name: estimates[name].flops for name in ESTIMATES}


def dispatch_truth(model: nn.Module, ids: torch.Tensor) -> float:
    """PyTorch's dispatch count of a forward and backward pass with eager attention."""
    base_config = model.config
    previous = base_config._attn_implementation
    base_config._attn_implementation = "eager"
    try:
        return float(count(model, ids, measured_formulas()))
    finally:
        base_config._attn_implementation = previous


# --------------------------------------------------------------------------- the peers
# Each takes the model (eager attention) and the ids, and returns training FLOP.
def _calflops(model: nn.Module, ids: torch.Tensor) -> float:
    from calflops import calculate_flops

    flops, _, _ = calculate_flops(
        model=model,
        kwargs={"input_ids": ids},
        include_backPropagation=True,  # its convention: backward = 2 x forward
        print_results=False,
        print_detailed=False,
        output_as_string=False,
    )
    return float(flops)


def _ptflops(model: nn.Module, ids: torch.Tensor) -> float:
    from ptflops import get_model_complexity_info

    macs, _ = get_model_complexity_info(
        model,
        tuple(ids.shape),
        input_constructor=lambda _: {"input_ids": ids},
        as_strings=False,
        print_per_layer_stat=False,
        verbose=False,
    )
    return 6.0 * float(macs)


def _fvcore(model: nn.Module, ids: torch.Tensor) -> float:
    from fvcore.nn import FlopCountAnalysis

    class Logits(nn.Module):  # fvcore traces with torch.jit: tensors in and out, no dicts
        def __init__(self) -> None:
            super().__init__()
            self.model = model

        def forward(self, ids: torch.Tensor) -> torch.Tensor:
            return self.model(input_ids=ids, use_cache=False, return_dict=False)[0]

    analysis = FlopCountAnalysis(Logits(), (ids,))
    analysis.unsupported_ops_warnings(False).uncalled_modules_warnings(False)
    return 6.0 * float(analysis.total())  # fvcore counts one multiply-add as one "flop"


def _deepspeed(model: nn.Module, ids: torch.Tensor) -> float:
    from deepspeed.profiling.flops_profiler import get_model_profile

    flops, _, _ = get_model_profile(
        model, kwargs={"input_ids": ids}, print_profile=False, detailed=False, as_string=False
    )
    return 3.0 * float(flops)


PEERS: dict[str, Callable[[nn.Module, torch.Tensor], float]] = {
    "calflops": _calflops,
    "ptflops": _ptflops,
    "fvcore": _fvcore,
    "deepspeed": _deepspeed,
}


def peer_ratio(peer: str, model: nn.Module, ids: torch.Tensor, truth: float) -> float | str:
    """A peer's figure over the truth, or ``"n/a (why)"`` when it cannot give one."""
    base_config = model.config
    previous = base_config._attn_implementation
    base_config._attn_implementation = "eager"
    quiet = io.StringIO()
    try:
        with contextlib.redirect_stdout(quiet), contextlib.redirect_stderr(quiet):
            return PEERS[peer](model, ids) / truth
    except ImportError as exc:
        return f"n/a (not installed: {exc.name or exc})"
    except Exception as exc:  # a peer that cannot run on meta tensors: say why, go on
        return f"n/a ({type(exc).__name__}: {str(exc).splitlines()[0][:80] if str(exc) else ''})"
    finally:
        base_config._attn_implementation = previous
        model.zero_grad(set_to_none=True)


def measure_row(name: str, mode: str, tokens: int, peers: Sequence[str]) -> Row:
    """One row of the table (see the module docstring), on a model built for it."""
    config = model_config(name)
    result = Row(name, mode, tokens)
    limit = context_limit(config)
    if limit is not None and tokens > limit:
        result.ratios = {m: f"n/a (context {limit} tokens)" for m in (*ESTIMATES, *peers)}
        return result
    model = meta_model(config, mode)
    ids = torch.zeros((1, tokens), dtype=torch.long, device="meta")
    with meta_autocast():
        try:
            estimates = meter_estimates(model, ids)
            result.truth = dispatch_truth(model, ids)
        except RuntimeError as exc:  # the model itself cannot train on meta
            why = f"n/a (cannot run on meta: {str(exc).splitlines()[0][:60]})"
            result.truth, result.ratios = None, {m: why for m in (*ESTIMATES, *peers)}
            return result
        for method, flops in estimates.items():
            result.ratios[method] = flops / result.truth if flops is not None else "n/a (none)"
        for peer in peers:
            result.ratios[peer] = peer_ratio(peer, model, ids, result.truth)
    return result


def table(
    models: Iterable[str] = MODELS,
    modes: Iterable[str] = MODES,
    lengths: Iterable[int] = LENGTHS,
    peers: Sequence[str] = tuple(PEERS),
    on_row: Callable[[Row], None] | None = None,
) -> list[Row]:
    """The rows for every model, mode and length (in that order), each on a model built for it.

    A model is not reused across lengths: a ``FlopMeter`` leaves state on the model it meters,
    and a second meter on it reports no estimates.

    Args:
        models: Keys of :data:`MODELS`.
        modes: ``full`` and/or ``lora``.
        lengths: Tokens of the one sequence.
        peers: Keys of :data:`PEERS` to run beside flopmeter's estimates.
        on_row: Called with each row as soon as it is measured (to print it).
    """
    rows = []
    for name in models:
        for mode in modes:
            for tokens in lengths:
                result = measure_row(name, mode, tokens, peers)
                rows.append(result)
                if on_row is not None:
                    on_row(result)
    return rows


def cells(result: Row, methods: Sequence[str]) -> list[str]:
    """The markdown cells of a row: model, mode, tokens, truth per token, ratios."""
    if result.truth is None:  # not run: the reason once
        return [result.model, result.mode, f"{result.tokens:,}", str(result.ratios.get(methods[0]))]
    per_token = f"{result.truth / result.tokens:.3e}"
    ratios = [
        f"{r:.3f}" if isinstance(r, float) else str(result.ratios.get(m, "n/a"))
        for m in methods
        for r in [result.ratios.get(m, "n/a")]
    ]
    return [result.model, result.mode, f"{result.tokens:,}", per_token, *ratios]


def versions(peers: Iterable[str]) -> str:
    """The versions the table ran with."""
    from importlib.metadata import PackageNotFoundError, version

    out = [f"Python {platform.python_version()}"]
    for package in ("torch", "transformers", "peft", *peers):
        with contextlib.suppress(PackageNotFoundError):
            out.append(f"{package} {version(package)}")
    return ", ".join(out)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--no-peers", action="store_true", help="flopmeter's columns only")
    parser.add_argument("--models", nargs="*", default=list(MODELS), choices=list(MODELS))
    parser.add_argument("--json", type=Path, help="also write the rows to this file")
    args = parser.parse_args()
    peers = () if args.no_peers else tuple(PEERS)
    methods = (*ESTIMATES, *peers)
    print(f"machine: {platform.machine()}, {torch.get_num_threads()} threads; {versions(peers)}")
    print(row(["model", "mode", "tokens", "truth FLOP / token", *methods]))
    print(row(["---"] * 3 + ["---:"] * (1 + len(methods))), flush=True)
    start = time.perf_counter()
    rows = table(
        args.models, peers=peers, on_row=lambda r: print(row(cells(r, methods)), flush=True)
    )
    exact = [r for r in rows if isinstance(r.ratios.get("transformer"), float)]
    within = sum(abs(float(r.ratios["transformer"]) - 1) < 1e-6 for r in exact)
    print(
        f"\n{len(rows)} rows; transformer equals the truth (1e-6) in {within} of {len(exact)} "
        f"measured rows; {time.perf_counter() - start:.0f} s"
    )
    if args.json:
        args.json.write_text(json.dumps([asdict(r) for r in rows], indent=1))


if __name__ == "__main__":
    main()
