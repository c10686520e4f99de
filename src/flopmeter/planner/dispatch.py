"""The dispatch count of one sequence's training step on meta, for families the ``transformer``
estimate does not know.

PyTorch's :class:`torch.utils.flop_counter.FlopCounterMode` with flopmeter's registry
(:func:`flopmeter.flops.aten_ops.measured_formulas`) counts the matmuls of a forward and
backward pass, as the meter's ``measured`` estimate does on sampled micro-batches; on the
``meta`` device nothing is allocated and no arithmetic runs, so a full-size model costs seconds.
A plan counts each distinct shape of its sequences once (batch 1) and multiplies: the families
here have no work that couples the sequences of a micro-batch.

torch and transformers are imported inside the functions.
"""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from flopmeter.errors import ConfigurationError
from flopmeter.planner.build import meta_autocast
from flopmeter.planner.families import Family

__all__ = ["SequenceShape", "dispatch_flops", "global_counter", "image_positions", "meta_masks"]


@dataclass(frozen=True)
class SequenceShape:
    """One training sequence's shape (batch 1).

    Attributes:
        tokens: Text tokens: the encoder's (encoder-decoder), the language model's text
            (vision-language, image positions not included) or the only stream.
        decoder_tokens: Decoder tokens (encoder-decoder, speech); 0 otherwise.
        images: Images in the sequence (vision-language); 0 otherwise.
        clips: Audio clips (speech: one, of the configuration's frames); 0 otherwise.
    """

    tokens: int
    decoder_tokens: int = 0
    images: int = 0
    clips: int = 0


def image_positions(hf: Any) -> int:
    """Positions of the language model's sequence one image takes (LLaVA's
    ``image_seq_length``, else the vision config's patches per image)."""
    value = getattr(hf, "image_seq_length", None)
    if isinstance(value, int) and value > 0:
        return value
    vision = hf.vision_config
    return (vision.image_size // vision.patch_size) ** 2


@contextlib.contextmanager
def meta_masks() -> Iterator[None]:
    """Within: transformers' packed-sequence detection takes meta position ids as unpacked.

    ``masking_utils.find_packed_sequence_indices`` reads the values of ``position_ids``
    (Whisper's decoder passes them), which meta tensors do not have; a plan's sequences are
    never packed, which is what the function answers for real ``arange`` positions.
    """
    import transformers.masking_utils as masks

    real = masks.find_packed_sequence_indices

    def unpacked_on_meta(position_ids: Any) -> Any:
        return None if position_ids.device.type == "meta" else real(position_ids)

    masks.find_packed_sequence_indices = unpacked_on_meta
    try:
        yield
    finally:
        masks.find_packed_sequence_indices = real


class _GlobalOnly:
    """A module tracker that tracks nothing: its ``parents`` are always ``{"Global"}``.

    ``FlopCounterMode`` adds each operation's FLOP to every module its tracker says is
    running, ``"Global"`` always among them (``torch.utils.module_tracker.ModuleTracker``: its
    ``parents`` "always contains the Global key"), and ``get_total_flops`` reads ``"Global"``
    only. Without the per-module hooks the total is the same, operation for operation, and
    the count runs about a third faster.
    """

    parents = frozenset({"Global"})

    def __enter__(self) -> _GlobalOnly:
        return self

    def __exit__(self, *args: object) -> None:
        return None


def global_counter(**kwargs: Any) -> Any:
    """``FlopCounterMode(**kwargs)`` that counts the total only (:class:`_GlobalOnly`)."""
    from torch.utils.flop_counter import FlopCounterMode

    counter = FlopCounterMode(**kwargs)
    counter.mod_tracker = _GlobalOnly()  # type: ignore[assignment]
    return counter


def _ids(length: int) -> Any:
    import torch

    return torch.zeros((1, length), dtype=torch.long, device="meta")


def _step(model: Any, family: Family, shape: SequenceShape) -> None:
    """One forward and backward pass of ``shape`` through ``model`` (on meta)."""
    import torch

    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    config = base.config
    if family.name == "encoder-decoder":
        dec = _ids(shape.decoder_tokens)
        out = model(
            input_ids=_ids(shape.tokens), decoder_input_ids=dec, labels=dec, use_cache=False
        )
    elif family.name == "speech":
        frames = 2 * config.max_source_positions  # Whisper's conv stride 2: 3000 mel frames
        features = torch.zeros((shape.clips, config.num_mel_bins, frames), device="meta")
        dec = _ids(shape.decoder_tokens)
        out = model(input_features=features, decoder_input_ids=dec, labels=dec, use_cache=False)
    elif family.name == "vision-language":
        embeds = base.get_input_embeddings()(_ids(shape.tokens))
        if shape.images:
            size = config.vision_config.image_size
            pixels = torch.zeros((shape.images, 3, size, size), device="meta")
            feats = base.model.get_image_features(pixel_values=pixels)
            feats = getattr(feats, "pooler_output", feats)
            feats = torch.cat(list(feats), 0) if isinstance(feats, (list, tuple)) else feats
            embeds = torch.cat([feats.reshape(1, -1, embeds.shape[-1]), embeds], dim=1)
        out = model(inputs_embeds=embeds, labels=_ids(embeds.shape[1]), use_cache=False)
    elif family.auto_class == "AutoModelForSequenceClassification":
        out = model(input_ids=_ids(shape.tokens), labels=_ids(1)[0])
    else:
        out = model(input_ids=_ids(shape.tokens), labels=_ids(shape.tokens))
    out.loss.backward()


def dispatch_flops(model: Any, family: Family, shape: SequenceShape) -> int:
    """PyTorch's dispatch count of one training step (forward and backward) of ``shape``.

    Args:
        model: The model on meta, set up for its method (:func:`planner.build.method_model`).
        family: Its family.
        shape: The sequence (batch 1).

    Returns:
        FLOP, by ``FlopCounterMode`` with flopmeter's registry (its total only, without its
        per-module breakdown: :func:`global_counter`).

    Raises:
        ConfigurationError: the model cannot run the step on meta (the first line of why).
    """
    from flopmeter.flops.aten_ops import measured_formulas

    try:
        with (
            meta_autocast(),
            meta_masks(),
            warnings.catch_warnings(),
            global_counter(display=False, custom_mapping=measured_formulas()) as counter,
        ):
            warnings.simplefilter("ignore")
            _step(model, family, shape)
    except (ValueError, RuntimeError, NotImplementedError, TypeError, AttributeError) as exc:
        first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise ConfigurationError(
            f"the {family.model_type} model cannot run a training step on meta: {first[:160]}"
        ) from None
    finally:
        model.zero_grad(set_to_none=True)
    return int(counter.get_total_flops())
