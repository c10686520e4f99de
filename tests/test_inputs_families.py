"""What the meter reads from a micro-batch's inputs, family by family (issue 20).

Each test trains a real transformers / diffusers class (a tiny config, built from the config,
never downloaded) under the meter and checks the run's totals against a count made here by
hand from the batches the test built: padding and ``-100`` labels included. The truth is
computed from the Python lists the batches were made of, never from the meter's own helpers.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import flopmeter.counting.call_counts
from flopmeter import FlopMeter
from flopmeter.counting.call_args import find_token_inputs
from flopmeter.counting.counters import RunCounters
from flopmeter.counting.inputs import ModelInputFacts, model_input_facts, read_call, shape_units
from flopmeter.counting.work_units import MAX_INPUT_SHAPES
from flopmeter.run.hooks import TrainingHooks
from flopmeter.tokens.batch import TokenInputError
from tests.support.dist import gloo_group
from tests.support.host_syncs import record_host_syncs

# spawns gloo processes: one rerun for gloo's teardown abort alone (tests/conftest.py)
pytestmark = pytest.mark.gloo

transformers = pytest.importorskip("transformers")

VOCAB, HIDDEN, PAD = 64, 16, 0


# ----------------------------------------------------------------------------- batches + truth
def _ids(lengths: list[int], width: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Right-padded ids (``PAD`` after each row's ``lengths[r]`` real tokens) and their mask."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.full((len(lengths), width), PAD, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for r, n in enumerate(lengths):
        ids[r, :n] = torch.randint(3, VOCAB - 8, (n,), generator=g)
        mask[r, :n] = 1
    return ids, mask


def _labels(lengths: list[int], width: int, seed: int) -> torch.Tensor:
    ids, mask = _ids(lengths, width, seed)
    return ids.masked_fill(mask == 0, -100)


class _Truth:
    """The run's counts, added up here from the lengths the batches were built of."""

    def __init__(self) -> None:
        self.tokens = self.decoder = self.decoder_sq = self.cross = self.items = 0

    def encoder_decoder(self, enc: list[int], dec: list[int]) -> None:
        self.tokens += sum(enc)
        self.decoder += sum(dec)
        self.decoder_sq += sum(d * d for d in dec)
        self.cross += sum(e * d for e, d in zip(enc, dec, strict=True))
        self.items += len(enc)


def _run(model: nn.Module, calls: list[Any], step, **meter: Any) -> Any:
    """Trains ``model`` on ``calls`` (``step(model, call)`` returns the loss) under a meter
    without sampling, one optimizer step per call; the report."""
    model.train()
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
    with FlopMeter(model, meter.pop("pad_id", None), measure_every=0, **meter) as m:
        for call in calls:
            step(model, call).backward()
            optimizer.step()
            optimizer.zero_grad()
    return m.report()


def _kw_loss(model: nn.Module, call: dict[str, Any]) -> torch.Tensor:
    return model(**call).loss


def _hf(cls: str, config: Any) -> nn.Module:
    torch.manual_seed(0)
    return getattr(transformers, cls)._from_config(config, attn_implementation="eager")


# ----------------------------------------------------------------------------- encoder-decoders
SOURCES = [([3, 6, 2], 6), ([5, 4], 5)]
TARGETS = [([2, 5, 1], 7), ([4, 3], 4)]  # other lengths than the sources, -100 padding


def _t5() -> nn.Module:
    config = transformers.T5Config(
        vocab_size=VOCAB, d_model=HIDDEN, d_kv=8, d_ff=32, num_layers=1, num_decoder_layers=1,
        num_heads=2, pad_token_id=PAD, decoder_start_token_id=PAD, eos_token_id=1,
    )  # fmt: skip
    return _hf("T5ForConditionalGeneration", config)


def _bart() -> nn.Module:
    config = transformers.BartConfig(
        vocab_size=VOCAB, d_model=HIDDEN, encoder_layers=1, decoder_layers=1,
        encoder_attention_heads=2, decoder_attention_heads=2, encoder_ffn_dim=32,
        decoder_ffn_dim=32, max_position_embeddings=64, pad_token_id=PAD, bos_token_id=1,
        eos_token_id=2, decoder_start_token_id=2, forced_eos_token_id=None,
    )  # fmt: skip
    return _hf("BartForConditionalGeneration", config)


def test_t5_counts_encoder_and_decoder_tokens_and_cross_pairs_from_labels():
    truth, calls = _Truth(), []
    for i, ((src, sw), (tgt, tw)) in enumerate(zip(SOURCES, TARGETS, strict=True)):
        ids, mask = _ids(src, sw, i)
        calls.append({"input_ids": ids, "attention_mask": mask, "labels": _labels(tgt, tw, 9 + i)})
        truth.encoder_decoder(src, tgt)
    report = _run(_t5(), calls, _kw_loss, pad_id=PAD)
    t = report.tokens
    # hand arithmetic: encoder 11 + 9; decoder 8 + 7; 4+25+1 + 16+9; 3*2+6*5+2*1 + 5*4+4*3
    assert truth.tokens == 20 and truth.decoder == 15
    assert truth.decoder_sq == 55 and truth.cross == 70
    assert (t.tokens_processed, t.decoder_tokens) == (truth.tokens, truth.decoder)
    assert (t.decoder_sum_sq_len, t.cross_pairs) == (truth.decoder_sq, truth.cross)
    assert (t.items, t.non_text_micro_batches, t.micro_batches_unread) == (5, 2, 0)
    assert t.modality == "text" and "encoder" in t.tokens_meaning
    assert sorted((c.key, c.micro_batches, c.items) for c in t.input_shapes) == [
        ("attention_mask:5;input_ids:5;labels:4", 1, 2),
        ("attention_mask:6;input_ids:6;labels:7", 1, 3),
    ]


def test_bart_counts_the_decoder_by_its_mask_before_its_labels():
    truth, calls = _Truth(), []
    for i, ((src, sw), (tgt, tw)) in enumerate(zip(SOURCES, TARGETS, strict=True)):
        ids, mask = _ids(src, sw, i)
        dec_ids, dec_mask = _ids(tgt, tw, 20 + i)
        labels = dec_ids.clone()  # no -100: only the decoder mask says what is padding
        calls.append(
            {"input_ids": ids, "attention_mask": mask, "decoder_input_ids": dec_ids,
             "decoder_attention_mask": dec_mask, "labels": labels}
        )  # fmt: skip
        truth.encoder_decoder(src, tgt)
    t = _run(_bart(), calls, _kw_loss, pad_id=PAD).tokens
    assert (t.tokens_processed, t.decoder_tokens) == (20, 15)
    assert (t.decoder_sum_sq_len, t.cross_pairs) == (truth.decoder_sq, truth.cross) == (55, 70)


def test_decoder_ids_without_mask_or_labels_count_every_decoder_position():
    ids, mask = _ids([3, 6, 2], 6, 0)
    dec_ids, _ = _ids([7, 7, 7], 7, 1)
    t = _run(_bart(), [{"input_ids": ids, "attention_mask": mask, "decoder_input_ids": dec_ids}],
             lambda m, c: m(**c).logits.float().pow(2).mean(), pad_id=PAD).tokens  # fmt: skip
    assert (t.decoder_tokens, t.decoder_sum_sq_len) == (3 * 7, 3 * 49)
    assert t.cross_pairs == (3 + 6 + 2) * 7


# ----------------------------------------------------------------------------- audio
FRAMES, POSITIONS = 16, 8  # Whisper's input window is 2 x max_source_positions frames


def _whisper() -> nn.Module:
    config = transformers.WhisperConfig(
        vocab_size=VOCAB, num_mel_bins=8, d_model=HIDDEN, encoder_layers=1, decoder_layers=1,
        encoder_attention_heads=2, decoder_attention_heads=2, encoder_ffn_dim=32,
        decoder_ffn_dim=32, max_source_positions=POSITIONS, max_target_positions=32,
        pad_token_id=PAD, bos_token_id=1, eos_token_id=2, decoder_start_token_id=1,
        suppress_tokens=None, begin_suppress_tokens=None,
    )  # fmt: skip
    return _hf("WhisperForConditionalGeneration", config)


def test_whisper_counts_audio_frames_and_the_decoder_from_labels():
    calls, targets = [], [([3, 6, 2], 6), ([5, 4], 5)]
    for i, (tgt, tw) in enumerate(targets):
        features = torch.randn(len(tgt), 8, FRAMES, generator=torch.Generator().manual_seed(i))
        calls.append({"input_features": features, "labels": _labels(tgt, tw, 30 + i)})
    t = _run(_whisper(), calls, _kw_loss).tokens
    assert t.modality == "audio" and "frames" in t.tokens_meaning
    assert (t.tokens_processed, t.tokens_seen, t.items) == (5 * FRAMES, 5 * FRAMES, 5)
    assert (t.decoder_tokens, t.decoder_sum_sq_len) == (11 + 9, 9 + 36 + 4 + 25 + 16)
    assert t.cross_pairs == (11 + 9) * POSITIONS  # every decoder token x the encoder's 8
    assert (t.non_text_micro_batches, t.micro_batches_unread) == (2, 0)


# ----------------------------------------------------------------------------- images
def _vit() -> nn.Module:
    config = transformers.ViTConfig(
        image_size=16, patch_size=4, hidden_size=HIDDEN, num_hidden_layers=1,
        num_attention_heads=2, intermediate_size=32, num_labels=3,
    )  # fmt: skip
    return _hf("ViTForImageClassification", config)


def _images(n: int, size: int = 16, seed: int = 0) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return {"pixel_values": torch.randn(n, 3, size, size, generator=g),
            "labels": torch.randint(0, 3, (n,), generator=g)}  # fmt: skip


def test_vit_counts_image_patches_by_the_configs_patch_size():
    report = _run(_vit(), [_images(2), _images(3, seed=1)], _kw_loss)
    t = report.tokens
    per_image = (16 // 4) * (16 // 4)  # 16 patches of 4 x 4 pixels
    assert t.modality == "image" and "patches" in t.tokens_meaning
    assert (t.tokens_processed, t.sequences, t.items) == (5 * per_image, 5, 5)
    assert t.sum_sq_seq_len == 5 * per_image**2
    assert (t.micro_batches, t.micro_batches_unread, t.non_text_micro_batches) == (2, 0, 2)
    assert [(c.key, c.micro_batches, c.items) for c in t.input_shapes] == [
        ("labels:;pixel_values:3x16x16", 2, 5)
    ]
    text = report.to_text()
    assert "image patches" in text, text


def test_images_without_a_known_patch_size_are_items_and_the_report_says_so():
    class Cnn(nn.Module):  # a plain module: no config, so no patch size
        def __init__(self) -> None:
            super().__init__()
            self.conv, self.head = nn.Conv2d(3, 4, 3, stride=2), nn.Linear(4, 3)

        def forward(self, pixel_values, labels):
            x = self.conv(pixel_values).mean((2, 3))
            return F.cross_entropy(self.head(x), labels)

    t = _run(Cnn(), [_images(2), _images(4, size=8)], lambda m, c: m(**c)).tokens
    assert t.modality == "items" and (t.tokens_processed, t.items) == (6, 6)
    assert "no patch size" in t.tokens_meaning
    assert len(t.input_shapes) == 2  # two image sizes, two shape keys


def test_a_plain_cnn_on_float_input_counts_items():
    model = nn.Sequential(nn.Conv2d(3, 4, 3), nn.ReLU(), nn.Flatten(), nn.Linear(4 * 6 * 6, 2))
    calls = [torch.randn(4, 3, 8, 8), torch.randn(3, 3, 8, 8)]
    report = _run(model, calls, lambda m, x: m(x).square().mean())
    t = report.tokens
    assert (t.tokens_processed, t.tokens_seen, t.sequences, t.items) == (7, 7, 7, 7)
    assert (t.modality, t.micro_batches_unread, t.non_text_micro_batches) == ("items", 0, 2)
    assert [(c.key, c.items) for c in t.input_shapes] == [("arg0:3x8x8", 7)]


# ----------------------------------------------------------------------------- VLMs
def _llama_text() -> Any:
    return transformers.LlamaConfig(
        vocab_size=VOCAB, hidden_size=HIDDEN, intermediate_size=32, num_hidden_layers=1,
        num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=64,
        pad_token_id=PAD, tie_word_embeddings=False,
    )  # fmt: skip


def _llava() -> nn.Module:
    vision = transformers.CLIPVisionConfig(
        hidden_size=HIDDEN, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2,
        image_size=8, patch_size=4,
    )  # fmt: skip
    config = transformers.LlavaConfig(
        vision_config=vision.to_dict(), text_config=_llama_text().to_dict(),
        image_token_id=VOCAB - 1, vision_feature_layer=-1, projector_hidden_act="gelu",
    )  # fmt: skip
    return _hf("LlavaForConditionalGeneration", config)


def _vlm_batch(lengths: list[int], width: int, seed: int, image: int, start: int) -> dict:
    ids, mask = _ids(lengths, width, seed)
    ids[:, start : start + 4] = image  # 4 image placeholder tokens per row, inside the text
    labels = ids.masked_fill(mask == 0, -100)
    labels[:, start : start + 4] = -100
    return {"input_ids": ids, "attention_mask": mask, "labels": labels}


VLM_ROWS = [([9, 7, 8], 9), ([10, 6], 10)]


def test_llava_counts_the_text_tokens_its_language_model_sees_placeholders_included():
    calls = []
    for i, (lengths, width) in enumerate(VLM_ROWS):
        batch = _vlm_batch(lengths, width, i, VOCAB - 1, 1)
        batch["pixel_values"] = torch.randn(len(lengths), 3, 8, 8)
        calls.append(batch)
    t = _run(_llava(), calls, _kw_loss, pad_id=PAD).tokens
    assert t.tokens_processed == 9 + 7 + 8 + 10 + 6  # the 4 placeholders per row are in them
    assert (t.tokens_seen, t.sequences) == (3 * 9 + 2 * 10, 5)
    assert (t.modality, t.items, t.non_text_micro_batches) == ("text", 5, 2)
    assert t.decoder_tokens == 0 and t.micro_batches_unread == 0
    assert "placeholder" in t.tokens_meaning


def _qwen2vl() -> nn.Module:
    config = transformers.Qwen2VLConfig(
        text_config=dict(
            vocab_size=VOCAB, hidden_size=HIDDEN, intermediate_size=32, num_hidden_layers=1,
            num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=64,
            pad_token_id=PAD, bos_token_id=1, eos_token_id=2,
            rope_scaling={"type": "mrope", "mrope_section": [1, 1, 2]},
            rope_parameters={"rope_type": "default", "mrope_section": [1, 1, 2]},
            tie_word_embeddings=False,
        ),
        vision_config=dict(
            depth=1, embed_dim=HIDDEN, hidden_size=HIDDEN, num_heads=2, mlp_ratio=2,
            patch_size=2, spatial_merge_size=2, temporal_patch_size=2, in_channels=3,
        ),
        image_token_id=VOCAB - 1, bos_token_id=1, eos_token_id=2, video_token_id=VOCAB - 4,
        vision_start_token_id=VOCAB - 2, vision_end_token_id=VOCAB - 3,
    )  # fmt: skip
    return _hf("Qwen2VLForConditionalGeneration", config)


def test_qwen2vl_patches_and_grid_are_not_batched_like_the_call():
    calls = []
    for i, (lengths, width) in enumerate(VLM_ROWS):
        batch = _vlm_batch(lengths, width, i, VOCAB - 1, 2)
        batch["input_ids"][:, 1] = VOCAB - 2  # vision start
        batch["input_ids"][:, 6] = VOCAB - 3  # vision end
        rows = len(lengths)
        # one 1 x 4 x 4 grid of patches per row (16 patches of 3 x 2 x 2 x 2 = 24 values)
        batch["pixel_values"] = torch.randn(rows * 16, 24)
        batch["image_grid_thw"] = torch.tensor([[1, 4, 4]] * rows)
        batch["mm_token_type_ids"] = (batch["input_ids"] == VOCAB - 1).long()
        calls.append(batch)
    t = _run(_qwen2vl(), calls, _kw_loss, pad_id=PAD).tokens
    assert t.tokens_processed == 9 + 7 + 8 + 10 + 6 and t.items == 5
    assert (t.modality, t.non_text_micro_batches, t.micro_batches_unread) == ("text", 2, 0)
    keys = sorted(c.key for c in t.input_shapes)
    assert "image_grid_thw:3x3" in keys[1] and "pixel_values:48x24" in keys[1], keys
    assert "image_grid_thw:2x3" in keys[0] and "pixel_values:32x24" in keys[0], keys


# ----------------------------------------------------------------------------- diffusion
def _latents(n: int, seed: int, classes: bool) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    out = {"sample": torch.randn(n, 4, 8, 8, generator=g),
           "timestep": torch.randint(1, 1000, (n,), generator=g)}  # fmt: skip
    if classes:
        out["class_labels"] = torch.randint(0, 10, (n,), generator=g)
    return out


def test_unet_called_positionally_counts_latents_not_its_timestep_as_tokens():
    diffusers = pytest.importorskip("diffusers")
    torch.manual_seed(0)
    model = diffusers.UNet2DModel(
        sample_size=8, in_channels=4, out_channels=4, layers_per_block=1,
        block_out_channels=(8, 16), down_block_types=("DownBlock2D", "AttnDownBlock2D"),
        up_block_types=("AttnUpBlock2D", "UpBlock2D"), norm_num_groups=4, attention_head_dim=4,
    )  # fmt: skip
    calls = [_latents(3, 0, False), _latents(2, 1, False)]
    t = _run(model, calls, lambda m, c: m(c["sample"], c["timestep"]).sample.pow(2).mean()).tokens
    # today the [B] integer timestep was taken as the ids: 3 + 2 "tokens" of one row each
    assert (t.modality, t.tokens_processed, t.items, t.sequences) == ("items", 5, 5, 5)
    assert [(c.key, c.micro_batches) for c in t.input_shapes] == [("arg0:4x8x8;arg1:", 2)]


def test_dit_with_keywords_counts_latents_not_timesteps_or_class_labels():
    diffusers = pytest.importorskip("diffusers")
    torch.manual_seed(0)
    model = diffusers.DiTTransformer2DModel(
        num_attention_heads=2, attention_head_dim=8, in_channels=4, num_layers=1,
        sample_size=8, patch_size=2, num_embeds_ada_norm=10,
    )  # fmt: skip

    def step(m: nn.Module, c: dict[str, torch.Tensor]) -> torch.Tensor:
        out = m(hidden_states=c["sample"], timestep=c["timestep"], class_labels=c["class_labels"])
        return out.sample.pow(2).mean()

    t = _run(model, [_latents(3, 0, True), _latents(3, 1, True)], step).tokens
    assert (t.modality, t.tokens_processed, t.items, t.micro_batches_unread) == ("items", 6, 6, 0)
    assert t.input_shapes[0].key == "class_labels:;hidden_states:4x8x8;timestep:"


# ----------------------------------------------------------------------------- pure shape rules
def test_an_integer_timestep_is_never_the_token_ids():
    sample, step = torch.randn(2, 4, 8, 8), torch.tensor([5, 9])
    assert find_token_inputs((sample, step), {}).ref is None
    assert find_token_inputs((sample,), {"timestep": step}).ref is None
    assert find_token_inputs((torch.tensor(3),), {}).ref is None  # 0-d: a timestep
    units = shape_units((sample, step), {})
    assert (units.modality, units.items, units.text) == ("items", 2, False)


def test_ambiguous_or_unreadable_calls_are_unread_with_a_reason_naming_them():
    with pytest.raises(TokenInputError, match=r"x \[2, 3\], y \[5, 3\]"):
        shape_units((), {"x": torch.randn(2, 3), "y": torch.randn(5, 3)})
    with pytest.raises(TokenInputError, match="one item"):
        shape_units((torch.randn(8),), {})
    with pytest.raises(TokenInputError, match=r"pixel_values of shape \[3, 8\]"):
        shape_units((), {"pixel_values": torch.randn(3, 8)})
    with pytest.raises(TokenInputError, match="encoder's length") as err:
        facts = ModelInputFacts(is_encoder_decoder=True)  # no max_source_positions
        shape_units((), {"input_features": torch.randn(2, 8, 16),
                         "labels": torch.ones(2, 3, dtype=torch.long)}, facts=facts)  # fmt: skip
    assert err.value.kind == "unread"
    with pytest.raises(TokenInputError, match="decoder_attention_mask") as err:
        ids = torch.ones(2, 4, dtype=torch.long)
        shape_units((), {"input_ids": ids, "decoder_input_ids": ids,
                         "decoder_attention_mask": torch.ones(2, 5)})  # fmt: skip
    assert err.value.kind == "inconsistent"


def test_text_units_and_padded_decoder_shapes():
    ids = torch.ones(2, 5, dtype=torch.long)
    units = shape_units((), {"input_ids": ids, "attention_mask": ids, "labels": ids})
    assert (units.text, units.modality, units.items) == (True, "text", 2)
    assert units.key == "attention_mask:5;input_ids:5;labels:5"
    t5 = ModelInputFacts(is_encoder_decoder=True)
    labels = torch.ones(2, 3, dtype=torch.long)
    units = shape_units((), {"input_ids": ids, "labels": labels}, facts=t5)
    assert (units.text, units.decoder_tokens, units.decoder_sum_sq_len) == (False, 6, 18)
    assert units.cross_pairs == 2 * 5 * 3
    # a causal LM's labels are not a decoder stream; a per-token tensor by any name is text
    assert shape_units((), {"input_ids": ids, "labels": ids}).decoder_tokens == 0
    assert shape_units((), {"input_ids": ids, "loss_weights": torch.ones(2, 5)}).text
    assert not shape_units((), {"input_ids": ids, "extra": torch.ones(2, 7)}).text


def test_a_sequence_in_two_halves_is_read_joined_with_its_masks():
    """TRL's DistillationTrainer hands ``prompt_ids`` and ``completion_ids`` (with their masks)
    to its forward redirection: the model runs them joined, and so are they counted."""
    prompt, completion = torch.ones(2, 5, dtype=torch.long), torch.ones(2, 6, dtype=torch.long)
    prompt_mask = torch.tensor([[0, 1, 1, 1, 1], [1, 1, 1, 1, 1]])
    completion_mask = torch.tensor([[1, 1, 1, 0, 0, 0], [1, 1, 1, 1, 1, 1]])
    inputs = {"prompt_ids": prompt, "completion_ids": completion, "prompt_mask": prompt_mask,
              "completion_mask": completion_mask}  # fmt: skip
    model = torch.nn.Linear(2, 2)
    found = find_token_inputs((model, inputs), {})  # the redirection's (module, inputs) call
    assert found.input_ids.shape == (2, 11)
    assert int(found.attention_mask.sum()) == 4 + 3 + 5 + 6  # counted here, independently
    units = shape_units((model, inputs), {})
    assert (units.text, units.items) == (True, 2)
    # without the masks the ids count whole; halves of other rows are not one sequence
    assert (
        find_token_inputs((), {"prompt_ids": prompt, "completion_ids": completion}).attention_mask
        is None
    )
    odd = {"prompt_ids": prompt, "completion_ids": torch.ones(3, 6, dtype=torch.long)}
    assert find_token_inputs((), odd).input_ids.shape == (2, 5)  # the first integer tensor


def test_model_input_facts_read_the_config():
    assert model_input_facts(_vit()).patch_size == 4
    assert model_input_facts(_llava()).patch_size == 4  # vision_config
    whisper = model_input_facts(_whisper())
    assert (whisper.is_encoder_decoder, whisper.encoder_positions) == (True, POSITIONS)
    assert model_input_facts(nn.Linear(2, 2)) == ModelInputFacts()


def test_shape_keys_beyond_the_kept_ones_are_counted_dropped():
    counters = RunCounters()
    for width in range(1, MAX_INPUT_SHAPES + 4):
        counters.add_call(read_call((torch.randn(2, width),), {}), None)
    totals = counters.snapshot(sync=False).totals
    assert len(totals.input_shapes) == MAX_INPUT_SHAPES and totals.input_shapes_dropped == 3
    assert totals.items == 2 * (MAX_INPUT_SHAPES + 3)


def test_a_call_of_another_modality_than_the_runs_is_unread():
    counters = RunCounters()
    counters.add_call(read_call((), {"input_ids": torch.ones(2, 3, dtype=torch.long)}), None)
    counters.add_call(read_call((torch.randn(2, 3),), {}), None)
    snap = counters.snapshot(sync=False)
    assert snap.unread == 1 and "unlike units" in snap.unread_reason
    assert snap.totals.tokens_processed == 6 and snap.modality_micro_batches == {"text": 1}


# ----------------------------------------------------------------------------- resume, ranks
def _t5_calls(seed: int) -> tuple[list[dict], _Truth]:
    truth, calls = _Truth(), []
    for i, ((src, sw), (tgt, tw)) in enumerate(zip(SOURCES, TARGETS, strict=True)):
        ids, mask = _ids(src, sw, seed + i)
        calls.append({"input_ids": ids, "attention_mask": mask,
                      "labels": _labels(tgt, tw, seed + 9 + i)})  # fmt: skip
        truth.encoder_decoder(src, tgt)
    return calls, truth


@pytest.mark.slow
def test_a_resumed_run_continues_the_new_totals():
    model = _t5()
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
    calls, truth = _t5_calls(0)
    with FlopMeter(model, PAD, measure_every=0) as first:
        for call in calls:
            model(**call).loss.backward()
            optimizer.step()
    state = first.state_dict()
    with FlopMeter(model, PAD, measure_every=0) as second:
        second.load_state_dict(state)
        for call in calls:
            model(**call).loss.backward()
            optimizer.step()
    t = second.report().tokens
    assert (t.decoder_tokens, t.decoder_sum_sq_len) == (2 * truth.decoder, 2 * truth.decoder_sq)
    assert (t.cross_pairs, t.items) == (2 * truth.cross, 2 * truth.items)
    assert t.non_text_micro_batches == 4 and t.modality == "text"
    assert sorted(c.micro_batches for c in t.input_shapes) == [2, 2]


def _rank_worker(rank: int, world: int, store: str, out_dir: str) -> None:
    with gloo_group(rank, world, store):
        counters = RunCounters()
        calls, _ = _t5_calls(rank)
        for call in calls[rank:]:  # rank 0 both batches, rank 1 only the second
            counters.add_call(read_call((), call, None, ModelInputFacts(True)), PAD)
        snap = counters.snapshot(sync=True)
        Path(out_dir, f"rank{rank}.json").write_text(
            json.dumps([snap.totals.model_dump(), dict(snap.modality_micro_batches or {})])
        )


@pytest.mark.slow
def test_two_gloo_ranks_sum_the_new_counts(tmp_path):
    torch.multiprocessing.spawn(
        _rank_worker, args=(2, str(tmp_path / "store"), str(tmp_path)), nprocs=2, join=True
    )
    # rank 0: both batches (decoder 8 + 7); rank 1: the second batch (7); by hand
    expected_cross = (3 * 2 + 6 * 5 + 2 * 1) + 2 * (5 * 4 + 4 * 3)
    for rank in (0, 1):
        totals, modalities = json.loads((tmp_path / f"rank{rank}.json").read_text())
        assert totals["decoder_tokens"] == 8 + 7 + 7
        assert totals["cross_pairs"] == expected_cross
        assert totals["items"] == 3 + 2 + 2 and totals["non_text_micro_batches"] == 3
        shapes = {s["key"]: (s["micro_batches"], s["items"]) for s in totals["input_shapes"]}
        assert shapes == {
            "attention_mask:6;input_ids:6;labels:7": (1, 3),
            "attention_mask:5;input_ids:5;labels:4": (2, 4),
        }
        assert modalities == {"text": 3}


# ----------------------------------------------------------------------------- no host sync
@pytest.fixture
def guarded(monkeypatch) -> list[str]:
    """The host reads made by the meter's forward pre-hook after the first (census) call."""
    calls: list[str] = []
    real = TrainingHooks.on_forward_pre
    seen: list[bool] = []

    def hook(self, *args: Any, **kwargs: Any) -> Any:
        if not seen:
            seen.append(True)
            return real(self, *args, **kwargs)
        with record_host_syncs(calls):
            return real(self, *args, **kwargs)

    monkeypatch.setattr(TrainingHooks, "on_forward_pre", hook)
    return calls


def test_decoder_and_image_counting_make_no_host_read(guarded):
    calls, truth = _t5_calls(0)
    t = _run(_t5(), calls * 2, _kw_loss, pad_id=PAD).tokens
    assert t.decoder_tokens == 2 * truth.decoder  # the decoder path ran under the guard
    _run(_vit(), [_images(2), _images(3, seed=1)], _kw_loss)
    assert guarded == []


def test_the_guard_sees_a_host_read_in_the_decoder_counts(guarded, monkeypatch):
    real = flopmeter.counting.call_counts._decoder_counts

    def syncing(*args: Any) -> torch.Tensor:
        out = real(*args)
        out.tolist()
        return out

    monkeypatch.setattr(flopmeter.counting.call_counts, "_decoder_counts", syncing)
    calls, _ = _t5_calls(0)
    _run(_t5(), calls, _kw_loss, pad_id=PAD)
    assert [c.split(" ")[0] for c in guarded] == ["tolist"]


def test_a_2_0_report_written_before_these_counts_reads_them_as_not_recorded(tmp_path):
    from flopmeter.report.reading import read_report
    from flopmeter.report.sections import TOKENS_ADDED_IN_2_0

    out = tmp_path / "run.json"
    model = nn.Sequential(nn.Conv2d(3, 4, 3), nn.Flatten(), nn.Linear(4 * 6 * 6, 2))
    with FlopMeter(model, output=out, measure_every=0):
        model(torch.randn(2, 3, 8, 8)).sum().backward()
    data = json.loads(out.read_text())
    assert data["tokens"]["items"] == 2 and data["tokens"]["modality"] == "items"
    for key in TOKENS_ADDED_IN_2_0:
        del data["tokens"][key]
    out.write_text(json.dumps(data))
    t = read_report(out).tokens
    assert all(getattr(t, key) is None for key in TOKENS_ADDED_IN_2_0)  # never 0: not recorded
    assert t.tokens_processed == 2


def test_a_scalar_beside_the_ids_leaves_the_call_text():
    """The Trainer passes ``num_items_in_batch`` (a 0-d count) beside the ids: no work of its
    own, so the call's work is still all in the text stream (no forced sample, text scaling)."""
    from flopmeter.counting.inputs import shape_units

    ids = torch.ones(2, 6, dtype=torch.long)
    units = shape_units(
        (), {"input_ids": ids, "labels": ids, "num_items_in_batch": torch.tensor(9)}
    )
    assert units.text and units.items == 2 and units.modality == "text"
    wider = shape_units((), {"input_ids": ids, "extra": torch.ones(2, 6, 3)})
    assert not wider.text
