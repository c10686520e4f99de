"""A forward call's arguments: where it carries its tokens, and its tensors by name.

The meter's forward pre-hook sees ``(args, kwargs)``; :func:`find_token_inputs` turns them into
the tensors the token statistics need. Only shapes, dtypes and names are looked at: no tensor
value is read on the host.

Where the ids are looked for, in order:

1. where the user said (the meter's ``token_inputs`` option: a keyword name, or a function of
   the call's ``(args, kwargs)``);
2. ``input_ids`` among the named inputs (the keyword arguments, or a mapping passed as the
   first argument), with ``attention_mask``;
3. the first integer tensor among the positional arguments (a second argument of the same
   shape as a first-argument id tensor is the mask), or the first element of a tuple or list
   passed as the first argument (``model((ids, labels))``, no mask);
4. a sequence passed in two halves, ``prompt_ids`` and ``completion_ids`` (with
   ``prompt_mask`` and ``completion_mask``), as TRL's trainers hand their inputs to a forward
   redirection: the two joined along the sequence, as the model runs them;
5. the first integer tensor of one or two dimensions under any other keyword (``model(x=ids)``),
   except the names that never hold token ids (``labels``, ``position_ids``, ``timestep``,
   ``class_labels``, ...);
6. ``inputs_embeds`` (``[B, T, H]``): every position a token.

A 0-d integer positional tensor is never the ids, nor is an integer positional tensor after a
floating one of three or more dimensions (diffusers' ``UNet2DModel(sample, timestep)``: the
timestep, not tokens).

:func:`call_tensors` names every tensor argument of a call (keywords by name, positional ones
as ``arg0``...). What the rest of a call stands for (decoder stream, images, audio features,
float inputs) is read from its shapes by :mod:`flopmeter.counting.inputs`, which re-exports
:func:`find_token_inputs`, :func:`locate_with`, ``TokenLocator`` and ``CU_SEQLENS_KEYS``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any, Union

import torch

from flopmeter.tokens.batch import TokenInputError, TokenInputs

__all__ = [
    "CU_SEQLENS_KEYS",
    "SCALAR_TYPES",
    "TokenLocator",
    "call_tensors",
    "find_token_inputs",
    "first_tensor",
    "float_tensor",
    "integer_tensor",
    "locate_with",
    "named_inputs",
    "tensor_or_none",
]

#: Keyword names under which packed batches pass their document offsets (flash-attention
#: varlen style; Hugging Face's DataCollatorWithFlattening uses ``cu_seq_lens_q``).
CU_SEQLENS_KEYS = ("cu_seqlens", "cu_seq_lens_q", "cu_seqlens_q")

#: The plain values a call's structure may hold beside its tensors, keyed by their type alone
#: (the call plans' key and the hot path's: :mod:`flopmeter.counting.call_plan`,
#: :mod:`flopmeter.counting.planned`).
SCALAR_TYPES = frozenset({bool, int, float, str, type(None)})

#: Integer tensors under these names are never the token ids.
_NOT_IDS = frozenset(
    {
        "labels",
        "label",
        "position_ids",
        "token_type_ids",
        "attention_mask",
        "cache_position",
        "decoder_input_ids",
        "decoder_attention_mask",
        "head_mask",
        "timestep",
        "timesteps",
        "class_labels",
        "image_grid_thw",
        "video_grid_thw",
        *CU_SEQLENS_KEYS,
        "cu_seq_lens_k",
        "cu_seqlens_k",
    }
)

#: What the ``token_inputs`` option may be: the name under which a forward call passes the
#: ids, or a function of the call's ``(args, kwargs)`` returning the ids tensor, a mapping with
#: ``input_ids`` (and optionally ``attention_mask``, ``position_ids``, ``cu_seqlens``), or a
#: :class:`~flopmeter.tokens.stats.TokenInputs`.
TokenLocator = Union[str, Callable[[tuple[Any, ...], Mapping[str, Any]], Any]]  # noqa: UP007


def find_token_inputs(
    args: tuple[Any, ...], kwargs: Mapping[str, Any], locator: TokenLocator | None = None
) -> TokenInputs:
    """Finds a forward call's token inputs (see the module docstring for the order).

    Args:
        args: The call's positional arguments.
        kwargs: The call's keyword arguments.
        locator: Where the user says the tokens are (the ``token_inputs`` option).

    Returns:
        The inputs found; ``ref`` is ``None`` when the call holds no tokens the meter can read.

    Raises:
        Exception: whatever ``locator`` raises, or a ``TypeError`` when it returns something
            that is not token inputs (the meter counts the micro-batch as unread).
    """
    source = named_inputs(args, kwargs)
    if locator is not None:
        return locate_with(locator, args, kwargs, source)
    ids = tensor_or_none(source.get("input_ids"))  # floating "ids" stand for embeddings: all count
    mask = tensor_or_none(source.get("attention_mask"))
    if ids is None and source is kwargs:
        ids, mask = _positional(args, mask)
    if ids is None and mask is None:
        ids, mask = _split_sequence(source)
    if ids is None and mask is None:
        ids = _any_keyword_ids(source)
    if ids is None and mask is None:
        embeds = source.get("inputs_embeds")
        if isinstance(embeds, torch.Tensor) and embeds.dim() == 3:
            # Every position of [B, T, H] embeddings is a token: an all-ones mask, as a
            # zero-copy view.
            mask = torch.ones((), dtype=torch.bool, device=embeds.device).expand(embeds.shape[:2])
    return _with_packing(ids, mask, source)


def locate_with(
    locator: TokenLocator,
    args: tuple[Any, ...],
    kwargs: Mapping[str, Any],
    source: Mapping[str, Any] | None = None,
) -> TokenInputs:
    """The token inputs where ``locator`` says they are.

    Raises:
        TypeError: what it finds is not an integer tensor, a mapping or ``TokenInputs``.
    """
    source = named_inputs(args, kwargs) if source is None else source
    if isinstance(locator, str):
        found: Any = source.get(locator)
        mask = tensor_or_none(source.get("attention_mask"))
    else:
        found, mask = locator(args, kwargs), None
    where = repr(locator) if isinstance(locator, str) else "the token_inputs function"
    if isinstance(found, TokenInputs):
        return found
    if isinstance(found, Mapping):
        ids = tensor_or_none(found.get("input_ids"))
        _check_ids(ids, where)
        return _with_packing(ids, tensor_or_none(found.get("attention_mask")), found)
    if isinstance(found, torch.Tensor):
        _check_ids(found, where)
        return _with_packing(found, mask, source)
    raise TypeError(
        f"token_inputs: {where} gave {type(found).__name__}, not an integer tensor of token ids "
        "(or a mapping with input_ids)"
    )


def _check_ids(ids: torch.Tensor | None, where: str) -> None:
    """Token ids the user pointed at are integers: a floating (pixels, embeddings), complex or
    bool tensor is not, and counting its elements as tokens would give a figure out by orders
    of magnitude.

    Raises:
        TokenInputError: ``"unread"``, naming the option and the dtype (the micro-batch is
            counted as unread with this reason; training goes on).
    """
    if ids is None or not (ids.is_floating_point() or ids.is_complex() or ids.dtype == torch.bool):
        return
    raise TokenInputError(
        "unread",
        f"token_inputs: {where} gave a {str(ids.dtype).removeprefix('torch.')} tensor, not token "
        "ids (an integer tensor); point token_inputs at the input_ids, or leave it unset for a "
        "model that takes no tokens",
    )


def named_inputs(args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> Mapping[str, Any]:
    """The keyword arguments, or a mapping passed as the first argument, or, behind a module
    passed first (a forward redirection: TRL's ``_ForwardRedirection`` and Lightning's call the
    wrapper as ``wrapper(inner_module, inputs, ...)``), a mapping passed second."""
    if "input_ids" not in kwargs and args:
        first = args[0]
        if isinstance(first, Mapping):
            return first
        if len(args) > 1 and isinstance(first, torch.nn.Module) and isinstance(args[1], Mapping):
            return args[1]
    return kwargs


def tensor_or_none(value: Any) -> torch.Tensor | None:
    """``value`` when it is a tensor, else ``None``."""
    return value if isinstance(value, torch.Tensor) else None


def integer_tensor(value: Any) -> torch.Tensor | None:
    """``value`` when it is a tensor of integers (not bool: a bool tensor is a mask)."""
    if (
        isinstance(value, torch.Tensor)
        and not value.is_floating_point()
        and not value.is_complex()
        and value.dtype != torch.bool
    ):
        return value
    return None


def _positional(
    args: Sequence[Any], mask: torch.Tensor | None
) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """Ids (and a mask) among positional arguments, or the first element of a tuple/list.

    A batch passed whole as a tuple or list (``(ids, labels, ...)``) gives its first element
    as the ids and no mask (its other elements are labels as often as masks). Otherwise the
    first integer positional tensor is the ids, and when it is the first argument, a second
    argument of the same shape is the mask.
    """
    if args and isinstance(args[0], (tuple, list)):
        return (integer_tensor(args[0][0]) if args[0] else None), mask
    for i, value in enumerate(args):
        if isinstance(value, torch.Tensor) and value.is_floating_point() and value.dim() >= 3:
            return None, mask  # a sample (pixels, latents): integers after it are timesteps
        ids = integer_tensor(value)
        if ids is None or ids.dim() == 0:  # a 0-d integer is a timestep or a label, not ids
            continue
        second = args[1] if i == 0 and len(args) > 1 else None
        if mask is None and isinstance(second, torch.Tensor) and second.shape == ids.shape:
            mask = second
        return ids, mask
    return None, mask


def _split_sequence(source: Mapping[str, Any]) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """The ids (and mask) of a sequence passed as ``prompt_ids`` and ``completion_ids`` (and
    ``prompt_mask``, ``completion_mask``), joined along the sequence; ``(None, None)`` unless
    both halves are ``[B, T]`` integer tensors of the same rows (a mask only when both halves
    have one of their shape)."""
    prompt = integer_tensor(source.get("prompt_ids"))
    completion = integer_tensor(source.get("completion_ids"))
    if (
        prompt is None
        or completion is None
        or prompt.dim() != 2
        or completion.dim() != 2
        or prompt.shape[0] != completion.shape[0]
    ):
        return None, None
    masks = (
        tensor_or_none(source.get("prompt_mask")),
        tensor_or_none(source.get("completion_mask")),
    )
    mask = None
    if all(
        m is not None and m.shape == t.shape
        for m, t in zip(masks, (prompt, completion), strict=True)
    ):
        mask = torch.cat(masks, dim=1)  # type: ignore[arg-type]
    return torch.cat((prompt, completion), dim=1), mask


def _any_keyword_ids(source: Mapping[str, Any]) -> torch.Tensor | None:
    """The first integer ``[T]`` or ``[B, T]`` tensor under a name that may hold token ids."""
    for key, value in source.items():
        if key in _NOT_IDS:
            continue
        ids = integer_tensor(value)
        if ids is not None and 1 <= ids.dim() <= 2:
            return ids
    return None


def _with_packing(
    ids: torch.Tensor | None, mask: torch.Tensor | None, source: Mapping[str, Any]
) -> TokenInputs:
    """``TokenInputs`` with the packed-batch markers of ``source`` that fit the tokens.

    ``position_ids`` are kept only when they can describe the tokens (1-D or 2-D with the
    same last dimension; e.g. the 3-D positions of multimodal rotary embeddings are not
    document markers).
    """
    ref = ids if ids is not None else mask
    if ref is None:
        return TokenInputs()
    pos = source.get("position_ids")
    if (
        isinstance(pos, torch.Tensor)
        and 1 <= pos.dim() <= 2
        and ref.dim() >= 1
        and pos.shape[-1] == ref.shape[-1]
        and ref.dim() <= 2
    ):
        return TokenInputs(ids, mask, pos, None)
    for key in CU_SEQLENS_KEYS:
        value = source.get(key)
        if isinstance(value, torch.Tensor):
            return TokenInputs(ids, mask, None, value)
    return TokenInputs(ids, mask, None, None)


def first_tensor(source: Mapping[str, Any], names: Sequence[str]) -> Any:
    """The tensor under the first of ``names`` that holds one in ``source``, else ``None``."""
    for name in names:
        if isinstance(source.get(name), torch.Tensor):
            return source[name]
    return None


def float_tensor(value: Any) -> torch.Tensor | None:
    """``value`` when it is a floating tensor, else ``None``."""
    return value if isinstance(value, torch.Tensor) and value.is_floating_point() else None


def call_tensors(
    args: tuple[Any, ...], kwargs: Mapping[str, Any], source: Mapping[str, Any]
) -> list[tuple[str, torch.Tensor]]:
    """The call's tensor inputs by name: keywords (or the mapping passed first) by their name,
    positional ones as ``arg0``, ``arg1``..., a tuple or list passed first as ``arg0.0``..."""
    out: list[tuple[str, torch.Tensor]] = []
    positional: Sequence[Any] = args
    if source is not kwargs:
        out.extend((str(k), v) for k, v in source.items() if isinstance(v, torch.Tensor))
        positional = args[1:]
        start = 1
    else:
        start = 0
        if args and isinstance(args[0], (tuple, list)):
            out.extend(
                (f"arg0.{j}", v) for j, v in enumerate(args[0]) if isinstance(v, torch.Tensor)
            )
            positional, start = args[1:], 1
    out.extend(
        (f"arg{i}", v) for i, v in enumerate(positional, start) if isinstance(v, torch.Tensor)
    )
    out.extend((str(k), v) for k, v in kwargs.items() if isinstance(v, torch.Tensor))
    return out
