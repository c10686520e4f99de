"""The FLOP-model recorder on its own: profile retries as explicit states, the samples, and
the observations that compute_estimates takes."""

from __future__ import annotations

import logging

import pytest
import torch
from torch import nn

from flopmeter.counting.census import take_census
from flopmeter.flops.estimates import compute_estimates, estimate_notes
from flopmeter.flops.recorder import MAX_PROFILE_ATTEMPTS, FlopModelRecorder, FlopObservations
from flopmeter.types import TokenTotals
from tests.support.models import Flaky as RetryFlaky

VOCAB = 32


def Flaky(failures: int = 0) -> nn.Module:
    """The profile-retry tests' model (its forward raises while ``failures`` is positive)."""
    return RetryFlaky(failures, vocab=VOCAB)


def step(recorder: FlopModelRecorder, model: Flaky, ids: torch.Tensor, n: int) -> None:
    """One training micro-batch as the meter drives it: pre-hook, forward, backward, step."""
    recorder.on_training_forward(ids, n)
    try:
        model(ids).sum().backward()
    except RuntimeError:
        return
    recorder.on_optimizer_step()


IDS = torch.randint(0, VOCAB, (2, 4), generator=torch.Generator().manual_seed(0))


def test_reasons_follow_the_profile_states(caplog: pytest.LogCaptureFixture) -> None:
    model = Flaky(failures=MAX_PROFILE_ATTEMPTS)
    recorder = FlopModelRecorder(model, measure_every=0)
    reason = recorder.observations().profile_reason
    assert reason == "no training micro-batch with input_ids or attention_mask was seen"
    recorder.on_training_forward(IDS, 1)
    assert recorder.observations().profile_reason == (
        "the first training forward pass has not finished"
    )
    with pytest.raises(RuntimeError):
        model(IDS)
    assert recorder.observations().profile_reason == (
        "the first training forward pass did not complete"
    )
    for n in range(2, MAX_PROFILE_ATTEMPTS + 2):  # two more attempts fail, then it gives up
        with caplog.at_level(logging.WARNING, logger="flopmeter"):
            step(recorder, model, IDS, n)
    assert recorder.profile_attempts == MAX_PROFILE_ATTEMPTS
    assert "failed on 3 training micro-batches; not trying again" in caplog.text
    observations = recorder.observations()
    assert observations.profile is None
    assert observations.profile_reason == (
        "the model profile was tried on 3 training forward passes and none completed (given up)"
    )
    recorder.reset_profile()  # what the meter's recount() does: profile again
    step(recorder, model, IDS, 10)
    assert recorder.profile_attempts == 1
    assert recorder.observations().profile is not None
    recorder.stop()


def test_observations_give_the_same_estimates_as_the_keyword_form() -> None:
    model = Flaky()
    recorder = FlopModelRecorder(model, measure_every=1)
    for n in (1, 2, 3):
        step(recorder, model, IDS, n)
    recorder.stop()
    assert not recorder.sampling
    observations = recorder.observations()
    assert isinstance(observations, FlopObservations)
    assert len(observations.samples) == 3 and observations.profile is not None
    census = take_census(model)
    totals = TokenTotals(tokens_processed=24, tokens_seen=24, sequences=6, sum_sq_seq_len=96)
    estimates, primary = compute_estimates(census, totals, observations)
    keywords, primary_kw = compute_estimates(
        census,
        totals,
        profile=observations.profile,
        profile_reason=observations.profile_reason,
        samples=observations.samples,
        sampling_reason=observations.sampling_reason,
        unknown_ops=observations.unknown_ops,
    )
    assert primary == primary_kw == "transformer"
    assert {k: v.model_dump() for k, v in estimates.items()} == {
        k: v.model_dump() for k, v in keywords.items()
    }
    assert estimates["measured"].flops == pytest.approx(estimates["transformer"].flops)
    assert estimate_notes(estimates, primary, observations) == estimate_notes(
        estimates, primary, observations.profile, observations.profile_reason
    )
    with pytest.raises(TypeError):
        compute_estimates(census, totals, observations, samples=observations.samples)
