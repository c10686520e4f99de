"""The forward pre-hook's reading of a call, worked out once per call structure.

What :func:`flopmeter.counting.inputs.read_call` finds in a training call depends only on the call's
structure: which positions and names hold tensors (and which hold plain scalars), each tensor's
shape, dtype and device, and the meter's fixed options (``token_inputs`` given as a name, what
the model's config says). A training loop calls its model with a few such structures over and
over, so :class:`CallPlans` reads the first call of each structure in full and keeps a
:class:`CallPlan`: where each tensor it used sits in the call, and the shape units, which are
the same for every call of the structure. A later call of that structure takes its tensors from
those places (no search, no shape keys made again) and is counted exactly as a full reading
would count it (tests/test_call_plan.py compares both on every kind of call).

Calls whose structure cannot be keyed this cheaply are read in full every time: arguments that
are containers (a mapping or a tuple passed to the model), a ``token_inputs`` function, a tensor
the reading found in two places under names that do not say which it is. At most
:data:`MAX_PLANS` structures are kept; the calls of others are read in full.

A plan of an unpacked text call on CPU tensors also says how its tokens are counted
(:meth:`flopmeter.counting.planned.PlannedCalls.add`): one copy or one reduction, no more; once
such a call is counted so, its structure has a hot path (:meth:`~flopmeter.counting.planned.
PlannedCalls.take`).
Only shapes, dtypes, devices and names are looked at: no tensor value is read on the host.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from flopmeter.counting.call_args import SCALAR_TYPES, TokenLocator
from flopmeter.counting.counters import RunCounters
from flopmeter.counting.inputs import CallInputs, DecoderInputs, ModelInputFacts, read_call
from flopmeter.counting.work_units import ShapeUnits
from flopmeter.tokens.batch import MODE_IDS, MODE_MASK, TokenInputs, prepare_batch
from flopmeter.tokens.staging import FastText

__all__ = ["MAX_PLANS", "CallPlan", "CallPlans", "call_key"]

#: Call structures kept at most (each a few hundred bytes); the calls of others are read in
#: full. A run that pads each batch to its longest sequence has one structure per length.
MAX_PLANS = 1024
#: The names under which read_call takes each role, to tell one tensor passed twice apart.
_TOKEN_NAMES = ("input_ids", "attention_mask", "position_ids", None)
_DECODER_NAMES = ("decoder_attention_mask", "labels", "attention_mask", "input_ids")


def call_key(args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> tuple[Any, ...] | None:
    """The call's structure: per positional argument and per keyword (in order), a tensor's
    shape, dtype and device, or a scalar's type; ``None`` when an argument is anything else."""
    key: list[Any] = []
    for value in args:
        if isinstance(value, torch.Tensor):
            key.append((value.shape, value.dtype, value.device))
        elif type(value) in SCALAR_TYPES:
            key.append(type(value))
        else:
            return None
    for name, value in kwargs.items():
        if isinstance(value, torch.Tensor):
            key.append((name, value.shape, value.dtype, value.device))
        elif type(value) in SCALAR_TYPES:
            key.append((name, type(value)))
        else:
            return None
    return tuple(key)


def _take(place: Any, args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> Any:
    """The value at a place of the call: a positional index, a keyword name, or a constant
    tensor the reading made from the shapes alone (an all-ones view); ``None``: nothing."""
    if place is None or isinstance(place, torch.Tensor):
        return place
    return kwargs[place] if isinstance(place, str) else args[place]


class CallPlan:
    """Where one call structure carries what the meter reads (see the module docstring).

    Attributes:
        units: The calls' shape units (the same for every call of the structure).
        fast: How its tokens are counted without the full path, when it can be (an unpacked
            text call on CPU tensors); ``None`` otherwise.
        slot: The plan's number among its meter's plans: the counters keep their state of
            its calls (staging area, calls whose shape units are pending) under it.
    """

    __slots__ = ("_decoder", "_ref", "_tokens", "fast", "item_length", "slot", "units")

    def __init__(
        self,
        tokens: tuple[Any, ...],
        decoder: tuple[Any, ...] | None,
        ref: Any,
        units: ShapeUnits,
        item_length: int,
        fast: FastText | None,
        slot: int,
    ) -> None:
        self._tokens, self._decoder, self._ref = tokens, decoder, ref
        self.units, self.item_length, self.fast, self.slot = units, item_length, fast, slot

    def ref(self, args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> torch.Tensor:
        """The call's reference tensor (:attr:`flopmeter.counting.inputs.CallInputs.ref`)."""
        return _take(self._ref, args, kwargs)

    def call(self, args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> CallInputs:
        """What :func:`~flopmeter.counting.inputs.read_call` gives for this call."""
        tokens = TokenInputs(*(_take(p, args, kwargs) for p in self._tokens))
        decoder = None
        if self._decoder is not None:
            rows, length, *places, encoder_length = self._decoder
            decoder = DecoderInputs(
                rows, length, *(_take(p, args, kwargs) for p in places), encoder_length
            )
        return CallInputs(tokens, self.units, self.ref(args, kwargs), decoder, self.item_length)


class _Unplannable(Exception):
    """A tensor of the reading is in two places of the call (which one is not known)."""


def _place(
    tensor: torch.Tensor | None,
    args: tuple[Any, ...],
    kwargs: Mapping[str, Any],
    name: str | None,
) -> Any:
    """Where ``tensor`` is in the call: its keyword ``name`` when it is there, else its one
    place; the tensor itself when it is nowhere (made by the reading from shapes).

    Raises:
        _Unplannable: it is in several places, none of them ``name``.
    """
    if tensor is None:
        return None
    if name is not None and kwargs.get(name) is tensor:
        return name
    found = [i for i, v in enumerate(args) if v is tensor]
    found += [k for k, v in kwargs.items() if v is tensor]
    if len(found) > 1:
        raise _Unplannable
    return found[0] if found else tensor


def make_plan(
    call: CallInputs,
    args: tuple[Any, ...],
    kwargs: Mapping[str, Any],
    pad_id: int | None,
    slot: int = 0,
) -> CallPlan | None:
    """The plan of a call read in full (``call``), number ``slot`` among its meter's, or
    ``None`` when its places are ambiguous."""
    try:
        tokens = tuple(
            _place(t, args, kwargs, n) for t, n in zip(call.tokens, _TOKEN_NAMES, strict=True)
        )
        decoder = None
        if call.decoder is not None:
            d = call.decoder
            places = (d.mask, d.labels, d.encoder_mask, d.encoder_ids)
            decoder = (
                d.rows,
                d.length,
                *(_place(t, args, kwargs, n) for t, n in zip(places, _DECODER_NAMES, strict=True)),
                d.encoder_length,
            )
        name = "input_ids" if call.tokens.input_ids is not None else "attention_mask"
        ref = _place(call.ref, args, kwargs, name)
    except _Unplannable:
        return None
    fast = _fast(call, tokens, pad_id)
    return CallPlan(tokens, decoder, ref, call.units, call.item_length, fast, slot)


def _fast(call: CallInputs, places: tuple[Any, ...], pad_id: int | None) -> FastText | None:
    """How the call's tokens are counted without the full path: unpacked text on the CPU."""
    t = call.tokens
    ref = t.ref
    if (
        ref is None
        or call.decoder is not None
        or call.units.modality != "text"
        or t.position_ids is not None
        or t.cu_seqlens is not None
        or ref.device.type != "cpu"
    ):
        return None
    batch = prepare_batch(t, pad_id)  # checked when the call was counted: it does not raise
    if batch is None or batch.rows * batch.cols == 0:
        return None
    source = {MODE_MASK: places[1], MODE_IDS: places[0]}.get(batch.mode)
    if isinstance(source, torch.Tensor):  # counted by a tensor made from shapes: full path
        return None
    return FastText(source, batch.mode, batch.pad_id, batch.rows, batch.cols)


class CallPlans:
    """The plans of one meter's calls, by structure (see the module docstring).

    Args:
        locator: The meter's ``token_inputs`` option (a function: no plans are made).
        pad_id: The meter's pad id.
    """

    def __init__(self, locator: TokenLocator | None, pad_id: int | None) -> None:
        self._plans: dict[tuple[Any, ...], CallPlan | None] = {}
        self._slots = 0
        self._on = not callable(locator)
        self.locator, self.pad_id = locator, pad_id

    def count(
        self,
        counters: RunCounters,
        args: tuple[Any, ...],
        kwargs: Mapping[str, Any],
        facts: ModelInputFacts,
    ) -> tuple[tuple[int, int], torch.Tensor, ShapeUnits]:
        """Counts one training call into ``counters``: from its structure's plan when there is
        one, else read in full (:func:`~flopmeter.counting.inputs.read_call`, then
        :meth:`~flopmeter.counting.counters.RunCounters.add_call`) and its plan kept.

        Returns:
            ``(rows, cols)`` (what the budget guard bounds a step by), the call's reference
            tensor and its shape units (what the FLOP model is told).

        Raises:
            TokenInputError: as :func:`~flopmeter.counting.inputs.read_call`, or the tokens do not fit
                each other (nothing is kept for the structure then).
        """
        key = call_key(args, kwargs) if self._on else None
        plan = self._plans.get(key) if key is not None else None
        if plan is not None:
            shape = None
            fast = plan.fast
            if fast is not None:
                shape = counters.planned.add(fast, plan.units, plan.slot, args, kwargs)
                if shape is not None:
                    counters.planned.learn(fast, plan.slot, args, kwargs)
            if shape is None:  # not a fast call, or one its staging cannot take now
                shape = counters.add_call(plan.call(args, kwargs), self.pad_id)
            return shape, plan.ref(args, kwargs), plan.units
        # Shapes only (no value read); unreadable or ambiguous: TokenInputError, unread.
        call = read_call(args, kwargs, self.locator, facts)
        # Device work only: no .item(), .cpu(), host copy or collective per micro-batch.
        shape = counters.add_call(call, self.pad_id)
        self.learn(key, call, args, kwargs)
        return shape, call.ref, call.units

    def learn(
        self,
        key: tuple[Any, ...] | None,
        call: CallInputs,
        args: tuple[Any, ...],
        kwargs: Mapping[str, Any],
    ) -> None:
        """Keeps the plan of a call read in full and counted (at most :data:`MAX_PLANS`)."""
        if key is None or key in self._plans or len(self._plans) >= MAX_PLANS:
            return
        self._plans[key] = make_plan(call, args, kwargs, self.pad_id, slot=self._slots)
        self._slots += 1  # never reused, also after forget(): the counters' state is by slot

    def forget(self) -> None:
        """Drops every plan (the model's input facts may have changed: a new census)."""
        self._plans.clear()

    def __len__(self) -> int:
        return len(self._plans)
