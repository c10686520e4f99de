"""Parameter census against counts made by hand from the configuration."""

import math

import torch
from torch import nn

from flopmeter.counting.census import take_census
from tests.support.models import tiny_llama

# tiny_llama: vocab 97, hidden 32, intermediate 64, 2 layers, 4 heads of 8, 2 KV heads.
EMBED = 97 * 32  # 3104
PER_LAYER = (
    32 * 32  # q_proj  1024
    + 32 * 16  # k_proj 512 (2 KV heads x 8)
    + 32 * 16  # v_proj 512
    + 32 * 32  # o_proj 1024
    + 3 * 32 * 64  # gate, up, down 6144
    + 2 * 32  # two RMSNorms 64
)  # 9280
BODY = 2 * PER_LAYER + 32  # layers + final norm = 18592


def test_untied_model_counts_every_matrix():
    c = take_census(tiny_llama())
    assert c.n_total == EMBED + BODY + EMBED  # 24800, lm_head separate
    assert c.n_trainable == c.n_total
    assert c.n_frozen == 0
    assert c.n_embedding == EMBED


def test_tied_weights_count_once():
    model = tiny_llama(tie_word_embeddings=True)
    assert model.lm_head.weight is model.model.embed_tokens.weight
    c = take_census(model)
    assert c.n_total == EMBED + BODY  # 21696
    assert c.n_embedding == EMBED


def test_lora_counts_adapters_as_trainable_and_base_as_frozen():
    from peft import LoraConfig, get_peft_model

    model = get_peft_model(
        tiny_llama(), LoraConfig(r=4, target_modules=["q_proj", "v_proj"], lora_dropout=0.0)
    )
    # per layer: q A 4x32 + B 32x4 = 256; v A 4x32 + B 16x4 = 192; two layers: 896
    lora = 2 * (4 * 32 + 32 * 4 + 4 * 32 + 16 * 4)
    c = take_census(model)
    assert c.n_trainable == lora == 896
    assert c.n_total == 24800 + lora
    assert c.n_frozen == 24800
    trainable, total = model.get_nb_trainable_parameters()
    assert (c.n_trainable, c.n_total) == (trainable, total)


def test_frozen_layers_are_frozen():
    model = tiny_llama()
    for p in model.model.layers[0].parameters():
        p.requires_grad_(False)
    c = take_census(model)
    assert c.n_frozen == PER_LAYER
    assert c.n_trainable == 24800 - PER_LAYER


class _QuantState:
    def __init__(self, shape):
        self.shape = torch.Size(shape)


class Params4bit(nn.Parameter):
    """Stands in for bitsandbytes' Params4bit (bitsandbytes needs CUDA to quantize): two 4-bit
    values packed per uint8 byte, with the logical shape in ``quant_state.shape``."""


def test_4bit_parameters_count_their_logical_elements():
    layer = nn.Linear(64, 32, bias=False)
    packed = Params4bit(torch.zeros(64 * 32 // 2, 1, dtype=torch.uint8), requires_grad=False)
    packed.quant_state = _QuantState((32, 64))
    layer.weight = packed
    c = take_census(layer)
    assert c.n_total == 32 * 64
    assert c.n_quantized_4bit == 32 * 64
    assert c.n_trainable == 0


def test_zero3_partitioned_parameters_count_their_full_size():
    # DeepSpeed ZeRO-3 leaves an empty local tensor and records the full size in ds_numel.
    layer = nn.Linear(16, 8)
    for p in layer.parameters():
        full = p.numel()
        p.data = torch.empty(0)
        p.ds_numel = full
    c = take_census(layer)
    assert c.n_total == 16 * 8 + 8
    assert c.n_partitioned == 16 * 8 + 8


def test_fsdp_flat_parameter_counts_unsharded_size():
    flat = nn.Parameter(torch.zeros(50))
    flat._unpadded_unsharded_size = torch.Size([200])  # FSDP1: this rank holds a quarter
    holder = nn.Module()
    holder.flat = flat
    c = take_census(holder)
    assert c.n_total == 200 == math.prod((200,))
