"""The ``measured`` estimate: flopmeter's operator formulas and the sampler's lifecycle.

The formulas are checked against PyTorch's own counts of the equivalent unfused operations
(``bmm`` for attention, ``mm`` for eager experts); the sampler against the dispatch-mode stack,
which it must always leave as it found it.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.flop_counter import FlopCounterMode

from flopmeter import FlopMeter
from flopmeter.flops.aten_ops import measured_formulas
from flopmeter.flops.sampler import MeasuredSampler
from tests.support.models import tiny_llama_config, tiny_mixtral_config

transformers = pytest.importorskip("transformers")

VOCAB = 128


def stack_depth() -> int:
    return torch._C._len_torch_dispatch_stack()


def tiny_llama(**kwargs: object) -> nn.Module:
    torch.manual_seed(0)
    # the shared tiny Llama with this file's vocabulary, LlamaConfig's default context length
    # and no pad id
    config = tiny_llama_config(vocab_size=VOCAB, max_position_embeddings=2048, pad_token_id=None)
    model = transformers.AutoModelForCausalLM.from_config(config, **kwargs)
    return model.train()


def tiny_mixtral(experts: str) -> nn.Module:
    torch.manual_seed(0)
    config = tiny_mixtral_config(vocab_size=VOCAB)
    model = transformers.AutoModelForCausalLM.from_config(
        config, attn_implementation="eager", experts_implementation=experts
    )
    return model.train()


# ----------------------------------------------------------------------------- formulas
def test_cpu_sdpa_formulas_match_torch_count_of_eager_attention() -> None:
    torch.manual_seed(0)
    q = torch.randn(2, 4, 16, 8, requires_grad=True)
    k = torch.randn(2, 4, 16, 8, requires_grad=True)
    v = torch.randn(2, 4, 16, 8, requires_grad=True)
    with FlopCounterMode(display=False) as eager:  # torch's bmm formulas, nothing of ours
        scores = torch.softmax(q @ k.transpose(-1, -2) / 8**0.5, dim=-1)
        (scores @ v).sum().backward()
    with FlopCounterMode(display=False, custom_mapping=measured_formulas()) as fused:
        F.scaled_dot_product_attention(q, k, v).sum().backward()
    ops = {str(op) for op in fused.get_flop_counts()["Global"]}
    assert "aten._scaled_dot_product_flash_attention_for_cpu" in ops
    assert fused.get_total_flops() == eager.get_total_flops()
    # forward 2 matmuls of 2 * 8 * 16 * 8 * 16 = 32768, backward 4: 6 * 32768 = 196608
    assert eager.get_total_flops() == 196608
    with FlopCounterMode(display=False) as plain:
        F.scaled_dot_product_attention(q, k, v).sum().backward()
    assert plain.get_total_flops() == 0  # the gap the formulas fill


@pytest.mark.slow
def test_grouped_mm_experts_count_like_eager_experts() -> None:
    ids = torch.randint(0, VOCAB, (2, 16))
    counts = {}
    for experts in ("eager", "grouped_mm"):
        model = tiny_mixtral(experts)
        with FlopCounterMode(display=False, custom_mapping=measured_formulas()) as counter:
            model(input_ids=ids, labels=ids).loss.backward()
        counts[experts] = counter.get_total_flops()
        if experts == "grouped_mm":
            assert "aten._grouped_mm" in {str(op) for op in counter.get_flop_counts()["Global"]}
    assert counts["grouped_mm"] == counts["eager"]
    model = tiny_mixtral("grouped_mm")
    with FlopCounterMode(display=False) as plain:
        model(input_ids=ids, labels=ids).loss.backward()
    assert plain.get_total_flops() < counts["eager"]  # torch alone counts the experts as 0


# ----------------------------------------------------------------------------- schedule
def test_sampling_schedule() -> None:
    sampler = MeasuredSampler(every=4)
    assert [n for n in range(1, 14) if sampler.due(n)] == [1, 2, 4, 8, 12]
    assert not any(MeasuredSampler(every=0).due(n) for n in range(1, 10))


# ----------------------------------------------------------------------------- lifecycle
def train_steps(model: nn.Module, meter_kwargs: dict, steps: int, ids: torch.Tensor) -> FlopMeter:
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
    with FlopMeter(model, **meter_kwargs) as meter:
        for _ in range(steps):
            model(input_ids=ids, labels=ids).loss.backward()
            optimizer.step()
            optimizer.zero_grad()
            assert stack_depth() == 0  # no mode left on the user's stack after a step
    return meter


@pytest.mark.slow
def test_samples_agree_with_the_transformer_estimate_sdpa_default() -> None:
    ids = torch.randint(0, VOCAB, (2, 16))
    meter = train_steps(tiny_llama(), {"measure_every": 3}, 7, ids)
    report = meter.report()
    measured = report.compute.estimates["measured"]
    assert measured.inputs["samples"] == 4  # micro-batches 1, 2, 3 and 6
    assert report.compute.measured_to_transformer_ratio == pytest.approx(1.0, rel=1e-9)
    assert not any("Warning" in n for n in report.notes)


@pytest.mark.slow
def test_forward_that_raises_drops_the_sample_and_keeps_the_exception() -> None:
    model = tiny_llama()
    meter = FlopMeter(model, measure_every=1).start()
    with pytest.raises(IndexError):  # not some error of the meter's
        model(input_ids=torch.full((1, 8), VOCAB + 5))
    assert stack_depth() == 0
    ids = torch.randint(0, VOCAB, (1, 8))
    model(input_ids=ids, labels=ids).loss.backward()
    report = meter.stop()
    assert stack_depth() == 0
    assert report.compute.estimates["measured"].inputs["samples"] == 1
    assert any(
        "the forward pass raised (1)" in n for n in report.compute.estimates["measured"].notes
    )
    assert report.compute.measured_to_transformer_ratio == pytest.approx(1.0, rel=1e-9)


def test_a_users_mode_around_the_forward_is_left_alone() -> None:
    model = tiny_llama()
    ids = torch.randint(0, VOCAB, (1, 8))
    with FlopMeter(model, measure_every=1) as meter:
        with FlopCounterMode(display=False) as user:
            loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        assert stack_depth() == 0
    assert user.get_total_flops() > 0
    notes = meter.report().compute.estimates["measured"].notes
    assert any("another dispatch mode was active" in n for n in notes)


@pytest.mark.slow
def test_a_users_mode_entered_after_ours_is_never_popped_by_the_meter() -> None:
    model = tiny_llama()
    ids = torch.randint(0, VOCAB, (1, 8))
    meter = FlopMeter(model, measure_every=1).start()
    loss = model(input_ids=ids, labels=ids).loss  # sample open
    user = FlopCounterMode(display=False)
    user.__enter__()
    loss.backward()  # our sample closes at the end of this backward pass; the user's mode stays
    torch.optim.SGD(model.parameters(), lr=0.0).step()  # the meter's step hook: ours is not
    # on top, so it must not pop anything
    assert stack_depth() == 2
    user.__exit__(None, None, None)
    assert user.get_total_flops() > 0
    report = meter.stop()
    assert stack_depth() == 0
    assert report.compute.estimates["measured"].inputs["samples"] == 1


@pytest.mark.slow
def test_accumulated_forwards_join_one_sample() -> None:
    model = tiny_llama()
    ids = torch.randint(0, VOCAB, (1, 8))
    with FlopMeter(model, measure_every=1) as meter:
        for _ in range(3):
            first = model(input_ids=ids, labels=ids).loss
            second = model(input_ids=ids, labels=ids).loss
            (first + second).backward()
    measured = meter.report().compute.estimates["measured"]
    assert measured.inputs["samples"] == 3
    assert measured.inputs["sample_tokens"] == 3 * 2 * 8
    assert meter.report().compute.measured_to_transformer_ratio == pytest.approx(1.0, rel=1e-9)


@pytest.mark.slow
def test_activation_checkpoint_recomputation_is_left_out() -> None:
    model = tiny_llama()
    model.gradient_checkpointing_enable()
    ids = torch.randint(0, VOCAB, (1, 8))
    meter = train_steps(model, {"measure_every": 1}, 2, ids)
    measured = meter.report().compute.estimates["measured"]
    assert measured.inputs["recompute_flops_excluded"] > 0
    assert meter.report().compute.measured_to_transformer_ratio == pytest.approx(1.0, rel=1e-9)


def test_training_failure_inside_an_open_sample_leaves_no_mode() -> None:
    model = tiny_llama()
    ids = torch.randint(0, VOCAB, (1, 8))
    with pytest.raises(RuntimeError, match="boom"), FlopMeter(model, measure_every=1):
        model(input_ids=ids, labels=ids)
        raise RuntimeError("boom")
    assert stack_depth() == 0


class HiddenMatmul(nn.Module):
    """A recognised model (linear layers only) that also multiplies by a fixed buffer, which
    the architecture reading cannot see but the dispatch-level count does."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(VOCAB, 32)
        self.proj = nn.Linear(32, 32)
        self.register_buffer("mix", torch.randn(32, 32))
        self.head = nn.Linear(32, VOCAB)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        h = self.proj(self.embed(input_ids)) @ self.mix
        return self.head(h)


def test_disagreement_beyond_ten_percent_is_a_warning() -> None:
    model = HiddenMatmul().train()
    ids = torch.randint(0, VOCAB, (2, 8))
    with FlopMeter(model, measure_every=1) as meter:
        model(ids).sum().backward()
    report = meter.report()
    # transformer: 6 * (32*32 + 32*128) per token; the buffer matmul adds 4 * 32*32 per
    # token (forward and input gradient): ratio (6*5120 + 4*1024) / (6*5120) = 1.1333
    assert report.compute.measured_to_transformer_ratio == pytest.approx(34816 / 30720, rel=1e-9)
    assert any(n.startswith("Warning: the measured estimate is 1.133") for n in report.notes)
    # Beyond the 1% agreement: the measured figure is the primary one, and says why.
    assert report.compute.primary_estimate == "measured"
    assert report.compute.primary_flops == report.compute.estimates["measured"].flops
    assert any("beyond the 1% the two must agree within" in n for n in report.notes)
    assert report.compute.primary_reason == (
        "measured: transformer 11.8% lower than the dispatch count on 1 sampled micro-batches"
    )


# ----------------------------------------------------------------------------- None outputs
class KeepsItsLoss(nn.Module):
    """A model whose forward returns None: it keeps its loss on itself for the loop."""

    def __init__(self, raises: bool = False) -> None:
        super().__init__()
        self.model = tiny_llama(attn_implementation="eager")
        self.loss: torch.Tensor | None = None
        self.raises = raises

    def forward(self, input_ids: torch.Tensor) -> None:
        self.loss = self.model(input_ids=input_ids, labels=input_ids).loss
        if self.raises:
            raise ValueError("simulated failure after the work")


@pytest.mark.slow
def test_a_forward_that_returns_none_is_profiled_and_sampled() -> None:
    model = KeepsItsLoss().train()
    ids = torch.randint(0, VOCAB, (2, 8))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.0)  # the weights stay as they are
    with FlopMeter(model, measure_every=1) as meter:
        for _ in range(3):
            assert model(ids) is None  # the hooks leave the output alone
            assert model.loss is not None
            model.loss.backward()
            optimizer.step()
            optimizer.zero_grad()
            assert stack_depth() == 0
    report = meter.report()
    assert report.compute.primary_estimate == "transformer"
    with FlopCounterMode(display=False) as counter:
        model(ids)
        assert model.loss is not None
        model.loss.backward()
    assert report.compute.primary_flops == pytest.approx(3 * counter.get_total_flops(), rel=1e-9)
    measured = report.compute.estimates["measured"]
    assert measured.flops is not None
    assert measured.inputs["samples"] == 3
    assert report.compute.measured_to_transformer_ratio == pytest.approx(1.0, rel=1e-9)
    assert not any("raised" in n for n in measured.notes)


@pytest.mark.slow
def test_a_none_forward_without_a_step_closes_at_the_next_forward() -> None:
    """Gradient accumulation over forwards that return None: each backward is its own sample,
    closed by the next training forward pass (or the meter's stop)."""
    model = KeepsItsLoss().train()
    ids = torch.randint(0, VOCAB, (2, 8))
    with FlopMeter(model, measure_every=1) as meter:
        for _ in range(2):
            model(ids)
            assert model.loss is not None
            model.loss.backward()
        model(ids)  # no backward before the next forward: dropped
        model(ids)
        model.loss.backward()
    assert stack_depth() == 0
    measured = meter.report().compute.estimates["measured"]
    assert measured.inputs["samples"] == 3
    assert any(
        "no backward pass seen before the next forward pass (1)" in n for n in measured.notes
    )
    assert meter.report().compute.measured_to_transformer_ratio == pytest.approx(1.0, rel=1e-9)


@pytest.mark.slow
def test_a_forward_that_raises_after_its_work_is_still_a_failure() -> None:
    """The work ran and the loss is set, but the forward raised: no profile, no sample."""
    model = KeepsItsLoss(raises=True).train()
    ids = torch.randint(0, VOCAB, (2, 8))
    with FlopMeter(model, measure_every=1) as meter:
        with pytest.raises(ValueError, match="simulated failure"):
            model(ids)
        assert stack_depth() == 0
        transformer = meter.report().compute.estimates["transformer"]  # a running report
        assert transformer.flops is None
        assert transformer.notes == ["the first training forward pass did not complete"]
        model.raises = False
        model(ids)
        assert model.loss is not None
        model.loss.backward()
    report = meter.report()
    assert report.compute.primary_estimate == "transformer"
    measured = report.compute.estimates["measured"]
    assert measured.inputs["samples"] == 1
    assert any("the forward pass raised (1)" in n for n in measured.notes)
