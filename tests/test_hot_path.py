"""The hooks' hot path (issue 32): a learned call structure counted by
:meth:`flopmeter.counting.planned.PlannedCalls.take`, and quiet optimizer steps only counted.

Each run here is made twice, with the hot path and quiet steps and with both switched off
(every micro-batch and step through the full path), and the two reports must agree on every
count, every sample and every estimate; the tokens are also counted by hand.
"""

from __future__ import annotations

import json
import math

import pytest
import torch

from flopmeter import FlopMeter
from flopmeter.counting.planned import PlannedCalls
from flopmeter.run.hooks import TrainingHooks
from tests.support.models import TinyLM
from tests.support.token_truth import true_stats

PAD = 0


def _batches(n: int, seed: int = 0) -> list[dict[str, torch.Tensor]]:
    """Right-padded batches of two shapes, with masks (and one shape with ids only)."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for i in range(n):
        rows, cols = (4, 12) if i % 3 else (2, 7)
        lengths = torch.randint(0, cols + 1, (rows,), generator=g)
        mask = (torch.arange(cols) < lengths[:, None]).long()
        ids = torch.randint(1, 64, (rows, cols), generator=g) * mask
        batch = {"input_ids": ids, "labels": ids.masked_fill(mask == 0, -100)}
        if i % 3:
            batch["attention_mask"] = mask
        out.append(batch)
    return out


def _truth(batches: list[dict[str, torch.Tensor]]) -> tuple[int, ...]:
    total = [0, 0, 0, 0]
    for b in batches:
        s = true_stats(input_ids=b["input_ids"], attention_mask=b.get("attention_mask"), pad_id=PAD)
        total = [a + x for a, x in zip(total, s, strict=True)]
    return tuple(total)


def _run(batches, *, hot: bool, monkeypatch, accumulate: int = 1, **meter_kwargs):
    """Trains on ``batches`` under a meter; ``hot=False``: every call and step in full."""
    with monkeypatch.context() as m:
        taken = []
        if not hot:
            m.setattr(PlannedCalls, "take", lambda self, args, kwargs: None)
            m.setattr(TrainingHooks, "_flop_model_step", _full_steps)
        else:
            original = PlannedCalls.take

            def take(self, args, kwargs):
                shape = original(self, args, kwargs)
                taken.append(shape is not None)
                return shape

            m.setattr(PlannedCalls, "take", take)
        torch.manual_seed(0)
        model = TinyLM()
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        with FlopMeter(model, pad_id=PAD, output=None, **meter_kwargs) as meter:
            model.train()
            for i, batch in enumerate(batches):
                (model(**batch) / accumulate).backward()
                if (i + 1) % accumulate == 0:
                    optimizer.step()
                    optimizer.zero_grad()
            report = meter.report()
        assert meter.problems == {}
        return report, sum(taken)


def _full_steps(self, step, micro_batches):
    """The FLOP model's step with no quiet steps after it."""
    self.flop_model.on_optimizer_step(micro_batches, step=step)


def _same(a, b) -> None:
    """Two reports agree on every count and estimate (times and ids aside)."""
    skip = {"run", "run_id", "started_at", "ended_at", "updated_at", "hardware", "seconds"}

    def scrub(x):
        if isinstance(x, dict):
            return {k: scrub(v) for k, v in x.items() if k not in skip and "seconds" not in k}
        if isinstance(x, list):
            return [scrub(v) for v in x]
        return x

    assert scrub(json.loads(a.model_dump_json())) == scrub(json.loads(b.model_dump_json()))


@pytest.mark.parametrize("accumulate", [1, 4])
@pytest.mark.parametrize("measure_every", [0, 8])
def test_hot_path_counts_as_the_full_path_and_by_hand(monkeypatch, accumulate, measure_every):
    batches = _batches(64)
    kwargs = {"measure_every": measure_every, "accumulate": accumulate}
    hot, taken = _run(batches, hot=True, monkeypatch=monkeypatch, **kwargs)
    full, _ = _run(batches, hot=False, monkeypatch=monkeypatch, **kwargs)
    t = hot.tokens
    assert (t.tokens_processed, t.tokens_seen, t.sequences, t.sum_sq_seq_len) == _truth(batches)
    assert t.micro_batches == len(batches)
    assert t.optimizer_steps == len(batches) // accumulate
    _same(hot, full)
    assert taken > len(batches) // 2  # most micro-batches took the hot path


def test_a_tensor_refilled_in_place_counts_its_values_at_each_call(monkeypatch):
    batches = _batches(40)
    ids, mask = batches[1]["input_ids"].clone(), batches[1]["attention_mask"].clone()

    def fed():  # the same tensors, refilled in place before each call
        for b in batches:
            if "attention_mask" in b:
                ids.copy_(b["input_ids"])
                mask.copy_(b["attention_mask"])
                b = {"input_ids": ids, "attention_mask": mask, "labels": b["labels"]}
            yield b

    hot, taken = _run(fed(), hot=True, monkeypatch=monkeypatch, measure_every=0)
    t = hot.tokens
    assert (t.tokens_processed, t.tokens_seen, t.sequences, t.sum_sq_seq_len) == _truth(batches)
    assert taken > 0


def test_a_scalar_argument_keeps_the_hot_path_and_another_type_leaves_it(monkeypatch):
    batches = _batches(30)
    for i, b in enumerate(batches):
        b["num_items_in_batch"] = 5 if i < 20 else 5.0  # a new structure from call 20 on
    hot, taken = _run(batches, hot=True, monkeypatch=monkeypatch, measure_every=0)
    t = hot.tokens
    assert (t.tokens_processed, t.tokens_seen, t.sequences, t.sum_sq_seq_len) == _truth(batches)
    assert taken > 10


def test_quiet_steps_end_when_a_refresh_is_due(tmp_path, monkeypatch):
    """The report file is refreshed when due although the steps between are quiet."""
    from flopmeter.run.run_file import RunFile

    refreshed = []
    monkeypatch.setattr(RunFile, "write_later", lambda self, build: refreshed.append(1))
    now = [0.0]
    monkeypatch.setattr("flopmeter.run.hooks._monotonic", lambda: now[0])
    monkeypatch.setattr("flopmeter.run.run_file.time.monotonic", lambda: now[0])
    model = TinyLM()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    out = tmp_path / "report.json"
    with FlopMeter(model, pad_id=PAD, output=out, refresh_seconds=10, measure_every=0) as m:
        hooks = m._run.hooks
        assert hooks.refresh_clock.next_due == 10.0
        for i, b in enumerate(_batches(40)):
            model(**b).backward()
            optimizer.step()
            optimizer.zero_grad()
            if i == 20:
                assert hooks._quiet_steps_below > hooks.counters.optimizer_steps + 1
                assert refreshed == []
                now[0] = 10.5  # a refresh is due at the next step
        assert refreshed == [1]
        assert hooks.refresh_clock.next_due == 20.5
    assert hooks.refresh_clock.next_due == math.inf  # closed: never due


def test_a_new_census_drops_the_hot_paths(monkeypatch):
    """recount() forgets the plans (the input facts may change): their hot paths go too."""
    torch.manual_seed(0)
    model = TinyLM()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    batches = _batches(12)
    with FlopMeter(model, pad_id=PAD, output=None, measure_every=0) as meter:
        for i, b in enumerate(batches):
            if i == 6:
                assert meter._run.hooks.counters.planned._hot
                meter._run.hooks.recount()
                assert not meter._run.hooks.counters.planned._hot
            model(**b).backward()
            optimizer.step()
            optimizer.zero_grad()
        t = meter.report().tokens
    assert (t.tokens_processed, t.tokens_seen, t.sequences, t.sum_sq_seq_len) == _truth(batches)
