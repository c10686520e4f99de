"""Interim recorder (replaced by the flops/ restructuring): profile retry policy and sampler."""

from __future__ import annotations

import logging
from dataclasses import dataclass

import torch
from torch import nn

from flopmeter.flops.measured import MeasuredSample, MeasuredSampler
from flopmeter.flops.profile import ModelProfile, Profiler

logger = logging.getLogger("flopmeter")

_MAX_PROFILE_ATTEMPTS = 3


@dataclass(frozen=True)
class FlopObservations:
    """What the FLOP model saw of a run."""

    profile: ModelProfile | None
    profile_reason: str | None
    samples: tuple[MeasuredSample, ...]
    sampling_reason: str | None
    unknown_ops: frozenset[str]


class FlopModelRecorder:
    """Profiles the first training micro-batch and samples dispatch-level counts."""

    def __init__(self, model: nn.Module, *, measure_every: int) -> None:
        self.model = model
        self.sampler = MeasuredSampler(every=measure_every)
        self._profiler: Profiler | None = None
        self._profile: ModelProfile | None = None
        self._attempts = 0

    def on_training_forward(self, ref: torch.Tensor, micro_batch: int) -> None:
        if self._profile is None and self._attempts <= _MAX_PROFILE_ATTEMPTS:
            profiler = self._profiler
            if profiler is not None and profiler.profile is not None:
                self._profile = profiler.profile
            elif profiler is None or profiler.failed:
                if profiler is not None:
                    profiler.remove()
                if self._attempts < _MAX_PROFILE_ATTEMPTS:
                    self._profiler = Profiler(self.model, batch_tokens=ref.numel()).start()
                else:
                    logger.warning(
                        "flopmeter: the model profile failed on %d training micro-batches; "
                        "not trying again",
                        self._attempts,
                    )
                self._attempts += 1
        sampler = self.sampler
        if sampler.active or sampler.due(micro_batch):
            sampler.on_training_forward(self.model, ref, micro_batch)

    def on_optimizer_step(self) -> None:
        if self.sampler.active:
            self.sampler.on_optimizer_step()

    def stop(self) -> None:
        self.sampler.stop()
        if self.sampler.active:
            logger.warning(
                "flopmeter: its FLOP-counting mode could not leave the dispatch stack "
                "(another mode was entered above it and is still active)"
            )
        if self._profiler is not None:
            self._profiler.remove()

    def reset_profile(self) -> None:
        self._profile = None
        self._attempts = 0
        if self._profiler is not None:
            self._profiler.remove()
            self._profiler = None

    def _profile_and_reason(self) -> tuple[ModelProfile | None, str | None]:
        if self._profile is None and self._profiler is not None:
            self._profile = self._profiler.profile
        if self._profile is not None:
            return self._profile, None
        if self._profiler is None:
            return None, "no training micro-batch with input_ids or attention_mask was seen"
        if self._profiler.failed:
            if self._attempts > _MAX_PROFILE_ATTEMPTS:
                return None, (
                    f"the model profile was tried on {_MAX_PROFILE_ATTEMPTS} training forward "
                    "passes and none completed (given up)"
                )
            return None, "the first training forward pass did not complete"
        return None, "the first training forward pass has not finished"

    def observations(self) -> FlopObservations:
        profile, reason = self._profile_and_reason()
        return FlopObservations(
            profile=profile,
            profile_reason=reason,
            samples=tuple(self.sampler.samples),
            sampling_reason=self.sampler.sampling_note(),
            unknown_ops=frozenset(self.sampler.unknown_ops),
        )
