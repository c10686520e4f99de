"""Where a forward call carries its tokens: one :class:`~flopmeter.tokens.TokenInputs` per call.

The meter's forward pre-hook sees ``(args, kwargs)``; :func:`find_token_inputs` turns them into
the tensors the token statistics need. Only shapes, dtypes and names are looked at: no tensor
value is read on the host.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from flopmeter.tokens import TokenInputs

__all__ = ["CU_SEQLENS_KEYS", "find_token_inputs"]

#: Keyword names under which packed batches pass their document offsets (flash-attention
#: varlen style; Hugging Face's DataCollatorWithFlattening uses ``cu_seq_lens_q``).
CU_SEQLENS_KEYS = ("cu_seqlens", "cu_seq_lens_q", "cu_seqlens_q")


def find_token_inputs(args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> TokenInputs:
    """Finds a forward call's token inputs.

    Named inputs first: the keyword arguments (Hugging Face style), or a mapping passed as the
    first argument. Then positional tensors: an integer first argument is the ids, and a second
    argument of the same shape is the mask. ``inputs_embeds`` (``[B, T, H]``) stands in for ids
    of ``[B, T]`` (every position a token). ``position_ids`` / ``cu_seqlens`` mark the documents
    of a packed batch.

    Args:
        args: The call's positional arguments.
        kwargs: The call's keyword arguments.

    Returns:
        The inputs found; ``ref`` is ``None`` when the call holds no tokens the meter can read.
    """
    source = _named_inputs(args, kwargs)
    ids = _tensor(source.get("input_ids"))
    mask = _tensor(source.get("attention_mask"))
    if ids is None and source is kwargs and args and isinstance(args[0], torch.Tensor):
        first = args[0]
        if not first.is_floating_point():
            ids = first
            second = args[1] if len(args) > 1 else None
            if mask is None and isinstance(second, torch.Tensor) and second.shape == first.shape:
                mask = second
    if ids is None and mask is None:
        embeds = source.get("inputs_embeds")
        if isinstance(embeds, torch.Tensor) and embeds.dim() == 3:
            # Every position of [B, T, H] embeddings is a token: an all-ones mask, as a
            # zero-copy view.
            mask = torch.ones((), dtype=torch.bool, device=embeds.device).expand(embeds.shape[:2])
    ref = ids if ids is not None else mask
    if ref is None:
        return TokenInputs()
    position_ids, cu_seqlens = _packing_inputs(source, ref)
    return TokenInputs(ids, mask, position_ids, cu_seqlens)


def _named_inputs(args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> Mapping[str, Any]:
    """The keyword arguments, or a mapping passed as the first argument."""
    if "input_ids" not in kwargs and args and isinstance(args[0], Mapping):
        return args[0]
    return kwargs


def _tensor(value: Any) -> torch.Tensor | None:
    return value if isinstance(value, torch.Tensor) else None


def _packing_inputs(
    source: Mapping[str, Any], ref: torch.Tensor
) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """``(position_ids, cu_seqlens)`` of a packed batch among a call's named inputs.

    ``position_ids`` are kept only when they can describe ``ref``'s tokens (1-D or 2-D with the
    same last dimension; e.g. the 3-D positions of multimodal rotary embeddings are not
    document markers).
    """
    pos = source.get("position_ids")
    if (
        isinstance(pos, torch.Tensor)
        and 1 <= pos.dim() <= 2
        and pos.shape[-1] == ref.shape[-1]
        and ref.dim() <= 2
    ):
        return pos, None
    for key in CU_SEQLENS_KEYS:
        value = source.get(key)
        if isinstance(value, torch.Tensor):
            return None, value
    return None, None
