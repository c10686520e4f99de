"""What the meter reads of a whole training forward call, from its shapes.

:func:`shape_units` reads a call's shapes into :class:`~flopmeter.counting.work_units.ShapeUnits`: the
decoder stream of an encoder-decoder, images, audio features and float inputs, beside the text
tokens that :func:`~flopmeter.counting.call_args.find_token_inputs` finds (the order in which the ids
are looked for is in :mod:`flopmeter.counting.call_args`, whose public names are re-exported here);
:func:`read_call` gives the hook both, with the tensors the decoder's device counts need;
:func:`model_input_facts` reads what a model's config says about its inputs. Only shapes,
dtypes and names are looked at: no tensor value is read on the host.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, NamedTuple

import torch

from flopmeter.counting.call_args import (
    CU_SEQLENS_KEYS,
    TokenLocator,
    call_tensors,
    find_token_inputs,
    first_tensor,
    float_tensor,
    integer_tensor,
    named_inputs,
    tensor_or_none,
)
from flopmeter.counting.work_units import Modality, ShapeUnits
from flopmeter.tokens.batch import TokenInputError, TokenInputs

__all__ = [
    "CallInputs",
    "DecoderInputs",
    "ModelInputFacts",
    "model_input_facts",
    "read_call",
    "shape_units",
]

#: Why a training call is unread when it holds nothing the meter can count.
NO_INPUTS_REASON = (
    "a training forward pass had no input_ids, attention_mask, inputs_embeds or integer token "
    "tensor, and no pixel_values, input_features or floating input tensor the meter could find"
)
#: Named inputs of a text call besides the ids: with only these beside them, all of a call's
#: work is in its one text-token stream (``ShapeUnits.text``).
_TEXT_NAMES = frozenset(
    {
        "input_ids",
        "attention_mask",
        "labels",
        "label",
        "position_ids",
        "token_type_ids",
        "inputs_embeds",
        "cache_position",
        "head_mask",
        # a sequence passed in two halves (TRL's prompt and completion, joined as the ids)
        "prompt_ids",
        "prompt_mask",
        "completion_ids",
        "completion_mask",
        *CU_SEQLENS_KEYS,
        "cu_seq_lens_k",
        "cu_seqlens_k",
    }
)
#: Image inputs (``[B, C, H, W]``, ``[B, N, C, H, W]``, or Qwen2-VL's ``[patches, dim]``).
_IMAGE_NAMES = ("pixel_values", "pixel_values_videos")
#: Inputs whose leading dimension is never the call's batch dimension (they keep every
#: dimension in the shape key); Qwen2-VL's ``pixel_values`` of ``[patches, dim]`` join them
#: when a grid is passed.
_GRID_NAMES = ("image_grid_thw", "video_grid_thw")
#: The names under which diffusers' models take their sample (UNet2DModel, DiT).
_SAMPLE_NAMES = ("sample", "hidden_states")
#: Label value the Hugging Face losses ignore: a decoder position that is padding.
IGNORE_INDEX = -100


@dataclass(frozen=True)
class ModelInputFacts:
    """What a model's config says about reading its inputs (host attributes, read once).

    Attributes:
        is_encoder_decoder: ``labels`` build the decoder's inputs (T5, BART, Whisper), so they
            are the decoder stream, not the encoder's targets.
        patch_size: The vision encoder's patch side, pixels (``config.vision_config.patch_size``
            or ``config.patch_size``); ``None`` when the config gives none (images are then
            counted as items).
        encoder_positions: An audio encoder's output positions per clip (Whisper's
            ``max_source_positions``): the keys of its cross-attention; ``None`` when unknown.
    """

    is_encoder_decoder: bool = False
    patch_size: int | None = None
    encoder_positions: int | None = None


def _config_value(config: Any, name: str) -> Any:
    if config is None:
        return None
    if isinstance(config, Mapping):
        return config.get(name)
    return getattr(config, name, None)


def _positive_int(value: Any) -> int | None:
    if isinstance(value, (tuple, list)) and value and all(v == value[0] for v in value):
        value = value[0]  # a square patch given as (p, p)
    if isinstance(value, int) and not isinstance(value, bool) and value > 0:
        return value
    return None


def model_input_facts(model: Any) -> ModelInputFacts:
    """What ``model``'s config (``model.config``: transformers, diffusers, peft wrappers) says
    about its inputs; every fact unknown (``None``/``False``) without a config. Host only."""
    try:
        config = getattr(model, "config", None)
    except Exception:  # a wrapper whose attribute lookup raises: nothing known
        config = None
    vision = _config_value(config, "vision_config")
    patch = _positive_int(_config_value(vision, "patch_size"))
    if patch is None:
        patch = _positive_int(_config_value(config, "patch_size"))
    return ModelInputFacts(
        is_encoder_decoder=bool(_config_value(config, "is_encoder_decoder")),
        patch_size=patch,
        encoder_positions=_positive_int(_config_value(config, "max_source_positions")),
    )


class DecoderInputs(NamedTuple):
    """What the device counts of a call's decoder stream need (tensors not read on the host).

    Attributes:
        rows: Sequences (the call's batch dimension).
        length: Decoder positions per sequence (padded).
        mask: ``decoder_attention_mask`` ``[rows, length]``, when given.
        labels: ``labels`` ``[rows, length]`` (``-100`` marks padding), when given.
        encoder_mask: The encoder's ``attention_mask`` ``[rows, encoder_length]``, when given.
        encoder_ids: The encoder's ids ``[rows, encoder_length]`` (padding by the pad id).
        encoder_length: Encoder positions per sequence (padded; an audio encoder's output
            positions).
    """

    rows: int
    length: int
    mask: torch.Tensor | None
    labels: torch.Tensor | None
    encoder_mask: torch.Tensor | None
    encoder_ids: torch.Tensor | None
    encoder_length: int


class CallInputs(NamedTuple):
    """What the meter reads from one training forward call.

    Attributes:
        tokens: The text token inputs (``ref`` ``None`` for a call without tokens).
        units: The call's shape units.
        ref: The FLOP model's reference for the micro-batch, whose element count is the call's
            tokens (padding included): the token ids or mask; for a call without text tokens
            an all-ones ``[items, tokens per item]`` view on the main input's device (the
            pixels', audio features' or float sample's), every patch, frame or item a token.
        decoder: The decoder stream's tensors, when the call has one.
        item_length: For a call without text tokens, the tokens of each item (patches of an
            image, frames of a clip; 1 for other items); 0 for a text call.
    """

    tokens: TokenInputs
    units: ShapeUnits
    ref: torch.Tensor
    decoder: DecoderInputs | None
    item_length: int


def shape_units(
    args: tuple[Any, ...],
    kwargs: Mapping[str, Any],
    token_inputs: TokenLocator | None = None,
    *,
    facts: ModelInputFacts | None = None,
) -> ShapeUnits:
    """The shape units of a training forward call (shapes only; no device value is read).

    Args:
        args: The call's positional arguments.
        kwargs: The call's keyword arguments.
        token_inputs: Where the user says the tokens are (the meter's ``token_inputs`` option).
        facts: What the model's config says (:func:`model_input_facts`); without it, labels
            are never a decoder stream and images are items.

    Returns:
        The call's units (see :class:`~flopmeter.counting.work_units.ShapeUnits`).

    Raises:
        TokenInputError: ``"unread"`` when the call holds nothing the meter can count, or is
            ambiguous (the reason names the inputs); ``"inconsistent"`` when its inputs
            contradict each other (a decoder mask of another shape than the decoder's ids).
    """
    return read_call(args, kwargs, token_inputs, facts).units


def read_call(
    args: tuple[Any, ...],
    kwargs: Mapping[str, Any],
    token_inputs: TokenLocator | None = None,
    facts: ModelInputFacts | None = None,
) -> CallInputs:
    """A training forward call's token inputs, shape units and decoder tensors (shapes only).

    Which tensors are which: the text tokens by :func:`find_token_inputs`; a decoder stream from
    ``decoder_input_ids``/``decoder_inputs_embeds``, or (``facts.is_encoder_decoder``) from
    ``labels``; images from ``pixel_values``; audio from ``input_features``; otherwise the
    sample of a diffusers call (``sample``, ``hidden_states``) or the floating input tensor.
    What the run's "tokens" are for the call (``units.modality``): the text tokens when the call
    has them (a vision-language model's ids, image placeholders included); else image patches
    (``facts.patch_size`` known), audio frames (the last dimension of ``input_features``), or
    items.

    Raises:
        TokenInputError: as :func:`shape_units`.
        Exception: whatever ``token_inputs`` raises (see :func:`find_token_inputs`).
    """
    facts = facts or ModelInputFacts()
    source = named_inputs(args, kwargs)
    tokens = find_token_inputs(args, kwargs, token_inputs)
    image = float_tensor(first_tensor(source, _IMAGE_NAMES))
    audio = float_tensor(source.get("input_features"))
    if (
        token_inputs is None
        and tokens.input_ids is None
        and (image is not None or audio is not None)
    ):
        tokens = TokenInputs()  # the mask of pixels or audio features, not of text tokens
    tensors = call_tensors(args, kwargs, source)
    grid = any(isinstance(source.get(name), torch.Tensor) for name in _GRID_NAMES)
    unbatched = {*_GRID_NAMES, *(_IMAGE_NAMES if grid else ())}
    item_length = 0
    if tokens.ref is not None:
        ref = tokens.ref
        modality: Modality = "text"
        rows = ref.shape[0] if ref.dim() >= 2 else 1
    elif audio is not None:
        if audio.dim() != 3:
            raise TokenInputError(
                "unread",
                f"input_features of shape {list(audio.shape)} is not [batch, mel bins, frames]",
            )
        ref, modality, rows, item_length = audio, "audio", audio.shape[0], audio.shape[-1]
    elif image is not None:
        ref, modality, rows, item_length = image, *_image_units(image, facts)
    else:
        ref = _main_float(args, source, tensors)
        modality, rows, item_length = "items", ref.shape[0], 1
    if modality != "text":
        # Every patch, frame or item a token: an all-ones [items, tokens per item] view (as
        # for inputs_embeds), so the FLOP model's reference holds the call's tokens.
        ref = torch.ones((), dtype=torch.bool, device=ref.device).expand(rows, item_length)
    decoder = _decoder(source, tokens, facts, rows, modality)
    text = (
        modality == "text"
        and decoder is None
        and all(_text_companion(name, t, ref) for name, t in tensors)
    )
    units = ShapeUnits(
        key=_shape_key(tensors, rows, unbatched),
        items=rows,
        text=text,
        modality=modality,
        decoder_tokens=0 if decoder is None else rows * decoder.length,
        decoder_sum_sq_len=0 if decoder is None else rows * decoder.length**2,
        cross_pairs=0 if decoder is None else rows * decoder.encoder_length * decoder.length,
    )
    return CallInputs(tokens, units, ref, decoder, item_length)


def _shape_key(tensors: list[tuple[str, torch.Tensor]], rows: int, unbatched: set[str]) -> str:
    """``name:d1xd2`` per tensor, the batch dimension dropped where it leads, sorted by name."""
    parts = []
    for name, t in tensors:
        dims = tuple(t.shape)
        if name not in unbatched and dims and dims[0] == rows:
            dims = dims[1:]
        parts.append(f"{name}:{'x'.join(str(d) for d in dims)}")
    return ";".join(sorted(parts))


def _text_companion(name: str, t: torch.Tensor, ref: torch.Tensor) -> bool:
    """Whether a tensor beside the ids leaves all the call's work in the text stream: a known
    text input, one of the ids' shape (a mask, labels or weights per token, by any name), or a
    scalar (the Trainer's ``num_items_in_batch``: a count, no work of its own)."""
    return name in _TEXT_NAMES or t is ref or t.shape == ref.shape or t.dim() == 0


def _image_units(image: torch.Tensor, facts: ModelInputFacts) -> tuple[Modality, int, int]:
    """``(modality, items, tokens per item)`` of a call whose only input is ``pixel_values``."""
    shape = list(image.shape)
    if image.dim() not in (4, 5):
        raise TokenInputError(
            "unread",
            f"pixel_values of shape {shape} without token ids: not [batch, channels, height, "
            "width] or [batch, images, channels, height, width], so the meter cannot tell the "
            "images in it",
        )
    per_item = shape[1] if image.dim() == 5 else 1
    p = facts.patch_size
    if p is None:
        return "items", shape[0], 1
    return "image", shape[0], per_item * (shape[-2] // p) * (shape[-1] // p)


def _main_float(
    args: tuple[Any, ...], source: Mapping[str, Any], tensors: list[tuple[str, torch.Tensor]]
) -> torch.Tensor:
    """The sample of a call without tokens, images or audio: diffusers' ``sample`` or
    ``hidden_states``, else the first floating positional tensor, else the floating keyword
    tensors when they share their batch dimension.

    Raises:
        TokenInputError: ``"unread"``: no floating input of two or more dimensions, or several
            whose leading dimensions differ (which is the batch is not known; named).
    """
    named = float_tensor(first_tensor(source, _SAMPLE_NAMES))
    if named is not None and named.dim() >= 1:
        return named
    for value in args:
        value = float_tensor(value)
        if value is not None and value.dim() >= 2:
            return value
    floats = [(n, t) for n, t in tensors if t.is_floating_point() and t.dim() >= 2]
    if not floats and any(t.is_floating_point() for _, t in tensors):
        raise TokenInputError(
            "unread",
            "a training forward pass without token ids had only floating inputs of fewer than "
            "two dimensions: whether one is a batch or one item is not known",
        )
    if not floats:
        raise TokenInputError("unread", NO_INPUTS_REASON)
    if len({t.shape[0] for _, t in floats}) > 1:
        named_shapes = ", ".join(f"{n} {list(t.shape)}" for n, t in floats)
        raise TokenInputError(
            "unread",
            f"a training forward pass without token ids had floating inputs of different "
            f"leading dimensions ({named_shapes}): which is the batch is ambiguous",
        )
    return floats[0][1]


def _decoder(
    source: Mapping[str, Any],
    tokens: TokenInputs,
    facts: ModelInputFacts,
    rows: int,
    modality: Modality,
) -> DecoderInputs | None:
    """The call's decoder stream: from ``decoder_input_ids`` / ``decoder_inputs_embeds``, else
    (an encoder-decoder model) from ``labels``; ``None`` without one.

    Raises:
        TokenInputError: ``"inconsistent"``: decoder inputs of another batch than the call,
            or a mask or labels of another shape; ``"unread"``: the encoder's length is not
            known from the shapes (an encoder-decoder over images, or audio without
            ``facts.encoder_positions``).
    """
    ids = integer_tensor(source.get("decoder_input_ids"))
    embeds = float_tensor(source.get("decoder_inputs_embeds"))
    labels = integer_tensor(source.get("labels"))
    mask = tensor_or_none(source.get("decoder_attention_mask"))
    if ids is not None:
        shape = tuple(ids.shape)
        what = "decoder_input_ids"
    elif embeds is not None and embeds.dim() == 3:
        shape = tuple(embeds.shape[:2])
        what = "decoder_inputs_embeds"
    elif facts.is_encoder_decoder and labels is not None and labels.dim() == 2:
        shape = tuple(labels.shape)
        what = "labels"
    else:
        return None
    if len(shape) != 2 or shape[0] != rows:
        raise _decoder_batch_error(what, shape, rows)
    for name, t in (("decoder_attention_mask", mask), ("labels", labels)):
        if t is not None and tuple(t.shape) != shape and not (name == "labels" and t.dim() != 2):
            raise _decoder_misfit_error(name, t, what, shape)
    if labels is not None and labels.dim() != 2:
        labels = None
    if mask is not None and mask.dim() != 2:
        mask = None
    encoder_mask = encoder_ids = None
    if modality == "text":
        ref = tokens.ref
        assert ref is not None
        if ref.dim() != 2 or ref.shape[0] != rows:
            raise _encoder_shape_error(ref)
        encoder_length = ref.shape[1]
        if tokens.attention_mask is not None and tokens.attention_mask.shape == ref.shape:
            encoder_mask = tokens.attention_mask
        elif tokens.input_ids is not None and not tokens.input_ids.is_floating_point():
            encoder_ids = tokens.input_ids
    elif modality == "audio" and facts.encoder_positions is not None:
        encoder_length = facts.encoder_positions
    else:
        raise _encoder_length_error(modality)
    return DecoderInputs(rows, shape[1], mask, labels, encoder_mask, encoder_ids, encoder_length)


# _decoder's errors, built only when its inputs are wrong (its common path calls none).
def _decoder_batch_error(what: str, shape: tuple[int, ...], rows: int) -> TokenInputError:
    """``"inconsistent"``: the decoder stream is not ``[batch, decoder length]`` (``rows``)."""
    return TokenInputError(
        "inconsistent",
        f"{what} of shape {list(shape)} is not [batch, decoder length] for a batch of {rows}",
    )


def _decoder_misfit_error(
    name: str, t: torch.Tensor, what: str, shape: tuple[int, ...]
) -> TokenInputError:
    """``"inconsistent"``: the decoder's mask or labels do not fit its ``what`` of ``shape``."""
    return TokenInputError(
        "inconsistent",
        f"{name} of shape {list(t.shape)} does not fit {what} of shape {list(shape)}",
    )


def _encoder_shape_error(ref: torch.Tensor) -> TokenInputError:
    """``"unread"``: the encoder's tokens ``ref`` are not ``[batch, length]``."""
    return TokenInputError(
        "unread",
        f"an encoder-decoder call whose encoder tokens are of shape {list(ref.shape)}, "
        "not [batch, length]: the cross-attention's lengths are not known",
    )


def _encoder_length_error(modality: Modality) -> TokenInputError:
    """``"unread"``: the encoder's length is not known for ``modality`` inputs."""
    return TokenInputError(
        "unread",
        f"an encoder-decoder call over {modality} inputs: the encoder's length (the "
        "cross-attention's keys) is not known from the shapes or the model's config",
    )
