"""Zero-code metering of the Hugging Face Trainer (and TRL, and a subclass): an unmodified
script leaves the report the same script edited to pass the callback leaves, a meter the script
makes itself is never doubled, and nothing in the attach breaks the job."""

from __future__ import annotations

import json
import os

import pytest

pytest.importorskip("peft")

import transformers.trainer
from peft import LoraConfig, get_peft_model

from flopmeter.auto import hf as auto_hf
from flopmeter.auto.job import read_records
from flopmeter.integrations.hf import FlopMeterCallback
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
from tests.support.trainers import hf_trainer
from tests.support.zero_code import LAUNCHERS

SCRIPT = "hf_train.py"


@pytest.fixture
def patched(monkeypatch, tmp_path):
    """``transformers.trainer`` patched as the import watch patches it, undone after the test;
    the job folder is ``tmp_path/job`` and no meter option comes from the environment."""
    for name in [k for k in os.environ if k.startswith("FLOPMETER_")]:
        monkeypatch.delenv(name)
    job = tmp_path / "job"
    job.mkdir()
    monkeypatch.setenv("FLOPMETER_JOB_DIR", str(job))
    monkeypatch.setattr(
        transformers.trainer.Trainer, "__init__", transformers.trainer.Trainer.__init__
    )
    auto_hf.patch_trainer_module(transformers.trainer)
    return job


def _trainer(out, callbacks=(), **settings):
    model = get_peft_model(
        tiny_llama(vocab_size=WORD_VOCAB), LoraConfig(r=4, target_modules=["q_proj"])
    )
    return hf_trainer(
        out,
        model=model,
        train_dataset=TokenDataset(sequences(8, seed=7)),
        data_collator=RecordingCollator(),
        callbacks=list(callbacks),
        remove_unused_columns=False,
        **{"per_device_train_batch_size": 4, "max_steps": 2, "save_strategy": "no", **settings},
    )


def _meter_callbacks(trainer):
    return [cb for cb in trainer.callback_handler.callbacks if isinstance(cb, FlopMeterCallback)]


# ----------------------------------------------------------------------------- in process
def test_the_patch_adds_one_zero_code_callback_and_is_idempotent(patched, tmp_path):
    wrapped = transformers.trainer.Trainer.__init__
    auto_hf.patch_trainer_module(transformers.trainer)  # the watch may call it again
    assert transformers.trainer.Trainer.__init__ is wrapped
    trainer = _trainer(tmp_path / "out")
    (callback,) = _meter_callbacks(trainer)
    assert type(callback) is FlopMeterCallback  # the class checkpoints name its state by
    assert callback._adapter.zero_code.method == "hf_trainer"
    assert getattr(trainer.train, "_flopmeter_wrapped", False)  # what on_init_end would do
    assert read_records(patched) == []  # nothing is recorded before its meter starts


def test_a_trainer_with_the_scripts_own_callback_gets_none_added(patched, tmp_path):
    own = FlopMeterCallback()
    trainer = _trainer(tmp_path / "out", callbacks=[own])
    assert _meter_callbacks(trainer) == [own]
    assert own._adapter.zero_code is None
    (record,) = read_records(patched)
    assert record["event"] == "explicit"
    assert record["trainer_class"] == "transformers.trainer.Trainer"


def test_the_environments_options_reach_the_callback(patched, tmp_path, monkeypatch):
    monkeypatch.setenv("FLOPMETER_PAD_ID", "5")
    monkeypatch.setenv("FLOPMETER_OUTPUT", str(tmp_path / "elsewhere.json"))
    (callback,) = _meter_callbacks(_trainer(tmp_path / "out"))
    given = callback._adapter.options.given_values()
    assert given["pad_id"] == 5
    assert os.fspath(given["output"]) == str(tmp_path / "elsewhere.json")


def test_a_module_the_patch_does_not_know_is_recorded_not_raised(patched):
    class Odd:
        __name__ = "transformers.trainer"

    auto_hf.patch_trainer_module(Odd())  # type: ignore[arg-type]  # no Trainer in it
    (record,) = read_records(patched)
    assert record["event"] == "problem"
    assert "AttributeError" in record["detail"]


@pytest.mark.slow
def test_a_failing_callback_constructor_leaves_the_trainer_working(patched, tmp_path, monkeypatch):
    def broken(self, *args, **kwargs):
        raise RuntimeError("no meter today")

    monkeypatch.setattr(FlopMeterCallback, "__init__", broken)
    trainer = _trainer(tmp_path / "out")
    assert _meter_callbacks(trainer) == []
    trainer.train()
    assert trainer.state.global_step == 2
    (record,) = read_records(patched)
    assert record["event"] == "problem"
    assert record["detail"] == "RuntimeError: no meter today"
    assert not (tmp_path / "out" / "flops_meter.json").exists()


@pytest.mark.slow
def test_a_failing_event_ends_the_meter_and_leaves_training_to_finish(patched, tmp_path):
    trainer = _trainer(tmp_path / "out", logging_steps=1)
    (callback,) = _meter_callbacks(trainer)
    original = callback._sync_point
    calls = []

    def sync_point(*args):
        calls.append(1)
        if len(calls) == 1:
            raise ValueError("a broken refresh")
        return original(*args)

    callback._sync_point = sync_point
    trainer.train()
    assert trainer.state.global_step == 2
    assert len(calls) == 1  # after the failure the callback does nothing more
    assert [r["event"] for r in read_records(patched)] == ["attached", "problem"]
    written = report(tmp_path / "out")
    assert written["run"]["status"] == "failed"  # the meter ended with the failure, said so
    assert "a broken refresh" in str(written["run"]["error"])


@pytest.mark.slow
def test_the_scripts_callback_added_after_init_wins(patched, tmp_path):
    trainer = _trainer(tmp_path / "out", save_strategy="steps", save_steps=2)
    own = FlopMeterCallback()
    trainer.add_callback(own)  # after __init__: the zero-code one is there already
    trainer.train()
    assert _meter_callbacks(trainer) == [own]  # the zero-code one left at on_train_begin
    assert own.meter is not None and own.meter.attach is None
    assert [r["event"] for r in read_records(patched)] == ["explicit"]
    written = report(tmp_path / "out")
    assert written["attach"] is None
    assert written["tokens"]["optimizer_steps"] == 2
    saved = json.loads((tmp_path / "out" / "checkpoint-2" / "trainer_state.json").read_text())
    entry = saved["stateful_callbacks"]["FlopMeterCallback"]
    # one state, the script's callback's counts (a resume reads them)
    assert (
        entry["attributes"]["saved_meter_state"]["tokens_processed"]
        == (written["tokens"]["tokens_processed"])
    )


# ----------------------------------------------------------------------------- subprocesses
@pytest.mark.slow
@pytest.mark.parametrize("launcher", LAUNCHERS)
@pytest.mark.parametrize("kind", ["lora", "sft"])
def test_an_unmodified_script_reports_what_the_edited_one_does(
    tmp_path, shared_runs, launcher, kind
):
    trainer = ("--trainer", kind) if kind != "lora" else ()  # lora: the script's default
    plain_run(shared_runs, SCRIPT, tmp_path / "edited", *trainer, "--edited")
    job = tmp_path / "job"
    run_script(SCRIPT, tmp_path / "auto", "--trainer", kind, launcher=launcher, job=job)

    edited, auto = report(tmp_path / "edited"), report(tmp_path / "auto")
    assert counts(auto) == counts(edited)
    assert auto["tokens"]["tokens_processed"] > 0
    assert auto["tokens"]["tokens_seen"] > auto["tokens"]["tokens_processed"]  # padding
    assert edited["attach"] is None
    attach = auto["attach"]
    assert attach["method"] == "hf_trainer"
    assert attach["launcher"] == launcher
    assert attach["unseen_micro_batches"] is False
    trainer_class = "trl.trainer.sft_trainer.SFTTrainer" if kind == "sft" else "transformers."
    assert attach["trainer_class"].startswith(trainer_class)
    assert attach["model_class"].startswith("peft.peft_model.PeftModel")  # after PEFT wrapping
    assert attach["found"].endswith(": " + attach["model_class"].rsplit(".", 1)[1])
    (attached,) = meter_records(job)
    assert attached["event"] == "attached"
    assert attached["report"] == str((tmp_path / "auto" / "flops_meter.json").resolve())
    assert attached["method"] == "hf_trainer"


@pytest.mark.slow
@pytest.mark.parametrize("launcher", ["flopmeter run"])  # one launcher: the attach is the same
def test_the_edited_script_under_zero_code_is_metered_once(tmp_path, shared_runs, launcher):
    plain_run(shared_runs, SCRIPT, tmp_path / "plain", "--edited")
    job = tmp_path / "job"
    run_script(SCRIPT, tmp_path / "both", "--edited", launcher=launcher, job=job)

    assert counts(report(tmp_path / "both")) == counts(report(tmp_path / "plain"))
    assert report(tmp_path / "both")["attach"] is None  # the script's own callback's report
    assert report_files(tmp_path / "both") == ["flops_meter.json"]
    assert facts(tmp_path / "both")["callbacks"].count("FlopMeterCallback") == 1
    assert events(job) == ["explicit"]


@pytest.mark.slow
@pytest.mark.parametrize("launcher", ["environment"])  # one launcher: the attach is the same
def test_a_flopmeter_around_train_under_zero_code_is_not_doubled(tmp_path, shared_runs, launcher):
    plain_run(shared_runs, SCRIPT, tmp_path / "plain", "--with-meter")
    job = tmp_path / "job"
    run_script(SCRIPT, tmp_path / "auto", "--with-meter", launcher=launcher, job=job)

    own = report(tmp_path / "auto" / "own_meter.json")
    assert counts(own) == counts(report(tmp_path / "plain" / "own_meter.json"))
    assert own["attach"] is None
    assert own["tokens"]["tokens_processed"] > 0
    assert report_files(tmp_path / "auto") == ["own_meter.json"]  # the zero-code one stood down
    (record,) = meter_records(job)
    assert record["event"] == "explicit"
    assert record["report"] == str((tmp_path / "auto" / "own_meter.json").resolve())


@pytest.mark.slow
@pytest.mark.parametrize("launcher", ["flopmeter run"])  # one launcher: the attach is the same
def test_a_trainer_subclass_of_the_scripts_own_is_attached(tmp_path, shared_runs, launcher):
    plain_run(shared_runs, SCRIPT, tmp_path / "edited", "--edited")
    run_script(SCRIPT, tmp_path / "auto", "--trainer", "subclass", launcher=launcher)

    auto = report(tmp_path / "auto")
    assert auto["attach"]["trainer_class"] == "__main__.MyTrainer"
    assert counts(auto) == counts(report(tmp_path / "edited"))  # same training, same counts


@pytest.mark.slow
@pytest.mark.parametrize("launcher", LAUNCHERS)
@pytest.mark.parametrize("resumed_by", ["zero-code", "edited"])
def test_a_checkpoint_saved_under_zero_code_continues_the_counts(
    tmp_path, shared_runs, launcher, resumed_by
):
    plain_run(shared_runs, SCRIPT, tmp_path / "whole", "--edited")
    out = tmp_path / "out"
    run_script(SCRIPT, out, "--max-steps", "2", "--save-steps", "2", launcher=launcher)
    assert (out / "checkpoint-2").is_dir()
    if resumed_by == "zero-code":
        run_script(SCRIPT, out, "--resume", launcher=launcher)
    else:
        run_script(SCRIPT, out, "--resume", "--edited", launcher=None)

    assert facts(out)["global_step"] == 4
    resumed = report(out)
    assert counts(resumed) == counts(report(tmp_path / "whole"))
    assert resumed["compute"]["withheld_reason"] is None
    assert (resumed["attach"] is None) == (resumed_by == "edited")


@pytest.mark.slow
@pytest.mark.parametrize("launcher", ["environment"])  # one launcher: the attach is the same
def test_a_stood_down_callback_resumed_from_a_checkpoint_without_it_saves(tmp_path, launcher):
    """transformers fails at save time for a stateful callback its resumed state lacks: the
    zero-code callback that stood down for the script's FlopMeter keeps its entry."""
    out = tmp_path / "out"
    run_script(SCRIPT, out, "--max-steps", "2", "--save-steps", "2", launcher=None)
    job = tmp_path / "job"
    run_script(
        SCRIPT, out, "--with-meter", "--resume", "--save-steps", "2", launcher=launcher, job=job
    )

    assert facts(out)["global_step"] == 4
    assert (out / "checkpoint-4" / "trainer_state.json").is_file()
    assert report_files(out) == ["own_meter.json"]
    assert events(job) == ["explicit"]


@pytest.mark.slow
@pytest.mark.parametrize(
    ("twice", "launcher"), [("--runs", "environment"), ("--trainers", "flopmeter run")]
)
def test_two_runs_in_one_process_each_keep_a_report_the_job_s_end_names_and_sums(
    tmp_path, shared_runs, twice, launcher
):
    """``trainer.train()`` twice, and two Trainers, in one process (before: the second run's
    report was the one the job's end named, half the job's tokens missing)."""
    alone = plain_run(shared_runs, SCRIPT, tmp_path / "edited", "--edited")
    out = tmp_path / "auto"
    done = run_script(SCRIPT, out, twice, "2", launcher=launcher)
    epoch = TokenDataset(sequences(32, seed=7)).total_tokens()  # each run: one epoch of them
    assert_each_run_named(done, out, 2, epoch, alone)
