"""The ``transformer`` estimate against PyTorch's dispatch-level counter on real (tiny) models.

Truth: torch.utils.flop_counter.FlopCounterMode over one forward and backward pass with eager
attention and eager experts, where PyTorch's own formulas count every matmul (no formula of
flopmeter's involved). Models are built from small configs (no downloads).
"""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.utils.flop_counter import FlopCounterMode

from flopmeter.flops.capture import profile_model
from flopmeter.flops.transformer import transformer_estimate
from flopmeter.types import TokenTotals
from tests.support.models import tiny_llama_config, tiny_mixtral_config

transformers = pytest.importorskip("transformers")
peft = pytest.importorskip("peft")

VOCAB = 128
COMMON = {
    "vocab_size": VOCAB,
    "hidden_size": 32,
    "intermediate_size": 64,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
}


def make_config(arch: str):
    t = transformers
    if arch == "llama":
        # the shared tiny Llama with COMMON's figures: LlamaConfig's default context, no pad id
        return tiny_llama_config(vocab_size=VOCAB, max_position_embeddings=2048, pad_token_id=None)
    if arch == "qwen2":  # grouped-query attention, tied embeddings, q/k/v biases
        return t.Qwen2Config(**COMMON, num_key_value_heads=2, tie_word_embeddings=True)
    if arch == "mistral":
        return t.MistralConfig(**COMMON, num_key_value_heads=2, sliding_window=8)
    if arch == "mixtral":
        return tiny_mixtral_config(vocab_size=VOCAB)
    if arch == "gemma":  # head_dim 16 != hidden / heads = 8; multi-query attention
        return t.GemmaConfig(**COMMON, num_key_value_heads=1, head_dim=16)
    if arch == "gpt2":  # Conv1D layers, fused c_attn
        return t.GPT2Config(vocab_size=VOCAB, n_embd=32, n_layer=2, n_head=4, n_positions=64)
    if arch == "phi":
        return t.PhiConfig(**COMMON, num_key_value_heads=4)
    raise ValueError(arch)


ARCHS = ["llama", "qwen2", "mistral", "mixtral", "gemma", "gpt2", "phi"]


def make_model(arch: str, mode: str) -> nn.Module:
    torch.manual_seed(0)
    kwargs = {"attn_implementation": "eager"}
    if arch == "mixtral":
        kwargs["experts_implementation"] = "eager"
    model = transformers.AutoModelForCausalLM.from_config(make_config(arch), **kwargs)
    if mode == "frozen":  # embeddings and the bottom half of the blocks frozen
        blocks = model.transformer.h if arch == "gpt2" else model.model.layers
        for module in [model.get_input_embeddings(), *blocks[: len(blocks) // 2]]:
            module.requires_grad_(False)
        if arch == "gpt2":
            model.transformer.wpe.requires_grad_(False)
    elif mode == "lora":
        targets = ["c_attn"] if arch == "gpt2" else ["q_proj", "v_proj"]
        model = peft.get_peft_model(model, peft.LoraConfig(r=4, target_modules=targets))
    model.train()
    return model


def dispatch_count(model: nn.Module, ids: torch.Tensor) -> int:
    with FlopCounterMode(display=False) as counter:
        model(input_ids=ids, labels=ids).loss.backward()
    return counter.get_total_flops()


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["full", "lora", "frozen"])
@pytest.mark.parametrize("arch", ARCHS)
def test_transformer_estimate_equals_dispatch_count(arch: str, mode: str) -> None:
    model = make_model(arch, mode)
    ids = torch.randint(0, VOCAB, (2, 24))
    profile = profile_model(model, input_ids=ids, labels=ids)
    assert profile.recognised, profile.notes
    # tokens and squared lengths counted by hand: 2 sequences of 24
    totals = TokenTotals(tokens_processed=2 * 24, sum_sq_seq_len=2 * 24 * 24, sequences=2)
    estimate = transformer_estimate(profile, totals)
    assert estimate.flops == pytest.approx(dispatch_count(model, ids), rel=1e-9)


def test_layers_below_the_first_trainable_cost_forward_only() -> None:
    model = make_model("llama", "frozen")
    ids = torch.randint(0, VOCAB, (1, 16))
    profile = profile_model(model, input_ids=ids, labels=ids)
    attention = profile.attention
    # layer 0 is frozen and below every trainable weight: no backward at all
    assert (attention[0].q_grad, attention[0].k_grad, attention[0].v_grad) == (False,) * 3
    assert (attention[1].q_grad, attention[1].k_grad, attention[1].v_grad) == (True,) * 3
    groups = {(g.kind, g.input_grad, g.weight_grad): g.macs_per_token for g in profile.linear}
    # per layer: q 32x32, k 32x16, v 32x16, o 32x32, gate/up 32x64, down 64x32
    # = 1024 + 512 + 512 + 1024 + 2048 + 2048 + 2048 = 9216 MACs
    # layer 0: forward only (2 FLOP per MAC); layer 1 trains, and its inputs need gradients
    # (its own input norm trains): 6 FLOP per MAC; lm_head 32x128 likewise
    assert groups == {
        ("linear", False, False): 9216,
        ("linear", True, True): 9216,
        ("lm_head", True, True): 32 * VOCAB,
    }


def test_lora_first_adapted_layer_has_no_key_gradient() -> None:
    model = make_model("llama", "lora")
    ids = torch.randint(0, VOCAB, (1, 16))
    profile = profile_model(model, input_ids=ids, labels=ids)
    first, second = profile.attention
    # LoRA on q and v: in the first layer the hidden state needs no gradient, so k has none
    assert (first.q_grad, first.k_grad, first.v_grad) == (True, False, True)
    assert (second.q_grad, second.k_grad, second.v_grad) == (True, True, True)
    lora = [g for g in profile.linear if g.kind == "lora"]
    # A: 32x4 and B: 4x32 (q), 4x16 (v) per layer, two layers: 2 * (128 + 128 + 128 + 64) = 896
    assert sum(g.macs_per_token for g in lora) == 896
    assert all(g.weight_grad for g in lora)


def test_mixture_of_experts_counts_top_k_and_reports_active_parameters() -> None:
    model = make_model("mixtral", "full")
    ids = torch.randint(0, VOCAB, (1, 16))
    profile = profile_model(model, input_ids=ids, labels=ids)
    experts = [g for g in profile.linear if g.kind == "experts"]
    # per expert gate_up 128x32 + down 32x64 = 4096 + 2048 = 6144 weights; top-2 of 4:
    # 2 * 6144 = 12288 MACs per token per layer, two layers = 24576
    assert sum(g.macs_per_token for g in experts) == 24576
    routers = [g for g in profile.linear if g.kind == "router"]
    assert sum(g.macs_per_token for g in routers) == 2 * 4 * 32  # the router counts in full
    # inactive: half the experts, 2 layers * 4 experts * 6144 / 2 = 24576
    assert profile.inactive_expert_params == 24576


def test_gemma_head_dim_and_mistral_window_come_from_the_config() -> None:
    gemma = profile_model(
        make_model("gemma", "full"), input_ids=torch.zeros((1, 4), dtype=torch.long)
    )
    assert {layer.query_width for layer in gemma.attention} == {4 * 16}  # not hidden 32
    mistral = profile_model(
        make_model("mistral", "full"), input_ids=torch.zeros((1, 4), dtype=torch.long)
    )
    assert {layer.window for layer in mistral.attention} == {8}
    # the causal convention caps windowed layers at window * tokens: 2 sequences of 24,
    # pairs min((1152 + 48) / 2, 8 * 48) = 384 per layer
    totals = TokenTotals(tokens_processed=48, sum_sq_seq_len=1152, sequences=2)
    full = transformer_estimate(mistral, totals)
    causal = transformer_estimate(mistral, totals, attention="causal")
    width = mistral.attention[0].query_width
    per_pair = 2 * (width * 3 + width * 3)  # one layer, all gradients
    assert full.inputs["attention_flops"] == 2 * per_pair * 1152
    assert causal.inputs["attention_flops"] == 2 * per_pair * 384
    assert causal.inputs["linear_flops"] == full.inputs["linear_flops"]
