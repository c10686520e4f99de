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


def _run(
    batches, *, hot: bool, monkeypatch, accumulate: int = 1, call=None, optimizers=1, **meter_kwargs
):
    """Trains on ``batches`` under a meter; ``hot=False``: every call and step in full.
    ``call(model, batch)`` calls the model (keywords by default); ``optimizers``: the model's
    parameters split between that many SGD optimizers, each stepped at every step."""
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
        params = list(model.parameters())
        split = [params[i::optimizers] for i in range(optimizers)]
        opts = [torch.optim.SGD(group, lr=0.1) for group in split]
        call = call or (lambda model, batch: model(**batch))
        with FlopMeter(model, pad_id=PAD, output=None, **meter_kwargs) as meter:
            model.train()
            for i, batch in enumerate(batches):
                (call(model, batch) / accumulate).backward()
                if (i + 1) % accumulate == 0:
                    for optimizer in opts:
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


def _hot_and_full(batches, monkeypatch, **kwargs):
    """Trains twice on ``batches`` (``_run``'s options), with and without the hot path and
    quiet steps: the reports agree, and the tokens are the hand count. Returns the hot run's
    report and how many calls the hot path took."""
    batches = list(batches)
    hot, taken = _run(batches, hot=True, monkeypatch=monkeypatch, **kwargs)
    full, _ = _run(batches, hot=False, monkeypatch=monkeypatch, **kwargs)
    t = hot.tokens
    assert (t.tokens_processed, t.tokens_seen, t.sequences, t.sum_sq_seq_len) == _truth(batches)
    _same(hot, full)
    return hot, taken


@pytest.mark.parametrize("accumulate", [1, 4])
@pytest.mark.parametrize("measure_every", [0, 8])
def test_hot_path_counts_as_the_full_path_and_by_hand(monkeypatch, accumulate, measure_every):
    batches = _batches(64)
    hot, taken = _hot_and_full(
        batches, monkeypatch, measure_every=measure_every, accumulate=accumulate
    )
    t = hot.tokens
    assert t.micro_batches == len(batches)
    assert t.optimizer_steps == len(batches) // accumulate
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


def test_the_hot_key_tells_apart_what_the_call_plans_tell_apart():
    """Two learnable calls share a hot key exactly when they share a call-plan key: a new
    shape, dtype, name, order, place (positional or keyword) or class is a new key."""
    from flopmeter.counting.call_plan import call_key
    from flopmeter.counting.planned import _learnable, hot_key

    ids, mask = torch.ones(2, 5, dtype=torch.long), torch.ones(2, 5, dtype=torch.long)
    calls = [
        ((), {"input_ids": ids, "attention_mask": mask}),
        ((), {"input_ids": ids.clone(), "attention_mask": mask.clone()}),  # same structure
        ((), {"attention_mask": mask, "input_ids": ids}),  # the names' order
        ((), {"input_ids": ids, "attention_mask": mask.int()}),  # a dtype
        ((), {"input_ids": ids, "attention_mask": mask.bool()}),
        ((), {"input_ids": ids[:, :4], "attention_mask": mask[:, :4]}),  # a shape
        ((), {"input_ids": ids.reshape(5, 2), "attention_mask": mask.reshape(5, 2)}),
        ((), {"input_ids": ids, "labels": mask}),  # a name
        ((ids,), {"attention_mask": mask}),  # a place
        ((ids, mask), {}),
        ((mask, ids), {}),
        ((ids,), {"attention_mask": mask, "num_items_in_batch": 3}),  # a scalar's class
        ((ids,), {"attention_mask": mask, "num_items_in_batch": 3.0}),
        ((ids,), {"attention_mask": mask, "num_items_in_batch": 4}),  # another value: same
        ((ids,), {"attention_mask": mask, "num_items_in_batch": None}),
    ]
    assert all(_learnable(*c) for c in calls)
    for a in calls:
        for b in calls:
            assert (hot_key(*a) == hot_key(*b)) == (call_key(*a) == call_key(*b)), (a, b)


def test_a_call_off_the_cpu_or_of_a_subclass_is_never_hot_and_counted_in_full(monkeypatch):
    """A tensor on another device (meta here: no values, the call plan's key holds the device)
    makes the structure never hot; a tensor subclass (a Parameter) is not hot this time."""
    from flopmeter.counting.planned import _learnable, hot_key

    ids = torch.ones(2, 5, dtype=torch.long)
    on_meta = ((), {"input_ids": ids, "labels": torch.empty(2, 5, device="meta")})
    assert _learnable(*on_meta) is None
    sub = ((), {"input_ids": ids, "labels": torch.nn.Parameter(ids.float(), False)})
    assert _learnable(*sub) is False
    assert hot_key(*sub) != hot_key((), {"input_ids": ids, "labels": ids.float()})

    batches = _batches(30)  # a weight per token beside the ids, of another dtype or class
    for i, b in enumerate(batches):
        weights = torch.ones(b["input_ids"].shape, dtype=torch.float64 if i % 4 else torch.float32)
        b["weights"] = torch.nn.Parameter(weights, False) if i % 5 == 0 else weights
    _, taken = _hot_and_full(batches, monkeypatch, measure_every=0)
    assert 0 < taken < len(batches) - 6  # the Parameter calls are never taken


@pytest.mark.parametrize("accumulate", [1, 3])
def test_positional_calls_take_the_hot_path_and_count_as_the_full_path(monkeypatch, accumulate):
    batches = _batches(36, seed=3)

    def positional(model, b):
        return model(b["input_ids"], b.get("attention_mask"), b["labels"])

    _, taken = _hot_and_full(
        batches, monkeypatch, call=positional, accumulate=accumulate, measure_every=0
    )
    assert taken > len(batches) // 2


def test_two_optimizers_of_the_model_count_as_the_full_path(monkeypatch):
    """The model's parameters split over two optimizers, both stepped at every step: each
    step of each is counted as the full path counts it (quiet steps are one optimizer's)."""
    batches = _batches(24, seed=5)
    hot, _ = _hot_and_full(batches, monkeypatch, optimizers=2, measure_every=0)
    assert hot.tokens.optimizer_steps == 2 * len(batches)
