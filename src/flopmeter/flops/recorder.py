"""The FLOP model's recording during a run: the model profile and the measured samples.

:class:`FlopModelRecorder` is what the meter delegates to from its hooks: it profiles the first
training micro-batch (retrying a forward pass that raised, a few times), opens and closes the
dispatch-level samples, and hands what it saw to :func:`flopmeter.flops.estimates.compute_estimates` as
:class:`FlopObservations`.
"""

from __future__ import annotations

import dataclasses
import enum
import logging
import sys
from dataclasses import dataclass, field

import torch
from torch import nn

from flopmeter.counting.work_units import ShapeUnits
from flopmeter.flops.capture import Profiler, stream_sizes
from flopmeter.flops.classify import sequence_mixer
from flopmeter.flops.forwards import ForwardWatch
from flopmeter.flops.model_profile import ModelProfile
from flopmeter.flops.phases import PhaseTally, merge_tallies
from flopmeter.flops.sampler import MeasuredSampler
from flopmeter.flops.scaling import MeasuredSample

logger = logging.getLogger("flopmeter")

__all__ = ["MAX_PROFILE_ATTEMPTS", "FlopModelRecorder", "FlopObservations"]

#: Training micro-batches the model profile is tried on before the recorder gives up on it (a
#: profiler walks and hooks every module, so it is not restarted on every micro-batch).
MAX_PROFILE_ATTEMPTS = 3


@dataclass(frozen=True)
class FlopObservations:
    """What the recorder saw: the inputs of the ``transformer`` and ``measured`` estimates.

    Attributes:
        profile: The model profile of a training micro-batch; None when none was taken.
        profile_reason: Why there is no profile (None when there is one).
        samples: Complete dispatch-level samples (FLOP and token counts).
        sampling_reason: Why micro-batches were not sampled or samples were dropped, if any.
        unknown_ops: Compute-like operators the samples had no FLOP formula for.
        phases: What the forward watch saw of the run's other phases (the trained model's
            forward passes without gradients, other models' forward passes), by phase name.
    """

    profile: ModelProfile | None = None
    profile_reason: str | None = None
    samples: tuple[MeasuredSample, ...] = ()
    sampling_reason: str | None = None
    unknown_ops: frozenset[str] = frozenset()
    phases: dict[str, PhaseTally] = field(default_factory=dict)


@dataclass
class _CrossCheckingSampler(MeasuredSampler):
    """A sampler that also samples, whatever its rate, while :attr:`forced` and it has no
    complete sample: the profile met work it could not model, and the run needs a cross-check.
    """

    forced: bool = field(default=False)

    def due(self, micro_batch: int, units: ShapeUnits | None = None) -> bool:
        """Whether training micro-batch ``micro_batch`` (1-based) should be sampled."""
        return (self.forced and not self.samples) or super().due(micro_batch, units)

    def sampling_note(self) -> str | None:
        """Why micro-batches were not sampled, and when one was sampled anyway."""
        note = super().sampling_note()
        if self.forced and self.samples and self.every <= 0:
            cross = (
                "Sampling was turned off (measure_every=0), but a micro-batch was sampled to "
                "cross-check work the model profile could not model."
            )
            rest = (note or "").removeprefix("Sampling was turned off (measure_every=0).")
            return (cross + rest).strip()
        return note


class _Profiling(enum.Enum):
    """Where the model profile stands."""

    WAITING = "no training micro-batch seen yet"
    CAPTURING = "a profiler's hooks are on a training forward pass (or it raised)"
    TAKEN = "the profile is taken"
    GIVEN_UP = "every attempt raised"


class FlopModelRecorder:
    """Profiles the first training micro-batch and samples dispatch-level FLOP counts.

    Not thread-safe across meters; every method is called from the meter's hooks (or its
    stop and report). Nothing here syncs the host with the device.

    Args:
        model: The model being trained.
        measure_every: Sample training micro-batches 1, 2 and every ``measure_every``-th after
            (forward and backward); ``0`` turns sampling off.
    """

    def __init__(self, model: nn.Module, *, measure_every: int) -> None:
        self.model = model
        self._sampler = _CrossCheckingSampler(every=measure_every)
        #: The run's forward passes besides its training passes (other phases).
        self.forwards = ForwardWatch(model, every=measure_every)
        #: The other phases a resumed run's checkpoint saved (all ranks', added once).
        self.restored_phases: dict[str, PhaseTally] = {}
        self._state = _Profiling.WAITING
        self._profiler: Profiler | None = None
        self._attempts = 0  # training micro-batches a profiler was started on
        self._mixed: dict[int, tuple[ShapeUnits, ShapeUnits]] = {}  # a mixer's units, by id
        #: Text micro-batches numbered below this need nothing of :meth:`on_training_forward`
        #: (nothing to profile or sample until then); 0: every one is shown to it.
        self.quiet_below = 0
        # A state-space / linear-attention mixer runs its scan as plain matmuls on activations,
        # which the dispatch count files with attention (scaled by squared lengths) although
        # they grow with the length: its micro-batches are scaled per shape key instead
        # (sampled once per key, as a non-text micro-batch is), never by the text rule.
        self._mixer = next(
            (type(m).__name__ for m in model.modules() if sequence_mixer(m) is not None), None
        )

    @property
    def profile_attempts(self) -> int:
        """Training micro-batches a profiler was started on since the last reset."""
        return self._attempts

    @property
    def sampling(self) -> bool:
        """Whether a sample is open (counting, or closed but its mode not yet off the stack)."""
        return self._sampler.active

    def on_training_forward(
        self, ref: torch.Tensor, micro_batch: int, units: ShapeUnits | None = None
    ) -> None:
        """The meter's forward pre-hook, for a training micro-batch (after its tokens counted).

        After the profile is taken this is a few attribute tests and an integer modulo, unless
        the micro-batch is sampled. May raise; the meter catches and notes the error.

        Args:
            ref: The micro-batch's ``input_ids`` or ``attention_mask``; its shape is read (its
                element count is the micro-batch's tokens, padding included).
            micro_batch: The micro-batch's number, 1-based.
            units: What the call's input shapes say (:func:`flopmeter.counting.inputs.shape_units`).
        """
        if self.forwards.end_hooked:  # a training call: the end hook of others goes
            self.forwards.unhook_end()
        if self._state in (_Profiling.WAITING, _Profiling.CAPTURING):
            self._advance_profile(ref, units)
            profile = self._profiler.profile if self._profiler is not None else None
            self._sampler.forced = bool(profile is not None and profile.cross_check)
        if self._mixer is not None and units is not None and units.text:
            units = self._as_mixed(units)
        sampler = self._sampler
        if sampler.needs(micro_batch, units):
            sampler.on_training_forward(self.model, ref, micro_batch, units)
        self.quiet_below = self._quiet_until(micro_batch)

    def _quiet_until(self, micro_batch: int) -> int:
        """The first micro-batch number after ``micro_batch`` that a text micro-batch must be
        shown to the recorder at (the one before the next one the rate samples, where a
        compiled call sets the next to run eagerly); 0 when every one must be (a profile to
        take, a sample open or forced, the stance forced, a mixer's micro-batches)."""
        s = self._sampler
        if (
            self._state in (_Profiling.WAITING, _Profiling.CAPTURING)
            or self._mixer is not None
            or s.active
            or s.forced
            or s.eager.forced
        ):
            return 0
        if s.every <= 0 or len(s.samples) >= s.max_samples:
            return sys.maxsize
        if micro_batch < 2:
            return micro_batch + 1
        scheduled = (micro_batch // s.every + 1) * s.every
        return scheduled - 1 if scheduled - 1 > micro_batch else scheduled

    def _as_mixed(self, units: ShapeUnits) -> ShapeUnits:
        """``units`` not all text (a mixer's micro-batch), made once per units object."""
        kept = self._mixed.get(id(units))
        if kept is None or kept[0] is not units:
            if len(self._mixed) >= 4096:
                self._mixed.clear()
            kept = self._mixed[id(units)] = (units, dataclasses.replace(units, text=False))
        return kept[1]

    def _advance_profile(self, ref: torch.Tensor, units: ShapeUnits | None = None) -> None:
        """Keeps a finished profile, or starts a profiler on this micro-batch when none runs or
        the last one's forward pass raised (at most :data:`MAX_PROFILE_ATTEMPTS` in all).

        The profiler is told the micro-batch's streams: its text tokens (the ids' elements,
        0 for a call without token ids, whose ``ref`` counts patches, frames or items) and what
        its shape units say (decoder positions, items, the per-item shape key)."""
        profiler = self._profiler
        if profiler is not None:
            profiler.finish()  # its window, if open, ends at the next training forward pass
        if profiler is not None and profiler.profile is not None:
            self._state = _Profiling.TAKEN
            return
        if profiler is not None and not profiler.failed:
            return  # its forward pass has not ended (a nested training forward)
        if profiler is not None:
            profiler.remove()
        if self._attempts < MAX_PROFILE_ATTEMPTS:
            text = ref.numel() if units is None or units.modality == "text" else 0
            self._profiler = Profiler(
                self.model,
                batch_tokens=text,
                streams=stream_sizes(text, units),
                follow_backward=True,
            ).start()
            self._attempts += 1
            self._state = _Profiling.CAPTURING
            return
        logger.warning(
            "flopmeter: the model profile failed on %d training micro-batches; not trying again",
            self._attempts,
        )
        self._state = _Profiling.GIVEN_UP

    def start(self) -> None:
        """The meter's start: the forward watch hooks the model and looks for other models."""
        self.forwards.start()

    def on_optimizer_step(self, micro_batches: int | None = None, step: int | None = None) -> None:
        """The meter's optimizer-step hook (a counted step): closes an open sample and the
        profile's window. May raise.

        Args:
            micro_batches: The training micro-batches counted so far, when the caller knows:
                every one has had its backward pass (a step follows them), which lets a later
                sample's long backward be told from one holding forward passes outside it.
            step: The step's number (1-based), when the caller skipped quiet steps
                (:meth:`quiet_steps_below`); else the step after the last one seen here.
        """
        if self._profiler is not None and self._state is _Profiling.CAPTURING:
            self._profiler.finish()  # taken or given up: its hooks are already removed
        if self._sampler.active:
            self._sampler.on_optimizer_step()
        if micro_batches is not None:
            self._sampler.settled(micro_batches)
        self.forwards.on_step(self.forwards.steps + 1 if step is None else step)

    def quiet_steps_below(self) -> int:
        """The first optimizer step number (1-based) after the last one seen here that
        :meth:`on_optimizer_step` must see: it closes a sample or the profile's window, or
        opens or closes the forward watch's discovery window. The steps before it may be left
        out, provided the micro-batches they settle are handed over (:meth:`settled`) before
        the next training micro-batch the recorder sees (a sample then reads them)."""
        if self._sampler.active or self._state is _Profiling.CAPTURING:
            return 0
        return self.forwards.quiet_steps_below()

    def settled(self, micro_batches: int) -> None:
        """Every training micro-batch through ``micro_batches`` (a count) has had its backward
        pass: what a quiet optimizer step left out (:meth:`quiet_steps_below`)."""
        self._sampler.settled(micro_batches)

    def stop(self) -> None:
        """Closes an open sample and removes every hook (the meter's stop). May raise.

        Logs a warning when the counting mode cannot leave the dispatch stack (another mode was
        entered above it and is still active).
        """
        self.forwards.stop()
        self._sampler.stop()
        if self._sampler.active:
            logger.warning(
                "flopmeter: its FLOP-counting mode could not leave the dispatch stack "
                "(another mode was entered above it and is still active)"
            )
        if self._profiler is not None:
            self._profiler.finish()
            self._profiler.remove()

    def reset_profile(self) -> None:
        """Drops the profile: the next training micro-batch is profiled again (up to
        :data:`MAX_PROFILE_ATTEMPTS` attempts anew). For runs that change what trains midway."""
        if self._profiler is not None:
            self._profiler.remove()
        self._profiler = None
        self._attempts = 0
        self._state = _Profiling.WAITING
        self.quiet_below = 0

    def _profile(self) -> tuple[ModelProfile | None, str | None]:
        profiler = self._profiler
        if profiler is not None and profiler.profile is not None:
            return profiler.profile, None
        if self._state is _Profiling.GIVEN_UP:
            return None, (
                f"the model profile was tried on {MAX_PROFILE_ATTEMPTS} training forward "
                "passes and none completed (given up)"
            )
        if profiler is None:
            return None, "no training micro-batch with input_ids or attention_mask was seen"
        if profiler.failed:
            return None, "the first training forward pass did not complete"
        return None, "the first training forward pass has not finished"

    def observations(self) -> FlopObservations:
        """What was recorded so far: the profile (or why none) and the complete samples."""
        profile, reason = self._profile()
        return FlopObservations(
            profile=profile,
            profile_reason=reason,
            samples=tuple(self._sampler.samples),
            sampling_reason=self._sampler.sampling_note(),
            unknown_ops=frozenset(self._sampler.unknown_ops),
            phases=self.phases(),
        )

    def phases(self, live: list[dict[str, PhaseTally]] | None = None) -> dict[str, PhaseTally]:
        """The other phases: ``live`` (every rank's tallies, gathered) or this rank's, with what
        a checkpoint restored, added once; new objects that later calls do not change."""
        parts = live if live is not None else [self.forwards.tallies]
        return merge_tallies([*parts, self.restored_phases])
