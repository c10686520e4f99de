"""The ``transformer`` estimate by stream (text, decoder, cross-attention, items) against
PyTorch's dispatch-level count of the same micro-batches.

Truth: ``torch.utils.flop_counter.FlopCounterMode`` with flopmeter's registry
(:func:`flopmeter.flops.aten_ops.measured_formulas`) over one forward and backward pass per
micro-batch, eager attention, no padding (the non-padding convention: a padded batch's truth is
its sequences run unpadded, one by one). Convolutions' backward is counted by hand arithmetic
(each gradient costs the forward's multiply-adds, ``groups`` included), because torch's own
``convolution_backward`` formula ignores ``groups``. The run's token statistics are counted by
hand from the batches. Models are the real transformers / diffusers / peft classes built from
tiny configs (no downloads).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pytest
import torch
from torch import nn
from torch.utils.flop_counter import FlopCounterMode

from flopmeter.flops.aten_ops import measured_formulas
from flopmeter.flops.capture import profile_model
from flopmeter.flops.model_profile import StreamSizes
from flopmeter.flops.streams import stream_of
from flopmeter.flops.transformer import transformer_estimate
from flopmeter.types import InputShapeCount, TokenTotals

transformers = pytest.importorskip("transformers")
peft = pytest.importorskip("peft")

R = torch.randint


def conv_backward_flop(
    grad_out_shape: Any,
    x_shape: Any,
    w_shape: Any,
    _bias: Any,
    _stride: Any,
    _padding: Any,
    _dilation: Any,
    transposed: bool,
    _output_padding: Any,
    _groups: Any,
    output_mask: Any,
    out_shape: Any = None,
) -> int:
    """A convolution's backward by hand: each gradient (input, weight) costs the forward's
    multiply-adds, ``batch x weight elements x output positions`` (input positions when
    transposed; the weight is ``out x in/groups x kernel``, so ``groups`` is in it)."""
    spatial = x_shape[2:] if transposed else grad_out_shape[2:]
    macs = x_shape[0] * math.prod(w_shape) * math.prod(spatial)
    return 2 * macs * (int(output_mask[0]) + int(output_mask[1]))


def _mapping() -> dict[Any, Any]:
    return {**measured_formulas(), torch.ops.aten.convolution_backward: conv_backward_flop}


def _loss(out: Any) -> torch.Tensor:
    if getattr(out, "loss", None) is not None:
        return out.loss
    for name in ("logits", "sample", "last_hidden_state"):
        value = getattr(out, name, None)
        if value is not None:
            return value.float().pow(2).mean()
    raise AssertionError(f"no output to train on in {type(out).__name__}")


def dispatch_count(model: nn.Module, inputs: dict[str, Any]) -> int:
    """FlopCounterMode's count of one training forward and backward pass."""
    with FlopCounterMode(display=False, custom_mapping=_mapping()) as counter:
        _loss(model(**inputs)).backward()
    model.zero_grad()
    return counter.get_total_flops()


def hand_totals(batches: list[dict[str, Any]], decoder: str | None = None) -> TokenTotals:
    """The run's token statistics of unpadded batches, counted by hand from their shapes."""
    tokens = squares = dec = dec_squares = cross = items = 0
    for batch in batches:
        first = next(v for v in batch.values() if isinstance(v, torch.Tensor))
        ids = batch.get("input_ids")
        b = int((ids if ids is not None else first).shape[0])
        items += b
        t = int(ids.shape[1]) if ids is not None else 0
        tokens, squares = tokens + b * t, squares + b * t * t
        if decoder is not None:
            d = int(batch[decoder].shape[1])
            dec, dec_squares, cross = dec + b * d, dec_squares + b * d * d, cross + b * t * d
    return TokenTotals(
        tokens_processed=tokens,
        tokens_seen=tokens,
        sequences=items,
        sum_sq_seq_len=squares,
        micro_batches=len(batches),
        decoder_tokens=dec,
        decoder_sum_sq_len=dec_squares,
        cross_pairs=cross,
        items=items,
    )


@dataclass
class Family:
    """A model family: how to build it, two micro-batches of different shapes, LoRA targets."""

    build: Callable[[], nn.Module]
    batches: Callable[[], list[dict[str, Any]]]
    lora: list[str]
    decoder: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)


def _t5() -> nn.Module:
    config = transformers.T5Config(
        vocab_size=64,
        d_model=32,
        d_kv=8,
        d_ff=64,
        num_layers=2,
        num_decoder_layers=2,
        num_heads=4,
        decoder_start_token_id=0,
        pad_token_id=0,
    )
    return transformers.T5ForConditionalGeneration(config)


def _bart() -> nn.Module:
    config = transformers.BartConfig(
        vocab_size=64,
        d_model=32,
        encoder_layers=2,
        decoder_layers=2,
        encoder_attention_heads=4,
        decoder_attention_heads=4,
        encoder_ffn_dim=64,
        decoder_ffn_dim=64,
        max_position_embeddings=64,
    )
    return transformers.BartForConditionalGeneration._from_config(
        config, attn_implementation="eager"
    )


def _whisper() -> nn.Module:
    config = transformers.WhisperConfig(
        vocab_size=64,
        d_model=32,
        encoder_layers=2,
        decoder_layers=2,
        encoder_attention_heads=4,
        decoder_attention_heads=4,
        encoder_ffn_dim=64,
        decoder_ffn_dim=64,
        num_mel_bins=8,
        max_source_positions=16,
        max_target_positions=32,
        decoder_start_token_id=1,
        pad_token_id=0,
        bos_token_id=1,
        eos_token_id=2,
    )
    return transformers.WhisperForConditionalGeneration._from_config(
        config, attn_implementation="eager"
    )


VISION = {
    "hidden_size": 32,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "intermediate_size": 64,
    "image_size": 16,
    "patch_size": 4,
}


def _vit() -> nn.Module:
    config = transformers.ViTConfig(**VISION, num_labels=3)
    return transformers.ViTForImageClassification._from_config(config, attn_implementation="eager")


def _clip_vision() -> nn.Module:
    config = transformers.CLIPVisionConfig(**VISION, projection_dim=16)
    return transformers.CLIPVisionModel._from_config(config, attn_implementation="eager")


IMAGE_TOKEN = 63


def _llava() -> nn.Module:
    config = transformers.LlavaConfig(
        vision_config={"model_type": "clip_vision_model", **VISION, "projection_dim": 16},
        text_config={
            "model_type": "llama",
            "vocab_size": 64,
            "hidden_size": 32,
            "num_hidden_layers": 2,
            "num_attention_heads": 4,
            "num_key_value_heads": 2,  # grouped-query attention in the language model
            "intermediate_size": 64,
        },
        image_token_index=IMAGE_TOKEN,
        vision_feature_layer=-1,
    )
    return transformers.LlavaForConditionalGeneration._from_config(
        config, attn_implementation="eager"
    )


def _llava_batch(batch: int, length: int) -> dict[str, Any]:
    ids = R(0, 60, (batch, length))
    ids[:, 1:17] = IMAGE_TOKEN  # 16 patches per 16x16 image (4x4 patches; the CLS is dropped)
    return {"input_ids": ids, "pixel_values": torch.randn(batch, 3, 16, 16), "labels": ids}


def _resnet() -> nn.Module:
    config = transformers.ResNetConfig(
        embedding_size=8, hidden_sizes=[8, 16], depths=[1, 1], layer_type="basic", num_labels=3
    )
    return transformers.ResNetForImageClassification(config)


def _convnext() -> nn.Module:  # depthwise 7x7 convolutions (groups = channels)
    config = transformers.ConvNextConfig(
        num_stages=2, hidden_sizes=[8, 16], depths=[1, 1], num_labels=3
    )
    return transformers.ConvNextForImageClassification(config)


def _eager_diffusers(model: nn.Module) -> nn.Module:
    from diffusers.models.attention_processor import Attention, AttnProcessor

    for module in model.modules():
        if isinstance(module, Attention):
            module.set_processor(AttnProcessor())  # eager: baddbmm and bmm, not fused sdpa
    return model


def _unet() -> nn.Module:
    diffusers = pytest.importorskip("diffusers")
    return _eager_diffusers(
        diffusers.UNet2DModel(
            sample_size=16,
            in_channels=3,
            out_channels=3,
            block_out_channels=(8, 16),
            layers_per_block=1,
            down_block_types=("DownBlock2D", "AttnDownBlock2D"),
            up_block_types=("AttnUpBlock2D", "UpBlock2D"),
            norm_num_groups=4,
            attention_head_dim=4,
        )
    )


def _dit() -> nn.Module:
    diffusers = pytest.importorskip("diffusers")
    return _eager_diffusers(
        diffusers.DiTTransformer2DModel(
            num_attention_heads=2,
            attention_head_dim=8,
            in_channels=4,
            out_channels=4,
            num_layers=2,
            sample_size=8,
            patch_size=2,
            num_embeds_ada_norm=10,
            norm_num_groups=4,
        )
    )


def _images(size: int, labels: bool = True) -> Callable[[], list[dict[str, Any]]]:
    def batches() -> list[dict[str, Any]]:
        out = []
        for b in (2, 3):
            batch: dict[str, Any] = {"pixel_values": torch.randn(b, 3, size, size)}
            if labels:
                batch["labels"] = R(0, 3, (b,))
            out.append(batch)
        return out

    return batches


FAMILIES: dict[str, Family] = {
    # encoder-decoders: the two batches' decoder / encoder length ratios differ (5/12, 20/4)
    "t5": Family(
        _t5,
        lambda: [
            {"input_ids": R(1, 64, (2, 12)), "labels": R(1, 64, (2, 5))},
            {"input_ids": R(1, 64, (3, 4)), "labels": R(1, 64, (3, 20))},
        ],
        ["q", "v"],
        decoder="labels",
    ),
    "bart": Family(
        _bart,
        lambda: [
            {"input_ids": R(3, 64, (2, 12)), "labels": R(3, 64, (2, 5))},
            {"input_ids": R(3, 64, (3, 4)), "labels": R(3, 64, (3, 20))},
        ],
        ["q_proj", "v_proj"],
        decoder="labels",
    ),
    "whisper": Family(
        _whisper,
        lambda: [
            {"input_features": torch.randn(2, 8, 32), "labels": R(3, 64, (2, 5))},
            {"input_features": torch.randn(3, 8, 32), "labels": R(3, 64, (3, 11))},
        ],
        ["q_proj", "v_proj"],
        decoder="labels",
    ),
    "vit": Family(_vit, _images(16), ["q_proj", "v_proj"]),
    "clip_vision": Family(_clip_vision, _images(16, labels=False), ["q_proj", "v_proj"]),
    "llava": Family(
        _llava, lambda: [_llava_batch(2, 24), _llava_batch(2, 40)], ["q_proj", "v_proj"]
    ),
    "resnet": Family(_resnet, _images(32), ["convolution"]),
    "convnext": Family(_convnext, _images(32), ["pwconv1", "pwconv2"]),
    "unet": Family(
        _unet,
        lambda: [
            {"sample": torch.randn(2, 3, 16, 16), "timestep": torch.tensor([3, 5])},
            {"sample": torch.randn(3, 3, 16, 16), "timestep": torch.tensor([1, 2, 3])},
        ],
        ["to_q", "to_v"],
    ),
    "dit": Family(
        _dit,
        lambda: [
            {
                "hidden_states": torch.randn(2, 4, 8, 8),
                "timestep": torch.tensor([3, 5]),
                "class_labels": torch.tensor([1, 2]),
            },
            {
                "hidden_states": torch.randn(3, 4, 8, 8),
                "timestep": torch.tensor([1, 2, 3]),
                "class_labels": torch.tensor([1, 2, 3]),
            },
        ],
        ["to_q", "to_v"],
    ),
}


def make(family: Family, mode: str) -> nn.Module:
    torch.manual_seed(0)
    model = family.build()
    if mode == "lora":
        model = peft.get_peft_model(model, peft.LoraConfig(r=4, target_modules=family.lora))
    model.train()
    return model


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["full", "lora"])
@pytest.mark.parametrize("name", list(FAMILIES))
def test_stream_estimate_equals_dispatch_count(name: str, mode: str) -> None:
    family = FAMILIES[name]
    model = make(family, mode)
    torch.manual_seed(1)
    batches = family.batches()
    profile = profile_model(model, **batches[0])
    assert profile.recognised, profile.notes
    truth = sum(dispatch_count(model, batch) for batch in batches)
    estimate = transformer_estimate(profile, hand_totals(batches, family.decoder))
    assert estimate.flops == pytest.approx(truth, rel=1e-6)


def test_t5_streams_and_the_long_target_run() -> None:
    """T5 with long targets: the decoder's work scales with the decoder tokens (main scaled
    it all by the encoder's tokens: 0.086x of the truth on such a run)."""
    model = make(FAMILIES["t5"], "full")
    profile = profile_model(model, input_ids=R(1, 64, (2, 8)), labels=R(1, 64, (2, 3)))
    streams = {(g.kind, g.stream) for g in profile.linear}
    assert streams == {("linear", "text"), ("linear", "decoder"), ("lm_head", "decoder")}
    # per encoder token: 2 layers x (q, k, v, o 32x32 + wi 32x64 + wo 64x32) = 2 x 8192, plus
    # the cross-attention's k and v over the encoder's output: 2 layers x 2 x 1024
    text = sum(g.macs_per_token for g in profile.linear if g.stream == "text")
    assert text == 2 * 8192 + 2 * 2 * 1024
    assert (
        sorted(a.stream for a in profile.attention)
        == ["cross"] * 2 + ["decoder"] * 2 + ["text"] * 2
    )
    assert profile.streams == StreamSizes(
        text_tokens=16, decoder_tokens=6, items=2, text_only=False, item_key=""
    )
    batches = [{"input_ids": R(1, 64, (2, 16)), "labels": R(1, 64, (2, 256))}]
    truth = dispatch_count(model, batches[0])
    estimate = transformer_estimate(profile, hand_totals(batches, "labels"))
    assert estimate.flops == pytest.approx(truth, rel=1e-6)


def test_causal_convention_halves_the_decoder_not_the_encoder_or_cross_attention() -> None:
    model = make(FAMILIES["t5"], "full")
    batch = {"input_ids": R(1, 64, (2, 12)), "labels": R(1, 64, (2, 5))}
    profile = profile_model(model, **batch)
    totals = hand_totals([batch], "labels")
    full = transformer_estimate(profile, totals).inputs["attention_flops"]
    causal = transformer_estimate(profile, totals, attention="causal").inputs["attention_flops"]
    per_pair = 2 * (32 * 3 + 32 * 3)  # width 4 heads x 8, every gradient
    # 2 layers each: encoder 2 x 12^2 (full either way), cross 2 x 12 x 5, decoder 2 x 5^2
    # full, or its causal half 2 x 5 x 6 / 2
    assert full == 2 * per_pair * (288 + 120 + 50)
    assert causal == 2 * per_pair * (288 + 120 + 30)


def test_equal_lengths_in_the_profiled_batch_are_split_by_module() -> None:
    """Encoder and decoder of equal length in the profiled micro-batch: the rows cannot tell
    the streams apart, the modules do (decoder, cross-attention keys and values, lm_head)."""
    model = make(FAMILIES["bart"], "full")
    torch.manual_seed(2)
    profiled = {"input_ids": R(3, 64, (2, 8)), "labels": R(3, 64, (2, 8))}
    profile = profile_model(model, **profiled)
    assert profile.recognised, profile.notes
    batches = [profiled, {"input_ids": R(3, 64, (1, 30)), "labels": R(3, 64, (1, 3))}]
    truth = sum(dispatch_count(model, b) for b in batches)
    estimate = transformer_estimate(profile, hand_totals(batches, "labels"))
    assert estimate.flops == pytest.approx(truth, rel=1e-6)


def test_padded_encoder_decoder_batch_counts_its_unpadded_sequences() -> None:
    model = make(FAMILIES["t5"], "lora")
    lengths = [(10, 3), (4, 7)]  # (encoder, decoder) non-padding lengths
    ids = torch.zeros((2, 10), dtype=torch.long)
    mask = torch.zeros((2, 10), dtype=torch.long)
    labels = torch.full((2, 7), -100)
    rows = []
    for i, (te, td) in enumerate(lengths):
        x, y = R(1, 64, (1, te)), R(1, 64, (1, td))
        ids[i, :te], mask[i, :te], labels[i, :td] = x[0], 1, y[0]
        rows.append({"input_ids": x, "labels": y})
    profile = profile_model(model, input_ids=ids, attention_mask=mask, labels=labels)
    assert profile.recognised, profile.notes
    truth = sum(dispatch_count(model, row) for row in rows)
    totals = hand_totals(rows, "labels")  # non-padding counts: the sequences on their own
    assert transformer_estimate(profile, totals).flops == pytest.approx(truth, rel=1e-6)


def test_a_stream_the_run_did_not_count_gives_no_estimate() -> None:
    t5 = make(FAMILIES["t5"], "full")
    batch = FAMILIES["t5"].batches()[0]
    profile = profile_model(t5, **batch)
    text_only = TokenTotals(tokens_processed=24, sum_sq_seq_len=288, sequences=2, micro_batches=1)
    estimate = transformer_estimate(profile, text_only)
    assert estimate.flops is None
    assert "decoder_tokens" in estimate.notes[0]
    vit = make(FAMILIES["vit"], "full")
    profile = profile_model(vit, **FAMILIES["vit"].batches()[0])
    estimate = transformer_estimate(profile, TokenTotals(micro_batches=1))
    assert estimate.flops is None
    assert "items" in estimate.notes[0]


def test_per_item_work_holds_only_at_the_profiled_input_shape() -> None:
    model = make(FAMILIES["vit"], "full")
    profile = profile_model(model, pixel_values=torch.randn(2, 3, 16, 16), labels=R(0, 3, (2,)))
    assert profile.streams.item_key == "pixel_values:3x16x16"
    same = InputShapeCount(key="labels:;pixel_values:3x16x16", micro_batches=2, items=5)
    other = InputShapeCount(key="labels:;pixel_values:3x32x32", micro_batches=1, items=2)
    base = {"items": 7, "micro_batches": 3, "sequences": 7}
    kept = transformer_estimate(profile, TokenTotals(**base, input_shapes=(same,)))
    assert kept.flops is not None and kept.flops > 0
    mixed = transformer_estimate(profile, TokenTotals(**base, input_shapes=(same, other)))
    assert mixed.flops is None
    assert "3x32x32" in mixed.notes[0]


def test_clip_contrastive_logits_are_not_silently_recognised() -> None:
    config = transformers.CLIPConfig(
        text_config={
            "vocab_size": 64,
            "hidden_size": 32,
            "num_hidden_layers": 1,
            "num_attention_heads": 4,
            "intermediate_size": 64,
            "max_position_embeddings": 32,
        },
        vision_config={**VISION, "num_hidden_layers": 1},
        projection_dim=16,
    )
    model = transformers.CLIPModel._from_config(config, attn_implementation="eager").train()
    profile = profile_model(
        model, input_ids=R(0, 64, (2, 7)), pixel_values=torch.randn(2, 3, 16, 16)
    )
    assert not profile.recognised
    assert any("CLIPModel" in note and "contrastive" in note for note in profile.notes)


def test_qwen2_vl_vision_tower_is_not_recognised_and_says_why() -> None:
    """Qwen2-VL's vision tower packs a varying number of patches per image into one sequence
    with a fused qkv projection: not modelled, so not recognised, naming the class."""
    config = transformers.Qwen2VLConfig(
        vision_config={
            "depth": 1,
            "embed_dim": 32,
            "hidden_size": 32,
            "num_heads": 4,
            "mlp_ratio": 2,
            "patch_size": 2,
            "spatial_merge_size": 2,
            "temporal_patch_size": 2,
        },
        text_config={
            "vocab_size": 64,
            "hidden_size": 32,
            "num_hidden_layers": 1,
            "num_attention_heads": 4,
            "num_key_value_heads": 2,
            "intermediate_size": 64,
            "rope_scaling": {"type": "mrope", "mrope_section": [1, 1, 2]},
        },
        image_token_id=63,
        vision_start_token_id=61,
        vision_end_token_id=62,
    )
    model = transformers.Qwen2VLForConditionalGeneration._from_config(
        config, attn_implementation="eager"
    ).train()
    ids = R(0, 60, (1, 12))
    ids[0, 2], ids[0, 3:7], ids[0, 7] = 61, 63, 62  # one 4x4-patch image, merged to 4 tokens
    kinds = torch.zeros_like(ids)
    kinds[0, 3:7] = 1
    profile = profile_model(
        model,
        input_ids=ids,
        pixel_values=torch.randn(16, 3 * 2 * 2 * 2),
        image_grid_thw=torch.tensor([[1, 4, 4]]),
        mm_token_type_ids=kinds,
        labels=ids,
    )
    assert not profile.recognised
    assert any("VisionAttention" in note for note in profile.notes)


class _Convs(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.grouped = nn.Conv2d(8, 12, kernel_size=3, stride=2, padding=1, groups=4)
        self.up = nn.ConvTranspose2d(12, 6, kernel_size=2, stride=2, groups=2)
        self.line = nn.Conv1d(6, 4, kernel_size=5, dilation=2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.up(self.grouped(x))  # [B, 6, 10, 10]
        return self.line(y.flatten(2))  # [B, 4, 92]


def test_convolution_work_by_hand() -> None:
    model = _Convs()
    x = torch.randn(3, 8, 10, 10)
    profile = profile_model(model, x)
    groups = {
        (g.kind, g.stream, g.input_grad, g.weight_grad): g.macs_per_token for g in profile.linear
    }
    # per item: grouped 5x5 out x 12 out x (8/4) in x 9 = 5400 (its input needs no gradient);
    # transposed: 5x5 in positions x 12 in x (6/2) out x 4 = 3600; conv1d: 92 out x 4 x 6 x 5
    # = 11040
    assert groups == {
        ("conv", "items", False, True): 5400,
        ("conv", "items", True, True): 3600 + 11040,
    }
    with FlopCounterMode(display=False, custom_mapping=_mapping()) as counter:
        model(x).pow(2).mean().backward()
    truth = counter.get_total_flops()
    totals = TokenTotals(items=3, micro_batches=1, sequences=3)
    assert transformer_estimate(profile, totals).flops == pytest.approx(truth, rel=1e-9)


@pytest.mark.parametrize(
    ("name", "rows", "kind", "cross", "stream"),
    [
        ("encoder.block.0.layer.0.SelfAttention.q", 16, "linear", False, "text"),
        ("decoder.block.0.layer.0.SelfAttention.q", 6, "linear", False, "decoder"),
        ("decoder.block.0.layer.1.EncDecAttention.k", 16, "linear", True, "text"),
        ("lm_head", 6, "lm_head", False, "decoder"),
        ("vision_tower.encoder.layers.0.mlp.fc1", 34, "linear", False, "items"),
        ("classifier", 2, "linear", False, "items"),
    ],
)
def test_stream_of_a_call_by_rows(name: str, rows: int, kind: str, cross: bool, stream: str):
    sizes = StreamSizes(text_tokens=16, decoder_tokens=6, items=2, text_only=False)
    assert stream_of(name, rows, sizes, kind, cross) == stream


@pytest.mark.parametrize(
    ("name", "kind", "cross", "stream"),
    [
        ("encoder.layers.0.fc1", "linear", False, "text"),
        ("decoder.layers.0.fc1", "linear", False, "decoder"),
        ("decoder.layers.0.encoder_attn.k_proj", "linear", True, "text"),
        ("lm_head", "lm_head", False, "decoder"),
        ("model.vision_tower.layers.0.fc1", "linear", False, "items"),
    ],
)
def test_stream_of_a_call_on_equal_lengths_by_module(
    name: str, kind: str, cross: bool, stream: str
) -> None:
    sizes = StreamSizes(text_tokens=16, decoder_tokens=16, items=2, text_only=False)
    assert stream_of(name, 16, sizes, kind, cross) == stream


def test_a_text_only_micro_batch_keeps_one_stream() -> None:
    sizes = StreamSizes(text_tokens=16)
    assert stream_of("model.vision_tower.fc1", 7, sizes) == "text"
