"""The model families of issue 20, tiny: one builder per family (the real transformers /
diffusers class from a small config, no download), its training micro-batches, and the truth
the tests hold flopmeter's figures to.

The truth is PyTorch's own count (``torch.utils.flop_counter.FlopCounterMode``) of the same
micro-batches, forward and backward, under the project's convention that the work is that of
the non-padding tokens: a padded text batch is counted one sequence at a time, unpadded (see
:func:`truth_units`); a batch without padding (images, latents, audio clips, CLIP's captions of
one length) is counted whole. The truth model is the same config with eager attention (and
eager experts; diffusers' SDPA under the math backend), so that every score matmul is one of
PyTorch's own operators; its only formula not PyTorch's is :func:`conv_backward_flops`, since
PyTorch's ``convolution_backward`` formula ignores ``groups`` (a depthwise convolution's weight
gradient billed ``x channels``). Nothing of flopmeter's registry is used.

A figure that counts the positions computed, padding included (its estimate's
``padding_convention`` is ``padded``: the dispatch count scaled per shape key), is held to
:func:`run_truth` instead: PyTorch's count of the same micro-batches whole, as the run ran them.

Chunked kernels (Mamba2 and Falcon-H1's SSD scan, Qwen3-Next's gated delta rule) pad each
sequence to a whole number of chunks; their rows are whole chunks here, so that the truth has
no kernel padding the convention would have to name.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

import torch
import torch.nn.functional as F
from torch import nn

Mode = Literal["full", "lora"]
MODES: tuple[Mode, ...] = ("full", "lora")
Batch = dict[str, torch.Tensor]

VOCAB = 97
PAD = 0
HIDDEN = 32
#: Right-padded micro-batches of text: (non-padding lengths, width).
TEXT_ROWS = [([7, 4, 6], 7), ([9, 3], 10), ([5, 5, 2, 8], 8)]
#: The same for the chunked kernels (Mamba2 and Falcon-H1 with chunks of 4).
CHUNK4_ROWS = [([8, 4, 8], 8), ([12, 4], 12), ([4, 8, 4, 8], 8)]
#: Qwen3-Next's gated delta rule runs in chunks of 64 (transformers' fixed default).
CHUNK64_ROWS = [([64, 128], 128), ([64], 64)]
#: Images (or latents) per micro-batch.
IMAGE_BATCHES = [2, 3, 1]


# --------------------------------------------------------------------------------- the truth


def conv_backward_flops(
    grad_out_shape: list[int],
    x_shape: list[int],
    w_shape: list[int],
    _bias: Any,
    _stride: Any,
    _padding: Any,
    _dilation: Any,
    transposed: bool,
    _output_padding: Any,
    _groups: int,
    output_mask: list[bool],
    out_shape: Any = None,
) -> int:
    """FLOP of ``aten.convolution_backward`` (grouped convolutions counted right), by hand.

    A convolution's forward does ``items x positions x prod(w_shape)`` multiply-adds, where the
    positions are the output's (the input's for a transposed convolution, whose every input
    element is scattered through the weight) and ``w_shape`` already holds ``C_in / groups``
    (``C_out / groups`` transposed). The input gradient and the weight gradient each do exactly
    as many multiply-adds as the forward; the bias gradient is a sum (not counted, as PyTorch
    counts no reduction).

    Returns:
        FLOP (2 per multiply-add) of the gradients ``output_mask`` asks for.
    """
    positions = math.prod(x_shape[2:] if transposed else grad_out_shape[2:])
    forward = 2 * grad_out_shape[0] * positions * math.prod(w_shape)
    return forward * (int(bool(output_mask[0])) + int(bool(output_mask[1])))


def truth_mapping() -> dict[Any, Callable[..., int]]:
    """``FlopCounterMode``'s ``custom_mapping`` for the truth: PyTorch's formulas, but the
    hand formula for convolution backward."""
    return {torch.ops.aten.convolution_backward: conv_backward_flops}


def count(fn: Callable[[], torch.Tensor]) -> int:
    """PyTorch's count of ``fn()`` (a loss) and its backward, FLOP."""
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from torch.utils.flop_counter import FlopCounterMode

    # SDPA under the math backend: PyTorch's own matmuls (diffusers' attention)
    with (
        sdpa_kernel([SDPBackend.MATH]),
        FlopCounterMode(display=False, custom_mapping=truth_mapping()) as counter,
    ):
        fn().backward()
    return counter.get_total_flops()


# ----------------------------------------------------------------------------- the batches


def _rng(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def text_batch(lengths: list[int], width: int, *, seed: int, low: int = 3) -> Batch:
    """Right-padded ids (``PAD`` after each row), the mask, and labels ``-100`` on padding."""
    g = _rng(seed)
    ids = torch.full((len(lengths), width), PAD, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for r, n in enumerate(lengths):
        ids[r, :n] = torch.randint(low, VOCAB - 8, (n,), generator=g)
        mask[r, :n] = 1
    return {"input_ids": ids, "attention_mask": mask, "labels": ids.masked_fill(mask == 0, -100)}


def text_batches(rows: list[tuple[list[int], int]] = TEXT_ROWS) -> list[Batch]:
    """Causal-LM micro-batches: padded ids, masks, labels ``-100`` on padding."""
    return [text_batch(lengths, width, seed=i) for i, (lengths, width) in enumerate(rows)]


def mlm_batches() -> list[Batch]:
    """Masked-LM micro-batches: a quarter of the real tokens masked (id 3) and labelled, every
    other label ``-100``."""
    out = []
    for i, (lengths, width) in enumerate(TEXT_ROWS):
        batch = text_batch(lengths, width, seed=i, low=4)
        g = _rng(100 + i)
        chosen = (torch.rand(batch["input_ids"].shape, generator=g) < 0.25) & (
            batch["attention_mask"] == 1
        )
        chosen[:, 0] |= True  # at least one label per row
        batch["labels"] = batch["input_ids"].masked_fill(~chosen, -100)
        batch["input_ids"] = batch["input_ids"].masked_fill(chosen, 3)
        out.append(batch)
    return out


def seq2seq_batches(target_rows: list[tuple[list[int], int]] | None = None) -> list[Batch]:
    """Encoder-decoder micro-batches: padded source ids and mask, padded target labels
    (``-100`` on padding) of other lengths than the sources."""
    targets = target_rows or [([3, 6, 2], 6), ([5, 4], 5), ([2, 7, 4, 3], 7)]
    out = []
    for i, ((lengths, width), (t_lengths, t_width)) in enumerate(
        zip(TEXT_ROWS, targets, strict=True)
    ):
        batch = text_batch(lengths, width, seed=i)
        batch["labels"] = text_batch(t_lengths, t_width, seed=50 + i)["labels"]
        out.append(batch)
    return out


def long_target_batches() -> list[Batch]:
    """Encoder-decoder micro-batches with short sources and long targets (the issue's T5 at
    0.086x)."""
    return seq2seq_batches([([30, 24, 28], 30), ([31, 20], 31), ([26, 30, 22, 29], 30)])


def image_batches(size: int = 16, channels: int = 3, *, labels: int | None = 3) -> list[Batch]:
    """Image micro-batches of different sizes: ``pixel_values`` and class labels."""
    out = []
    for i, n in enumerate(IMAGE_BATCHES):
        g = _rng(i)
        batch = {"pixel_values": torch.randn(n, channels, size, size, generator=g)}
        if labels:
            batch["labels"] = torch.randint(0, labels, (n,), generator=g)
        out.append(batch)
    return out


def clip_batches() -> list[Batch]:
    """CLIP micro-batches: images and captions of one length per micro-batch (no padding, so
    the batch is its own truth: the contrastive loss spans the batch)."""
    out = []
    for i, (n, length) in enumerate(zip(IMAGE_BATCHES, [6, 9, 4], strict=True)):
        g = _rng(i)
        ids = torch.randint(3, VOCAB - 8, (n, length), generator=g)
        ids[:, -1] = 2  # the end token the text tower pools
        out.append(
            {
                "input_ids": ids,
                "attention_mask": torch.ones_like(ids),
                "pixel_values": torch.randn(n, 3, 16, 16, generator=g),
                "return_loss": True,
            }
        )
    return out


def clip_padded_batches() -> list[Batch]:
    """CLIP micro-batches whose captions are right-padded to the longest of the micro-batch
    (``PAD`` after the end token, the mask 0 there): the padded case of :func:`clip_batches`."""
    out = []
    for i, lengths in enumerate([[6, 3], [9, 5, 7], [4]]):
        g = _rng(i)
        width = max(lengths)
        ids = torch.full((len(lengths), width), PAD, dtype=torch.long)
        mask = torch.zeros_like(ids)
        for r, n in enumerate(lengths):
            ids[r, :n] = torch.randint(3, VOCAB - 8, (n,), generator=g)
            ids[r, n - 1] = 2  # the end token the text tower pools
            mask[r, :n] = 1
        pixels = torch.randn(len(lengths), 3, 16, 16, generator=g)
        out.append(
            {"input_ids": ids, "attention_mask": mask, "pixel_values": pixels, "return_loss": True}
        )
    return out


def audio_batches(mels: int = 8, frames: int = 32) -> list[Batch]:
    """Whisper micro-batches: log-mel features (the whole window: Whisper takes no other
    length) and padded target labels."""
    out = []
    for i, (lengths, width) in enumerate([([3, 6, 2], 6), ([5, 4], 5), ([2, 7, 4, 3], 7)]):
        labels = text_batch(lengths, width, seed=50 + i)["labels"]
        g = _rng(i)
        features = torch.randn(len(lengths), mels, frames, generator=g)
        out.append({"input_features": features, "labels": labels})
    return out


def _with_image_tokens(batch: Batch, image_token: int, n_image: int, start: int = 1) -> Batch:
    """Puts ``n_image`` image tokens at ``start`` in every row (labels -100 there)."""
    ids = batch["input_ids"].clone()
    ids[:, start : start + n_image] = image_token
    labels = batch["labels"].clone()
    labels[:, start : start + n_image] = -100
    return {**batch, "input_ids": ids, "labels": labels}


def vlm_rows() -> list[tuple[list[int], int]]:
    """Text rows long enough for the image tokens (and Qwen2-VL's start and end tokens)."""
    return [([9, 7, 12], 12), ([14, 8], 14), ([10, 8, 11, 8], 11)]


def llava_batches(image_token: int) -> list[Batch]:
    """LLaVA micro-batches: one 8x8 image per row (4 patches, 4 image tokens) and text."""
    out = []
    for i, (lengths, width) in enumerate(vlm_rows()):
        batch = _with_image_tokens(text_batch(lengths, width, seed=i), image_token, 4)
        batch["pixel_values"] = torch.randn(len(lengths), 3, 8, 8, generator=_rng(i))
        out.append(batch)
    return out


def gemma3_batches(image_token: int) -> list[Batch]:
    """Gemma 3 micro-batches: one 16x16 image per row (pooled to 4 image tokens), text, and
    the ``token_type_ids`` (1 on image tokens) Gemma 3 needs in training."""
    out = []
    for i, (lengths, width) in enumerate(vlm_rows()):
        batch = _with_image_tokens(text_batch(lengths, width, seed=i), image_token, 4)
        batch["pixel_values"] = torch.randn(len(lengths), 3, 16, 16, generator=_rng(i))
        batch["token_type_ids"] = (batch["input_ids"] == image_token).long()
        out.append(batch)
    return out


#: Qwen2-VL's images here: a 1 x 4 x 4 grid of 2x2 patches (frames of 2), merged 2x2 into 4
#: image tokens; a patch is 3 x 2 x 2 x 2 = 24 values.
QWEN2VL_GRID = (1, 4, 4)
QWEN2VL_PATCH = 24


def qwen2vl_batches(image_token: int, start_token: int, end_token: int) -> list[Batch]:
    """Qwen2-VL micro-batches: one image per row, its patches flattened along the batch as
    the processor makes them (``pixel_values [patches, 24]``, ``image_grid_thw [images, 3]``)."""
    out = []
    patches = math.prod(QWEN2VL_GRID)
    for i, (lengths, width) in enumerate(vlm_rows()):
        batch = _with_image_tokens(text_batch(lengths, width, seed=i), image_token, 4, start=2)
        batch["input_ids"][:, 1] = start_token
        batch["input_ids"][:, 6] = end_token
        rows = len(lengths)
        batch["pixel_values"] = torch.randn(rows * patches, QWEN2VL_PATCH, generator=_rng(i))
        batch["image_grid_thw"] = torch.tensor([QWEN2VL_GRID] * rows)
        batch["mm_token_type_ids"] = (batch["input_ids"] == image_token).long()
        out.append(batch)
    return out


def latent_batches(channels: int, size: int, *, classes: int | None) -> list[Batch]:
    """Diffusion micro-batches: noisy latents, integer timesteps, (class labels), and the
    noise to predict (``target``, the loss's, not the model's)."""
    out = []
    for i, n in enumerate(IMAGE_BATCHES):
        g = _rng(i)
        batch = {
            "sample": torch.randn(n, channels, size, size, generator=g),
            "timestep": torch.randint(0, 1000, (n,), generator=g),
            "target": torch.randn(n, channels, size, size, generator=g),
        }
        if classes:
            batch["class_labels"] = torch.randint(0, classes, (n,), generator=g)
        out.append(batch)
    return out


def truth_units(batch: Batch, per_row: bool, seq2seq: bool = False) -> list[Batch]:
    """The pieces the truth counts ``batch`` in: each row unpadded on its own (``per_row``),
    else the batch whole.

    A row keeps its ``[rows, width]`` text tensors cut to its mask's length, its labels cut
    to its last label (``seq2seq``: the decoder stream) or like the ids, its Qwen2-VL patches
    (by ``image_grid_thw``) and its slice of every other tensor.
    """
    if not per_row:
        return [batch]
    ids = batch.get("input_ids")
    grid = batch.get("image_grid_thw")
    units = []
    for r in range(len(batch["labels"])):
        n_src = int(batch["attention_mask"][r].sum()) if "attention_mask" in batch else None
        unit: Batch = {}
        for key, value in batch.items():
            if not isinstance(value, torch.Tensor):
                unit[key] = value
            elif key == "labels" and (seq2seq or ids is None):
                n = int((value[r] != -100).nonzero().max()) + 1
                unit[key] = value[r : r + 1, :n]
            elif key == "pixel_values" and grid is not None:
                per = int(grid[r].prod())
                unit[key] = value[r * per : (r + 1) * per]
            elif ids is not None and value.dim() == 2 and value.shape == ids.shape:
                unit[key] = value[r : r + 1, :n_src]
            else:
                unit[key] = value[r : r + 1]
        units.append(unit)
    return units


# ----------------------------------------------------------------------------- the families


@dataclass(frozen=True)
class Family:
    """One model family.

    Attributes:
        name: The family's name in test ids and tables.
        make: ``make(eager)``: the base model (seeded), with eager attention and experts when
            ``eager`` (the truth's), the defaults otherwise (SDPA, grouped experts: the metered
            run's). Diffusers models have one form (their SDPA runs under the math backend in
            the truth's count).
        batches: The training micro-batches (several shapes).
        lora_targets: peft LoRA ``target_modules`` that exist in the family.
        tokens: What the report should call "tokens" for it (docs/methodology.md).
        exact: The issue names it among the families the FLOP model must know exactly.
        per_row: The truth counts each padded row on its own (else each batch whole).
        loss: The training loss of a micro-batch (default: the model's own ``.loss``).
        seq2seq: Labels are a decoder stream (not the ids' own).
        six_nd_meaningful: The guidelines' 6ND is a meaningful reference (docs/methodology.md).
    """

    name: str
    make: Callable[[bool], nn.Module]
    batches: Callable[[], list[Batch]]
    lora_targets: list[str]
    tokens: str
    exact: bool = False
    per_row: bool = True
    loss: Callable[[nn.Module, Batch], torch.Tensor] | None = None
    seq2seq: bool = False
    six_nd_meaningful: bool = True


def _hf(model_class: str, config: Any, eager: bool, *, experts: bool = False) -> nn.Module:
    import transformers

    kwargs: dict[str, Any] = {}
    if eager:
        kwargs["attn_implementation"] = "eager"
        if experts:
            kwargs["experts_implementation"] = "eager"
    torch.manual_seed(0)
    return getattr(transformers, model_class)._from_config(config, **kwargs)


def _llama_text(**over: Any) -> Any:
    import transformers

    kw: dict[str, Any] = dict(
        vocab_size=VOCAB,
        hidden_size=HIDDEN,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
        pad_token_id=PAD,
        tie_word_embeddings=False,
    )
    kw.update(over)
    return transformers.LlamaConfig(**kw)


def _llama(eager: bool) -> nn.Module:
    return _hf("LlamaForCausalLM", _llama_text(), eager)


def _bert(eager: bool) -> nn.Module:
    import transformers

    config = transformers.BertConfig(
        vocab_size=VOCAB,
        hidden_size=HIDDEN,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=64,
        max_position_embeddings=64,
        pad_token_id=PAD,
    )
    return _hf("BertForMaskedLM", config, eager)


def _modernbert(eager: bool) -> nn.Module:
    import transformers

    config = transformers.ModernBertConfig(
        vocab_size=VOCAB,
        hidden_size=HIDDEN,
        intermediate_size=64,
        num_hidden_layers=3,
        num_attention_heads=4,
        max_position_embeddings=64,
        global_attn_every_n_layers=3,
        local_attention=8,
        pad_token_id=PAD,
        bos_token_id=1,
        eos_token_id=2,
        cls_token_id=1,
        sep_token_id=2,
    )
    return _hf("ModernBertForMaskedLM", config, eager)


def _t5(eager: bool) -> nn.Module:
    import transformers

    config = transformers.T5Config(
        vocab_size=VOCAB,
        d_model=HIDDEN,
        d_kv=8,
        d_ff=64,
        num_layers=2,
        num_decoder_layers=2,
        num_heads=4,
        pad_token_id=PAD,
        decoder_start_token_id=PAD,
        eos_token_id=1,
    )
    return _hf("T5ForConditionalGeneration", config, eager)


def _bart(eager: bool) -> nn.Module:
    import transformers

    config = transformers.BartConfig(
        vocab_size=VOCAB,
        d_model=HIDDEN,
        encoder_layers=2,
        decoder_layers=2,
        encoder_attention_heads=4,
        decoder_attention_heads=4,
        encoder_ffn_dim=64,
        decoder_ffn_dim=64,
        max_position_embeddings=64,
        pad_token_id=PAD,
        bos_token_id=1,
        eos_token_id=2,
        decoder_start_token_id=2,
        forced_eos_token_id=None,
    )
    return _hf("BartForConditionalGeneration", config, eager)


def _whisper(eager: bool) -> nn.Module:
    import transformers

    config = transformers.WhisperConfig(
        vocab_size=VOCAB,
        num_mel_bins=8,
        d_model=HIDDEN,
        encoder_layers=2,
        decoder_layers=2,
        encoder_attention_heads=4,
        decoder_attention_heads=4,
        encoder_ffn_dim=64,
        decoder_ffn_dim=64,
        max_source_positions=16,
        max_target_positions=32,
        pad_token_id=PAD,
        bos_token_id=1,
        eos_token_id=2,
        decoder_start_token_id=1,
        suppress_tokens=None,
        begin_suppress_tokens=None,
    )
    return _hf("WhisperForConditionalGeneration", config, eager)


def _vit(eager: bool) -> nn.Module:
    import transformers

    config = transformers.ViTConfig(
        image_size=16,
        patch_size=4,
        hidden_size=HIDDEN,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=64,
        num_labels=3,
    )
    return _hf("ViTForImageClassification", config, eager)


def _clip_config() -> Any:
    import transformers

    text = transformers.CLIPTextConfig(
        vocab_size=VOCAB,
        hidden_size=HIDDEN,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        max_position_embeddings=32,
        pad_token_id=PAD,
        bos_token_id=1,
        eos_token_id=2,
    )
    vision = transformers.CLIPVisionConfig(
        hidden_size=HIDDEN,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        image_size=16,
        patch_size=4,
    )
    return text, vision


def _clip(eager: bool) -> nn.Module:
    import transformers

    text, vision = _clip_config()
    config = transformers.CLIPConfig(
        text_config=text.to_dict(), vision_config=vision.to_dict(), projection_dim=16
    )
    return _hf("CLIPModel", config, eager)


def _convnext(eager: bool) -> nn.Module:
    import transformers

    config = transformers.ConvNextConfig(
        num_stages=2, hidden_sizes=[8, 16], depths=[1, 1], patch_size=2, num_labels=3
    )
    return _hf("ConvNextForImageClassification", config, eager)


def _resnet(eager: bool) -> nn.Module:
    import transformers

    config = transformers.ResNetConfig(
        embedding_size=8, hidden_sizes=[8, 16], depths=[1, 1], layer_type="basic", num_labels=3
    )
    return _hf("ResNetForImageClassification", config, eager)


LLAVA_IMAGE = VOCAB - 1


def _llava(eager: bool) -> nn.Module:
    import transformers

    vision = transformers.CLIPVisionConfig(
        hidden_size=HIDDEN,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        image_size=8,
        patch_size=4,
    )
    config = transformers.LlavaConfig(
        vision_config=vision.to_dict(),
        text_config=_llama_text().to_dict(),
        image_token_id=LLAVA_IMAGE,
        vision_feature_layer=-1,
        projector_hidden_act="gelu",
    )
    return _hf("LlavaForConditionalGeneration", config, eager)


QWEN2VL_IMAGE, QWEN2VL_START, QWEN2VL_END = VOCAB - 1, VOCAB - 2, VOCAB - 3


def _qwen2vl(eager: bool) -> nn.Module:
    import transformers

    config = transformers.Qwen2VLConfig(
        text_config=dict(
            vocab_size=VOCAB,
            hidden_size=HIDDEN,
            intermediate_size=64,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            max_position_embeddings=256,
            pad_token_id=PAD,
            bos_token_id=1,
            eos_token_id=2,
            rope_scaling={"type": "mrope", "mrope_section": [1, 1, 2]},
            rope_parameters={"rope_type": "default", "mrope_section": [1, 1, 2]},
            tie_word_embeddings=False,
        ),
        vision_config=dict(
            depth=2,
            embed_dim=HIDDEN,
            hidden_size=HIDDEN,
            num_heads=4,
            mlp_ratio=2,
            patch_size=2,
            spatial_merge_size=2,
            temporal_patch_size=2,
            in_channels=3,
        ),
        image_token_id=QWEN2VL_IMAGE,
        bos_token_id=1,
        eos_token_id=2,
        video_token_id=VOCAB - 4,
        vision_start_token_id=QWEN2VL_START,
        vision_end_token_id=QWEN2VL_END,
    )
    return _hf("Qwen2VLForConditionalGeneration", config, eager)


GEMMA3_IMAGE = VOCAB - 1


def _gemma3(eager: bool) -> nn.Module:
    import transformers

    text = transformers.Gemma3TextConfig(
        vocab_size=VOCAB,
        hidden_size=HIDDEN,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=8,
        max_position_embeddings=256,
        sliding_window=8,
        pad_token_id=PAD,
    )
    vision = transformers.SiglipVisionConfig(
        hidden_size=HIDDEN,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        image_size=16,
        patch_size=4,
    )
    config = transformers.Gemma3Config(
        text_config=text.to_dict(),
        vision_config=vision.to_dict(),
        mm_tokens_per_image=4,
        image_token_index=GEMMA3_IMAGE,
        boi_token_index=VOCAB - 2,
        eoi_token_index=VOCAB - 3,
    )
    return _hf("Gemma3ForConditionalGeneration", config, eager)


def _mamba(eager: bool) -> nn.Module:
    from tests.support.models import tiny_mamba_config

    config = tiny_mamba_config(vocab_size=VOCAB, hidden_size=HIDDEN, pad_token_id=PAD)
    return _hf("MambaForCausalLM", config, eager)


def _mamba2(eager: bool) -> nn.Module:
    from tests.support.models import tiny_mamba2_config

    config = tiny_mamba2_config(vocab_size=VOCAB, hidden_size=HIDDEN, pad_token_id=PAD)
    return _hf("Mamba2ForCausalLM", config, eager)


def _jamba(eager: bool) -> nn.Module:
    from tests.support.models import tiny_jamba_config

    config = tiny_jamba_config(
        vocab_size=VOCAB, hidden_size=HIDDEN, use_mamba_kernels=False, pad_token_id=PAD
    )
    return _hf("JambaForCausalLM", config, eager, experts=True)


def _falcon_h1(eager: bool) -> nn.Module:
    import transformers

    config = transformers.FalconH1Config(
        vocab_size=VOCAB,
        hidden_size=HIDDEN,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=8,
        mamba_d_ssm=64,
        mamba_n_heads=4,
        mamba_d_head=16,
        mamba_n_groups=1,
        mamba_d_state=8,
        mamba_d_conv=4,
        mamba_expand=2,
        mamba_chunk_size=4,
        pad_token_id=PAD,
        max_position_embeddings=256,
        tie_word_embeddings=False,
    )
    return _hf("FalconH1ForCausalLM", config, eager)


def _qwen3_next(eager: bool) -> nn.Module:
    import transformers

    config = transformers.Qwen3NextConfig(
        vocab_size=VOCAB,
        hidden_size=HIDDEN,
        intermediate_size=64,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=8,
        linear_num_value_heads=4,
        linear_num_key_heads=2,
        linear_key_head_dim=8,
        linear_value_head_dim=8,
        linear_conv_kernel_dim=4,
        num_experts=4,
        num_experts_per_tok=2,
        moe_intermediate_size=16,
        shared_expert_intermediate_size=16,
        decoder_sparse_step=1,
        pad_token_id=PAD,
        max_position_embeddings=256,
    )
    return _hf("Qwen3NextForCausalLM", config, eager, experts=True)


def _deepseek_v3(eager: bool) -> nn.Module:
    import transformers

    config = transformers.DeepseekV3Config(
        vocab_size=VOCAB,
        hidden_size=HIDDEN,
        intermediate_size=64,
        moe_intermediate_size=16,
        num_hidden_layers=2,
        first_k_dense_replace=1,
        num_attention_heads=4,
        num_key_value_heads=4,
        n_routed_experts=4,
        num_experts_per_tok=2,
        n_group=1,
        topk_group=1,
        n_shared_experts=1,
        q_lora_rank=16,
        kv_lora_rank=16,
        qk_rope_head_dim=4,
        qk_nope_head_dim=8,
        v_head_dim=8,
        pad_token_id=PAD,
        max_position_embeddings=256,
    )
    return _hf("DeepseekV3ForCausalLM", config, eager, experts=True)


def _llama4(eager: bool) -> nn.Module:
    import transformers

    config = transformers.Llama4TextConfig(
        vocab_size=VOCAB,
        hidden_size=HIDDEN,
        intermediate_size=32,
        intermediate_size_mlp=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=8,
        num_local_experts=4,
        num_experts_per_tok=2,
        interleave_moe_layer_step=1,
        attention_chunk_size=64,
        pad_token_id=PAD,
        max_position_embeddings=256,
    )
    return _hf("Llama4ForCausalLM", config, eager, experts=True)


def _gpt_oss(eager: bool) -> nn.Module:
    import transformers

    config = transformers.GptOssConfig(
        vocab_size=VOCAB,
        hidden_size=HIDDEN,
        intermediate_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=8,
        num_local_experts=4,
        num_experts_per_tok=2,
        sliding_window=4,
        pad_token_id=PAD,
        max_position_embeddings=256,
    )
    return _hf("GptOssForCausalLM", config, eager, experts=True)


def _dit(eager: bool) -> nn.Module:
    from diffusers import DiTTransformer2DModel

    torch.manual_seed(0)
    model = DiTTransformer2DModel(
        num_attention_heads=2,
        attention_head_dim=8,
        in_channels=4,
        num_layers=2,
        sample_size=8,
        patch_size=2,
        num_embeds_ada_norm=10,
    )
    return model


def _unet(eager: bool) -> nn.Module:
    from diffusers import UNet2DModel

    torch.manual_seed(0)
    model = UNet2DModel(
        sample_size=8,
        in_channels=3,
        out_channels=3,
        layers_per_block=1,
        block_out_channels=(8, 16),
        down_block_types=("DownBlock2D", "AttnDownBlock2D"),
        up_block_types=("AttnUpBlock2D", "UpBlock2D"),
        norm_num_groups=4,
        attention_head_dim=4,
    )
    return model


def _dit_loss(model: nn.Module, batch: Batch) -> torch.Tensor:
    out = model(
        hidden_states=batch["sample"],
        timestep=batch["timestep"],
        class_labels=batch["class_labels"],
    ).sample
    return F.mse_loss(out, batch["target"])


def _unet_loss(model: nn.Module, batch: Batch) -> torch.Tensor:
    out = model(sample=batch["sample"], timestep=batch["timestep"]).sample
    return F.mse_loss(out, batch["target"])


_ATTN = ["q_proj", "v_proj"]
_TEXT = "text tokens seen by the model (non-padding ids)"

FAMILIES: dict[str, Family] = {
    f.name: f
    for f in [
        Family("llama", _llama, text_batches, _ATTN, _TEXT),
        Family("bert", _bert, mlm_batches, ["query", "value"], _TEXT),
        Family("modernbert", _modernbert, mlm_batches, ["Wqkv"], _TEXT),
        Family(
            "t5",
            _t5,
            seq2seq_batches,
            ["q", "v"],
            "encoder and decoder tokens (non-padding source ids and target labels)",
            exact=True,
            seq2seq=True,
        ),
        Family(
            "bart",
            _bart,
            seq2seq_batches,
            _ATTN,
            "encoder and decoder tokens (non-padding source ids and target labels)",
            exact=True,
            seq2seq=True,
        ),
        Family(
            "whisper",
            _whisper,
            audio_batches,
            _ATTN,
            "audio frames (encoder positions) and decoder tokens (target labels)",
            exact=True,
            seq2seq=True,
            six_nd_meaningful=False,
        ),
        Family(
            "vit",
            _vit,
            image_batches,
            _ATTN,
            "image patches (plus the class token)",
            per_row=False,
            six_nd_meaningful=False,
        ),
        Family(
            "clip",
            _clip,
            clip_batches,
            _ATTN,
            "text tokens and image patches (two towers)",
            per_row=False,
            six_nd_meaningful=False,
        ),
        Family(
            "convnext",
            _convnext,
            image_batches,
            ["pwconv1", "pwconv2"],
            "items (images): a CNN has no tokens",
            per_row=False,
            six_nd_meaningful=False,
        ),
        Family(
            "resnet",
            _resnet,
            image_batches,
            ["convolution"],
            "items (images): a CNN has no tokens",
            per_row=False,
            six_nd_meaningful=False,
        ),
        Family(
            "llava",
            _llava,
            lambda: llava_batches(LLAVA_IMAGE),
            _ATTN,
            "text tokens (image placeholders included) and the vision tower's patches",
            exact=True,
        ),
        Family(
            "qwen2_vl",
            _qwen2vl,
            lambda: qwen2vl_batches(QWEN2VL_IMAGE, QWEN2VL_START, QWEN2VL_END),
            _ATTN,
            "text tokens (image placeholders included) and the vision tower's patches",
            exact=True,
        ),
        Family(
            "gemma3",
            _gemma3,
            lambda: gemma3_batches(GEMMA3_IMAGE),
            _ATTN,
            "text tokens (image placeholders included) and the vision tower's patches",
            exact=True,
        ),
        Family("mamba", _mamba, text_batches, ["in_proj", "x_proj"], _TEXT, exact=True),
        Family(
            "mamba2",
            _mamba2,
            lambda: text_batches(CHUNK4_ROWS),
            ["in_proj"],
            _TEXT,
            exact=True,
        ),
        Family("jamba", _jamba, text_batches, ["q_proj", "v_proj", "in_proj"], _TEXT, exact=True),
        Family(
            "falcon_h1",
            _falcon_h1,
            lambda: text_batches(CHUNK4_ROWS),
            ["q_proj", "v_proj", "in_proj"],
            _TEXT,
            exact=True,
        ),
        Family(
            "qwen3_next",
            _qwen3_next,
            lambda: text_batches(CHUNK64_ROWS),
            ["q_proj", "v_proj", "in_proj_qkvz"],
            _TEXT,
            exact=True,
        ),
        Family(
            "deepseek_v3", _deepseek_v3, text_batches, ["q_b_proj", "kv_b_proj"], _TEXT, exact=True
        ),
        Family("llama4", _llama4, text_batches, _ATTN, _TEXT, exact=True),
        Family("gpt_oss", _gpt_oss, text_batches, _ATTN, _TEXT),
        Family(
            "dit",
            _dit,
            lambda: latent_batches(4, 8, classes=10),
            ["to_q", "to_v"],
            "items (latents): the patches are internal",
            per_row=False,
            loss=_dit_loss,
            six_nd_meaningful=False,
        ),
        Family(
            "unet",
            _unet,
            lambda: latent_batches(3, 8, classes=None),
            ["to_q", "to_v", "conv1"],
            "items (latents): a UNet has no tokens",
            per_row=False,
            loss=_unet_loss,
            six_nd_meaningful=False,
        ),
    ]
}


def build(family: Family, mode: Mode, *, eager: bool = False) -> nn.Module:
    """The family's model in ``mode`` (``full`` fine-tuning or peft ``lora``, r=4), training."""
    model = family.make(eager)
    if mode == "lora":
        import peft

        model = peft.get_peft_model(
            model, peft.LoraConfig(r=4, lora_alpha=8, target_modules=family.lora_targets)
        )
    return model.train()


def loss_of(family: Family, model: nn.Module, batch: Batch) -> torch.Tensor:
    """The training loss of one micro-batch."""
    if family.loss is not None:
        return family.loss(model, batch)
    return model(**batch).loss


def truth(family: Family, mode: Mode, batches: list[Batch] | None = None) -> int:
    """PyTorch's count (forward + backward, FLOP) of the family's micro-batches in ``mode``,
    the non-padding work (see the module docstring), with eager attention."""
    model = build(family, mode, eager=True)
    total = 0
    for batch in batches if batches is not None else family.batches():
        for unit in truth_units(batch, family.per_row, family.seq2seq):
            total += count(lambda u=unit: loss_of(family, model, u))
            model.zero_grad(set_to_none=True)
    return total


def run_truth(family: Family, mode: Mode, batches: list[Batch] | None = None) -> int:
    """PyTorch's count (forward + backward, FLOP) of the family's micro-batches whole, as the
    run ran them (padding included), with eager attention: the dispatch count of the run, the
    truth of a figure that counts the positions computed (``padding_convention`` ``padded``).
    Equal to :func:`truth` where the batches have no padding."""
    model = build(family, mode, eager=True)
    total = 0
    for batch in batches if batches is not None else family.batches():
        total += count(lambda b=batch: loss_of(family, model, b))
        model.zero_grad(set_to_none=True)
    return total


def truth_of(report: Any, truths: dict[str, int]) -> int:
    """The truth a report's primary figure is held to: of the positions its estimate says it
    counts (``inputs.padding_convention``: ``non_padding``, :func:`truth`, or ``padded``,
    :func:`run_truth`); the non-padding one for a report without a primary figure."""
    compute = report.compute
    estimate = compute.estimates.get(compute.primary_estimate or "")
    convention = estimate.inputs.get("padding_convention") if estimate is not None else None
    return truths["padded" if convention == "padded" else "non_padding"]


def truth_for(report: Any, family: Family, mode: Mode, batches: list[Batch]) -> int:
    """:func:`truth_of`, counting only the truth the report's primary figure is held to (each
    count is a dispatch-counted run of every micro-batch, seconds on a hybrid)."""
    compute = report.compute
    estimate = compute.estimates.get(compute.primary_estimate or "")
    padded = estimate is not None and estimate.inputs.get("padding_convention") == "padded"
    return (run_truth if padded else truth)(family, mode, batches)


def train_metered(family: Family, mode: Mode, batches: list[Batch] | None = None) -> Any:
    """Trains the family's default model (SDPA, default experts) under ``FlopMeter`` with
    default options, a raw loop with AdamW over the micro-batches; returns the report."""
    from flopmeter import FlopMeter

    model = build(family, mode)
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=1e-3)
    with FlopMeter(model) as meter:
        for batch in batches if batches is not None else family.batches():
            loss_of(family, model, batch).backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
    return meter.report()


def profile_recognition(family: Family, mode: Mode) -> tuple[bool, tuple[str, ...]]:
    """Whether flopmeter's FLOP model recognises the family (its ``ModelProfile`` of the first
    micro-batch, taken as the meter takes it), and the profile's notes (its reasons)."""
    from flopmeter.counting.inputs import model_input_facts, read_call
    from flopmeter.flops.capture import Profiler, stream_sizes

    model = build(family, mode)
    batch = family.batches()[0]
    ids = batch.get("input_ids")
    tokens = ids.numel() if isinstance(ids, torch.Tensor) else 0
    units = read_call((), batch, None, model_input_facts(model)).units  # as the meter reads it
    streams = stream_sizes(tokens, units)
    profiler = Profiler(model, batch_tokens=tokens, streams=streams, follow_backward=True).start()
    try:
        loss_of(family, model, batch).backward()
    finally:
        profiler.finish()
        profiler.remove()
    profile = profiler.profile
    if profile is None:
        return False, ("no profile was taken",)
    return profile.recognised, profile.notes
