"""Zero-code metering of the Lightning Trainer (and a subclass): an unmodified script leaves the
report the same script edited to pass the callback leaves, the callback sits where Lightning
keeps callbacks (before the checkpoint callbacks), its checkpoint state resumes, a meter the
script makes itself is never doubled, and nothing in the attach breaks the job."""

from __future__ import annotations

import os

import pytest

pytest.importorskip("lightning")

import lightning.pytorch.trainer.trainer as trainer_module
import torch
from lightning.pytorch.callbacks import ModelCheckpoint

from flopmeter.auto import lightning as auto_lightning
from flopmeter.auto.job import read_records
from flopmeter.integrations.lightning import FlopMeterCallback
from tests.support.attached import (
    assert_each_run_named,
    counts,
    events,
    facts,
    meter_records,
    plain_run,
    report,
    report_files,
    run_script,
)
from tests.support.batches import WORD_VOCAB, RecordingCollator, TokenDataset, sequences
from tests.support.models import tiny_llama
from tests.support.trainers import lightning_module, lightning_trainer
from tests.support.zero_code import LAUNCHERS

SCRIPT = "lightning_fit.py"


@pytest.fixture
def patched(monkeypatch, tmp_path):
    """The Lightning trainer module patched as the import watch patches it, undone after the
    test; the job folder is ``tmp_path/job`` and no meter option comes from the environment."""
    for name in [k for k in os.environ if k.startswith("FLOPMETER_")]:
        monkeypatch.delenv(name)
    job = tmp_path / "job"
    job.mkdir()
    monkeypatch.setenv("FLOPMETER_JOB_DIR", str(job))
    monkeypatch.setattr(trainer_module.Trainer, "__init__", trainer_module.Trainer.__init__)
    auto_lightning.patch_trainer_module(trainer_module)
    return job


def _meter_callbacks(trainer):
    return [cb for cb in trainer.callbacks if isinstance(cb, FlopMeterCallback)]


def _fit(trainer, **fit):
    module = lightning_module(tiny_llama(vocab_size=WORD_VOCAB))
    data = torch.utils.data.DataLoader(
        TokenDataset(sequences(8, seed=7)), batch_size=4, collate_fn=RecordingCollator()
    )
    trainer.fit(module, data, **fit)
    return module


# ----------------------------------------------------------------------------- in process
def test_the_callback_goes_before_the_checkpoint_callbacks_once(patched, tmp_path):
    auto_lightning.patch_trainer_module(trainer_module)  # the watch may call it again
    trainer = lightning_trainer(tmp_path, [ModelCheckpoint(dirpath=tmp_path)], max_steps=1)
    names = [type(cb).__name__ for cb in trainer.callbacks]
    assert names.count("FlopMeterCallback") == 1
    assert names.index("FlopMeterCallback") < names.index("ModelCheckpoint")
    assert [type(cb).__name__ for cb in trainer.checkpoint_callbacks] == ["ModelCheckpoint"]
    (callback,) = _meter_callbacks(trainer)
    assert type(callback) is FlopMeterCallback
    assert callback.state_key == "FlopMeterCallback"  # the key its checkpoint state is under
    assert callback._adapter.zero_code.method == "lightning_trainer"
    assert read_records(patched) == []


def test_a_trainer_with_the_scripts_own_callback_gets_none_added(patched, tmp_path):
    own = FlopMeterCallback()
    trainer = lightning_trainer(tmp_path, [own], max_steps=1)
    assert _meter_callbacks(trainer) == [own]
    (record,) = read_records(patched)
    assert record["event"] == "explicit"


@pytest.mark.slow
def test_the_zero_code_state_resumes_in_process(patched, tmp_path):
    first = lightning_trainer(
        tmp_path / "a", [ModelCheckpoint(dirpath=tmp_path / "a")], max_epochs=1
    )
    _fit(first)
    (callback,) = _meter_callbacks(first)
    saved = callback.state_dict()
    (ckpt,) = (tmp_path / "a").glob("*.ckpt")
    stored = torch.load(ckpt, weights_only=False)["callbacks"]["FlopMeterCallback"]
    # Lightning saved the zero-code callback's counts under its class name
    assert stored["meter"]["tokens_processed"] == saved["meter"]["tokens_processed"] > 0

    second = lightning_trainer(tmp_path / "b", [], max_epochs=2)
    _fit(second, ckpt_path=str(ckpt))
    whole = report(tmp_path / "b")
    # 8 rows in batches of 4, no accumulation: two optimizer steps an epoch
    per_epoch = TokenDataset(sequences(8, seed=7)).total_tokens()
    assert report(tmp_path / "a")["tokens"]["tokens_processed"] == per_epoch
    assert whole["tokens"]["tokens_processed"] == 2 * per_epoch  # continued, not restarted
    assert whole["tokens"]["optimizer_steps"] == 4
    assert whole["compute"]["withheld_reason"] is None
    assert whole["attach"]["method"] == "lightning_trainer"


@pytest.mark.slow
def test_the_scripts_callback_added_after_init_wins(patched, tmp_path):
    trainer = lightning_trainer(tmp_path, [], max_steps=2)
    own = FlopMeterCallback()
    trainer.callbacks.append(own)  # after __init__: the zero-code one is there already
    _fit(trainer)
    assert _meter_callbacks(trainer) == [own]  # the zero-code one left at on_train_start
    assert own.meter is not None and own.meter.attach is None
    assert [r["event"] for r in read_records(patched)] == ["explicit"]
    written = report(tmp_path)
    assert written["attach"] is None
    assert written["tokens"]["optimizer_steps"] == 2


@pytest.mark.slow
def test_a_failing_callback_constructor_leaves_the_trainer_working(patched, tmp_path, monkeypatch):
    def broken(self, *args, **kwargs):
        raise RuntimeError("no meter today")

    monkeypatch.setattr(FlopMeterCallback, "__init__", broken)
    trainer = lightning_trainer(tmp_path, [], max_steps=2)
    assert _meter_callbacks(trainer) == []
    _fit(trainer)
    assert trainer.global_step == 2
    (record,) = read_records(patched)
    assert record["event"] == "problem"
    assert record["detail"] == "RuntimeError: no meter today"


@pytest.mark.slow
def test_a_failing_hook_ends_the_meter_and_leaves_training_to_finish(patched, tmp_path):
    trainer = lightning_trainer(tmp_path, [], max_steps=2)
    (callback,) = _meter_callbacks(trainer)

    def broken(*args):
        raise ValueError("a broken hook")

    callback._plan_budget = broken  # called inside on_train_start, after the meter started
    module = _fit(trainer)
    assert trainer.global_step == 2
    assert module.batches == 2
    assert [r["event"] for r in read_records(patched)] == ["attached", "problem"]
    written = report(tmp_path)
    assert written["run"]["status"] == "failed"
    assert "a broken hook" in str(written["run"]["error"])


# ----------------------------------------------------------------------------- subprocesses
@pytest.mark.slow
@pytest.mark.parametrize("launcher", LAUNCHERS)
def test_an_unmodified_script_reports_what_the_edited_one_does(tmp_path, shared_runs, launcher):
    plain_run(shared_runs, SCRIPT, tmp_path / "edited", "--edited")
    job = tmp_path / "job"
    run_script(SCRIPT, tmp_path / "auto", launcher=launcher, job=job)

    edited, auto = report(tmp_path / "edited"), report(tmp_path / "auto")
    assert counts(auto) == counts(edited)
    assert auto["tokens"]["tokens_seen"] > auto["tokens"]["tokens_processed"] > 0  # padding
    assert auto["tokens"]["micro_batches"] == 2 * auto["tokens"]["optimizer_steps"] == 16
    assert edited["attach"] is None
    attach = auto["attach"]
    assert attach["method"] == "lightning_trainer"
    assert attach["launcher"] == launcher
    assert attach["trainer_class"] == "lightning.pytorch.trainer.trainer.Trainer"
    assert attach["model_class"].endswith("CausalLM")  # the LightningModule, not a view of it
    assert facts(tmp_path / "auto")["callbacks"] == ["FlopMeterCallback", "ModelCheckpoint"]
    (attached,) = meter_records(job)
    assert attached["event"] == "attached"
    assert attached["report"] == str((tmp_path / "auto" / "flops_meter.json").resolve())


@pytest.mark.slow
@pytest.mark.parametrize("launcher", ["environment"])  # one launcher: the attach is the same
def test_the_edited_script_under_zero_code_is_metered_once(tmp_path, shared_runs, launcher):
    plain_run(shared_runs, SCRIPT, tmp_path / "plain", "--edited")
    job = tmp_path / "job"
    run_script(SCRIPT, tmp_path / "both", "--edited", launcher=launcher, job=job)

    assert counts(report(tmp_path / "both")) == counts(report(tmp_path / "plain"))
    assert report(tmp_path / "both")["attach"] is None
    assert report_files(tmp_path / "both") == ["flops_meter.json"]
    assert facts(tmp_path / "both")["callbacks"].count("FlopMeterCallback") == 1
    assert events(job) == ["explicit"]


@pytest.mark.slow
@pytest.mark.parametrize("launcher", ["flopmeter run"])  # one launcher: the attach is the same
def test_a_flopmeter_around_fit_under_zero_code_is_not_doubled(tmp_path, shared_runs, launcher):
    plain_run(shared_runs, SCRIPT, tmp_path / "plain", "--with-meter")
    job = tmp_path / "job"
    run_script(SCRIPT, tmp_path / "auto", "--with-meter", launcher=launcher, job=job)

    own = report(tmp_path / "auto" / "own_meter.json")
    assert counts(own) == counts(report(tmp_path / "plain" / "own_meter.json"))
    assert own["attach"] is None
    assert own["tokens"]["tokens_processed"] > 0
    assert report_files(tmp_path / "auto") == ["own_meter.json"]
    (record,) = meter_records(job)
    assert record["event"] == "explicit"
    assert record["report"] == str((tmp_path / "auto" / "own_meter.json").resolve())


@pytest.mark.slow
@pytest.mark.parametrize("launcher", ["environment"])  # one launcher: the attach is the same
def test_a_trainer_subclass_and_a_resume_under_zero_code(tmp_path, shared_runs, launcher):
    """A subclass of the script's own is attached; a checkpoint it saved under zero-code
    continues the counts when the edited script resumes from it."""
    plain_run(shared_runs, SCRIPT, tmp_path / "whole", "--edited")
    out = tmp_path / "out"
    run_script(SCRIPT, out, "--subclass", "--epochs", "1", launcher=launcher)
    first = report(out)
    assert first["attach"]["trainer_class"] == "__main__.MyTrainer"
    assert first["tokens"]["optimizer_steps"] == 4
    run_script(SCRIPT, out, "--edited", "--ckpt", str(out / "last.ckpt"), launcher=None)

    resumed = report(out)
    assert facts(out)["global_step"] == 8
    assert counts(resumed) == counts(report(tmp_path / "whole"))
    assert resumed["compute"]["withheld_reason"] is None


@pytest.mark.slow
@pytest.mark.parametrize("launcher", ["environment"])  # one launcher: the attach is the same
def test_fit_twice_keeps_each_run_s_report_and_the_job_s_end_names_and_sums_them(
    tmp_path, shared_runs, launcher
):
    """Two fits in one process, each with a trainer of its own in the same folder (before: the
    job's end named the second fit's report only)."""
    alone = plain_run(shared_runs, SCRIPT, tmp_path / "edited", "--edited")
    out = tmp_path / "auto"
    done = run_script(SCRIPT, out, "--fits", "2", launcher=launcher)
    two_epochs = 2 * TokenDataset(sequences(32, seed=7)).total_tokens()
    assert_each_run_named(done, out, 2, two_epochs, alone)
