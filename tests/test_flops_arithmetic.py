"""Hand-checked arithmetic of the FLOP model: pure functions, no model, no framework."""

from __future__ import annotations

import dataclasses

import pytest

from flopmeter.counting.census import Census
from flopmeter.flops.architecture import BUNDLED_CONFIGS, bundled_config, read_architecture
from flopmeter.flops.aten_ops import cpu_sdpa_backward_flop, cpu_sdpa_flop, grouped_mm_flop
from flopmeter.flops.estimates import compute_estimates, estimate_notes, measured_ratio, n_active
from flopmeter.flops.model_profile import AttentionLayerWork, LinearGroup, ModelProfile
from flopmeter.flops.scaling import MeasuredSample, measured_estimate
from flopmeter.flops.transformer import (
    attention_flops,
    attention_pairs,
    linear_flops,
    transformer_estimate,
)
from flopmeter.types import TokenTotals


def group(macs: float, input_grad: bool, weight_grad: bool, kind: str = "linear") -> LinearGroup:
    return LinearGroup(
        kind=kind, input_grad=input_grad, weight_grad=weight_grad, macs_per_token=macs, modules=1
    )


def layer(width: int, q: bool, k: bool, v: bool, window: int | None = None) -> AttentionLayerWork:
    return AttentionLayerWork(query_width=width, window=window, q_grad=q, k_grad=k, v_grad=v)


# ----------------------------------------------------------------------------- linear work
@pytest.mark.parametrize(
    ("input_grad", "weight_grad", "expected"),
    [
        (True, True, 6),  # full fine-tuning: forward 2 + input gradient 2 + weight gradient 2
        (True, False, 4),  # frozen layer that gradients flow through
        (False, True, 4),  # first trainable layer: no gradient for its input
        (False, False, 2),  # below the first trainable parameter: forward only
    ],
)
def test_flops_per_mac(input_grad: bool, weight_grad: bool, expected: int) -> None:
    assert group(1, input_grad, weight_grad).flops_per_mac == expected


def test_linear_flops_hand_checked() -> None:
    # One trained 64 x 128 layer over 10 tokens: 6 * 64 * 128 * 10 = 491520
    assert linear_flops([group(64 * 128, True, True)], 10) == 491520
    # plus a frozen 128 x 32 layer below it (forward only): 2 * 128 * 32 * 10 = 81920
    assert linear_flops([group(64 * 128, True, True), group(128 * 32, False, False)], 10) == (
        491520 + 81920
    )


# ----------------------------------------------------------------------------- attention
def test_attention_pairs_full_and_causal() -> None:
    # Sequences of 3 and 5 tokens: full square 9 + 25 = 34 pairs
    assert attention_pairs(34, 8) == 34
    # causal: 3*4/2 + 5*6/2 = 6 + 15 = 21 = (34 + 8) / 2
    assert attention_pairs(34, 8, attention="causal") == 21
    # a window of 8 longer than both sequences changes nothing: min(21, 8 * 8 = 64)
    assert attention_pairs(34, 8, window=8, attention="causal") == 21
    # window 2: exactly (1+2+2) + (1+2+2+2+2) = 14; the sums give min(21, 2 * 8) = 16 (an
    # upper bound when lengths straddle the window)
    assert attention_pairs(34, 8, window=2, attention="causal") == 16
    # the full-square convention ignores windows (eager attention masks, it does not skip)
    assert attention_pairs(34, 8, window=2) == 34
    with pytest.raises(ValueError, match="attention must be one of"):
        attention_pairs(34, 8, attention="half")  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("flags", "matmuls"),
    [
        ((True, True, True), (2, 2)),  # dQ, dK; dP, dV
        ((True, False, True), (1, 2)),  # LoRA on q and v in the first adapted layer: no dK
        ((False, False, True), (0, 1)),  # only V needs a gradient: dV only
        ((False, False, False), (0, 0)),  # frozen below the first trainable parameter
    ],
)
def test_attention_backward_matmuls(
    flags: tuple[bool, bool, bool], matmuls: tuple[int, int]
) -> None:
    assert layer(64, *flags).backward_matmuls == matmuls


def test_attention_flops_hand_checked() -> None:
    # width 64, all gradients: per pair 2 * (64 * (1 + 2) + 64 * (1 + 2)) = 768; 34 pairs
    # -> 768 * 34 = 26112
    assert attention_flops([layer(64, True, True, True)], 34, 8) == 26112
    # a forward-only layer: 2 * (64 + 64) = 256 per pair -> 8704
    assert attention_flops([layer(64, False, False, False)], 34, 8) == 8704
    # LoRA on q, v: 2 * (64 * 2 + 64 * 3) = 640 per pair -> 21760
    assert attention_flops([layer(64, True, False, True)], 34, 8) == 21760
    # causal half of a full-gradient layer: 768 * 21 = 16128
    assert attention_flops([layer(64, True, True, True)], 34, 8, "causal") == 16128


def test_gqa_costs_the_query_heads() -> None:
    # 8 query heads of 16 over 2 key/value heads: scores over 8 * 16 = 128 wide, one pair:
    # forward 2 * (128 + 128) = 512 FLOP
    assert attention_flops([layer(8 * 16, False, False, False)], 1, 1) == 512


# ----------------------------------------------------------------------------- transformer estimate
def tiny_profile(recognised: bool = True) -> ModelProfile:
    return ModelProfile(
        linear=(group(1000, True, True), group(200, False, False, "lm_head")),
        attention=(layer(16, True, True, True), layer(16, False, False, False)),
        architecture=None,
        recognised=recognised,
        notes=("test profile",),
        inactive_expert_params=500,
        batch_tokens=10,
    )


def test_transformer_estimate_hand_checked() -> None:
    totals = TokenTotals(tokens_processed=10, sum_sq_seq_len=50, sequences=2)
    est = transformer_estimate(tiny_profile(), totals)
    # linear: 10 * (1000 * 6 + 200 * 2) = 64000
    # attention: 50 pairs * (2 * (16 * 3 + 16 * 3) + 2 * (16 + 16)) = 50 * (192 + 64) = 12800
    assert est.flops == 64000 + 12800
    assert est.inputs["linear_flops"] == 64000
    assert est.inputs["attention_flops"] == 12800
    assert est.method == "transformer"
    assert any("recomputation is not counted" in n for n in est.notes)
    # the attention layers are grouped by their numbers in the inputs
    assert sorted(g["layers"] for g in est.inputs["attention_layers"]) == [1, 1]


def test_transformer_estimate_without_profile_is_null_with_reason() -> None:
    est = transformer_estimate(None, TokenTotals(tokens_processed=5), reason="nothing ran")
    assert est.flops is None
    assert est.notes == ["nothing ran"]
    with pytest.raises(ValueError):
        transformer_estimate(tiny_profile(), TokenTotals(), attention="flash")  # type: ignore[arg-type]


# ----------------------------------------------------------------------------- operator formulas
def test_grouped_mm_flop_shapes() -> None:
    # routed rows [M=6, K=4] x experts [G=3, K=4, N=5]: 2 * 6 * 4 * 5 = 240
    assert grouped_mm_flop((6, 4), (3, 4, 5)) == 240
    # weight gradient [K=4, M=6] x [M=6, N=5] -> [G, 4, 5]: 2 * 4 * 6 * 5 = 240
    assert grouped_mm_flop((4, 6), (6, 5), out_shape=(3, 4, 5)) == 240
    # [G=3, M=2, K=4] x [K=4, N=7]: 2 * 2 * 4 * 7 = 112
    assert grouped_mm_flop((3, 2, 4), (4, 7)) == 112
    # batched [3, 2, 4] x [3, 4, 5]: 2 * 3 * 2 * 4 * 5 = 240
    assert grouped_mm_flop((3, 2, 4), (3, 4, 5)) == 240
    with pytest.raises(ValueError):
        grouped_mm_flop((2,), (2, 3))


def test_cpu_sdpa_formulas_with_gqa() -> None:
    # q [B=2, H=4, S=16, D=8], k/v with 2 heads: QK^T and AV, each 2 * (2 * 4) * 16 * 8 * 16
    # = 32768 -> 65536 forward; backward four such matmuls -> 131072
    q, kv = (2, 4, 16, 8), (2, 2, 16, 8)
    assert cpu_sdpa_flop(q, kv, kv) == 65536
    assert cpu_sdpa_backward_flop(q, q, kv, kv) == 131072


# ----------------------------------------------------------------------------- measured estimate
def test_measured_estimate_scales_tokens_and_squares() -> None:
    samples = [
        MeasuredSample(
            linear_flops=1000,
            attention_flops=500,
            recompute_flops=0,
            tokens=10,
            sum_sq_len=100,
            sequences=1,
        )
    ]
    totals = TokenTotals(tokens_processed=50, sum_sq_seq_len=1000, sequences=5)
    est = measured_estimate(samples, totals, transformer_flops=10000)
    # 50 tokens * 1000 / 10 + 1000 pairs * 500 / 100 = 5000 + 5000 = 10000
    assert est.flops == 10000
    assert est.inputs["ratio_to_transformer"] == 1.0
    assert not any(n.startswith("Warning") for n in est.notes)
    high = measured_estimate(samples, totals, transformer_flops=8000)
    assert high.inputs["ratio_to_transformer"] == 1.25
    assert any(n.startswith("Warning: measured / transformer = 1.250") for n in high.notes)


def test_measured_estimate_without_samples_is_null_with_reason() -> None:
    est = measured_estimate([], TokenTotals(tokens_processed=5), reason="sampling off")
    assert est.flops is None
    assert est.notes == ["sampling off"]


# ----------------------------------------------------------------------------- architecture
def test_read_architecture_gqa_head_dim_and_windows() -> None:
    arch, why = read_architecture(
        {
            "model_type": "qwen2",
            "num_hidden_layers": 4,
            "hidden_size": 64,
            "num_attention_heads": 4,
            "num_key_value_heads": 2,
            "head_dim": 32,
            "intermediate_size": 128,
            "sliding_window": 16,
            "layer_types": ["full_attention", "sliding_attention"] * 2,
        }
    )
    assert why is None and arch is not None
    assert (arch.num_key_value_heads, arch.head_dim, arch.query_width) == (2, 32, 128)
    assert arch.layer_windows == (None, 16, None, 16)
    assert arch.to_dict()["windowed_layers"] == [1, 3]


def test_read_architecture_aliases_and_refusals() -> None:
    gpt2, _ = read_architecture({"model_type": "gpt2", "n_layer": 2, "n_embd": 64, "n_head": 4})
    assert gpt2 is not None
    assert (gpt2.num_layers, gpt2.head_dim, gpt2.num_key_value_heads) == (2, 16, 4)
    assert gpt2.intermediate_size == 256  # GPT-2's n_inner=None means 4 * n_embd
    assert gpt2.layer_windows == (None, None)
    qwen, _ = read_architecture(
        {"num_hidden_layers": 2, "hidden_size": 8, "num_attention_heads": 2,
         "sliding_window": 4, "use_sliding_window": False}
    )  # fmt: skip
    assert qwen is not None and qwen.layer_windows == (None, None)
    assert read_architecture(None) == (None, "the model has no configuration")
    none, why = read_architecture({"is_encoder_decoder": True, "num_layers": 2})
    assert none is None and "encoder-decoder" in (why or "")
    none, why = read_architecture({"hidden_size": 8})
    assert none is None and "lacks" in (why or "")
    none, why = read_architecture(
        {"num_hidden_layers": 2, "hidden_size": 8, "num_attention_heads": 3,
         "num_key_value_heads": 2}
    )  # fmt: skip
    assert none is None and "cannot be grouped" in (why or "")


def test_bundled_configs_hold_the_public_figures() -> None:
    expected = {  # layers, hidden, heads, kv heads, head_dim, experts, top-k
        "llama-3.2-3b": (28, 3072, 24, 8, 128, None, None),
        "llama-3.1-8b": (32, 4096, 32, 8, 128, None, None),
        "qwen2.5-7b": (28, 3584, 28, 4, 128, None, None),
        "mixtral-8x7b": (32, 4096, 32, 8, 128, 8, 2),
    }
    assert set(expected) <= set(BUNDLED_CONFIGS)  # the planner's configs: tests/test_planner*
    for name, numbers in expected.items():
        arch, _ = read_architecture(bundled_config(name))
        assert arch is not None
        got = (
            arch.num_layers,
            arch.hidden_size,
            arch.num_attention_heads,
            arch.num_key_value_heads,
            arch.head_dim,
            arch.num_experts,
            arch.experts_per_token,
        )
        assert got == numbers, name
        assert arch.sliding_window is None, name
    with pytest.raises(KeyError, match="bundled"):
        bundled_config("gpt-5")


# ----------------------------------------------------------------------------- gathering
CENSUS = Census(n_total=2000, n_trainable=1500, n_frozen=500, n_embedding=300)


def test_compute_estimates_primary_follows_recognition() -> None:
    totals = TokenTotals(tokens_processed=10, sum_sq_seq_len=50, sequences=2)
    estimates, primary = compute_estimates(CENSUS, totals, profile=tiny_profile())
    assert primary is None  # recognised, but no dispatch-level sample checks it
    # seed: (4 * 2000 + 2 * 1500) * 10 = 110000; 6ND: 6 * 2000 * 10 = 120000
    assert estimates["seed"].flops == 110000
    assert estimates["six_nd"].flops == 120000
    assert estimates["transformer"].flops == 76800
    assert estimates["measured"].flops is None  # no samples given
    assert estimate_notes(estimates, primary, tiny_profile()) == []
    assert n_active(CENSUS, tiny_profile()) == 1500
    assert n_active(CENSUS, None) is None
    assert measured_ratio(estimates) is None

    estimates, primary = compute_estimates(CENSUS, totals, profile=tiny_profile(False))
    assert primary is None  # never seed
    notes = estimate_notes(estimates, primary, tiny_profile(False))
    assert len(notes) == 1 and "not recognised" in notes[0] and "test profile" in notes[0]

    estimates, primary = compute_estimates(CENSUS, totals, profile_reason="no batch")
    assert primary is None
    assert estimates["transformer"].flops is None
    assert "no batch" in estimate_notes(estimates, primary, None, "no batch")[0]


def test_unknown_routing_gives_no_n_active_rather_than_a_guess():
    """A mixture-of-experts model whose configuration names no experts per token, profiled
    without seeing a routing: how many parameters a token passes through is not known, so
    n_active is None with a note, not n_total minus every expert."""
    from flopmeter.flops.architecture import Architecture
    from flopmeter.flops.build import Captured, _inactive_experts
    from flopmeter.flops.estimates import n_active

    arch = Architecture(
        model_type="moe",
        num_layers=1,
        hidden_size=8,
        num_attention_heads=2,
        num_key_value_heads=2,
        head_dim=4,
        intermediate_size=16,
        vocab_size=32,
        tie_word_embeddings=False,
        layer_windows=(None,),
        num_experts=4,
        experts_per_token=None,
    )
    captured = Captured(expert_numel={"layers.0.experts": (4 * 256, 4)})
    notes: list[str] = []
    assert _inactive_experts(captured, arch, notes) is None
    assert "n_active is not given" in notes[0]
    # seen routing: 1 of 4 experts per token -> three quarters of the expert weights inactive
    captured.top_k_seen.add(1)
    assert _inactive_experts(captured, arch, []) == 3 * 256
    # and n_active follows: None for an unknown routing, n_total less the inactive otherwise
    unknown = dataclasses.replace(tiny_profile(), inactive_expert_params=None)
    assert n_active(CENSUS, unknown) is None
    assert n_active(CENSUS, tiny_profile()) == 2000 - 500
