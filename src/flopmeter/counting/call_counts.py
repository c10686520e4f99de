"""What a run's training calls add beside their text tokens: the decoder stream and the shapes.

:class:`~flopmeter.counting.counters.RunCounters` counts the text tokens (:mod:`flopmeter.tokens.stats`) and
keeps one of each of these for the rest of what :func:`flopmeter.counting.inputs.read_call` reads of a
call:

- :class:`DecoderCounts`: the decoder stream's non-padding tokens, their squared lengths and the
  cross-attention pairs, added on the call's device (no host read) and read at report time;
- :class:`ShapeCounts`: host integers from the shapes: the items, the micro-batches not all
  text, the micro-batches per modality (and so the run's modality), the shape keys.

:func:`merge_input_shapes` merges the shape keys over ranks and a restored state.
"""

from __future__ import annotations

import torch

from flopmeter.counting.inputs import IGNORE_INDEX, DecoderInputs
from flopmeter.counting.work_units import MAX_INPUT_SHAPES, Modality, ShapeUnits
from flopmeter.types import InputShapeCount

__all__ = ["MODALITIES", "DecoderCounts", "ShapeCounts", "merge_input_shapes"]

#: The modalities, in the order their micro-batch counts travel (summed over ranks, saved).
MODALITIES: tuple[Modality, ...] = ("text", "image", "audio", "items")
#: Slots of the decoder buffer: non-padding decoder tokens, their squared lengths per
#: sequence, cross-attention pairs (encoder x decoder non-padding lengths per sequence).
_N_DECODER = 3


class DecoderCounts:
    """A run's decoder-stream counts on this rank: an int64 buffer per device, and host integers
    for the streams with nothing on a device to count by (``meta``; counted padded)."""

    def __init__(self) -> None:
        self._buffers: dict[torch.device, torch.Tensor] = {}  # _N_DECODER slots per device
        self._shapes = [0] * _N_DECODER  # decoder streams on meta (host, padded)

    def add(self, d: DecoderInputs, cross_padded: int, pad_id: int | None, meta: bool) -> None:
        """Adds a decoder stream's non-padding counts into its device's buffer (device work
        only); a stream on ``meta`` (or with no tensor to count by) adds every position and
        ``cross_padded`` (the call's padded cross-attention pairs, tokens^2)."""
        tensors = [t for t in (d.mask, d.labels, d.encoder_mask, d.encoder_ids) if t is not None]
        if meta or not tensors or any(t.device.type == "meta" for t in tensors):
            # nothing on a device to count by: every position (meta tensors hold no values)
            for i, value in enumerate((d.rows * d.length, d.rows * d.length**2, cross_padded)):
                self._shapes[i] += value
            return
        device = tensors[0].device
        buffer = self._buffers.get(device)
        if buffer is None:
            buffer = self._buffers[device] = torch.zeros(
                _N_DECODER, dtype=torch.int64, device=device
            )
        buffer.add_(_decoder_counts(d, pad_id, device))

    def local(self) -> list[int]:
        """``[decoder tokens, their squared lengths (tokens^2), cross-attention pairs
        (tokens^2)]`` on this rank: the buffers' host read, at report time."""
        decoder = list(self._shapes)
        for buffer in self._buffers.values():
            for i, value in enumerate(buffer.tolist()):  # at report time, with the counts
                decoder[i] += int(value)
        return decoder


class ShapeCounts:
    """The host counts a run's calls add from their shapes (:class:`ShapeUnits`).

    Attributes:
        items: Items of the counted calls (sequences, images, clips, latents).
        non_text: Counted micro-batches whose work is not all in one text-token stream.
        modalities: Counted micro-batches per modality (every one of :data:`MODALITIES`).
        run_modality: The run's modality (its first counted call's, or the restored one's);
            ``None`` before any.
        input_shapes: ``{shape key: [micro_batches, items]}``, at most
            :data:`MAX_INPUT_SHAPES` keys.
        dropped: Micro-batches whose shape key came after the kept ones.
        seen_sq: Sum of rows x (padded width)^2 of the counted calls' tokens, tokens^2 (what
            :class:`~flopmeter.counting.counters.RunCounters` adds from each counted shape).
    """

    def __init__(self) -> None:
        self.items = 0
        self.non_text = 0
        self.modalities = dict.fromkeys(MODALITIES, 0)
        self.run_modality: Modality | None = None
        self.input_shapes: dict[str, list[int]] = {}
        self.dropped = 0
        self.seen_sq = 0

    def unlike_reason(self, units: ShapeUnits) -> str | None:
        """Why a call of ``units`` is not counted, ``None`` when it may be: its modality is not
        the run's, so its tokens are another unit."""
        run = self.run_modality
        if run is None or units.modality == run:
            return None
        return (
            f"its inputs are {units.modality} where the run's earlier micro-batches were "
            f"{run}: what the report calls tokens would add unlike units"
        )

    def add(self, units: ShapeUnits, calls: int = 1) -> None:
        """Adds ``calls`` counted calls of the same units: their items, whether they are not
        all text, their modality (the run's from now on) and their shape key (beyond
        :data:`MAX_INPUT_SHAPES` keys, a new key is counted as dropped)."""
        self.items += units.items * calls
        if not units.text:
            self.non_text += calls
        self.modalities[units.modality] += calls
        self.run_modality = units.modality
        kept = self.input_shapes.get(units.key)
        if kept is None and len(self.input_shapes) >= MAX_INPUT_SHAPES:
            self.dropped += calls
        elif kept is None:
            self.input_shapes[units.key] = [calls, units.items * calls]
        else:
            kept[0] += calls
            kept[1] += units.items * calls

    def local(self) -> list[int]:
        """``[items, non_text, dropped, seen_sq, *micro-batches per modality in MODALITIES'
        order]``."""
        counts = [self.items, self.non_text, self.dropped, self.seen_sq]
        return [*counts, *(self.modalities[m] for m in MODALITIES)]


def merge_input_shapes(
    parts: list[dict[str, list[int]]], dropped: int
) -> tuple[tuple[InputShapeCount, ...], int]:
    """Shape keys' counts summed by key over ``parts`` (ranks, a restored state), at most
    :data:`MAX_INPUT_SHAPES` keys: those with the most micro-batches (ties by key, so every
    rank keeps the same ones); the others' micro-batches are added to ``dropped``.

    Args:
        parts: Each ``{key: [micro_batches, items]}``.
        dropped: Micro-batches already dropped (beyond the kept keys).

    Returns:
        ``(counts sorted by key, dropped)``.
    """
    merged: dict[str, list[int]] = {}
    for part in parts:
        for key, (micro, items) in part.items():
            slot = merged.setdefault(key, [0, 0])
            slot[0] += int(micro)
            slot[1] += int(items)
    ranked = sorted(merged, key=lambda k: (-merged[k][0], k))
    for key in ranked[MAX_INPUT_SHAPES:]:
        dropped += merged.pop(key)[0]
    counts = tuple(
        InputShapeCount(key=k, micro_batches=merged[k][0], items=merged[k][1])
        for k in sorted(merged)
    )
    return counts, dropped


def _decoder_counts(d: DecoderInputs, pad_id: int | None, device: torch.device) -> torch.Tensor:
    """``[non-padding decoder tokens, sum of their squared lengths, cross-attention pairs]`` of
    one call (int64, on ``device``, where the call's decoder and encoder tensors are; device
    work only: a count of a comparison is int64 already, so nothing is converted or moved)."""
    if d.mask is not None:
        dec = (d.mask != 0).sum(-1)
    elif d.labels is not None:
        dec = (d.labels != IGNORE_INDEX).sum(-1)
    else:
        dec = torch.full((d.rows,), d.length, dtype=torch.int64, device=device)
    enc: torch.Tensor | int = d.encoder_length
    if d.encoder_mask is not None:
        enc = (d.encoder_mask != 0).sum(-1)
    elif d.encoder_ids is not None and pad_id is not None:
        enc = (d.encoder_ids != pad_id).sum(-1)
    return torch.stack((dec.sum(), (dec * dec).sum(), (dec * enc).sum()))
