"""The full-size accuracy table of docs/methodology.md: every method against the dispatch count.

Published models, built from their ``config.json`` values (written below, nothing
downloaded) on the ``meta`` device, so nothing is allocated and no arithmetic runs (Qwen2-VL on
the CPU: its forward reads values; :attr:`Workload.device`); full fine-tuning and LoRA (peft,
``target_modules="all-linear"``, r=16; on Mamba-based models the linear layers peft accepts
there, :data:`LORA_TARGETS`); one sequence of 512 and of 4096 tokens, no padding. For each row:

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
``--no-peers`` for flopmeter's columns only, ``--json FILE`` to keep the rows (``--update``:
re-run some rows of FILE, keeping the others and saying which run each holds). Not part of the
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
from flopmeter.flops.architecture import bundled_config
from flopmeter.flops.aten_ops import measured_formulas
from flopmeter.planner.build import _MetaAutocast, meta_autocast  # noqa: F401 (tests read it)

LENGTHS = (512, 4096)
MODES = ("full", "lora")
LORA = {"r": 16, "target_modules": "all-linear"}
ESTIMATES = ("transformer", "measured", "seed", "six_nd")
#: The family column of the causal LMs that are not plain attention decoders (else ``decoder``).
DECODER_FAMILIES = {
    "Mamba-2.8B": "state-space (Mamba)",
    "Mamba-Codestral-7B": "state-space (Mamba2)",
    "Falcon-H1-1.5B": "hybrid (Mamba2 + attention)",
    "Jamba-Mini-1.5": "hybrid (Mamba + attention + MoE)",
    "Qwen3-Next-80B-A3B": "hybrid (gated delta-net + attention + MoE)",
    "DeepSeek-V3": "latent attention + MoE",
    "DeepSeek-V2-Lite": "latent attention + MoE",
}
#: LoRA's targets where peft refuses ``all-linear``: peft 0.21 refuses LoRA on a Mamba mixer's
#: ``out_proj`` and ``conv1d`` for the model types it lists (``mamba``, ``mamba2``,
#: ``falcon_h1``), so those rows target every other linear layer (Jamba is not on peft's list).
LORA_TARGETS: dict[str, list[str]] = {
    "Mamba-2.8B": ["in_proj", "x_proj", "dt_proj"],
    "Mamba-Codestral-7B": ["in_proj"],
    "Falcon-H1-1.5B": [
        *("q_proj", "k_proj", "v_proj", "o_proj"),
        *("gate_proj", "up_proj", "down_proj", "in_proj"),
    ],
}

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
    # ---- state-space, hybrid and latent-attention families (issue 20)
    "Mamba-2.8B": {  # state-spaces/mamba-2.8b-hf
        "model_type": "mamba",
        "vocab_size": 50280,
        "hidden_size": 2560,
        "intermediate_size": 5120,
        "num_hidden_layers": 64,
        "state_size": 16,
        "expand": 2,
        "conv_kernel": 4,
        "time_step_rank": 160,
        "use_bias": False,
        "use_conv_bias": True,
        "tie_word_embeddings": True,
    },
    "Mamba-Codestral-7B": {  # mistralai/Mamba-Codestral-7B-v0.1 (Mamba2, torch fallback scan)
        "model_type": "mamba2",
        "vocab_size": 32768,
        "hidden_size": 4096,
        "num_hidden_layers": 64,
        "num_heads": 128,
        "head_dim": 64,
        "state_size": 128,
        "n_groups": 8,
        "expand": 2,
        "conv_kernel": 4,
        "chunk_size": 256,
        "time_step_rank": 256,
        "use_bias": False,
        "use_conv_bias": True,
        "rms_norm": True,
        "norm_before_gate": True,
        "residual_in_fp32": True,
        "tie_word_embeddings": False,
    },
    # tiiuae/Falcon-H1-1.5B-Base (parallel Mamba2 + attention in each layer). Written without
    # the file at hand: depth, width, heads, Mamba heads, head sizes and state size agree with
    # the table of transformers' FalconH1 documentation; vocab_size and intermediate_size are
    # not checked against the published config.json (the row's ratios are of this geometry).
    "Falcon-H1-1.5B": {
        "model_type": "falcon_h1",
        "vocab_size": 65537,
        "hidden_size": 2048,
        "intermediate_size": 4096,
        "num_hidden_layers": 24,
        "num_attention_heads": 8,
        "num_key_value_heads": 2,
        "head_dim": 128,
        "mamba_d_ssm": 3072,
        "mamba_n_heads": 48,
        "mamba_d_head": 64,
        "mamba_n_groups": 1,
        "mamba_d_state": 256,
        "mamba_d_conv": 4,
        "mamba_expand": 2,
        "mamba_chunk_size": 128,
        "mamba_conv_bias": True,
        "mamba_proj_bias": False,
        "mamba_rms_norm": True,
        "mamba_norm_before_gate": False,
        "max_position_embeddings": 131072,
        "rope_theta": 1e11,
        "tie_word_embeddings": False,
    },
    "Jamba-Mini-1.5": {  # ai21labs/AI21-Jamba-Mini-1.5
        "model_type": "jamba",
        "vocab_size": 65536,
        "hidden_size": 4096,
        "intermediate_size": 14336,
        "num_hidden_layers": 32,
        "num_attention_heads": 32,
        "num_key_value_heads": 8,
        "num_experts": 16,
        "num_experts_per_tok": 2,
        "expert_layer_period": 2,
        "expert_layer_offset": 1,
        "attn_layer_period": 8,
        "attn_layer_offset": 4,
        "mamba_d_state": 16,
        "mamba_d_conv": 4,
        "mamba_expand": 2,
        "mamba_dt_rank": 256,
        "mamba_conv_bias": True,
        "mamba_proj_bias": False,
        "use_mamba_kernels": False,
        "max_position_embeddings": 262144,
        "tie_word_embeddings": False,
    },
    "Qwen3-Next-80B-A3B": {  # Qwen/Qwen3-Next-80B-A3B-Instruct
        "model_type": "qwen3_next",
        "vocab_size": _QWEN_VOCAB,
        "hidden_size": 2048,
        "intermediate_size": 5120,
        "moe_intermediate_size": 512,
        "shared_expert_intermediate_size": 512,
        "num_hidden_layers": 48,
        "num_attention_heads": 16,
        "num_key_value_heads": 2,
        "head_dim": 256,
        "num_experts": 512,
        "num_experts_per_tok": 10,
        "decoder_sparse_step": 1,
        "mlp_only_layers": [],
        "norm_topk_prob": True,
        "full_attention_interval": 4,
        "linear_conv_kernel_dim": 4,
        "linear_key_head_dim": 128,
        "linear_value_head_dim": 128,
        "linear_num_key_heads": 16,
        "linear_num_value_heads": 32,
        "partial_rotary_factor": 0.25,
        "rope_theta": 10000000.0,
        "max_position_embeddings": 262144,
        "tie_word_embeddings": False,
    },
    "DeepSeek-V3": {  # deepseek-ai/DeepSeek-V3 (MLA, 256 routed experts + 1 shared)
        "model_type": "deepseek_v3",
        "vocab_size": 129280,
        "hidden_size": 7168,
        "intermediate_size": 18432,
        "moe_intermediate_size": 2048,
        "num_hidden_layers": 61,
        "first_k_dense_replace": 3,
        "num_attention_heads": 128,
        "num_key_value_heads": 128,
        "n_routed_experts": 256,
        "n_shared_experts": 1,
        "num_experts_per_tok": 8,
        "n_group": 8,
        "topk_group": 4,
        "routed_scaling_factor": 2.5,
        "norm_topk_prob": True,
        "q_lora_rank": 1536,
        "kv_lora_rank": 512,
        "qk_nope_head_dim": 128,
        "qk_rope_head_dim": 64,
        "v_head_dim": 128,
        "max_position_embeddings": 163840,
        "rope_theta": 10000.0,
        "tie_word_embeddings": False,
    },
    "DeepSeek-V2-Lite": {  # deepseek-ai/DeepSeek-V2-Lite (MLA without the query LoRA)
        "model_type": "deepseek_v2",
        "vocab_size": 102400,
        "hidden_size": 2048,
        "intermediate_size": 10944,
        "moe_intermediate_size": 1408,
        "num_hidden_layers": 27,
        "first_k_dense_replace": 1,
        "num_attention_heads": 16,
        "num_key_value_heads": 16,
        "n_routed_experts": 64,
        "n_shared_experts": 2,
        "num_experts_per_tok": 6,
        "n_group": 1,
        "topk_group": 1,
        "routed_scaling_factor": 1.0,
        "q_lora_rank": None,
        "kv_lora_rank": 512,
        "qk_nope_head_dim": 128,
        "qk_rope_head_dim": 64,
        "v_head_dim": 128,
        "max_position_embeddings": 163840,
        "tie_word_embeddings": False,
    },
}


# --------------------------------------------------------------------------- other families
# Models that are not causal LMs: each with the inputs of one training example as its trainer
# feeds it. ``unit`` says what the row's ``tokens`` column counts.
_CLIP_L_336 = {  # the vision tower of llava-hf/llava-1.5-7b-hf (openai/clip-vit-large-patch14-336)
    "model_type": "clip_vision_model",
    "hidden_size": 1024,
    "intermediate_size": 4096,
    "num_hidden_layers": 24,
    "num_attention_heads": 16,
    "image_size": 336,
    "patch_size": 14,
    "projection_dim": 768,
    "hidden_act": "quick_gelu",
}


@dataclass(frozen=True)
class Workload:
    """A model that is not a causal LM, and one training example of it.

    Attributes:
        family: ``encoder-decoder``, ``speech``, ``vision``, ``vision-language`` or
            ``diffusion``.
        config: The published ``config.json`` values (diffusers: the class's keyword
            arguments).
        unit: What a row's ``tokens`` counts, in words.
        lengths: The row lengths (text tokens; one ``0`` row for models without text).
        device: Where the model is built: ``meta``, or ``cpu`` (bfloat16 weights) for a model
            whose forward reads its inputs' values (Qwen2-VL's image grid and position ids),
            which meta tensors do not have. The dtype changes no FLOP count.
    """

    family: str
    config: dict[str, Any]
    unit: str
    lengths: tuple[int, ...] = (512,)
    device: str = "meta"


FAMILY_MODELS: dict[str, Workload] = {
    "T5-large": Workload(  # google-t5/t5-large
        "encoder-decoder",
        {
            "model_type": "t5",
            "vocab_size": 32128,
            "d_model": 1024,
            "d_ff": 4096,
            "d_kv": 64,
            "num_heads": 16,
            "num_layers": 24,
            "num_decoder_layers": 24,
            "feed_forward_proj": "relu",
            "relative_attention_num_buckets": 32,
            "decoder_start_token_id": 0,
            "pad_token_id": 0,
            "eos_token_id": 1,
        },
        "encoder tokens, with a 128-token target",
    ),
    "Whisper-large-v3": Workload(  # openai/whisper-large-v3
        "speech",
        {
            "model_type": "whisper",
            "vocab_size": 51866,
            "d_model": 1280,
            "encoder_layers": 32,
            "decoder_layers": 32,
            "encoder_attention_heads": 20,
            "decoder_attention_heads": 20,
            "encoder_ffn_dim": 5120,
            "decoder_ffn_dim": 5120,
            "num_mel_bins": 128,
            "max_source_positions": 1500,
            "max_target_positions": 448,
            "pad_token_id": 50256,
            "bos_token_id": 50257,
            "eos_token_id": 50257,
            "decoder_start_token_id": 50258,
        },
        "one 30-s clip (3,000 mel frames), a 128-token transcript",
        (0,),
    ),
    "ViT-L/16": Workload(  # google/vit-large-patch16-224, its 1000-class head
        "vision",
        {
            "model_type": "vit",
            "hidden_size": 1024,
            "intermediate_size": 4096,
            "num_hidden_layers": 24,
            "num_attention_heads": 16,
            "image_size": 224,
            "patch_size": 16,
            "num_labels": 1000,
        },
        "one 224 x 224 image (196 patches), classification",
        (0,),
    ),
    "LLaVA-1.5-7B": Workload(  # llava-hf/llava-1.5-7b-hf
        "vision-language",
        {
            "model_type": "llava",
            "image_token_index": 32000,
            "image_seq_length": 576,
            "vision_feature_layer": -2,
            "vision_feature_select_strategy": "default",
            "projector_hidden_act": "gelu",
            "vision_config": _CLIP_L_336,
            "text_config": {
                "model_type": "llama",
                "vocab_size": 32064,
                "hidden_size": 4096,
                "intermediate_size": 11008,
                "num_hidden_layers": 32,
                "num_attention_heads": 32,
                "num_key_value_heads": 32,
                "max_position_embeddings": 4096,
                "rms_norm_eps": 1e-5,
                "tie_word_embeddings": False,
            },
        },
        "text tokens, with one 336 x 336 image (576 positions)",
    ),
    "Qwen2-VL-2B": Workload(  # Qwen/Qwen2-VL-2B-Instruct
        "vision-language",
        {
            "model_type": "qwen2_vl",
            "image_token_id": 151655,
            "video_token_id": 151656,
            "vision_start_token_id": 151652,
            "vision_end_token_id": 151653,
            "tie_word_embeddings": True,
            "text_config": {
                "model_type": "qwen2_vl_text",
                "vocab_size": _QWEN_VOCAB,
                "hidden_size": 1536,
                "intermediate_size": 8960,
                "num_hidden_layers": 28,
                "num_attention_heads": 12,
                "num_key_value_heads": 2,
                "max_position_embeddings": 32768,
                "rope_theta": 1000000.0,
                "rope_scaling": {"type": "mrope", "mrope_section": [16, 24, 24]},
                "tie_word_embeddings": True,
            },
            "vision_config": {
                "depth": 32,
                "embed_dim": 1280,
                "hidden_size": 1536,
                "mlp_ratio": 4,
                "num_heads": 16,
                "in_channels": 3,
                "patch_size": 14,
                "spatial_merge_size": 2,
                "temporal_patch_size": 2,
            },
        },
        "text tokens, with one 224 x 224 image (256 patches, 64 image tokens); on CPU",
        device="cpu",
    ),
    "CLIP-ViT-L/14": Workload(  # openai/clip-vit-large-patch14 (both towers, contrastive loss)
        "contrastive",
        {
            "model_type": "clip",
            "projection_dim": 768,
            "text_config": {
                "model_type": "clip_text_model",
                "vocab_size": 49408,
                "hidden_size": 768,
                "intermediate_size": 3072,
                "num_hidden_layers": 12,
                "num_attention_heads": 12,
                "max_position_embeddings": 77,
                "projection_dim": 768,
                "bos_token_id": 49406,
                "eos_token_id": 49407,
                "pad_token_id": 1,
            },
            "vision_config": {
                "model_type": "clip_vision_model",
                "hidden_size": 1024,
                "intermediate_size": 4096,
                "num_hidden_layers": 24,
                "num_attention_heads": 16,
                "image_size": 224,
                "patch_size": 14,
                "projection_dim": 768,
            },
        },
        "caption tokens, with one 224 x 224 image (256 patches)",
        (77,),
    ),
    "DiT-XL/2": Workload(  # facebook/DiT-XL-2-256, transformer/config.json
        "diffusion",
        {
            "_class_name": "DiTTransformer2DModel",
            "num_attention_heads": 16,
            "attention_head_dim": 72,
            "in_channels": 4,
            "out_channels": 8,
            "num_layers": 28,
            "patch_size": 2,
            "sample_size": 32,
            "num_embeds_ada_norm": 1000,
            "norm_type": "ada_norm_zero",
            "activation_fn": "gelu-approximate",
        },
        "one 32 x 32 x 4 latent (256 px, 256 patches), one timestep",
        (0,),
    ),
    "SD-1.5-UNet": Workload(  # stable-diffusion-v1-5/stable-diffusion-v1-5, unet/config.json
        "diffusion",
        {
            "_class_name": "UNet2DConditionModel",
            "sample_size": 64,
            "in_channels": 4,
            "out_channels": 4,
            "block_out_channels": [320, 640, 1280, 1280],
            "layers_per_block": 2,
            "cross_attention_dim": 768,
            "attention_head_dim": 8,
            "down_block_types": [
                "CrossAttnDownBlock2D",
                "CrossAttnDownBlock2D",
                "CrossAttnDownBlock2D",
                "DownBlock2D",
            ],
            "up_block_types": [
                "UpBlock2D",
                "CrossAttnUpBlock2D",
                "CrossAttnUpBlock2D",
                "CrossAttnUpBlock2D",
            ],
        },
        "one 64 x 64 x 4 latent (512 px), a 77-token prompt, one timestep",
        (0,),
    ),
}

#: What LoRA targets on a diffusers model (peft's ``all-linear`` needs a transformers model):
#: the attention projections, as diffusers' own LoRA trainers choose.
DIFFUSERS_LORA = ["to_q", "to_k", "to_v", "to_out.0"]
_DECODER_TOKENS = 128


def family_model(name: str, mode: str) -> nn.Module:
    """The model of ``FAMILY_MODELS[name]`` on meta, in training mode, for ``mode``."""
    import peft

    work = FAMILY_MODELS[name]
    values = dict(work.config)
    if work.device != "meta":
        values["dtype"] = torch.bfloat16
    with torch.device(work.device):
        if work.family == "diffusion":
            import diffusers

            cls = getattr(diffusers, values.pop("_class_name"))
            model = cls(**values)
        else:
            import transformers as t

            config = t.AutoConfig.for_model(**values)
            auto = {
                "encoder-decoder": t.AutoModelForSeq2SeqLM,
                "speech": t.AutoModelForSpeechSeq2Seq,
                "vision": t.AutoModelForImageClassification,
                "vision-language": t.AutoModelForImageTextToText,
                "contrastive": t.AutoModel,
            }[work.family]
            model = auto.from_config(config, attn_implementation="eager")
    if mode == "lora":
        targets = DIFFUSERS_LORA if work.family == "diffusion" else LORA["target_modules"]
        model = peft.get_peft_model(model, peft.LoraConfig(r=LORA["r"], target_modules=targets))
    return model.train()


def family_inputs(name: str, tokens: int) -> dict[str, torch.Tensor]:
    """One training example of ``FAMILY_MODELS[name]`` on its device (batch 1)."""
    work = FAMILY_MODELS[name]
    c = work.config

    def ids(n: int, value: int = 5) -> torch.Tensor:
        return torch.full((1, n), value, dtype=torch.long, device=work.device)

    meta = {"device": work.device}
    if c.get("model_type") == "qwen2_vl":
        return _qwen2vl_inputs(c, ids, tokens)
    if work.family == "contrastive":
        size = c["vision_config"]["image_size"]
        caption = ids(tokens)
        caption[:, -1] = c["text_config"]["eos_token_id"]  # the token the text tower pools
        pixels = torch.zeros((1, 3, size, size), **meta)
        return {"input_ids": caption, "pixel_values": pixels, "return_loss": True}
    if work.family == "encoder-decoder":
        return {"input_ids": ids(tokens), "labels": ids(_DECODER_TOKENS)}
    if work.family == "speech":
        frames = 2 * c["max_source_positions"]
        features = torch.zeros((1, c["num_mel_bins"], frames), **meta)
        return {"input_features": features, "labels": ids(_DECODER_TOKENS)}
    if work.family == "vision":
        size = c["image_size"]
        return {"pixel_values": torch.zeros((1, 3, size, size), **meta), "labels": ids(1)[0]}
    if work.family == "vision-language":
        size = c["vision_config"]["image_size"]
        text = torch.cat([ids(c["image_seq_length"], c["image_token_index"]), ids(tokens)], 1)
        pixels = torch.zeros((1, 3, size, size), **meta)
        return {"input_ids": text, "pixel_values": pixels, "labels": text}
    side = c["sample_size"]
    latent = torch.zeros((1, c["in_channels"], side, side), **meta)
    step = torch.zeros((1,), dtype=torch.long, device="meta")
    if c["_class_name"] == "DiTTransformer2DModel":
        return {"hidden_states": latent, "timestep": step, "class_labels": step}
    prompt = torch.zeros((1, 77, c["cross_attention_dim"]), **meta)
    return {"sample": latent, "timestep": step, "encoder_hidden_states": prompt}


def _qwen2vl_inputs(
    c: dict[str, Any], ids: Callable[..., torch.Tensor], tokens: int
) -> dict[str, torch.Tensor]:
    """Qwen2-VL's example: a 224 x 224 image as the processor makes it (a 1 x 16 x 16 grid of
    14-pixel patches, each 2 frames x 3 channels x 14 x 14 values, merged 2 x 2 into 64 image
    tokens between the vision start and end tokens), then ``tokens`` text tokens."""
    vision = c["vision_config"]
    grid = (1, 16, 16)
    merged = grid[1] * grid[2] // vision["spatial_merge_size"] ** 2
    text = torch.cat(
        [
            ids(1, c["vision_start_token_id"]),
            ids(merged, c["image_token_id"]),
            ids(1, c["vision_end_token_id"]),
            ids(tokens),
        ],
        1,
    )
    patch = vision["in_channels"] * vision["temporal_patch_size"] * vision["patch_size"] ** 2
    pixels = torch.zeros((grid[0] * grid[1] * grid[2], patch), dtype=torch.bfloat16)
    return {
        "input_ids": text,
        "pixel_values": pixels.to(text.device),
        "image_grid_thw": torch.tensor([grid], device=text.device),
        "mm_token_type_ids": (text == c["image_token_id"]).long(),
        "labels": text,
    }


def family_loss(model: nn.Module, inputs: dict[str, torch.Tensor]) -> torch.Tensor:
    """The training loss of one example: the model's own (transformers), or the denoising
    objective's mean squared error against a target of the output's shape (diffusers)."""
    out = model(**inputs)
    if getattr(out, "loss", None) is not None:
        return out.loss
    sample = out.sample if hasattr(out, "sample") else out[0]
    return (sample.float() - torch.zeros_like(sample, dtype=torch.float32)).pow(2).mean()


@contextlib.contextmanager
def meta_checks() -> Any:
    """Within: transformers' value checks that meta tensors cannot answer are skipped.

    LLaVA checks that the image tokens match the image features (``torch_compilable_check``,
    which reads a count), and Whisper's decoder looks for packed sequences in its position ids
    (values). The inputs here are built to match, and are never packed; no FLOP changes.
    """
    import transformers.masking_utils as masks
    import transformers.models.llava.modeling_llava as llava

    from flopmeter.planner.dispatch import meta_masks

    real = llava.torch_compilable_check

    def check(condition: Any, *args: Any, **kwargs: Any) -> Any:
        if isinstance(condition, torch.Tensor) and condition.device.type == "meta":
            return None
        return real(condition, *args, **kwargs)

    llava.torch_compilable_check = check
    try:
        with meta_masks():
            assert masks.find_packed_sequence_indices is not None
            yield
    finally:
        llava.torch_compilable_check = real


def family_truth(model: nn.Module, inputs: dict[str, torch.Tensor]) -> float:
    """The dispatch count (flopmeter's registry) of one training step of the example."""
    from torch.utils.flop_counter import FlopCounterMode

    with FlopCounterMode(display=False, custom_mapping=measured_formulas()) as counter:
        family_loss(model, inputs).backward()
    model.zero_grad(set_to_none=True)
    return float(counter.get_total_flops())


def measure_family_row(name: str, mode: str, tokens: int, peers: Sequence[str] = ()) -> Row:
    """One row of a model of :data:`FAMILY_MODELS`, on models built for it."""
    work = FAMILY_MODELS[name]
    result = Row(name, mode, tokens, unit=work.unit, family=work.family)
    try:
        model = family_model(name, mode)
        inputs = family_inputs(name, tokens)
        with meta_autocast(), meta_checks():
            estimates, result.primary = metered(model, lambda: family_loss(model, inputs))
            model = family_model(name, mode)  # a fresh model: the meter leaves state on it
            result.truth = family_truth(model, inputs)
    except (RuntimeError, ValueError, NotImplementedError, TypeError, AttributeError) as exc:
        why = f"n/a (cannot run on meta: {type(exc).__name__}: {str(exc).splitlines()[0][:60]})"
        result.truth, result.ratios = None, dict.fromkeys((*ESTIMATES, *peers), why)
        return result
    for method, flops in estimates.items():
        result.ratios[method] = flops / result.truth if flops is not None else "n/a (none)"
    with meta_autocast(), meta_checks():
        for peer in peers:
            result.ratios[peer] = peer_ratio(peer, model, inputs, result.truth)
    return result


@dataclass
class Row:
    """One model, mode and length: the truth and every method's ratio to it.

    Attributes:
        model: The model's name (a key of :data:`MODELS`).
        mode: ``full`` or ``lora``.
        tokens: Tokens of the one sequence (text; 0 for a model without text).
        truth: The dispatch count of one training step, FLOP (``None`` when not run).
        ratios: Method name to its figure over the truth, or ``"n/a (why)"``.
        unit: What ``tokens`` counts and what else the example holds, in words.
        family: The model's family (``decoder`` for the causal LMs of :data:`MODELS`).
        primary: The report's primary estimate (``None`` when not run).
    """

    model: str
    mode: str
    tokens: int
    truth: float | None = None
    ratios: dict[str, float | str] = field(default_factory=dict)
    unit: str = "tokens"
    family: str = "decoder"
    primary: str | None = None


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
    """Whether the model has routed experts (Mixtral's ``num_local_experts``, ``num_experts``,
    DeepSeek's ``n_routed_experts``)."""
    return bool(
        getattr(config, "num_local_experts", None)
        or getattr(config, "num_experts", None)
        or getattr(config, "n_routed_experts", None)
    )


def context_limit(config: Any) -> int | None:
    """Tokens a learned position table allows (GPT-2's ``n_positions``), else ``None``."""
    return getattr(config, "n_positions", None)


def meta_model(config: Any, mode: str, name: str = "") -> nn.Module:
    """The model on meta, default implementations (SDPA attention, grouped-mm experts); LoRA
    on :data:`LORA_TARGETS` where ``name`` has an entry, else on all linear layers."""
    targets = LORA_TARGETS.get(name)
    lora = LORA if targets is None else {**LORA, "target_modules": targets}
    return build(config, mode, eager=False, device="meta", lora=lora)


def meter_estimates(
    model: nn.Module, ids: torch.Tensor
) -> tuple[dict[str, float | None], str | None]:
    """flopmeter's estimates of one training step, from a ``FlopMeter`` run's report, and the
    report's primary estimate."""
    return metered(model, lambda: model(input_ids=ids, labels=ids).loss)


def metered(
    model: nn.Module, loss: Callable[[], torch.Tensor]
) -> tuple[dict[str, float | None], str | None]:
    """One training step (``loss().backward()``, an SGD step) under a ``FlopMeter``: each
    estimate's figure (``None`` where the report has none) and the primary estimate's name."""
    optimizer = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=0.0)
    with FlopMeter(model, optimizer=optimizer, nvml=False) as meter:
        loss().backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    compute = meter.report().compute
    out = {}
    for name in ESTIMATES:
        entry = compute.estimates.get(name) if hasattr(compute.estimates, "get") else None
        out[name] = None if entry is None else entry.flops
    return out, compute.primary_estimate


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
# Each takes the model (eager attention) and the example's inputs by name, and returns
# training FLOP.
Inputs = dict[str, torch.Tensor]


def _calflops(model: nn.Module, inputs: Inputs) -> float:
    from calflops import calculate_flops

    flops, _, _ = calculate_flops(
        model=model,
        kwargs=dict(inputs),
        include_backPropagation=True,  # its convention: backward = 2 x forward
        print_results=False,
        print_detailed=False,
        output_as_string=False,
    )
    return float(flops)


def _ptflops(model: nn.Module, inputs: Inputs) -> float:
    from ptflops import get_model_complexity_info

    first = next(iter(inputs.values()))
    macs, _ = get_model_complexity_info(
        model,
        tuple(first.shape),
        input_constructor=lambda _: dict(inputs),
        as_strings=False,
        print_per_layer_stat=False,
        verbose=False,
    )
    return 6.0 * float(macs)


def _fvcore(model: nn.Module, inputs: Inputs) -> float:
    from fvcore.nn import FlopCountAnalysis

    names = [n for n in inputs if n != "labels"]
    extra = {"use_cache": False} if hasattr(getattr(model, "config", None), "use_cache") else {}

    class Logits(nn.Module):  # fvcore traces with torch.jit: tensors in and out, no dicts
        def __init__(self) -> None:
            super().__init__()
            self.model = model

        def forward(self, *tensors: torch.Tensor) -> torch.Tensor:
            named = dict(zip(names, tensors, strict=True))
            if "labels" in inputs and "decoder_input_ids" not in named and _seq2seq(model):
                named["labels"] = inputs["labels"]  # the decoder's inputs come from the labels
            return self.model(**named, **extra, return_dict=False)[0]

    analysis = FlopCountAnalysis(Logits(), tuple(inputs[n] for n in names))
    analysis.unsupported_ops_warnings(False).uncalled_modules_warnings(False)
    return 6.0 * float(analysis.total())  # fvcore counts one multiply-add as one "flop"


def _seq2seq(model: nn.Module) -> bool:
    return bool(getattr(getattr(model, "config", None), "is_encoder_decoder", False))


def _deepspeed(model: nn.Module, inputs: Inputs) -> float:
    from deepspeed.profiling.flops_profiler import get_model_profile

    flops, _, _ = get_model_profile(
        model, kwargs=dict(inputs), print_profile=False, detailed=False, as_string=False
    )
    return 3.0 * float(flops)


PEERS: dict[str, Callable[[nn.Module, Inputs], float]] = {
    "calflops": _calflops,
    "ptflops": _ptflops,
    "fvcore": _fvcore,
    "deepspeed": _deepspeed,
}


def peer_ratio(
    peer: str, model: nn.Module, inputs: torch.Tensor | Inputs, truth: float
) -> float | str:
    """A peer's figure over the truth, or ``"n/a (why)"`` when it cannot give one.

    ``inputs``: the token ids (a causal LM's example), or the example's inputs by name; the
    peers count the forward pass of the inputs without ``labels`` (an encoder-decoder's
    labels kept: its decoder's inputs are made from them).
    """
    named = {"input_ids": inputs} if isinstance(inputs, torch.Tensor) else dict(inputs)
    if not _seq2seq(model):
        named.pop("labels", None)
    config = getattr(model, "config", None)
    previous = getattr(config, "_attn_implementation", None)
    if previous is not None:
        config._attn_implementation = "eager"
    quiet = io.StringIO()
    try:
        with contextlib.redirect_stdout(quiet), contextlib.redirect_stderr(quiet):
            return PEERS[peer](model, named) / truth
    except ImportError as exc:
        return f"n/a (not installed: {exc.name or exc})"
    except Exception as exc:  # a peer that cannot run on meta tensors: say why, go on
        return f"n/a ({type(exc).__name__}: {str(exc).splitlines()[0][:80] if str(exc) else ''})"
    finally:
        if previous is not None:
            config._attn_implementation = previous
        model.zero_grad(set_to_none=True)


def measure_row(name: str, mode: str, tokens: int, peers: Sequence[str]) -> Row:
    """One row of the table (see the module docstring), on a model built for it."""
    config = model_config(name)
    result = Row(name, mode, tokens, family=DECODER_FAMILIES.get(name, "decoder"))
    limit = context_limit(config)
    if limit is not None and tokens > limit:
        result.ratios = {m: f"n/a (context {limit} tokens)" for m in (*ESTIMATES, *peers)}
        return result
    try:
        model = meta_model(config, mode, name)
    except ValueError as exc:  # peft refuses the targets (Mamba's out_proj, conv1d): say so
        why = f"n/a (cannot be built: {str(exc).splitlines()[0][:90]})"
        result.ratios = dict.fromkeys((*ESTIMATES, *peers), why)
        return result
    ids = torch.zeros((1, tokens), dtype=torch.long, device="meta")
    with meta_autocast():
        try:
            estimates, result.primary = meter_estimates(model, ids)
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
            own = FAMILY_MODELS[name].lengths if name in FAMILY_MODELS else None
            for tokens in own or lengths:
                if own is not None:
                    result = measure_family_row(name, mode, tokens, peers)
                else:
                    result = measure_row(name, mode, tokens, peers)
                rows.append(result)
                if on_row is not None:
                    on_row(result)
    return rows


def cells(result: Row, methods: Sequence[str]) -> list[str]:
    """The markdown cells of a row: model, mode, tokens, truth per token (per example for a
    model without text), ratios, and the report's primary estimate."""
    tokens = f"{result.tokens:,}" if result.tokens else "0"
    if result.truth is None:  # not run: the reason once
        return [result.model, result.mode, tokens, str(result.ratios.get(methods[0]))]
    per = result.tokens or 1
    per_token = f"{result.truth / per:.3e}" + ("" if result.tokens else " (example)")
    ratios = [
        f"{r:.3f}" if isinstance(r, float) else str(result.ratios.get(m, "n/a"))
        for m in methods
        for r in [result.ratios.get(m, "n/a")]
    ]
    primary = result.primary or "none (no verdict)"
    return [result.model, result.mode, tokens, per_token, *ratios, primary]


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
    names = [*MODELS, *FAMILY_MODELS]
    parser.add_argument("--models", nargs="*", default=names, choices=names)
    parser.add_argument("--modes", nargs="*", default=list(MODES), choices=list(MODES))
    parser.add_argument(
        "--lengths", nargs="*", type=int, default=list(LENGTHS), help="text tokens per row"
    )
    parser.add_argument(
        "--json", type=Path, help="also write the rows to this file (rewritten after each row)"
    )
    parser.add_argument(
        "--update",
        action="store_true",
        help="with --json: keep the file's rows this run does not re-run, and its earlier runs",
    )
    args = parser.parse_args()
    earlier = json.loads(args.json.read_text()) if args.update and args.json.exists() else None
    peers = () if args.no_peers else tuple(PEERS)
    methods = (*ESTIMATES, *peers)
    print(f"machine: {platform.machine()}, {torch.get_num_threads()} threads; {versions(peers)}")
    print(row(["model", "mode", "tokens", "truth FLOP / token", *methods, "primary"]))
    print(row(["---"] * 3 + ["---:"] * (1 + len(methods)) + ["---"]), flush=True)
    start = time.perf_counter()
    done: list[Row] = []
    asked = [f"{m} {mode}" for m in args.models for mode in args.modes]

    def on_row(r: Row) -> None:
        print(row(cells(r, methods)), flush=True)
        done.append(r)
        if args.json:  # kept as it grows: a long table interrupted keeps its rows
            data = merged(earlier, table_json(done, peers, asked))
            args.json.write_text(json.dumps(data, indent=1))

    rows = table(args.models, args.modes, args.lengths, peers=peers, on_row=on_row)
    exact = [r for r in rows if isinstance(r.ratios.get("transformer"), float)]
    within = sum(abs(float(r.ratios["transformer"]) - 1) < 1e-6 for r in exact)
    print(
        f"\n{len(rows)} rows; transformer equals the truth (1e-6) in {within} of {len(exact)} "
        f"measured rows; {time.perf_counter() - start:.0f} s"
    )
    if args.json:
        data = merged(earlier, table_json(rows, peers, asked))
        args.json.write_text(json.dumps(data, indent=1))


def _label(row: dict[str, Any]) -> str:
    return f"{row['model']} {row['mode']} {row['tokens']}"


def merged(earlier: dict[str, Any] | None, now: dict[str, Any]) -> dict[str, Any]:
    """``now`` (a :func:`table_json`) over ``earlier``'s: a row re-run (same model, mode and
    tokens) replaces the earlier one in place, new rows come after; ``runs`` lists every run
    (when, machine, versions) with the rows it still holds."""
    if earlier is None:
        return now
    runs = earlier.get("runs") or [
        {k: earlier[k] for k in ("run", "machine", "versions")}
        | {"rows": [_label(r) for r in earlier["rows"]]}
    ]
    fresh = {_label(r): r for r in now["rows"]}
    for run in runs:
        run["rows"] = [label for label in run["rows"] if label not in fresh]
    rows = [fresh.pop(_label(r), r) for r in earlier["rows"]] + list(fresh.values())
    this = {k: now[k] for k in ("run", "machine", "versions")}
    before = earlier.get("asked", [])
    asked = [*before, *(a for a in now["asked"] if a not in before)]
    return {
        **now,
        "asked": asked,
        "rows": rows,
        "runs": [r for r in runs if r["rows"]]
        + [this | {"rows": [_label(r) for r in now["rows"]]}],
    }


def machine() -> str:
    """The machine the table runs on, in words (processor, CPUs, load, accelerator)."""
    import os

    name = platform.processor() or platform.machine()
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                name = line.split(":", 1)[1].strip()
                break
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else None
    gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "no GPU"
    return (
        f"{name}, {os.cpu_count()} logical CPUs, {gpu}; 1-minute load average at the end {load:.1f}"
        if load is not None
        else f"{name}, {os.cpu_count()} logical CPUs, {gpu}"
    )


def table_json(
    rows: Sequence[Row], peers: Sequence[str], asked: Sequence[str] = ()
) -> dict[str, Any]:
    """The rows with the run's machine and versions (what benchmarks/write_table.py reads);
    ``asked``: the ``"model mode"`` pairs the run was asked for (those without a row were not
    reached)."""
    return {
        "asked": list(asked),
        "run": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "machine": machine(),
        "versions": versions(peers),
        "methods": [*ESTIMATES, *peers],
        "rows": [asdict(r) for r in rows],
    }


if __name__ == "__main__":
    main()
