"""A run's counters: token statistics on the device, steps and the clock, and resume state.

:class:`RunCounters` is the only state that grows while training runs. Per training micro-batch
it adds into a small device buffer (no host sync); the buffers are read once per
:meth:`RunCounters.snapshot`, which is made at report time (and, under torch.distributed, summed
over ranks in one collective, the shape keys merged in a second).

Beside the text tokens (:mod:`flopmeter.tokens.stats`), :meth:`RunCounters.add_call` counts what a
call's other inputs say (:func:`flopmeter.counting.inputs.read_call`) into :mod:`flopmeter.counting.call_counts`:
the decoder's non-padding tokens and cross pairs (on the device), and from the shapes (host
integers) the items, the micro-batches not all text, the modality, the shape keys and the padded
squared lengths; for calls without text tokens, their patches, frames or items are the tokens.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch

from flopmeter import distributed
from flopmeter.counting.call_counts import (
    MODALITIES,
    DecoderCounts,
    ShapeCounts,
    merge_input_shapes,
)
from flopmeter.counting.inputs import CallInputs
from flopmeter.counting.planned import PlannedCalls
from flopmeter.counting.saved_state import STATE_FORMAT, RestoredCompute, check_state
from flopmeter.tokens.batch import (
    SLOT_SEQUENCES,
    SLOT_SUM_SQ_LEN,
    SLOT_TOKENS,
    SLOT_TOKENS_SEEN,
    TokenInputs,
    new_buffer,
    shape_stats,
)
from flopmeter.tokens.stats import accumulate_token_stats
from flopmeter.types import CountsScope, TokenTotals

__all__ = ["CountSnapshot", "RunCounters"]

_SLOTS = (SLOT_TOKENS, SLOT_TOKENS_SEEN, SLOT_SEQUENCES, SLOT_SUM_SQ_LEN)
#: Why a micro-batch on the ``meta`` device is unread although its shapes are counted.
META_REASON = (
    "its tokens are on the meta device, which holds no values: they are counted from the "
    "shapes only, every position a real token and every row one sequence (an upper bound, "
    "padding included). The estimates are the cost of those shapes, for planning; a run on "
    "meta tensors trains nothing, so it gets no verdict"
)
#: Why a micro-batch whose inputs hold nothing to count is unread (not counted as no tokens).
NO_COUNT_REASON = (
    "its token inputs hold no ids and no [T] or [B, T] attention_mask to count the tokens by"
)


@dataclass(frozen=True)
class CountSnapshot:
    """The counts of a run at one moment (restored counts included).

    Attributes:
        totals: Token statistics.
        optimizer_steps: Optimizer steps (the largest of any rank when summed).
        seconds: Training time, seconds, including the time before a resume.
        session_seconds: Training time of this process's session only, seconds.
        scope: ``all_ranks`` when the counts cover the run, ``this_rank`` otherwise.
        partial: The counts are this rank's only although the run had several ranks.
        untracked_forwards: Forward passes without gradients or in evaluation mode.
        resumed: Counts were restored with ``load_state_dict``.
        unread: Training micro-batches whose tokens were not found or read (uncounted; on meta,
            counted from their shapes as an upper bound).
        inconsistent: Training micro-batches with inconsistent inputs.
        unread_reason: Why the first unread micro-batch (on this rank) was not read.
        inconsistent_reason: What the first inconsistent micro-batch (on this rank) had wrong;
            ``None`` when only the device found it (document offsets).
        restored: What the restored counts' checkpoint says of their compute (None: none).
        uncounted_steps: Optimizer steps trained before a resume from a checkpoint without meter
            counts (0: none); the counts do not cover them.
        modality_micro_batches: Counted training micro-batches per modality (the run's "tokens":
            :data:`flopmeter.counting.work_units.Modality`), restored included; only those with some.
    """

    totals: TokenTotals
    optimizer_steps: int
    seconds: float
    session_seconds: float
    scope: CountsScope
    partial: bool
    untracked_forwards: int
    resumed: bool
    unread: int = 0
    inconsistent: int = 0
    unread_reason: str | None = None
    inconsistent_reason: str | None = None
    restored: RestoredCompute | None = None
    uncounted_steps: int = 0
    modality_micro_batches: Mapping[str, int] | None = None

    @property
    def session_micro_batches(self) -> int:
        """Training micro-batches counted in this session (the restored ones left out)."""
        before = self.restored.micro_batches if self.restored is not None else 0
        return self.totals.micro_batches - before


class RunCounters:
    """Token statistics, micro-batches, optimizer steps, training time and restored counts."""

    def __init__(self) -> None:
        self._buffers: dict[torch.device, tuple[torch.Tensor, torch.Tensor]] = {}
        self._decoder = DecoderCounts()
        # from shapes (host): micro-batches on meta, and the tokens of calls without text
        self._shape_counts = [0] * len(_SLOTS)
        self._shapes = ShapeCounts()  # items, modalities, shape keys
        #: Planned text calls on CPU tensors: staged tokens, pending shapes, the hot path.
        self.planned = PlannedCalls(self._shapes, self)
        self.micro_batches = 0
        self.optimizer_steps = 0
        self.untracked_forwards = 0
        self.unread = 0
        self.inconsistent = 0  # found on the host; the device's are in the buffers
        self.unread_reason: str | None = None
        self.inconsistent_reason: str | None = None
        self.world_at_first_batch: int | None = None
        self.peer_copy = False  # a tensor-parallel peer's copy: left out of the sums over ranks
        self._t0: float | None = None
        self._stopped_seconds = 0.0
        self._prior = TokenTotals()
        self._prior_modalities = dict.fromkeys(MODALITIES, 0)
        self._prior_steps = 0
        self._prior_seconds = 0.0
        self._prior_unread = 0
        self._prior_inconsistent = 0
        self._restored: RestoredCompute | None = None
        #: Optimizer steps trained before a resume whose checkpoint held no counts.
        self.uncounted_steps = 0

    # ----------------------------------------------------------------- hot path
    def add_micro_batch(self, inputs: TokenInputs, pad_id: int | None) -> tuple[int, int]:
        """Counts one training micro-batch; device work only (no host read).

        ``inputs.ref`` must not be ``None`` (the caller tells an unreadable batch apart).
        Tokens on the ``meta`` device hold no values: they are counted from their shapes (an
        upper bound, see :func:`flopmeter.tokens.stats.shape_stats`) and the micro-batch is also
        recorded as unread (:data:`META_REASON`), so the run gets estimates but no verdict.
        Inputs with nothing to count (no ids, no ``[T]`` or ``[B, T]`` mask) are recorded as
        unread (:data:`NO_COUNT_REASON`), never as a batch of no tokens.

        Returns:
            ``(rows, cols)``: the batch's shape as counted (host integers; what the budget
            guard bounds a step by), ``(0, 0)`` when nothing was counted.
        """
        return self._add_tokens(inputs, pad_id) or (0, 0)

    def _add_tokens(self, inputs: TokenInputs, pad_id: int | None) -> tuple[int, int] | None:
        """:meth:`add_micro_batch`, ``None`` when nothing was counted (recorded as unread)."""
        ref = inputs.ref
        assert ref is not None
        if ref.device.type == "meta":
            counts = shape_stats(inputs, pad_id)
            for i, slot in enumerate(_SLOTS):
                self._shape_counts[i] += counts[slot]
            self.add_uncounted("unread", META_REASON)
            rows = counts[SLOT_SEQUENCES]
            self._shapes.seen_sq += counts[SLOT_SUM_SQ_LEN]  # every position a token: padded
            return rows, (counts[SLOT_TOKENS_SEEN] // rows if rows else 0)
        buffers = self._buffers.get(ref.device)
        if buffers is None:
            # the counts, and the micro-batches the device found inconsistent (0-d)
            buffers = new_buffer(ref.device), torch.zeros((), dtype=torch.int64, device=ref.device)
            self._buffers[ref.device] = buffers
        shape = accumulate_token_stats(buffers[0], inputs, pad_id=pad_id, inconsistent=buffers[1])
        if shape is None:
            self.add_uncounted("unread", NO_COUNT_REASON)
        else:
            self._shapes.seen_sq += shape[0] * shape[1] ** 2  # the padded squared lengths (host)
        return shape

    def add_call(self, call: CallInputs, pad_id: int | None) -> tuple[int, int]:
        """Counts one training call from what :func:`flopmeter.counting.inputs.read_call` read of it;
        device work and host integers from shapes only (no host read).

        Its text tokens as :meth:`add_micro_batch` does; a call without text tokens adds its
        patches, frames or items (``call.item_length`` per item) as the run's tokens, each item
        one sequence. Its decoder stream adds its non-padding decoder tokens (by
        ``decoder_attention_mask``, else labels that are not ``-100``, else every position),
        their squared lengths and the cross pairs, on the device. Every counted call adds its
        items, shape key (at most :data:`MAX_INPUT_SHAPES`, the rest dropped) and modality. A
        call whose modality is not the run's (the first's) is unread: another unit.

        Returns:
            ``(rows, cols)``: the call's tokens as a shape (what the budget guard bounds a step
            by), ``(0, 0)`` when nothing was counted.
        """
        units = call.units
        unlike = self._shapes.unlike_reason(units)
        if unlike is not None:
            self.add_uncounted("unread", unlike)
            return 0, 0
        meta = call.ref.device.type == "meta"
        if call.tokens.ref is not None:
            shape = self._add_tokens(call.tokens, pad_id)
            if shape is None:
                return 0, 0
        else:
            n = units.items * call.item_length
            for slot, value in (
                (SLOT_TOKENS, n),
                (SLOT_TOKENS_SEEN, n),
                (SLOT_SEQUENCES, units.items if call.item_length else 0),
                (SLOT_SUM_SQ_LEN, n * call.item_length),
            ):
                self._shape_counts[_SLOTS.index(slot)] += value
            if meta:
                self.add_uncounted("unread", META_REASON)
            shape = units.items, call.item_length
            self._shapes.seen_sq += n * call.item_length
        if call.decoder is not None:
            self._decoder.add(call.decoder, units.cross_pairs, pad_id, meta)
        self._shapes.add(units)
        return shape

    def add_uncounted(self, kind: str, reason: str) -> None:
        """Records a training micro-batch that could not be counted (``kind``: ``"unread"`` or
        ``"inconsistent"``), keeping the first reason of each kind."""
        if kind == "inconsistent":
            self.inconsistent += 1
            self.inconsistent_reason = self.inconsistent_reason or reason
        else:
            self.unread += 1
            self.unread_reason = self.unread_reason or reason

    # ----------------------------------------------------------------- clock
    def start_clock(self) -> None:
        """Starts (or continues) the training clock."""
        self._t0 = time.monotonic()

    def stop_clock(self) -> None:
        """Stops the training clock, keeping the time so far."""
        if self._t0 is not None:
            self._stopped_seconds += time.monotonic() - self._t0
        self._t0 = None

    def session_seconds(self) -> float:
        """Training time in this process so far, seconds."""
        running = time.monotonic() - self._t0 if self._t0 is not None else 0.0
        return self._stopped_seconds + running

    def elapsed_seconds(self) -> float:
        """Training time so far on this rank, seconds, including time before a resume."""
        return self._prior_seconds + self.session_seconds()

    # ----------------------------------------------------------------- reading
    def _local_counts(self) -> list[int]:
        self.planned.settle(self._shape_counts)
        stats = list(self._shape_counts)
        # planned CPU calls' tokens (a host read of CPU tensors)
        staged = self.planned.staged.totals()
        for slot, value in zip((SLOT_TOKENS, SLOT_SEQUENCES, SLOT_SUM_SQ_LEN), staged, strict=True):
            stats[_SLOTS.index(slot)] += value
        inconsistent = self.inconsistent
        for counts, found in self._buffers.values():
            # the one host read, at report time (both in one copy)
            values = torch.cat((counts, found.reshape(1))).tolist()
            for i, slot in enumerate(_SLOTS):
                stats[i] += int(values[slot])
            inconsistent += int(values[-1])
        # then [decoder tokens, ^2, cross pairs], [items, non_text, dropped, *modalities]
        local = [inconsistent, self.micro_batches, self.unread, *self._decoder.local()]
        return [*stats, *local, *self._shapes.local()]

    def snapshot(self, *, sync: bool) -> CountSnapshot:
        """The counts so far, restored ones included.

        Args:
            sync: Under torch.distributed, sum the counts over ranks (one collective; every
                rank must call it; a ``peer_copy`` rank adds nothing), and merge the shape keys
                by key (a second one). Steps and seconds are the largest of any rank (every
                rank steps together; the slowest rank's time is the run's).
        """
        sums = self._local_counts()
        seconds = self.elapsed_seconds()
        steps = self.optimizer_steps
        ranks_at_start = self.world_at_first_batch or 1
        scope: CountsScope = "this_rank"
        shapes: list[dict[str, list[int]]] = [self._shapes.input_shapes]
        if sync and distributed.is_distributed():  # seconds as microseconds (int64)
            copy = self.peer_copy
            sums, (steps, micros) = distributed.all_reduce_counts(
                [0] * len(sums) if copy else sums, [steps, round(seconds * 1e6)]
            )
            shapes = distributed.all_gather_objects({} if copy else self._shapes.input_shapes)
            seconds = micros / 1e6
            scope = "all_ranks"
        elif distributed.world_size() == 1 and ranks_at_start == 1:
            scope = "all_ranks"
        tokens, seen, sequences, sum_sq, inconsistent, micro, unread = sums[:7]
        dec_tokens, dec_sq, cross, items, non_text, dropped, seen_sq = sums[7:14]
        modalities = sums[14:]
        p = self._prior
        seen_sq_before = p.sum_sq_seq_len_seen  # None: a restored state did not keep it
        prior_shapes = {c.key: [c.micro_batches, c.items] for c in p.input_shapes}
        input_shapes, dropped = merge_input_shapes(
            [prior_shapes, *shapes], p.input_shapes_dropped + dropped
        )
        by_modality = {
            m: self._prior_modalities[m] + n for m, n in zip(MODALITIES, modalities, strict=True)
        }
        return CountSnapshot(
            totals=TokenTotals(
                tokens_processed=p.tokens_processed + tokens,
                tokens_seen=p.tokens_seen + seen,
                sequences=p.sequences + sequences,
                sum_sq_seq_len=p.sum_sq_seq_len + sum_sq,
                sum_sq_seq_len_seen=None if seen_sq_before is None else seen_sq_before + seen_sq,
                micro_batches=p.micro_batches + micro,
                decoder_tokens=p.decoder_tokens + dec_tokens,
                decoder_sum_sq_len=p.decoder_sum_sq_len + dec_sq,
                cross_pairs=p.cross_pairs + cross,
                items=p.items + items,
                non_text_micro_batches=p.non_text_micro_batches + non_text,
                input_shapes=input_shapes,
                input_shapes_dropped=dropped,
            ),
            optimizer_steps=self._prior_steps + steps,
            seconds=seconds,
            session_seconds=self.session_seconds(),
            scope=scope,
            partial=scope == "this_rank" and ranks_at_start > 1,
            untracked_forwards=self.untracked_forwards,
            resumed=bool(p.micro_batches or self._prior_steps),
            unread=self._prior_unread + unread,
            inconsistent=self._prior_inconsistent + inconsistent,
            unread_reason=self.unread_reason,
            inconsistent_reason=self.inconsistent_reason,
            restored=self._restored,
            uncounted_steps=self.uncounted_steps,
            modality_micro_batches={m: n for m, n in by_modality.items() if n},
        )

    # ----------------------------------------------------------------- resume
    @property
    def resumed(self) -> bool:
        """Whether counts were restored with :meth:`load_state_dict` (a resumed run)."""
        return bool(self._prior.micro_batches or self._prior_steps)

    @property
    def prior_seconds(self) -> float:
        """Training time restored from a checkpoint, seconds (0 for a fresh run)."""
        return self._prior_seconds

    def state_dict(
        self, extra: Mapping[str, Any], *, snapshot: CountSnapshot | None = None
    ) -> dict[str, Any]:
        """The cumulative counts summed over ranks (a collective under torch.distributed),
        with ``extra`` (the run's ``started_at`` and the model's identity); from ``snapshot``
        when given (taken with ``sync=True``), so the caller's one collective serves both."""
        snap = snapshot or self.snapshot(sync=True)
        return {
            "format": STATE_FORMAT,
            **snap.totals.model_dump(),
            "optimizer_steps": snap.optimizer_steps,
            "training_duration_seconds": snap.seconds,
            "micro_batches_unread": snap.unread,
            "micro_batches_inconsistent": snap.inconsistent,
            "uncounted_steps": snap.uncounted_steps,
            "modality_micro_batches": dict(snap.modality_micro_batches or {}),
            **extra,
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Adds a saved run's counts once to what is counted from now on (checked first: see
        :func:`check_state`)."""
        checked = check_state(state)
        self.planned.forget()  # the run's modality may change: hot paths are relearned
        self._prior = TokenTotals(**{k: checked[k] for k in TokenTotals.model_fields})
        self._prior_modalities = {
            m: checked["modality_micro_batches"].get(m, 0) for m in MODALITIES
        }
        # the run's tokens stay the unit they were before the resume
        self._shapes.run_modality = next((m for m in MODALITIES if self._prior_modalities[m]), None)
        self._prior_steps = checked["optimizer_steps"]
        self._prior_seconds = checked["training_duration_seconds"]
        self._prior_unread = checked["micro_batches_unread"]
        self._prior_inconsistent = checked["micro_batches_inconsistent"]
        self.uncounted_steps = checked["uncounted_steps"]
        self._restored = RestoredCompute(
            run_id=checked["run_id"],
            flops=checked["primary_flops_saved"],
            estimate=checked["primary_estimate_saved"],
            sessions=checked["sessions_flops_saved"],
            micro_batches=checked["micro_batches"],
            tokens_processed=checked["tokens_processed"],
        )
