"""What one micro-batch's input shapes say about its work, beside the text tokens.

Read from tensor shapes only (host integers; no device value is read), by
:func:`flopmeter.counting.inputs.shape_units`: the decoder stream of an encoder-decoder model, the items
(sequences, images, audio clips, latents) in the batch dimension, and the call's *shape key*,
the shapes of its tensor inputs with the batch dimension dropped. Micro-batches with the same
key do the same work per item, which is what lets the ``measured`` estimate scale a sample to
the run by the right unit (see :mod:`flopmeter.flops.scaling`).

This module imports nothing of flopmeter (a leaf, layer 0).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

__all__ = ["MAX_INPUT_SHAPES", "Modality", "ShapeUnits"]

#: What the report calls "tokens" for a run: text tokens seen by the model, image patches,
#: audio frames, or (for inputs that are only floats: latents, features without a known
#: patching) the items in the batch dimension.
Modality = Literal["text", "image", "audio", "items"]

#: Distinct shape keys a run keeps counts for; micro-batches with a key beyond these are
#: counted in ``TokenTotals.input_shapes_dropped`` (and per-item scaling cannot cover them).
MAX_INPUT_SHAPES = 64


@dataclass(frozen=True)
class ShapeUnits:
    """The shape-derived units of one training forward call (all host integers).

    Attributes:
        key: The call's shape key: its tensor inputs as ``name:d1xd2...`` with the batch
            dimension dropped, sorted by name and joined with ``;`` (positional inputs named
            ``arg0``, ``arg1``...). Two calls with the same key do the same work per item. A
            tensor whose leading dimension is not the call's batch dimension (Qwen2-VL's
            ``pixel_values`` of ``[patches, dim]``, ``image_grid_thw``) keeps all its
            dimensions in the key.
        items: The batch dimension of the call (sequences, images, clips, latents).
        text: All the call's work is in one text-token stream: token ids (or ``inputs_embeds``)
            with only masks, labels and positions of their shape beside them. The text rule of
            the ``measured`` estimate (tokens, squared lengths, micro-batches) is sound only
            then.
        modality: What the run's "tokens" are for this call (see :data:`Modality`).
        decoder_tokens: Decoder positions computed (``batch x decoder length``, padding
            included); 0 without a decoder stream.
        decoder_sum_sq_len: Sum over sequences of the decoder length squared (padded),
            tokens^2.
        cross_pairs: Sum over sequences of encoder length x decoder length (padded): the
            query-key pairs of cross-attention, tokens^2.

    These are the padded shapes of one call (a sample's denominators, as ``B x T`` is for the
    text tokens); the run's totals (``TokenTotals.decoder_tokens`` ...) are non-padding counts.
    """

    key: str
    items: int
    text: bool
    modality: Modality = "text"
    decoder_tokens: int = 0
    decoder_sum_sq_len: int = 0
    cross_pairs: int = 0
