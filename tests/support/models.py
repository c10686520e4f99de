"""Tiny real models: the shared tiny Llama (trains in milliseconds on a CPU) and the small
hand-written modules several tests train."""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from tests.support.batches import PAD_ID


def tiny_llama_config(**overrides: Any):
    """A Llama config small enough to train in milliseconds on a CPU.

    Two layers, hidden size 32, four heads over two key/value heads, vocabulary 97, context 64,
    pad id ``PAD_ID``, an untied head; ``overrides`` replace any of these (or add fields).
    """
    from transformers import LlamaConfig

    kwargs: dict[str, Any] = dict(
        vocab_size=97,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
        pad_token_id=PAD_ID,
        tie_word_embeddings=False,
    )
    kwargs.update(overrides)
    return LlamaConfig(**kwargs)


def tiny_mamba_config(**overrides: Any):
    """A Mamba config small enough for a CPU test: two layers of hidden size 32, state 8,
    expand 2, kernel 4, vocabulary 64, pad id 0, transformers' PyTorch path (no mambapy);
    ``overrides`` replace any of these (or add fields)."""
    from transformers import MambaConfig

    kwargs: dict[str, Any] = dict(
        vocab_size=64,
        hidden_size=32,
        state_size=8,
        num_hidden_layers=2,
        expand=2,
        conv_kernel=4,
        pad_token_id=0,
        use_mambapy=False,
    )
    kwargs.update(overrides)
    return MambaConfig(**kwargs)


def tiny_mamba2_config(**overrides: Any):
    """A Mamba2 config small enough for a CPU test: two layers of hidden size 32, 4 heads of
    16, one group, state 8, expand 2, kernel 4, chunks of 4, vocabulary 64 (pad id:
    transformers' default unless given); ``overrides`` replace any of these (or add fields)."""
    from transformers import Mamba2Config

    kwargs: dict[str, Any] = dict(
        vocab_size=64,
        hidden_size=32,
        state_size=8,
        num_heads=4,
        head_dim=16,
        n_groups=1,
        expand=2,
        conv_kernel=4,
        chunk_size=4,
        num_hidden_layers=2,
    )
    kwargs.update(overrides)
    return Mamba2Config(**kwargs)


def tiny_jamba_config(**overrides: Any):
    """A Jamba config (Mamba mixers, attention, experts) small enough for a CPU test.

    Four layers of hidden size 32: attention at layer 2, experts (4, top 2) at layers 1 and 3,
    Mamba elsewhere (state 8, kernel 4, expand 2, dt rank 4); vocabulary 64, context 256, pad
    id 0; ``overrides`` replace any of these (or add fields).
    """
    from transformers import JambaConfig

    kwargs: dict[str, Any] = dict(
        vocab_size=64,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        num_experts=4,
        num_experts_per_tok=2,
        expert_layer_period=2,
        expert_layer_offset=1,
        attn_layer_period=4,
        attn_layer_offset=2,
        mamba_d_state=8,
        mamba_d_conv=4,
        mamba_expand=2,
        mamba_dt_rank=4,
        max_position_embeddings=256,
        pad_token_id=0,
    )
    kwargs.update(overrides)
    return JambaConfig(**kwargs)


def tiny_llama(**overrides: Any):
    """``LlamaForCausalLM`` of ``tiny_llama_config(**overrides)``, initialised from seed 0."""
    from transformers import LlamaForCausalLM

    torch.manual_seed(0)
    return LlamaForCausalLM(tiny_llama_config(**overrides))


def eager_llama():
    """The tiny Llama with eager attention, whose attention FlopCounterMode counts as the meter
    does (its SDPA formula counts a causal single row differently)."""
    return tiny_llama(attn_implementation="eager")


class TinyLM(nn.Module):
    """A causal LM head over embeddings; accepts (and ignores) packing arguments like Hugging
    Face models do."""

    def __init__(self, vocab: int = 64, hidden: int = 16) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, hidden)
        self.mix = nn.Linear(hidden, hidden)
        self.head = nn.Linear(hidden, vocab)

    def forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        labels: torch.Tensor | None = None,
        **kwargs: Any,
    ) -> torch.Tensor:
        logits = self.head(torch.tanh(self.mix(self.embed(input_ids))))
        assert labels is not None
        return F.cross_entropy(logits.flatten(0, -2), labels.flatten(), ignore_index=-100)


class Flaky(nn.Module):
    """Embedding and two linear layers; its forward raises while ``failures`` is positive."""

    def __init__(self, failures: int = 0, vocab: int = 64) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.embed = nn.Embedding(vocab, 8)
        self.up = nn.Linear(8, 16)
        self.down = nn.Linear(16, vocab)
        self.failures = failures

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        hidden = self.up(self.embed(input_ids))
        if self.failures > 0:
            self.failures -= 1
            raise RuntimeError("simulated out of memory")
        return self.down(torch.relu(hidden))


def tiny_mixtral_config(**overrides: Any):
    """A Mixtral (mixture-of-experts) config of the tiny Llama's size: vocabulary 128, two
    layers, hidden size 32, four heads over two key/value heads, four experts of which each token
    uses two; ``overrides`` replace any of these."""
    from transformers import MixtralConfig

    kwargs: dict[str, Any] = dict(
        vocab_size=128,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        num_local_experts=4,
        num_experts_per_tok=2,
    )
    kwargs.update(overrides)
    return MixtralConfig(**kwargs)
