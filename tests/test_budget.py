"""The compute budget guard: its pure decisions, a raw loop, bad budgets, no host read far from
the budget, and two gloo ranks stopping at the same step.

The per-step compute the tests stop against is PyTorch's own count (``FlopCounterMode``) of a
forward and backward pass over each row on its own, never the meter's figure.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from flopmeter import BudgetExceeded, ConfigurationError, FlopMeter
from flopmeter.budget.controller import BudgetController
from flopmeter.budget.guard import NEAR_STEPS, BudgetGuard
from flopmeter.budget.resolve import (
    THRESHOLD_MARGIN,
    Budget,
    resolve_budget,
    threshold_budget_flops,
)
from flopmeter.compliance.thresholds import determine_threshold
from flopmeter.run.hooks import TrainingHooks
from tests.support.batches import PAD_ID, mixed_batches, padded_batch
from tests.support.dist import gloo_group, join_gloo
from tests.support.host_syncs import record_host_syncs
from tests.support.models import TinyLM, eager_llama
from tests.support.truth import STEP_ROWS, rows_truth

# spawns gloo processes: one rerun for gloo's teardown abort alone (tests/conftest.py)
pytestmark = pytest.mark.gloo


# ----------------------------------------------------------------------------- pure guard
def simulate(guard: BudgetGuard, step_flops: list[float]) -> tuple[int, float, list[int]]:
    """Runs the guard over steps of the given compute; returns (stop step, total then, the
    steps it read at)."""
    guard.start()
    total, reads = 0.0, []
    for step, flops in enumerate(step_flops, start=1):
        total += flops
        if guard.needs_reading(step):
            reads.append(step)
            if guard.on_reading(step, total).stop:
                return step, total, reads
    return len(step_flops), total, reads


def test_constant_steps_stop_at_the_last_step_within_with_few_readings():
    c = 3.0e9
    budget = 10_000.5 * c
    stop, total, reads = simulate(BudgetGuard(Budget(budget, "argument")), [c] * 20_000)
    assert stop == 10_000  # 10_000 steps fit; 10_001 would not
    assert total <= budget < total + c
    # a read at step 1, then halving, the three warning levels and the last NEAR_STEPS steps
    assert len(reads) <= math.log2(10_000) + 3 + NEAR_STEPS + 3
    assert reads[0] == 1 and reads[-NEAR_STEPS:] == list(range(stop - NEAR_STEPS + 1, stop + 1))


def test_steps_that_grow_up_to_twofold_between_readings_never_cross():
    c = 1.0
    steps = [c] * 300 + [1.9 * c] * 2000  # a jump right after a reading's forecast
    for budget in (500.5, 777.0, 1200.25):
        stop, total, _ = simulate(BudgetGuard(Budget(budget, "argument")), steps)
        assert total <= budget < total + steps[stop]  # the next step would have crossed


def test_a_first_step_over_the_budget_stops_at_once_and_says_it_crossed():
    guard = BudgetGuard(Budget(10.0, "argument"))
    guard.start()
    decision = guard.on_reading(1, 12.0)
    assert decision.stop and guard.flops_at_stop == 12.0
    assert decision.messages[-1][0] == "error" and "crossed" in decision.messages[-1][1]
    assert guard.budget_left_flops == -2.0


def test_warnings_at_50_80_95_percent_once_each():
    guard = BudgetGuard(Budget(100.0, "argument"))
    guard.start()
    said = []
    total = 0.0
    for step in range(1, 101):
        total += 1.0
        if guard.needs_reading(step):
            decision = guard.on_reading(step, total)
            said += [m for level, m in decision.messages if "over" in m]
            if decision.stop:
                break
    assert [m.split("over ")[1].split(" of")[0] for m in said] == ["50%", "80%", "95%"]
    assert "5.000e+01 FLOP used" in said[0]  # read at the step the level was reached


def test_the_plan_says_whether_the_run_fits():
    guard = BudgetGuard(Budget(100.0, "argument"))
    guard.start()
    guard.plan(150)
    (level, message), *_ = guard.on_reading(1, 1.0).messages
    assert level == "warning" and "1.500e+02 FLOP" in message
    assert "does not fit" in message and "about step 100" in message
    fits = BudgetGuard(Budget(100.0, "argument"))
    fits.start()
    fits.plan(60)
    (level, message), *_ = fits.on_reading(1, 1.0).messages
    assert level == "info" and "fits in the budget" in message


def test_an_unknown_compute_disables_the_guard_and_says_so():
    guard = BudgetGuard(Budget(100.0, "argument"))
    guard.start()
    decision = guard.on_reading(1, None, "2 micro-batches could not be read")
    assert not decision.stop
    assert decision.messages[0][0] == "error" and "could not be read" in decision.messages[0][1]
    assert guard.budget_left_flops is None and not guard.needs_reading(2)


def test_a_resumed_run_reads_twice_before_it_predicts():
    guard = BudgetGuard(Budget(100.0, "argument"))
    guard.start(resumed=True)
    assert not guard.on_reading(1, 90.0).stop  # 90 FLOP restored: the step's size unknown
    assert guard.step_flops is None and guard.needs_reading(2)
    assert guard.on_reading(2, 96.0).stop  # a step is 6 FLOP: 102 would cross
    assert guard.flops_at_stop == 96.0


@pytest.mark.parametrize(
    "value",
    [-1.0, 0, 0.0, float("nan"), float("inf"), -float("inf"), True, "lots", "1e20", [1e20], {}],
)
def test_bad_budgets_are_configuration_errors(value):
    with pytest.raises(ConfigurationError, match="budget"):
        resolve_budget(value)
    with pytest.raises(ConfigurationError, match="budget"):
        FlopMeter(eager_llama(), budget=value)


def test_bad_budget_actions_and_unknown_thresholds_are_configuration_errors():
    with pytest.raises(ConfigurationError, match="budget_action"):
        FlopMeter(eager_llama(), budget=1e20, budget_action="halt")
    with pytest.raises(ConfigurationError, match="needs a budget"):
        FlopMeter(eager_llama(), budget_action="raise")
    with pytest.raises(ConfigurationError, match="cannot be determined"):
        threshold_budget_flops(None)
    with pytest.raises(ConfigurationError, match="cannot be determined"):
        threshold_budget_flops(float("nan"))
    with pytest.raises(ConfigurationError, match="used up by the parent runs"):
        threshold_budget_flops(1.3e22, parents_flops=1.0e22)
    assert threshold_budget_flops(1.3e22, parents_flops=0.4e22) == pytest.approx(0.6e22)


def test_threshold_budget_is_the_reports_threshold_over_1_3():
    pretrain = 1.7e23  # Llama 3.2 3B (docs/budget.md)
    meter = FlopMeter(eager_llama(), budget="threshold", pretrain_flops=pretrain)
    expected = pretrain / 3 / THRESHOLD_MARGIN
    report = meter.report()
    assert report.budget.budget_flops == pytest.approx(expected, rel=1e-12)
    assert report.budget.budget_flops == pytest.approx(
        report.threshold.threshold_flops / 1.3, rel=1e-12
    )
    assert report.budget.source.startswith(
        "threshold (one third of the original compute): 5.667e+22 FLOP / 1.3"
    )
    unknown = FlopMeter(eager_llama(), budget="threshold", original_systemic_risk=True)
    fallback = determine_threshold(None, original_systemic_risk=True).value
    assert unknown.report().budget.budget_flops == pytest.approx(fallback / 1.3)


def test_threshold_budget_from_a_default_rule_says_which_rule_gave_it():
    # no original compute: the guidelines' fallback rule is the threshold; the source says so
    gpai = FlopMeter(eager_llama(), budget="threshold").report()
    assert gpai.budget.budget_flops == pytest.approx(1e23 / 3 / 1.3)
    assert gpai.budget.source.startswith(
        "threshold (default_gpai: original compute unknown or below 1e23 FLOP): 3.333e+22 FLOP"
    )
    risk = FlopMeter(eager_llama(), budget="threshold", original_systemic_risk=True).report()
    assert risk.budget.budget_flops == pytest.approx(1e25 / 3 / 1.3)
    assert risk.budget.source.startswith("threshold (default_systemic_risk: original compute")


def _parent_report(path: Path, *, fail: bool = False) -> None:
    model = eager_llama()
    with contextlib.suppress(RuntimeError), FlopMeter(model, PAD_ID, output=path):
        model(**padded_batch([7, 3], 8)).loss.backward()
        if fail:
            raise RuntimeError("out of memory")


def test_threshold_budget_subtracts_the_parent_runs_compute(tmp_path):
    _parent_report(tmp_path / "parent.json")
    parent = json.loads((tmp_path / "parent.json").read_text())["compute"]["primary_flops"]
    assert parent > 0
    meter = FlopMeter(
        eager_llama(),
        budget="threshold",
        pretrain_flops=1.7e23,
        parent_runs=[tmp_path / "parent.json"],
    )
    report = meter.report()
    threshold = 1.7e23 / 3
    # (a tiny parent is below the float resolution of 4.4e22; the source names its figure)
    assert report.budget.budget_flops == threshold / 1.3 - parent
    assert report.budget.source.endswith(f"less {parent:.4g} FLOP of parent runs")


@pytest.mark.slow
def test_threshold_budget_with_a_parent_of_unknown_compute_is_refused(tmp_path):
    _parent_report(tmp_path / "failed.json", fail=True)  # a failed run: no figure to trust
    with pytest.raises(ConfigurationError, match="parent runs"):
        FlopMeter(eager_llama(), budget="threshold", parent_runs=[tmp_path / "failed.json"])
    # a budget in FLOP is this run's own compute: the parents do not enter it
    assert FlopMeter(eager_llama(), budget=1e9, parent_runs=[tmp_path / "failed.json"]).report()


# ----------------------------------------------------------------------------- raw loop


def _loop(meter: FlopMeter, model, steps: int, accumulate: int = 1) -> int:
    """A raw loop that checks ``should_stop`` at its step boundary; returns the steps made."""
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
    batch = padded_batch(STEP_ROWS, 12, seed=1)
    with meter:
        for step in range(1, steps + 1):
            for _ in range(accumulate):
                (model(**batch).loss / accumulate).backward()
            optimizer.step()
            optimizer.zero_grad()
            if meter.should_stop:
                return step
    return steps


@pytest.mark.parametrize("accumulate", [1, 3])
@pytest.mark.slow
def test_raw_loop_stops_at_the_last_step_within_the_budget(accumulate, caplog):
    step = accumulate * rows_truth(STEP_ROWS)
    # half a step past step 7: with accumulation, one and a half micro-batches would still fit
    budget = 7.5 * step
    model = eager_llama()
    meter = FlopMeter(model, PAD_ID, budget=budget)
    assert meter.budget_left is None and not meter.should_stop
    with caplog.at_level(logging.INFO, logger="flopmeter"):
        stopped = _loop(meter, model, 30, accumulate)
    report = meter.report()
    assert stopped == report.tokens.optimizer_steps == 7
    assert report.tokens.micro_batches == 7 * accumulate  # never within an accumulation cycle
    assert report.compute.primary_flops == pytest.approx(7 * step, rel=1e-9)
    assert report.compute.primary_flops <= budget < report.compute.primary_flops + step
    assert report.budget.stopped_by_budget and report.run.status == "completed"
    assert report.budget.budget_flops == budget and report.budget.source == "argument"
    assert report.budget.flops_at_stop == report.compute.primary_flops
    assert meter.budget_left == pytest.approx(budget - 7 * step)
    warned = [r.getMessage() for r in caplog.records if "over " in r.getMessage()]
    # 7 / 7.5 = 93%: the 50% and 80% levels were reached, once each; 95% never was
    assert [m.split("over ")[1].split(" of")[0] for m in warned] == ["50%", "80%"]
    assert report.verdict.outcome == "below_threshold"  # the verdict is computed as always


@pytest.mark.slow
def test_an_unchecked_run_is_still_guarded_on_its_flop_model_figure():
    """With sampling off no dispatch count checks the FLOP model, so the report gives no
    verdict; the budget still stops the run, on the transformer figure (the cautious side)."""
    step = rows_truth(STEP_ROWS)
    model = eager_llama()
    meter = FlopMeter(model, PAD_ID, budget=7.5 * step, measure_every=0)
    stopped = _loop(meter, model, 30)
    report = meter.report()
    assert stopped == report.tokens.optimizer_steps == 7
    assert report.compute.primary_flops is None and report.verdict.outcome is None
    assert report.compute.estimates["transformer"].flops == pytest.approx(7 * step, rel=1e-9)
    assert report.budget.stopped_by_budget
    assert report.budget.flops_at_stop == pytest.approx(7 * step, rel=1e-9)


@pytest.mark.slow
def test_budget_action_raise_raises_at_the_step_boundary():
    step = rows_truth(STEP_ROWS)
    model = eager_llama()
    meter = FlopMeter(model, PAD_ID, budget=4.5 * step, budget_action="raise")
    with pytest.raises(BudgetExceeded) as caught:
        _loop(meter, model, 30)
    report = meter.report()
    assert caught.value.step == report.tokens.optimizer_steps == 4
    assert caught.value.flops_at_stop == pytest.approx(4 * step, rel=1e-9)
    # a clean stop: the final report is complete, with no error
    assert (
        report.run.status == "completed"
        and report.run.error is None
        and report.budget.stopped_by_budget
    )


@pytest.mark.slow
def test_a_loop_that_ignores_should_stop_is_told_once(caplog):
    step = rows_truth(STEP_ROWS)
    model = eager_llama()
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
    batch = padded_batch(STEP_ROWS, 12, seed=1)
    with (
        caplog.at_level(logging.ERROR, logger="flopmeter"),
        FlopMeter(model, PAD_ID, budget=2.5 * step) as meter,
    ):
        for _ in range(6):
            model(**batch).loss.backward()
            optimizer.step()
    went_on = [r for r in caplog.records if "went on after" in r.getMessage()]
    assert len(went_on) == 1 and meter.should_stop
    assert meter.report().budget.flops_at_stop == pytest.approx(2 * step, rel=1e-9)


@pytest.mark.slow
def test_a_resumed_run_counts_the_restored_compute_against_the_budget():
    step = rows_truth(STEP_ROWS)
    model = eager_llama()
    first = FlopMeter(model, PAD_ID)
    _loop(first, model, 4)
    resumed = FlopMeter(model, PAD_ID, budget=9.5 * step)
    resumed.load_state_dict(first.state_dict())
    stopped = _loop(resumed, model, 30)
    report = resumed.report()
    assert stopped == 5 and report.tokens.optimizer_steps == 9  # 4 restored + 5 in this session
    assert report.budget.flops_at_stop == pytest.approx(9 * step, rel=1e-9)
    assert report.compute.primary_flops <= 9.5 * step < report.compute.primary_flops + step


@pytest.mark.slow
def test_no_budget_changes_nothing():
    model = eager_llama()
    meter = FlopMeter(model, PAD_ID)
    _loop(meter, model, 3)
    report = meter.report()
    assert not meter.should_stop and meter.budget_left is None
    assert report.budget is None  # no budget: no budget figure, source, stop or stopped flag


# ----------------------------------------------------------------------------- no host read
def _watched_run(monkeypatch, budget: float, steps: int, accumulate: int = 2):
    """A run whose forward hooks and optimizer-step hooks record every host read; returns the
    reads per hook call (forward: after the census micro-batch) and the guard's reading steps."""
    forward_reads: list[str] = []
    step_reads: dict[int, list[str]] = {}
    readings: list[int] = []
    original_forward, original_step = TrainingHooks.on_forward_pre, TrainingHooks.on_any_step
    original_total = BudgetController._read_total
    seen = {"forwards": 0}
    running: dict[str, FlopMeter] = {}

    def forward(hooks, *args, **kwargs):
        seen["forwards"] += 1
        if seen["forwards"] == 1:  # the census micro-batch, once per run
            return original_forward(hooks, *args, **kwargs)
        with record_host_syncs(forward_reads):
            return original_forward(hooks, *args, **kwargs)

    def on_step(hooks, *args, **kwargs):
        calls = step_reads.setdefault(hooks.counters.optimizer_steps + 1, [])
        with record_host_syncs(calls):
            return original_step(hooks, *args, **kwargs)

    def total(controller, *args):
        readings.append(running["meter"].counters.optimizer_steps)
        return original_total(controller, *args)

    monkeypatch.setattr(TrainingHooks, "on_forward_pre", forward)
    monkeypatch.setattr(TrainingHooks, "on_any_step", on_step)
    monkeypatch.setattr(BudgetController, "_read_total", total)
    torch.manual_seed(0)
    model = TinyLM()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    batches = mixed_batches()
    running["meter"] = FlopMeter(model, pad_id=0, budget=budget)
    with running["meter"] as meter:
        for step in range(steps):
            for i in range(accumulate):
                model(**batches[(step * accumulate + i) % len(batches)]).backward()
            optimizer.step()
            optimizer.zero_grad()
            if meter.should_stop:
                break
    return meter, forward_reads, step_reads, readings


@pytest.mark.slow
def test_far_from_the_budget_no_host_read_per_micro_batch_and_one_reading(monkeypatch):
    meter, forward_reads, step_reads, readings = _watched_run(monkeypatch, 1e30, 40)
    assert meter.problems == {}
    assert forward_reads == []  # no micro-batch pays anything
    assert readings == [1]  # the one documented reading, at the first optimizer step
    assert len(step_reads) == 40
    assert [s for s, calls in step_reads.items() if calls] == [1]
    assert meter.report().tokens.micro_batches == 80


def test_near_the_budget_reads_happen_at_optimizer_steps_only(monkeypatch):
    meter, *_ = _watched_run(monkeypatch, 1e30, 1)
    step_flops = meter.report().compute.primary_flops  # about one step's size
    monkeypatch.undo()
    budget = 30.5 * step_flops
    meter, forward_reads, step_reads, readings = _watched_run(monkeypatch, budget, 60)
    report = meter.report()
    assert forward_reads == []  # still nothing per micro-batch
    assert readings[0] == 1 and readings == sorted(set(readings))
    assert [s for s, calls in step_reads.items() if calls] == readings  # reads: only there
    assert len(readings) < 15 < report.tokens.optimizer_steps
    assert report.budget.stopped_by_budget and report.compute.primary_flops <= budget


# ----------------------------------------------------------------------------- two ranks
RANK_ROWS = {0: [16, 2, 9], 1: [5, 5]}  # different work per rank, the same every step


def _rank_worker(rank: int, world: int, store: str, out_dir: str, budget: float) -> None:
    with gloo_group(rank, world, store):
        model = eager_llama()
        optimizer = torch.optim.SGD(model.parameters(), lr=1e-2)
        batch = padded_batch(RANK_ROWS[rank], 16, seed=rank)
        stopped_at = None
        with FlopMeter(model, PAD_ID, budget=budget) as meter:
            for step in range(1, 40):
                model(**batch).loss.backward()
                optimizer.step()
                optimizer.zero_grad()
                if meter.should_stop:
                    stopped_at = step
                    break
        report = meter.report()
        Path(out_dir, f"rank{rank}.json").write_text(
            json.dumps(
                {
                    "stopped_at": stopped_at,
                    "flops_at_stop": report.budget.flops_at_stop,
                    "flops": report.compute.primary_flops,
                }
            )
        )


@pytest.mark.slow
def test_two_gloo_ranks_stop_at_the_same_step_on_their_summed_compute(tmp_path):
    step = rows_truth(RANK_ROWS[0]) + rows_truth(RANK_ROWS[1])  # both ranks, one step
    budget = 9.5 * step  # either rank alone stays below it for far longer
    mp.spawn(
        _rank_worker,
        args=(2, str(tmp_path / "store"), str(tmp_path), budget),
        nprocs=2,
        join=True,
    )
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1)]
    # The next step's prediction is the ranks' padded step bounds summed (each row one
    # sequence of the full width 16): the cost of full rows of that width.
    bound = rows_truth([16] * len(RANK_ROWS[0])) + rows_truth([16] * len(RANK_ROWS[1]))
    assert bound > step  # padding makes the bound the larger
    expected = next(s for s in range(1, 40) if s * step + bound > budget)
    assert ranks[0]["stopped_at"] == ranks[1]["stopped_at"] == expected
    assert ranks[0]["flops_at_stop"] == ranks[1]["flops_at_stop"]
    assert ranks[0]["flops_at_stop"] == pytest.approx(expected * step, rel=1e-9)
    assert ranks[0]["flops"] <= budget < ranks[0]["flops"] + bound


# ----------------------------------------------------------------------------- resume at budget
def _stopped_state(budget: float) -> dict:
    model = eager_llama()
    meter = FlopMeter(model, PAD_ID, budget=budget)
    _loop(meter, model, 30)
    assert meter.should_stop
    return meter.state_dict()


def test_a_run_resumed_at_its_budget_stops_before_its_first_step(caplog):
    step = rows_truth(STEP_ROWS)
    budget = 4.5 * step
    state = _stopped_state(budget)
    caplog.clear()
    assert state["budget_flops_saved"] == pytest.approx(4 * step, rel=1e-9)
    model = eager_llama()
    meter = FlopMeter(model, PAD_ID, budget=budget)
    meter.load_state_dict(state)
    with caplog.at_level(logging.INFO, logger="flopmeter"), meter:
        assert meter.should_stop  # before any step of this session
    report = meter.report()
    assert report.tokens.optimizer_steps == 4 and report.budget.stopped_by_budget
    assert report.budget.flops_at_stop == pytest.approx(4 * step, rel=1e-9)
    said = [r.getMessage() for r in caplog.records]
    assert not [m for m in said if "FLOP used, over" in m]  # 50% and 80% were said before
    assert any("before the first step of this session" in m for m in said)


def test_a_run_resumed_at_its_budget_with_raise_raises_before_training():
    step = rows_truth(STEP_ROWS)
    state = _stopped_state(4.5 * step)
    model = eager_llama()
    before = [p.detach().clone() for p in model.parameters()]
    meter = FlopMeter(model, PAD_ID, budget=4.5 * step, budget_action="raise")
    meter.load_state_dict(state)
    with pytest.raises(BudgetExceeded) as caught:
        _loop(meter, model, 30)
    assert caught.value.step == 0
    after = list(model.parameters())
    assert all(torch.equal(a, b) for a, b in zip(before, after, strict=True))  # nothing trained
    assert meter.report().tokens.optimizer_steps == 4 and meter.report().run.status == "completed"


def test_a_resumed_run_with_room_left_goes_on_and_skips_passed_warnings(caplog):
    step = rows_truth(STEP_ROWS)
    state = _stopped_state(6.5 * step)  # stops after 6 steps: 50% and 80% said there
    caplog.clear()
    model = eager_llama()
    meter = FlopMeter(model, PAD_ID, budget=10.5 * step)
    meter.load_state_dict(state)
    with caplog.at_level(logging.INFO, logger="flopmeter"):
        stopped = _loop(meter, model, 30)
    assert stopped == 4 and meter.report().tokens.optimizer_steps == 10
    levels = [
        m.split("over ")[1].split(" of")[0]
        for m in (r.getMessage() for r in caplog.records)
        if "FLOP used, over" in m
    ]
    assert levels == ["80%", "95%"]  # 6/10.5 = 57% restored: 50% passed before the resume


def _failing_rank_worker(rank: int, world: int, store: str, out_dir: str) -> None:
    join_gloo(rank, world, store)
    try:
        if rank == 1:  # this rank's figure fails between the two collectives of a reading
            import flopmeter.run.measure as measure_module

            def broken(*args, **kwargs):
                raise RuntimeError("broken on rank 1")

            measure_module.withheld_reason = broken
        model = eager_llama()
        optimizer = torch.optim.SGD(model.parameters(), lr=1e-2)
        batch = padded_batch(RANK_ROWS[rank], 16, seed=rank)
        with FlopMeter(model, PAD_ID, budget=1e30) as meter:
            for _ in range(4):
                model(**batch).loss.backward()
                optimizer.step()
                optimizer.zero_grad()
        guard = meter._run.budget.guard
        Path(out_dir, f"rank{rank}.json").write_text(
            json.dumps({"unknown": guard.unknown_reason, "stopped": meter.should_stop})
        )
    finally:
        dist.destroy_process_group()


@pytest.mark.slow
def test_a_rank_failing_in_a_reading_does_not_leave_the_others_waiting(tmp_path):
    context = mp.spawn(
        _failing_rank_worker,
        args=(2, str(tmp_path / "store"), str(tmp_path)),
        nprocs=2,
        join=False,
    )
    finished = False
    for _ in range(120):  # a hang in a collective would never finish
        if context.join(timeout=1):
            finished = True
            break
    if not finished:
        for process in context.processes:
            process.kill()
    assert finished, "a rank waited in a collective its peer never joined"
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1)]
    # both ranks know the figure is unknown (NaN from rank 1), so both go on without the guard
    assert all("broken on rank 1" in r["unknown"] or "another rank" in r["unknown"] for r in ranks)
    assert not ranks[0]["stopped"] and not ranks[1]["stopped"]
