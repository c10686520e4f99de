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
#: The plain values a call may hold beside its tensors (as :func:`~flopmeter.counting.call_plan.
#: call_key` keys them: by their type).
_SCALARS = frozenset({bool, int, float, str, type(None)})
#: Hot paths kept at most (as many as the call plans: :data:`~flopmeter.counting.call_plan.
#: MAX_PLANS`).
MAX_HOT = 1024


def hot_key(args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> tuple[Any, ...]:
    """The call's structure as the hot path keys it: per positional argument and keyword, a
    plain tensor's shape, dtype and device, or any other value's class (a key with another
    class than a plain tensor or a scalar's is never learned: such calls are not hot)."""
    if args:
        return (
            *[
                (v.shape, v.dtype, v.device) if v.__class__ is _Tensor else v.__class__
                for v in args
            ],
            *[
                (k, v.shape, v.dtype, v.device) if v.__class__ is _Tensor else (k, v.__class__)
                for k, v in kwargs.items()
            ],
        )
    return tuple(
        [
            (k, v.shape, v.dtype, v.device) if v.__class__ is _Tensor else (k, v.__class__)
            for k, v in kwargs.items()
        ]
    )


def _plain(args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> bool:
    """Whether every value of the call is a plain tensor or a scalar (its hot key is exact)."""
    return all(v.__class__ is _Tensor or v.__class__ in _SCALARS for v in (*args, *kwargs.values()))


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
        if not _plain(args, kwargs):  # a tensor subclass this time: tried again later
            return
        by_name = fast.source.__class__ is str
        hot = HotCall(fast.source, by_name, stage or None, pending, (fast.rows, fast.cols))
        self._hot[hot_key(args, kwargs)] = hot
        pending.learned = True

    def take(self, args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> tuple[int, int] | None:
        """The hot path: counts a training call whose structure was learned (its tokens, its
        micro-batch) and returns its ``(rows, cols)``; ``None`` (nothing counted) otherwise.
        Anything that may raise comes before the counts change."""
        hot = self._hot.get(hot_key(args, kwargs))
        if hot is None:
            return None
        if hot.stage is not None:
            self.staged.stage(hot.stage, kwargs[hot.place] if hot.by_name else args[hot.place])
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
