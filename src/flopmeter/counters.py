"""A run's counters: token statistics on the device, steps and the clock, and resume state.

:class:`RunCounters` is the only state that grows while training runs. Per training micro-batch
it adds into a small device buffer (no host sync); the buffers are read once per
:meth:`RunCounters.snapshot`, which is made at report time (and, under torch.distributed, summed
over ranks in one collective).
"""

from __future__ import annotations

import math
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch

from flopmeter import distributed
from flopmeter.errors import ConfigurationError
from flopmeter.tokens import (
    SLOT_SEQUENCES,
    SLOT_SUM_SQ_LEN,
    SLOT_TOKENS,
    SLOT_TOKENS_SEEN,
    TokenInputs,
    accumulate_token_stats,
    new_buffer,
)
from flopmeter.types import CountsScope, TokenTotals

__all__ = ["STATE_FORMAT", "CountSnapshot", "RunCounters"]

#: The ``format`` of :meth:`RunCounters.state_dict` (and so of ``FlopMeter.state_dict``).
STATE_FORMAT = "flopmeter.meter/1"
_SLOTS = (SLOT_TOKENS, SLOT_TOKENS_SEEN, SLOT_SEQUENCES, SLOT_SUM_SQ_LEN)


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
    """

    totals: TokenTotals
    optimizer_steps: int
    seconds: float
    session_seconds: float
    scope: CountsScope
    partial: bool
    untracked_forwards: int
    resumed: bool


class RunCounters:
    """Token statistics, micro-batches, optimizer steps, training time and restored counts."""

    def __init__(self) -> None:
        self._buffers: dict[torch.device, torch.Tensor] = {}
        self.micro_batches = 0
        self.optimizer_steps = 0
        self.untracked_forwards = 0
        self.world_at_first_batch: int | None = None
        self._t0: float | None = None
        self._stopped_seconds = 0.0
        self._prior = TokenTotals()
        self._prior_steps = 0
        self._prior_seconds = 0.0

    # ----------------------------------------------------------------- hot path
    def add_micro_batch(self, inputs: TokenInputs, pad_id: int | None) -> None:
        """Counts one training micro-batch; device work only (no host read).

        ``inputs.ref`` must not be ``None`` (the caller tells an unreadable batch apart).
        """
        ref = inputs.ref
        assert ref is not None
        buffer = self._buffers.get(ref.device)
        if buffer is None:
            buffer = self._buffers[ref.device] = new_buffer(ref.device)
        accumulate_token_stats(buffer, inputs, pad_id=pad_id)

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
        stats = [0, 0, 0, 0]
        for buffer in self._buffers.values():
            values = buffer.tolist()  # the one host read, at report time
            for i, slot in enumerate(_SLOTS):
                stats[i] += int(values[slot])
        return [*stats, self.micro_batches]

    def snapshot(self, *, sync: bool) -> CountSnapshot:
        """The counts so far, restored ones included.

        Args:
            sync: Under torch.distributed, sum the counts over ranks (one collective; every
                rank must call it). Steps and seconds are the largest of any rank (every rank
                steps together; the slowest rank's time is the run's).
        """
        sums = self._local_counts()
        seconds = self.elapsed_seconds()
        steps = self.optimizer_steps
        ranks_at_start = self.world_at_first_batch or 1
        scope: CountsScope = "this_rank"
        if sync and distributed.is_distributed():
            # Seconds travel as whole microseconds in the int64 collective.
            sums, (steps, micros) = distributed.all_reduce_counts(
                sums, [steps, round(seconds * 1e6)]
            )
            seconds = micros / 1e6
            scope = "all_ranks"
        elif distributed.world_size() == 1 and ranks_at_start == 1:
            scope = "all_ranks"
        tokens, seen, sequences, sum_sq, micro = sums
        p = self._prior
        return CountSnapshot(
            totals=TokenTotals(
                tokens_processed=p.tokens_processed + tokens,
                tokens_seen=p.tokens_seen + seen,
                sequences=p.sequences + sequences,
                sum_sq_seq_len=p.sum_sq_seq_len + sum_sq,
                micro_batches=p.micro_batches + micro,
            ),
            optimizer_steps=self._prior_steps + steps,
            seconds=seconds,
            session_seconds=self.session_seconds(),
            scope=scope,
            partial=scope == "this_rank" and ranks_at_start > 1,
            untracked_forwards=self.untracked_forwards,
            resumed=bool(p.micro_batches or self._prior_steps),
        )

    # ----------------------------------------------------------------- resume
    @property
    def prior_seconds(self) -> float:
        """Training time restored from a checkpoint, seconds (0 for a fresh run)."""
        return self._prior_seconds

    def state_dict(self, started_at: str | None) -> dict[str, Any]:
        """The cumulative counts summed over ranks (a collective under torch.distributed)."""
        snap = self.snapshot(sync=True)
        return {
            "format": STATE_FORMAT,
            **snap.totals.model_dump(),
            "optimizer_steps": snap.optimizer_steps,
            "training_duration_seconds": snap.seconds,
            "started_at": started_at,
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> str | None:
        """Adds a saved run's counts once to what is counted from now on.

        Returns:
            The saved run's ``started_at``.

        Raises:
            ConfigurationError: ``state`` is not a flopmeter state or is incomplete.
        """
        if not isinstance(state, Mapping) or state.get("format") != STATE_FORMAT:
            raise ConfigurationError(f"Not a FlopMeter state (expected format {STATE_FORMAT!r}).")
        try:
            prior = TokenTotals(**{k: int(state[k]) for k in TokenTotals.model_fields})
            prior_steps = int(state["optimizer_steps"])
            seconds = float(state["training_duration_seconds"])
        except (KeyError, TypeError, ValueError) as exc:
            raise ConfigurationError(f"Incomplete FlopMeter state: {exc}") from None
        if not math.isfinite(seconds) or seconds < 0:
            raise ConfigurationError("FlopMeter state has an invalid training duration.")
        self._prior, self._prior_steps, self._prior_seconds = prior, prior_steps, seconds
        return state.get("started_at")
