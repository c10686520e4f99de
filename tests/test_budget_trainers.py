"""The compute budget on real trainer runs: a Hugging Face Trainer and a Lightning fit (tiny
Llama, CPU) given a budget a few steps into a longer run stop at the last optimizer step within
it, with that step's checkpoint saved and gradient accumulation respected.

Every row has the same length, so every optimizer step costs the same; that cost is PyTorch's
own count (``FlopCounterMode``, forward and backward of one row, times the rows of a step),
never the meter's figure.
"""

from __future__ import annotations

import json
import logging

import pytest

pytest.importorskip("transformers")

import torch

from flopmeter.errors import ConfigurationError
from tests.support.models import eager_llama
from tests.support.trainers import hf_trainer, lightning_module, lightning_trainer
from tests.support.truth import rows_truth

ROW_LENGTH = 12
ROWS = [
    torch.randint(1, 97, (ROW_LENGTH,), generator=torch.Generator().manual_seed(i))
    for i in range(48)
]
BATCH, ACCUMULATE, EPOCHS = 4, 2, 4  # 6 optimizer steps an epoch, 24 planned
PLANNED_STEPS = EPOCHS * len(ROWS) // (BATCH * ACCUMULATE)
STOP_AT = 7  # the budget is set half a step (one micro-batch) past this step


def step_truth() -> int:
    return rows_truth([ROW_LENGTH] * (BATCH * ACCUMULATE))


class Rows(torch.utils.data.Dataset):
    def __len__(self) -> int:
        return len(ROWS)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return {"input_ids": ROWS[i]}


def collate(rows: list[dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
    ids = torch.stack([r["input_ids"] for r in rows])
    return {"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": ids.clone()}


def plan_messages(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if "the run plans" in r.getMessage()]


def _hf_trainer(tmp_path, callback, **overrides):
    settings = dict(
        per_device_train_batch_size=BATCH,
        gradient_accumulation_steps=ACCUMULATE,
        num_train_epochs=EPOCHS,
        save_strategy="steps",
        save_steps=1000,  # no save of its own before the end: the stop's save is the guard's
        logging_steps=1000,
        seed=0,
    )
    settings.update(overrides)
    return hf_trainer(
        tmp_path,
        model=eager_llama(),
        train_dataset=Rows(),
        data_collator=collate,
        callbacks=[callback],
        **settings,
    )


def _lightning_fit(tmp_path, callback, ckpt_path=None):
    """A Lightning fit of the tiny Llama with ``callback`` and a ``ModelCheckpoint`` on its
    default schedule (into ``tmp_path / "ckpt"``): the trainer, and the module, whose
    ``batches`` counts the training batches this fit ran."""
    pytest.importorskip("lightning.pytorch")
    from lightning.pytorch.callbacks import ModelCheckpoint

    trainer = lightning_trainer(
        tmp_path,
        [callback, ModelCheckpoint(dirpath=str(tmp_path / "ckpt"), save_top_k=-1)],
        max_epochs=EPOCHS,
        accumulate_grad_batches=ACCUMULATE,
    )
    module = lightning_module(eager_llama())
    loader = torch.utils.data.DataLoader(Rows(), batch_size=BATCH, collate_fn=collate)
    trainer.fit(module, loader, ckpt_path=ckpt_path)
    return trainer, module


# ----------------------------------------------------------------------------- Hugging Face
@pytest.mark.slow
def test_hf_trainer_stops_at_the_last_step_within_the_budget_and_saves_it(tmp_path, caplog):
    from flopmeter.integrations.hf import FlopMeterCallback

    step = step_truth()
    budget = (STOP_AT + 0.5) * step
    callback = FlopMeterCallback(budget=budget)
    trainer = _hf_trainer(tmp_path, callback)
    with caplog.at_level(logging.INFO, logger="flopmeter"):
        trainer.train()
    report = callback.meter.report()
    assert trainer.state.global_step == report.tokens.optimizer_steps == STOP_AT < PLANNED_STEPS
    assert (
        report.tokens.micro_batches == STOP_AT * ACCUMULATE
    )  # stopped at an accumulation boundary
    assert report.compute.primary_flops == pytest.approx(STOP_AT * step, rel=1e-9)
    assert report.compute.primary_flops <= budget < report.compute.primary_flops + step
    assert report.budget.stopped_by_budget and report.run.status == "completed"
    assert report.budget.flops_at_stop == report.compute.primary_flops
    # the checkpoint of the stopping step is saved, with the meter's counts of that step
    saved = json.loads((tmp_path / f"checkpoint-{STOP_AT}" / "trainer_state.json").read_text())
    assert saved["global_step"] == STOP_AT
    counts = saved["stateful_callbacks"]["FlopMeterCallback"]["attributes"]["saved_meter_state"]
    assert counts["tokens_processed"] == STOP_AT * BATCH * ACCUMULATE * ROW_LENGTH
    assert sorted(p.name for p in tmp_path.glob("checkpoint-*")) == [f"checkpoint-{STOP_AT}"]
    written = json.loads((tmp_path / "flops_meter.json").read_text())
    assert (
        written["budget"]["stopped_by_budget"] is True
        and written["budget"]["budget_flops"] == budget
    )
    # after the first step, what the whole planned run would use, and that it does not fit
    (plan,) = plan_messages(caplog)
    assert f"plans {PLANNED_STEPS} optimizer steps" in plan
    assert f"{PLANNED_STEPS * step:.3e} FLOP" in plan and f"about step {STOP_AT}" in plan


def test_hf_callback_refuses_a_bad_budget_before_training():
    from flopmeter.integrations.hf import FlopMeterCallback

    for bad in (-5, 0, float("nan"), "all of it", True):
        with pytest.raises(ConfigurationError, match="budget"):
            FlopMeterCallback(budget=bad)


# ----------------------------------------------------------------------------- Lightning
@pytest.mark.slow
def test_lightning_stops_at_the_last_step_within_the_budget_and_checkpoints_it(tmp_path, caplog):
    pytest.importorskip("lightning.pytorch")
    from flopmeter.integrations.lightning import FlopMeterCallback

    step = step_truth()
    budget = (STOP_AT + 0.5) * step
    callback = FlopMeterCallback(budget=budget)
    with caplog.at_level(logging.INFO, logger="flopmeter"):
        trainer, _ = _lightning_fit(tmp_path, callback)
    report = callback.meter.report()
    assert trainer.global_step == report.tokens.optimizer_steps == STOP_AT < PLANNED_STEPS
    assert report.tokens.micro_batches == STOP_AT * ACCUMULATE
    assert report.compute.primary_flops == pytest.approx(STOP_AT * step, rel=1e-9)
    assert report.compute.primary_flops <= budget < report.compute.primary_flops + step
    assert report.budget.stopped_by_budget and report.run.status == "completed"
    # Lightning ends the epoch at should_stop, and ModelCheckpoint saves the stopping step then
    saved = {p.name: torch.load(p, weights_only=False) for p in (tmp_path / "ckpt").glob("*.ckpt")}
    last = [ckpt for ckpt in saved.values() if ckpt["global_step"] == STOP_AT]
    assert len(last) == 1, sorted(saved)
    (meter_state,) = [v for k, v in last[0]["callbacks"].items() if "FlopMeterCallback" in k]
    assert meter_state["meter"]["tokens_processed"] == STOP_AT * BATCH * ACCUMULATE * ROW_LENGTH
    (plan,) = plan_messages(caplog)
    assert f"plans {PLANNED_STEPS} optimizer steps" in plan and "does not fit" in plan


def test_lightning_callback_refuses_a_bad_budget_before_training():
    pytest.importorskip("lightning.pytorch")
    from flopmeter.integrations.lightning import FlopMeterCallback

    for bad in (-5, 0, float("inf"), "all of it", False):
        with pytest.raises(ConfigurationError, match="budget"):
            FlopMeterCallback(budget=bad)


# ----------------------------------------------------------------------------- fixes
def _count_saves(trainer) -> list[int]:
    """Wraps the trainer's ``_save_checkpoint``: the global step of each call."""
    saves: list[int] = []
    original = trainer._save_checkpoint

    def counted(*args, **kwargs):
        saves.append(trainer.state.global_step)
        return original(*args, **kwargs)

    trainer._save_checkpoint = counted
    return saves


@pytest.mark.slow
def test_hf_budget_stop_saves_its_checkpoint_once(tmp_path):
    from flopmeter.integrations.hf import FlopMeterCallback

    callback = FlopMeterCallback(budget=(STOP_AT + 0.5) * step_truth())
    trainer = _hf_trainer(tmp_path, callback)
    saves = _count_saves(trainer)
    trainer.train()
    assert trainer.state.global_step == STOP_AT and STOP_AT % (PLANNED_STEPS // EPOCHS)
    assert saves == [STOP_AT]  # on_step_end asks for it; on_epoch_end must not ask again


@pytest.mark.slow
def test_hf_save_strategy_no_saves_nothing_at_the_budget_stop(tmp_path):
    from flopmeter.integrations.hf import FlopMeterCallback

    callback = FlopMeterCallback(budget=(STOP_AT + 0.5) * step_truth())
    trainer = _hf_trainer(tmp_path, callback, save_strategy="no")
    saves = _count_saves(trainer)
    trainer.train()
    assert callback.meter.report().budget.stopped_by_budget
    assert trainer.state.global_step == STOP_AT
    assert saves == [] and list(tmp_path.glob("checkpoint-*")) == []


@pytest.mark.slow
def test_hf_resuming_a_run_stopped_by_its_budget_trains_no_further_step(tmp_path, caplog):
    from flopmeter import BudgetExceeded
    from flopmeter.integrations.hf import FlopMeterCallback

    step = step_truth()
    budget = (STOP_AT + 0.5) * step
    first = FlopMeterCallback(budget=budget)
    _hf_trainer(tmp_path, first).train()
    assert first.meter.report().budget.stopped_by_budget
    again = FlopMeterCallback(budget=budget)
    trainer = _hf_trainer(tmp_path, again)
    saves = _count_saves(trainer)
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="flopmeter"), pytest.raises(BudgetExceeded):
        trainer.train(resume_from_checkpoint=str(tmp_path / f"checkpoint-{STOP_AT}"))
    report = again.meter.report()
    assert trainer.state.global_step == STOP_AT and saves == []
    assert (
        report.tokens.optimizer_steps == STOP_AT
        and report.tokens.micro_batches == STOP_AT * ACCUMULATE
    )
    assert report.budget.stopped_by_budget and report.run.status == "completed"
    assert report.budget.flops_at_stop == pytest.approx(STOP_AT * step, rel=1e-9)
    # the levels passed before the resume are not said again
    assert not [r for r in caplog.records if "FLOP used, over" in r.getMessage()]


@pytest.mark.slow
def test_lightning_resuming_a_run_stopped_by_its_budget_trains_no_further_step(tmp_path):
    pytest.importorskip("lightning.pytorch")
    from flopmeter.integrations.lightning import FlopMeterCallback

    step = step_truth()
    budget = (STOP_AT + 0.5) * step
    first = FlopMeterCallback(budget=budget)
    _lightning_fit(tmp_path, first)
    assert first.meter.report().budget.stopped_by_budget
    (ckpt,) = [p for p in (tmp_path / "ckpt").glob("*.ckpt") if f"step={STOP_AT}" in p.name]
    again = FlopMeterCallback(budget=budget)
    trainer, module = _lightning_fit(tmp_path, again, ckpt_path=str(ckpt))
    report = again.meter.report()
    assert module.batches == 0 and trainer.global_step == STOP_AT  # no batch of this fit ran
    assert report.tokens.optimizer_steps == STOP_AT and report.budget.stopped_by_budget
    assert report.budget.flops_at_stop == pytest.approx(STOP_AT * step, rel=1e-9)
