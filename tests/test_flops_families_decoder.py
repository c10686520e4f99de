"""Decoder-only families the FLOP model once got wrong, against PyTorch's dispatch count.

Truth: :class:`torch.utils.flop_counter.FlopCounterMode` with flopmeter's registry
(``measured_formulas()``: the convolution formula that keeps ``groups``, hand-checked in
tests/test_aten_formulas.py) over one forward and backward pass of the same micro-batch, eager
attention and eager experts. The models are the real transformers classes from tiny configs
(no downloads), in full fine-tuning and with peft LoRA.

* DeepSeek-V3's multi-head latent attention: scores over heads x (nope + rope), values over
  heads x v_head_dim; exact.
* Llama 4 with top-2 routing: its experts run every token through ``bmm`` (the scores zero the
  tokens not routed); exact, and the dispatch counter files that ``bmm`` as linear work.
* Hybrid stacks (Jamba, Qwen3-Next) bill attention scores only in the layers that have it;
  Falcon-H1 has attention in every layer beside its mamba mixer.
* State-space and linear-attention mixers the FLOP model has no formula for (Mamba2's and
  Falcon-H1's chunked scan, Qwen3-Next's gated delta-net) run their convolution and scan
  outside the modules flopmeter reads: the
  profile is not recognised and names the mixer's class, the ``transformer`` estimate is null
  with that reason, and what it does read (every weight matrix, the attention scores) is
  exactly the dispatch count of those operators.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch import nn
from torch.utils.flop_counter import FlopCounterMode

from flopmeter.flops.aten_ops import measured_formulas
from flopmeter.flops.capture import profile_model
from flopmeter.flops.counter import SampleCounter
from flopmeter.flops.transformer import transformer_estimate
from flopmeter.types import TokenTotals

transformers = pytest.importorskip("transformers")
peft = pytest.importorskip("peft")

VOCAB = 128
BATCH, LENGTH = 2, 16
TOTALS = TokenTotals(
    tokens_processed=BATCH * LENGTH,
    sum_sq_seq_len=BATCH * LENGTH * LENGTH,
    sequences=BATCH,
    micro_batches=1,
)


def config(family: str) -> Any:
    t = transformers
    if family == "deepseek_v3":  # MLA: QK 4 x (8 + 4), V 4 x 6; routed top-2 of 4, 1 dense layer
        return t.DeepseekV3Config(
            vocab_size=VOCAB,
            hidden_size=32,
            intermediate_size=64,
            moe_intermediate_size=16,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=4,
            n_routed_experts=4,
            num_experts_per_tok=2,
            n_group=1,
            topk_group=1,
            first_k_dense_replace=1,
            q_lora_rank=16,
            kv_lora_rank=16,
            qk_nope_head_dim=8,
            qk_rope_head_dim=4,
            v_head_dim=6,
            head_dim=4,
        )
    if family == "llama4":  # top-2 of 4 experts in every layer
        return t.Llama4TextConfig(
            vocab_size=VOCAB,
            hidden_size=32,
            intermediate_size=32,
            intermediate_size_mlp=64,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            head_dim=8,
            num_local_experts=4,
            num_experts_per_tok=2,
            interleave_moe_layer_step=1,
        )
    if family == "jamba":  # attention in layer 1 of 4, mamba mixers in the others
        return t.JambaConfig(
            vocab_size=VOCAB,
            hidden_size=32,
            intermediate_size=64,
            num_hidden_layers=4,
            num_attention_heads=4,
            num_key_value_heads=2,
            num_experts=2,
            num_experts_per_tok=1,
            attn_layer_period=4,
            attn_layer_offset=1,
            expert_layer_period=2,
            expert_layer_offset=1,
            mamba_d_state=4,
            mamba_d_conv=4,
            mamba_expand=2,
            mamba_dt_rank=4,
        )
    if family == "qwen3_next":  # full attention in layer 3 of 4, gated delta-net in the others
        return t.Qwen3NextConfig(
            vocab_size=VOCAB,
            hidden_size=32,
            intermediate_size=64,
            moe_intermediate_size=16,
            shared_expert_intermediate_size=16,
            num_hidden_layers=4,
            num_attention_heads=4,
            num_key_value_heads=2,
            head_dim=8,
            num_experts=4,
            num_experts_per_tok=2,
            linear_num_value_heads=4,
            linear_num_key_heads=2,
            linear_key_head_dim=8,
            linear_value_head_dim=8,
            linear_conv_kernel_dim=4,
        )
    if family == "falcon_h1":  # attention and a mamba mixer side by side in every layer
        return t.FalconH1Config(
            vocab_size=VOCAB,
            hidden_size=32,
            intermediate_size=64,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            head_dim=8,
            mamba_d_ssm=32,
            mamba_n_heads=4,
            mamba_d_head=8,
            mamba_n_groups=1,
            mamba_d_state=4,
            mamba_d_conv=4,
            mamba_chunk_size=8,
        )
    if family == "mamba":
        return t.MambaConfig(
            vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2, state_size=4, expand=2
        )
    if family == "mamba2":
        return t.Mamba2Config(
            vocab_size=VOCAB,
            hidden_size=32,
            num_hidden_layers=2,
            num_heads=8,
            head_dim=8,
            state_size=4,
            expand=2,
            n_groups=1,
            chunk_size=8,
        )
    raise ValueError(family)


#: LoRA targets per family (peft refuses out_proj and conv1d on mamba-based models).
LORA_TARGETS: dict[str, Any] = {
    "deepseek_v3": "all-linear",  # experts too, through peft's ParamWrapper
    "llama4": ["q_proj", "v_proj"],
    "jamba": ["q_proj", "v_proj", "in_proj"],
    "qwen3_next": ["q_proj", "v_proj", "in_proj_qkvz"],
    "falcon_h1": ["q_proj", "v_proj", "in_proj"],
    "mamba": ["in_proj", "x_proj"],
    "mamba2": ["in_proj"],
}


def build(family: str, mode: str) -> nn.Module:
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(
        config(family), attn_implementation="eager", experts_implementation="eager"
    )
    if mode == "lora":
        model = peft.get_peft_model(
            model, peft.LoraConfig(r=4, target_modules=LORA_TARGETS[family])
        )
    return model.train()


def dispatch_counts(model: nn.Module, ids: torch.Tensor) -> tuple[int, dict[str, dict[str, int]]]:
    """PyTorch's count with flopmeter's registry: the total, and per module, per operator."""
    with FlopCounterMode(display=False, custom_mapping=measured_formulas()) as counter:
        model(input_ids=ids, labels=ids).loss.backward()
    model.zero_grad(set_to_none=True)
    by_module = {
        module: {str(op).split(".")[-1]: n for op, n in ops.items()}
        for module, ops in counter.get_flop_counts().items()
    }
    return counter.get_total_flops(), by_module


def ids() -> torch.Tensor:
    return torch.randint(0, VOCAB, (BATCH, LENGTH), generator=torch.Generator().manual_seed(1))


def attention_score_flops(by_module: dict[str, dict[str, int]]) -> int:
    """The attention modules' own batched products (QK^T, AV and their gradients)."""
    return sum(
        ops.get("bmm", 0) + ops.get("baddbmm", 0)
        for module, ops in by_module.items()
        if module.endswith(".self_attn")
    )


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["full", "lora"])
@pytest.mark.parametrize("family", ["deepseek_v3", "llama4"])
def test_transformer_estimate_equals_dispatch_count(family: str, mode: str) -> None:
    model = build(family, mode)
    batch = ids()
    profile = profile_model(model, input_ids=batch, labels=batch)
    assert profile.recognised, profile.notes
    estimate = transformer_estimate(profile, TOTALS)
    total, _ = dispatch_counts(model, batch)
    assert estimate.flops == pytest.approx(total, rel=1e-9)


def test_latent_attention_widths_come_from_the_config() -> None:
    profile = profile_model(build("deepseek_v3", "full"), input_ids=ids())
    # 4 heads x (qk_nope 8 + qk_rope 4) for the scores, 4 heads x v_head_dim 6 for the values
    # (the config's head_dim, 4, is the rope part only)
    assert {(a.query_width, a.value_width) for a in profile.attention} == {(48, 24)}
    assert profile.architecture is not None
    assert profile.architecture.head_dim == 12
    assert profile.architecture.value_head_dim == 6


def test_llama4_experts_are_linear_work_in_the_measured_sample() -> None:
    """The measured sample files Llama 4's expert bmm as linear work: its attention share is
    exactly the eager attention's scores (which the transformer estimate counts by hand)."""
    model = build("llama4", "full")
    batch = ids()
    profile = profile_model(model, input_ids=batch, labels=batch)
    counter = SampleCounter()
    counter.enter()
    try:
        model(input_ids=batch, labels=batch).loss.backward()
    finally:
        counter.exit()
    estimate = transformer_estimate(profile, TOTALS)
    assert counter.attention == estimate.inputs["attention_flops"]
    assert counter.linear == estimate.inputs["linear_flops"]


# family -> (the mixer's class, layers with attention); Mamba's and Jamba's selective scan is
# modelled (tests/test_flops_mixers.py)
MIXED = {
    "qwen3_next": ("Qwen3NextGatedDeltaNet", [3]),
    "falcon_h1": ("FalconH1Mixer", [0, 1]),
    "mamba2": ("Mamba2Mixer", []),
}


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["full", "lora"])
@pytest.mark.parametrize("family", sorted(MIXED))
def test_sequence_mixers_make_the_profile_not_recognised(family: str, mode: str) -> None:
    """Their convolution and scan run outside the modules the profile reads: never silently
    recognised; the reason names the mixer's class, and a measured cross-check is forced."""
    mixer, attention_layers = MIXED[family]
    model = build(family, mode)
    batch = ids()
    profile = profile_model(model, input_ids=batch, labels=batch)
    assert not profile.recognised
    assert any(f"{mixer} is a state-space / linear-attention mixer" in n for n in profile.notes)
    mixers = [n for n, m in model.named_modules() if type(m).__name__ == mixer]
    assert mixers
    assert set(mixers) <= set(profile.cross_check)
    # attention only in the layers that have it
    assert len(profile.attention) == len(attention_layers)
    estimate = transformer_estimate(profile, TOTALS)
    total, _ = dispatch_counts(model, batch)
    # no plausible figure that leaves the mixers out: null, with the reason naming the mixer
    assert estimate.flops is None
    assert any(f"({mixer})" in n and "no transformer estimate" in n for n in estimate.notes)
    read = estimate.inputs["linear_flops"] + estimate.inputs["attention_flops"]
    assert read < total  # the mixers' convolution and scan are what is left out


@pytest.mark.slow
@pytest.mark.parametrize("family", ["jamba", "qwen3_next", "falcon_h1"])
def test_hybrid_stacks_bill_attention_scores_where_attention_ran(family: str) -> None:
    """The attention-score FLOP equal the dispatch count of the attention modules' products:
    their forward (per module, as the counter attributes it), times 3 in full fine-tuning (each
    score matmul has two gradient matmuls of its width: dS K and dS^T Q for QK^T, dO V^T and
    P^T dO for AV)."""
    model = build(family, "full")
    batch = ids()
    profile = profile_model(model, input_ids=batch, labels=batch)
    with FlopCounterMode(display=False, custom_mapping=measured_formulas()) as counter:
        model(input_ids=batch, labels=batch)
    by_module = {
        module: {str(op).split(".")[-1]: n for op, n in ops.items()}
        for module, ops in counter.get_flop_counts().items()
    }
    forward = attention_score_flops(by_module)
    assert forward > 0
    estimate = transformer_estimate(profile, TOTALS)
    assert estimate.inputs["attention_flops"] == 3 * forward


class FlexDecoder(nn.Module):
    """A one-layer decoder whose attention is a compiled ``flex_attention`` (causal score_mod)."""

    def __init__(self) -> None:
        super().__init__()
        from torch.nn.attention.flex_attention import flex_attention

        self.flex = torch.compile(flex_attention)
        self.embed = nn.Embedding(VOCAB, 16)
        self.qkv = nn.Linear(16, 48)
        self.out = nn.Linear(16, VOCAB)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        x = self.embed(input_ids)
        b, n = input_ids.shape
        q, k, v = self.qkv(x).view(b, n, 3, 2, 8).permute(2, 0, 3, 1, 4)
        y = self.flex(q, k, v, score_mod=lambda s, _b, _h, i, j: torch.where(i >= j, s, -1e9))
        return self.out(y.transpose(1, 2).reshape(b, n, 16))


def _raised(fn) -> tuple[type, str] | None:
    try:
        fn()
    except Exception as exc:
        return type(exc), str(exc)
    return None


@pytest.mark.slow
def test_compiled_flex_attention_behaves_the_same_under_the_weight_watch() -> None:
    """The profile's weight watch (a TorchFunctionMode) once broke a compiled flex_attention
    on inputs needing a gradient ("query.dim: False"): under it, the model now does what it does
    without the meter. On this CPU that is torch's own refusal (flex attention has no CPU
    backward); without gradients the forward runs and its output is unchanged."""
    model = FlexDecoder()
    batch = ids()
    plain = _raised(lambda: model(batch))
    assert plain is not None and plain[0] is NotImplementedError  # torch 2.13 on CPU
    assert _raised(lambda: profile_model(model, input_ids=batch)) == plain
    model.requires_grad_(False)
    expected = model(batch)
    profile = profile_model(model, input_ids=batch)
    assert profile.linear  # the watch and hooks ran over the compiled attention
    assert torch.equal(model(batch), expected)
