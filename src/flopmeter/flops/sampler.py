"""The sampler: runs a counting mode over chosen training micro-batches, forward and backward.

A few training micro-batches (by default the first two, then one in every 1024) run forward and
backward under a :class:`~flopmeter.flops.counter.SampleCounter`; each complete one becomes a
:class:`~flopmeter.flops.scaling.MeasuredSample`, which :func:`~flopmeter.flops.scaling.
measured_estimate` scales to the run. A micro-batch whose inputs are not all text and whose
shape key no sample covers yet is sampled whatever the rate (forced, at most
:data:`MAX_FORCED_SAMPLES` per run), so that per-item scaling covers the run's keys.
Micro-batches that are not sampled cost nothing extra: no mode, no hook, no host sync. A
sampled micro-batch of a compiled model runs through its eager module
(:mod:`flopmeter.flops.eager_runs`: torch.compile's stance forced to eager over that micro-batch,
set one micro-batch ahead when the meter's hook runs inside the compiled call).
"""

from __future__ import annotations

import functools
import logging
import math
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from flopmeter import internals
from flopmeter.counting.work_units import ShapeUnits
from flopmeter.flops.counter import SampleCounter
from flopmeter.flops.eager_runs import EagerRuns
from flopmeter.flops.scaling import MeasuredSample
from flopmeter.flops.window import MicroBatchWindow, Outputs

logger = logging.getLogger("flopmeter")

__all__ = ["MAX_FORCED_SAMPLES", "MeasuredSampler"]

#: Samples a run forces, whatever its rate, of micro-batches whose inputs are not all text and
#: whose shape key no sample covers yet (so that per-item scaling covers every key); beyond
#: these, an unsampled key makes per-item scaling unsound (``flopmeter.flops.scaling``).
MAX_FORCED_SAMPLES = 8


class _Sample:
    """One open sample: its counter, its observation window, the micro-batches it spans
    (tokens, tokens^2, sequences)."""

    window: MicroBatchWindow
    eager = False  # it ran eagerly in place of compiled code

    def __init__(self, counter: SampleCounter, thread: int, micro_batch: int = 0) -> None:
        self.counter = counter
        self.thread = thread
        self.micro_batch = micro_batch  # the last micro-batch it spans, 1-based
        self.forwards = 0
        self.tokens = 0
        self.sum_sq = 0
        self.sequences = 0
        self.units: list[ShapeUnits] = []
        self.unitless = 0  # forward calls that came without units (counted as text)
        #: Earlier training forwards whose backward is not known to have run (-1: unknown).
        self.outside = -1

    def add_batch(self, ref: torch.Tensor, units: ShapeUnits | None = None) -> None:
        rows = 1 if ref.dim() == 1 else math.prod(ref.shape[:-1])
        cols = ref.shape[-1]
        self.forwards += 1
        if units is not None:
            self.units.append(units)
        else:
            self.unitless += 1
        self.tokens += rows * cols
        self.sum_sq += rows * cols * cols
        self.sequences += rows

    def unit_fields(self) -> dict[str, Any]:
        """The :class:`MeasuredSample` fields read from the calls' units: a call without units
        is text, and keys and items are known only when every call had units."""
        units = self.units
        text = all(u.text for u in units)
        if self.unitless or not units:
            return {"text": text}
        return {
            "text": text,
            "keys": tuple(dict.fromkeys(u.key for u in units)),
            "items": sum(u.items for u in units),
            "decoder_tokens": sum(u.decoder_tokens for u in units),
            "decoder_sum_sq_len": sum(u.decoder_sum_sq_len for u in units),
            "cross_pairs": sum(u.cross_pairs for u in units),
        }


@dataclass
class MeasuredSampler:
    """Runs :class:`FlopCounterMode` over chosen training micro-batches, forward and backward.

    The meter calls :meth:`due` on every training micro-batch (an integer test) and the other
    methods only around sampled ones. A sample opens in the model's forward pre-hook (only when
    no other dispatch mode is active) and closes when the backward pass that starts from the
    model's outputs ends (its :class:`~flopmeter.flops.window.MicroBatchWindow` sees that), or
    at the optimizer step. Further training forward passes before that backward (gradient
    accumulation over several forwards) join the sample; when the forward returned no tensor
    (``None``: the loss kept elsewhere), the next training forward pass (or the meter's stop)
    closes it instead, kept when work ran after the forward. Closing stops the count; the mode
    leaves the dispatch stack later, on the thread that entered it and only from the top, at the
    next training forward pass, the optimizer step or the meter's stop, so it never leaks onto
    the caller's stack. A sample is dropped when its forward pass raised (told apart from one
    that returned ``None``), when its outputs hold tensors but none needs a gradient, or when
    its backward pass did more than twice its forward pass's work while training forward
    passes before it had had no backward (counted: :attr:`settled_through`), which its backward
    may then hold; with none pending, a long backward is the sample's own and kept.

    Args:
        every: Sample micro-batch 1, 2, and every ``every``-th after; ``0`` turns sampling off.
        max_samples: Stop sampling after this many complete samples.
    """

    every: int
    max_samples: int = 64
    samples: list[MeasuredSample] = field(default_factory=list)
    unknown_ops: set[str] = field(default_factory=set)
    skipped: dict[str, int] = field(default_factory=dict)
    #: Shape keys a kept sample of that one key covers.
    sampled_keys: set[str] = field(default_factory=set)
    #: Samples begun because their micro-batch was forced (:data:`MAX_FORCED_SAMPLES`).
    forced_samples: int = 0
    #: Micro-batches that would have been forced past :data:`MAX_FORCED_SAMPLES`.
    unforced: int = 0
    #: Training micro-batches through which every forward pass's backward is known to have
    #: run (:meth:`settled`): a sample opening at the next has no forward outside it pending.
    settled_through: int = 0
    #: Kept samples whose backward did more than twice their forward's work, none pending.
    long_backwards: int = 0
    _open: _Sample | None = None
    #: Windows of settled samples, whose hooks leave the model at the next call (after a
    #: forward pass that raised, torch still iterates them).
    _stale: list[MicroBatchWindow] = field(default_factory=list)
    #: A compiled model's sampled micro-batches, run eagerly.
    eager: EagerRuns = field(default_factory=EagerRuns)

    #: Most forward passes one sample may span before it is dropped.
    MAX_FORWARDS = 16

    def __post_init__(self) -> None:
        self.eager.settle = self._settle_finished

    @property
    def active(self) -> bool:
        """Whether a sample is open (counting, or closed but not yet off the stack)."""
        return self._open is not None

    @property
    def collecting(self) -> bool:
        """Whether a sample is open, counting, and waiting for its backward pass."""
        sample = self._open
        return sample is not None and not sample.counter.closed and not sample.window.backward_seen

    def needs(self, micro_batch: int, units: ShapeUnits | None = None) -> bool:
        """Whether :meth:`on_training_forward` must see micro-batch ``micro_batch``: a sample is
        open or due, the stance is forced, or the next micro-batch is scheduled (a compiled
        call's is set to run eagerly one micro-batch ahead)."""
        return (
            self.active
            or self.eager.forced
            or self.scheduled(micro_batch + 1)
            or self.due(micro_batch, units)  # last: it counts what it turns down, once
        )

    def due(self, micro_batch: int, units: ShapeUnits | None = None) -> bool:
        """Whether training micro-batch number ``micro_batch`` (1-based) should be sampled: at
        the rate, or forced (:meth:`forces`). Counts the micro-batches :meth:`forces` turns
        down for the limit (:attr:`unforced`)."""
        if self.eager.owed or self.scheduled(micro_batch) or self.forces(units):
            return True
        if self._uncovered(units):
            self.unforced += 1
        return False

    def scheduled(self, micro_batch: int) -> bool:
        """Whether micro-batch ``micro_batch`` (1-based) is sampled at the rate: 1, 2 and every
        ``every``-th, up to ``max_samples``."""
        if self.every <= 0 or len(self.samples) >= self.max_samples:
            return False
        return micro_batch <= 2 or micro_batch % self.every == 0

    def forces(self, units: ShapeUnits | None) -> bool:
        """Whether a micro-batch of these units is sampled whatever the rate: its inputs are
        not all text (``units.text`` false), no kept sample covers its shape key yet, and fewer
        than :data:`MAX_FORCED_SAMPLES` were forced. A set lookup, for non-text units only."""
        return self._uncovered(units) and self.forced_samples < MAX_FORCED_SAMPLES

    def _uncovered(self, units: ShapeUnits | None) -> bool:
        """Whether these units are not all text and no kept sample covers their key."""
        return units is not None and not units.text and units.key not in self.sampled_keys

    def _skip(self, why: str) -> None:
        self.skipped[why] = self.skipped.get(why, 0) + 1

    def on_training_forward(
        self,
        model: torch.nn.Module,
        ref: torch.Tensor,
        micro_batch: int,
        units: ShapeUnits | None = None,
    ) -> None:
        """The meter's forward pre-hook, for a training micro-batch (after its tokens counted).

        Args:
            model: The model (its outputs show where the backward pass ends).
            ref: The micro-batch's ``input_ids`` or ``attention_mask`` (its shape is read).
            micro_batch: The micro-batch's number, 1-based.
            units: What the call's input shapes say (kept with the sample).
        """
        self._remove_stale()
        if self._open is not None:
            if self._open.window.blind and self.collecting:
                self._close_unseen("no backward pass seen before the next forward pass")
            elif self.collecting and self._open.forwards < self.MAX_FORWARDS:
                self._open.add_batch(ref, units)  # several forwards before one backward: one sample
                self._open.micro_batch = micro_batch
                self._open.window.watch_forward()
                return
            elif self.collecting:
                self._close(keep=False, why="spanned too many forward passes")
            self.settle()
        if self._open is None and self.due(micro_batch, units):
            if not self.scheduled(micro_batch) and self.forces(units):
                self.forced_samples += 1  # forced: counted whether it is kept or skipped
            self._begin(model, ref, micro_batch, units)
        if self._open is None:
            self.eager.release(before=micro_batch)  # forced for a call that is not sampled
            if not self.eager.forced and self.scheduled(micro_batch + 1):
                self.eager.prepare_next(micro_batch)

    def _begin(
        self,
        model: torch.nn.Module,
        ref: torch.Tensor,
        micro_batch: int = 0,
        units: ShapeUnits | None = None,
    ) -> None:
        if getattr(torch.compiler, "is_compiling", lambda: False)():
            self._skip("compiling")
            return
        if self.eager.pending is None and not internals.dispatch_stack_empty():
            self._skip("another dispatch mode was active")
            return
        counter = self.eager.counter_for(model, micro_batch)
        if not isinstance(counter, SampleCounter):
            if counter is not None:
                self._skip(counter)
            return
        sample = _Sample(counter, threading.get_ident(), micro_batch)
        sample.eager = self.eager.forced
        sample.window = MicroBatchWindow(
            model,
            on_return=self._guarded(functools.partial(self._on_return, sample)),
            on_raise=self._guarded(self._on_raise),
            on_backward_start=functools.partial(self._on_backward_start, sample),
            on_backward_end=self._on_backward_end,
        )
        if micro_batch > 0:
            sample.outside = max(0, micro_batch - 1 - self.settled_through)
        sample.add_batch(ref, units)
        self._open = sample
        sample.window.watch_forward()

    # -- the window's events: they come only while the window is open (its sample is _open) --
    def _guarded(self, event: Callable[..., None]) -> Callable[..., None]:
        """Wraps a window event so that an error in it drops the sample, never reaching
        training."""

        def run(*args: Any) -> None:
            try:
                event(*args)
            except Exception as exc:  # the meter never breaks training
                logger.warning("flopmeter (measured): %s; sample dropped", exc)
                self._close(keep=False, why="error in the sampler")

        return run

    def _settle_finished(self) -> bool:
        """Takes a finished sample's mode off the stack (the relay hook, outside compiled code);
        returns whether a sample is still open."""
        if self._open is not None and self._open.counter.closed:
            self.settle()
        return self._open is not None

    def _on_raise(self) -> None:
        self._close(keep=False, why="the forward pass raised")
        self.settle()

    def _on_return(self, sample: _Sample, outputs: Outputs) -> None:
        sample.counter.forward_flops = sample.counter.total
        # Outputs.NO_TENSOR: nothing to follow into the backward pass (the loss may live
        # elsewhere): the window is blind, and the optimizer step or the next training forward
        # pass closes the sample.
        if outputs is Outputs.NO_GRAD:
            self._close(keep=False, why="no model output needs a gradient")

    def _on_backward_start(self, sample: _Sample) -> None:
        sample.counter.forward_flops = sample.counter.total

    def _on_backward_end(self) -> None:
        sample = self._open
        self._close(keep=True)
        if sample is not None and sample.outside == 0:  # no forward outside it was pending
            self.settled(sample.micro_batch)

    def settled(self, micro_batches: int) -> None:
        """Every training forward pass through micro-batch ``micro_batches`` (a count) has had
        its backward pass: a kept sample's ended, or an optimizer step came (the recorder's
        step hook, with the meter's count). Integer work only."""
        self.settled_through = max(self.settled_through, micro_batches)

    def _close(self, *, keep: bool, why: str = "") -> None:
        sample = self._open
        if sample is None or sample.counter.closed:
            return
        counter = sample.counter
        counter.closed = True
        sample.window.close()
        if self.eager.forced and not self.scheduled(sample.micro_batch + 1):
            self.eager.release()  # its forward and backward ran eagerly; the next runs compiled
        if not keep:
            self._skip(why or "incomplete")
            return
        if counter.failed:
            # A formula raised on an operator: the sample's count is incomplete.
            self._skip(f"a FLOP formula failed ({counter.failed[0]})")
            return
        forward = counter.forward_flops
        if forward is None or forward <= 0:
            self._skip("no forward work was counted")
            return
        # A custom autograd function's own recomputation (TRL's fused LM head) is forward
        # work done again in the backward pass, not gradient work: judged apart.
        backward = counter.total - forward - counter.custom_recompute
        if backward > 2 * forward * (1 + 1e-6):
            if sample.outside != 0:
                # Past twice the forward's work, and earlier forwards had no backward yet: its
                # graph may hold them (it opened between two accumulated forwards).
                self._skip(
                    f"its backward pass did {backward / forward:.2f} times its forward pass's "
                    "work (past 2) with earlier forward passes' backward not yet run"
                )
                if sample.eager:  # its micro-batch was moved or set ahead: the next, eagerly
                    self.eager.owe(sample.micro_batch)
                return
            # Counted forwards: every one before the sample had had its backward, so this
            # backward holds the sample's own forward passes only: a long backward, kept.
            self.long_backwards += 1
        self.samples.append(
            MeasuredSample(
                linear_flops=counter.linear,
                attention_flops=counter.attention,
                recompute_flops=counter.recompute,
                per_micro_batch_flops=counter.per_micro_batch,
                micro_batches=sample.forwards,
                tokens=sample.tokens,
                sum_sq_len=sample.sum_sq,
                sequences=sample.sequences,
                **sample.unit_fields(),
            )
        )
        key = self.samples[-1].key
        if key is not None:
            self.sampled_keys.add(key)
        self.unknown_ops |= counter.unknown

    def on_optimizer_step(self) -> None:
        """The meter's optimizer-step hook: a backward pass has ended; close and settle."""
        self._close_unseen("no backward pass seen before the step")
        self.settle()
        if self._open is None:
            self.eager.drop_pending()  # one no sample took (the relay pushes another when due)

    def _close_unseen(self, why: str) -> None:
        """Closes a sample whose backward pass was not seen through the outputs: kept when work
        ran after its forward pass (a step, or the next training forward, follows a backward)."""
        sample = self._open
        if sample is not None and not sample.counter.closed:
            forward = sample.counter.forward_flops
            ran_backward = forward is not None and sample.counter.total > forward
            self._close(keep=ran_backward, why=why)

    def settle(self) -> None:
        """Closes an open sample (dropping it if incomplete) and takes its mode off the stack.

        The mode is popped only on the thread that pushed it and only from the top of the
        stack; otherwise it stays closed (counting nothing) and leaves at the next call.
        """
        sample = self._open
        if sample is None:
            return
        if not sample.counter.closed:
            self._close(keep=False, why="no backward pass seen")
        if threading.get_ident() != sample.thread or internals.in_compiled_frame():
            return  # popped inside a compiled call, the key would come back: at the next call
        if not sample.counter.on_top():
            return  # another mode is above ours: it stays closed; pop at the next call
        try:
            sample.counter.exit()
        finally:
            self._open = None
            self._stale.append(sample.window)

    def _remove_stale(self) -> None:
        while self._stale:
            self._stale.pop().close()

    def stop(self) -> None:
        """Closes everything (the meter's stop)."""
        sample = self._open
        if sample is not None and sample.window.blind:
            self._close_unseen("no backward pass seen before the stop")
        self.settle()
        self._remove_stale()
        self.eager.stop()

    def sampling_note(self) -> str | None:
        """Why micro-batches were not sampled, when some were not (and which were forced)."""
        notes = []
        if self.every <= 0:
            notes.append("Sampling was turned off (measure_every=0).")
        if self.forced_samples:
            notes.append(
                f"{self.forced_samples} micro-batch(es) whose inputs are not all text were "
                "sampled whatever the rate (forced), each of a shape key no sample covered yet."
            )
        if self.unforced:
            notes.append(
                f"{self.unforced} micro-batch(es) of shape keys no sample covers were not "
                f"sampled: at most {MAX_FORCED_SAMPLES} samples are forced per run."
            )
        if self.long_backwards:
            notes.append(
                f"{self.long_backwards} sample(s) whose backward pass did more than twice their "
                "forward pass's work were kept: every training forward pass before them had had "
                "its backward pass or an optimizer step, so their backward held their own "
                "forward passes only (a chunked scan's backward, such as the gated delta rule's)."
            )
        if self.skipped:
            notes.append(
                "Samples dropped or skipped: "
                + ", ".join(f"{k} ({v})" for k, v in self.skipped.items())
                + "."
            )
        notes.append(self.eager.note() or "")
        return " ".join(n for n in notes if n) or None
