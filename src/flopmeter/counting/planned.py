"""Planned text calls on CPU tensors: counted with one copy per micro-batch, settled at a read.

A call structure whose plan (:mod:`flopmeter.counting.call_plan`) says its tokens are unpacked
text on CPU tensors is counted here (:class:`PlannedCalls`): its mask or ids go to a staging
area (:mod:`flopmeter.tokens.staging`), and what its shape alone adds (tokens seen, padded squared
lengths, shape units; every count when every token is real) waits in a :class:`Pending` of its
structure, multiplied out when the counters are read (:meth:`PlannedCalls.settle`).

Once a structure has been counted so, :meth:`PlannedCalls.take` is its hot path: one key made
from the call's shapes, one lookup, the copy, two integer additions. The forward pre-hook tries
it first (:meth:`flopmeter.run.hooks.TrainingHooks.on_forward_pre`) on the micro-batches the
FLOP model does not need to see; a call it does not know goes the planned or the full way.
Only shapes, dtypes, devices and names are looked at: no tensor value is read on the host.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, NamedTuple

import torch

from flopmeter.counting.call_args import SCALAR_TYPES
from flopmeter.counting.call_counts import ShapeCounts
from flopmeter.counting.work_units import ShapeUnits
from flopmeter.tokens.batch import (
    MODE_ALL,
    SLOT_SEQUENCES,
    SLOT_SUM_SQ_LEN,
    SLOT_TOKENS,
    SLOT_TOKENS_SEEN,
)
from flopmeter.tokens.staging import FastText, StagedTokens, TokenStage

__all__ = ["HotCall", "Pending", "PlannedCalls", "hot_key"]

_Tensor = torch.Tensor
#: Hot paths kept at most (as many as the call plans: :data:`~flopmeter.counting.call_plan.
#: MAX_PLANS`).
MAX_HOT = 1024


def hot_key(args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> tuple[Any, ...]:
    """The call's structure as the hot path keys it, flat: the number of positional
    arguments and the keywords' names, then per value (positional first) a plain tensor's
    shape, dtype and whether it is on the CPU, or any other value's class.

    Only structures whose every value is a plain CPU tensor or a scalar are learned
    (:func:`_learnable`), so a key that matches a learned one says every tensor is a plain
    tensor on the CPU of that shape and dtype, every other value of that class: what
    :func:`~flopmeter.counting.call_plan.call_key` says of the call (a CPU tensor's device is
    ``cpu``). The key is flat (a shape is never a class, so it reads one way only) and holds
    no device object: it is built, hashed and compared on every training micro-batch."""
    key = [len(args), *kwargs]
    for v in (*args, *kwargs.values()) if args else kwargs.values():
        cls = type(v)
        if cls is _Tensor:
            key += (v.shape, v.dtype, v.is_cpu)
        else:
            key.append(cls)
    return tuple(key)


def _learnable(args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> bool | None:
    """Whether the call's hot key is exact: every value a plain CPU tensor or a scalar
    (``True``); a tensor off the CPU (``None``: never, its plan's key holds the device, so
    every call of the plan has it); a value of another class, a tensor subclass (``False``:
    perhaps a later call of the plan)."""
    values = (*args, *kwargs.values())
    if any(isinstance(v, torch.Tensor) and not v.is_cpu for v in values):
        return None
    return all(v.__class__ is _Tensor or v.__class__ in SCALAR_TYPES for v in values)


class Pending:
    """The calls of one planned structure counted since the last read, and what each adds
    from its shape alone (host integers).

    Attributes:
        units: The structure's shape units.
        hits: Its calls since the last :meth:`PlannedCalls.settle`.
        rows: Rows of a call (leading dimensions folded).
        cols: Tokens per row, padding included.
        all_real: Every token real (``MODE_ALL``): the counts are the shape's.
        learned: The structure's hot path is made, or never will be (:meth:`PlannedCalls.learn`
            is not tried again).
    """

    __slots__ = ("all_real", "cols", "hits", "learned", "rows", "units")

    def __init__(self, units: ShapeUnits, rows: int, cols: int, all_real: bool) -> None:
        self.units, self.rows, self.cols, self.all_real = units, rows, cols, all_real
        self.hits = 0
        self.learned = False


class HotCall(NamedTuple):
    """What the hot path does for one call structure.

    Attributes:
        place: Where the counted tensor is: a keyword's name or a positional index.
        by_name: ``place`` is a keyword's name.
        stage: The staging area its tensor is copied into; ``None`` when every token is real.
        pending: The structure's pending calls.
        shape: ``(rows, cols)`` of a call.
    """

    place: Any
    by_name: bool
    stage: TokenStage | None
    pending: Pending
    shape: tuple[int, int]


class PlannedCalls:
    """The planned CPU text calls of one run's counters (see the module docstring).

    Args:
        shapes: The counters' shape counts (the run's modality, where units settle).
        counters: The counters; :meth:`take` adds its micro-batch to ``micro_batches``.
    """

    def __init__(self, shapes: ShapeCounts, counters: Any) -> None:
        self._shapes, self._counters = shapes, counters
        self.staged = StagedTokens()  # their tokens, not yet in the totals
        self._stages: dict[int, TokenStage | bool] = {}  # by plan slot: its staging area
        self._pending: dict[int, Pending] = {}  # by plan slot
        self._hot: dict[tuple[Any, ...], HotCall] = {}

    def add(
        self,
        fast: FastText,
        units: ShapeUnits,
        slot: int,
        args: tuple[Any, ...],
        kwargs: Mapping[str, Any],
    ) -> tuple[int, int] | None:
        """Counts one call of plan ``slot`` (its ``fast`` part) as a full reading counts it;
        ``None`` when it must be read in full (a run of another modality, or a call the
        staging cannot take now).

        Returns:
            ``(rows, cols)``, as :meth:`flopmeter.counting.counters.RunCounters.add_call`.
        """
        if self._shapes.run_modality != "text":
            return None
        if fast.mode != MODE_ALL:
            place = fast.source
            source = kwargs[place] if place.__class__ is str else args[place]
            stage = self._stages.get(slot)
            if stage is None:  # the structure's first call here: its staging area, if any
                stage = self._stages[slot] = self.staged.stage_for(
                    source, fast.mode, fast.pad_id, fast.cols
                )
            if stage:
                self.staged.stage(stage, source)  # type: ignore[arg-type]
            elif not self.staged.count_now(source, fast.mode, fast.pad_id, fast.cols):
                return None  # the torch operations, through the full reading
        pending = self._pending.get(slot)
        if pending is None:
            pending = self._pending[slot] = Pending(
                units, fast.rows, fast.cols, fast.mode == MODE_ALL
            )
        pending.hits += 1
        return fast.rows, fast.cols

    def learn(
        self, fast: FastText, slot: int, args: tuple[Any, ...], kwargs: Mapping[str, Any]
    ) -> None:
        """Makes the hot path of plan ``slot``'s structure, after :meth:`add` counted a call of
        it: when it is staged (or every token is real) and the call's hot key is exact."""
        pending = self._pending.get(slot)
        if pending is None or pending.learned:
            return  # not counted here, or learned (or never to be) already
        stage = self._stages.get(slot) if fast.mode != MODE_ALL else None
        if stage is False or len(self._hot) >= MAX_HOT:
            pending.learned = True  # reduced at once (too large to stage), or no room
            return
        learnable = _learnable(args, kwargs)
        if not learnable:  # never (off the CPU), or a tensor subclass this time: later
            pending.learned = learnable is None
            return
        by_name = fast.source.__class__ is str
        hot = HotCall(fast.source, by_name, stage or None, pending, (fast.rows, fast.cols))
        self._hot[hot_key(args, kwargs)] = hot
        pending.learned = True

    def take(self, args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> tuple[int, int] | None:
        """The hot path: counts a training call whose structure was learned (its tokens, its
        micro-batch) and returns its ``(rows, cols)``; ``None`` (nothing counted) otherwise,
        or when the call could not be taken (the hot paths are then relearned from the plans).
        Anything that may raise comes before the counts change."""
        try:
            hot = self._hot.get(hot_key(args, kwargs))
            if hot is None:
                return None
            if hot.stage is not None:
                self.staged.stage(hot.stage, kwargs[hot.place] if hot.by_name else args[hot.place])
        except Exception:  # nothing counted: the caller reads the call in full
            self.forget()
            return None
        hot.pending.hits += 1
        self._counters.micro_batches += 1
        return hot.shape

    def forget(self) -> None:
        """Drops the hot paths (a new census, or restored counts): relearned from the plans."""
        self._hot.clear()
        for pending in self._pending.values():
            pending.learned = False

    def settle(self, counts: list[int]) -> None:
        """Adds what the pending calls' shapes say into ``counts`` (``SLOT_*`` order) and the
        shape counts: before a read."""
        shapes = self._shapes
        for p in self._pending.values():
            hits = p.hits
            if not hits:
                continue
            p.hits = 0
            seen = hits * p.rows * p.cols
            counts[SLOT_TOKENS_SEEN] += seen
            shapes.seen_sq += seen * p.cols
            if p.all_real:  # every token real: the counts are the shape's
                counts[SLOT_TOKENS] += seen
                counts[SLOT_SEQUENCES] += hits * p.rows
                counts[SLOT_SUM_SQ_LEN] += seen * p.cols
            shapes.add(p.units, hits)
