"""The Hugging Face Trainer adapter on real Trainer runs (tiny Llama, CPU).

Expected counts are independent of flopmeter: the dataset's own lengths, the batches the
collator produced, the Trainer's ``state.num_input_tokens_seen`` (``"non_padding"``) and peft's
``get_nb_trainable_parameters``.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("transformers")
pytest.importorskip("peft")

from transformers import Trainer, TrainerCallback

from flopmeter.errors import ConfigurationError
from flopmeter.integrations.hf import FlopMeterCallback
from flopmeter.report.reading import read_report
from flopmeter.report.sagemaker import sagemaker_output_path
from tests.support.batches import PAD_ID, WORD_VOCAB, RecordingCollator, TokenDataset, sequences
from tests.support.models import tiny_llama
from tests.support.text import word_tokenizer
from tests.support.trainers import hf_trainer

EPOCHS = 2
TRAIN_ROWS = sequences(24, seed=1)
EVAL_ROWS = sequences(8, seed=2)


class LogRecorder(TrainerCallback):
    """Stands in for a reporting integration (TensorBoard, W&B): keeps what on_log shows it."""

    def __init__(self) -> None:
        self.logs: list[dict[str, float]] = []

    def on_log(self, args, state, control, logs=None, **kwargs):
        self.logs.append(dict(logs or {}))


class CrashAt(TrainerCallback):
    """Kills the run at the end of a given optimizer step (after that step's checkpoint)."""

    def __init__(self, step: int | None) -> None:
        self.step = step

    def on_step_end(self, args, state, control, **kwargs):
        if self.step is not None and state.global_step == self.step:
            raise RuntimeError(f"simulated crash at step {self.step}")


#: The Trainer settings of these runs (``hf_arguments`` adds a quiet CPU run's own).
SETTINGS = dict(
    per_device_train_batch_size=4,
    per_device_eval_batch_size=4,
    gradient_accumulation_steps=2,
    num_train_epochs=EPOCHS,
    eval_strategy="steps",
    eval_steps=2,
    logging_steps=1,
    save_strategy="steps",
    save_steps=2,
    include_num_input_tokens_seen="non_padding",
    seed=0,
    remove_unused_columns=False,  # the collator tells training rows from evaluation rows
)


def run_trainer(output_dir, callbacks, *, model=None, collator=None, resume=None, **overrides):
    collator = collator or RecordingCollator()
    trainer = hf_trainer(
        output_dir,
        model=model if model is not None else tiny_llama(vocab_size=WORD_VOCAB),
        train_dataset=TokenDataset(TRAIN_ROWS),
        eval_dataset=TokenDataset(EVAL_ROWS, split="eval"),
        data_collator=collator,
        processing_class=word_tokenizer(),
        callbacks=callbacks,
        **{**SETTINGS, **overrides},
    )
    trainer.train(resume_from_checkpoint=resume)
    return trainer, collator


def meter_callback(trainer: Trainer) -> FlopMeterCallback:
    """The callback the Trainer holds now (it replaces it when restoring callback states)."""
    return next(c for c in trainer.callback_handler.callbacks if isinstance(c, FlopMeterCallback))


@pytest.fixture(scope="module")
def full_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("hf_full")
    recorder = LogRecorder()
    trainer, collator = run_trainer(out, [recorder, FlopMeterCallback()])
    return trainer, collator, recorder, out


@pytest.mark.slow
def test_tokens_equal_independent_counts_with_accumulation_padding_and_eval(full_run):
    trainer, collator, _, _ = full_run
    report = meter_callback(trainer).meter.report()
    assert report.run.status == "completed"
    # every row trained once per epoch; evaluation rows never count
    assert report.tokens.tokens_processed == EPOCHS * TokenDataset(TRAIN_ROWS).total_tokens()
    assert report.tokens.tokens_processed == sum(collator.non_padding)
    assert report.tokens.tokens_processed == trainer.state.num_input_tokens_seen
    assert report.tokens.tokens_seen == sum(collator.with_padding) > report.tokens.tokens_processed
    assert report.tokens.sequences == EPOCHS * len(TRAIN_ROWS)
    assert report.tokens.micro_batches == len(collator.non_padding) == EPOCHS * len(TRAIN_ROWS) // 4
    assert (
        report.tokens.optimizer_steps
        == trainer.state.global_step
        == report.tokens.micro_batches // 2
    )
    assert report.run.epochs == pytest.approx(EPOCHS)
    # evaluation did run during training (and was not counted above)
    assert sum("eval_loss" in entry for entry in trainer.state.log_history) >= 3
    # and it is the evaluation phase (the Trainer's evaluation loop, marked by the callback):
    # shown with its compute, never in the judged figure
    phases = {p.name: p for p in report.compute.phases}
    assert set(phases) == {"training", "evaluation"}
    assert not phases["evaluation"].counted and phases["evaluation"].calls >= 3
    assert report.verdict.judged_flops == report.compute.primary_flops


@pytest.mark.slow
def test_census_is_the_trained_model(full_run):
    trainer, _, _, _ = full_run
    report = meter_callback(trainer).meter.report()
    n = sum(p.numel() for p in trainer.model.parameters())
    assert report.model.n_total == report.model.n_trainable == n
    assert report.model.n_frozen == 0
    assert report.model.name == "LlamaForCausalLM"


@pytest.mark.slow
def test_report_written_to_output_dir(full_run):
    trainer, _, _, out = full_run
    written = json.loads((out / "flops_meter.json").read_text())
    report = meter_callback(trainer).meter.report()
    assert written["run"]["status"] == "completed"
    assert written["tokens"]["tokens_processed"] == report.tokens.tokens_processed
    assert written["compute"]["primary_flops"] == report.compute.primary_flops > 0


@pytest.mark.slow
def test_running_compute_reaches_reporters_and_log_history(full_run):
    trainer, _, recorder, _ = full_run
    train_logs = [log for log in recorder.logs if "loss" in log]
    eval_logs = [log for log in recorder.logs if "eval_loss" in log]
    assert len(train_logs) == trainer.state.global_step  # logging_steps=1
    for log in train_logs:
        # the recorder comes before the meter in callbacks=[...] and still sees the compute
        assert log["flopmeter_tokens"] == log["num_input_tokens_seen"]
        assert log["flopmeter_flops"] > 0
        assert log["flopmeter_ratio_to_threshold"] > 0
    tokens = [log["flopmeter_tokens"] for log in train_logs]
    assert tokens == sorted(tokens) and tokens[-1] == trainer.state.num_input_tokens_seen
    assert eval_logs and not any("flopmeter_tokens" in log for log in eval_logs)
    history = [h for h in trainer.state.log_history if "loss" in h]
    assert [h["flopmeter_tokens"] for h in history] == tokens


@pytest.mark.slow
@pytest.mark.parametrize("restore_callback_states", [False, True])
def test_resume_from_checkpoint_continues_counts(full_run, tmp_path, restore_callback_states):
    full, _, _, _ = full_run
    expected = meter_callback(full).meter.report()
    crashed = FlopMeterCallback()
    with pytest.raises(RuntimeError, match="simulated crash"):
        run_trainer(tmp_path, [crashed, CrashAt(5)])
    # by the time train() has raised, the file holds this run's failed report, real exception
    failed = json.loads((tmp_path / "flops_meter.json").read_text())
    assert failed["run"]["status"] == "failed"
    assert failed["run"]["error"] == "RuntimeError: simulated crash at step 5"
    assert (
        failed["run"]["run_id"] == crashed.meter.run_id and failed["tokens"]["optimizer_steps"] == 5
    )

    trainer, _ = run_trainer(
        tmp_path,
        [FlopMeterCallback()],
        resume=str(tmp_path / "checkpoint-4"),
        restore_callback_states_from_checkpoint=restore_callback_states,
    )
    resumed = meter_callback(trainer).meter.report()
    for field in ("tokens_processed", "tokens_seen", "sequences", "micro_batches"):
        assert getattr(resumed.tokens, field) == getattr(expected.tokens, field), field
    assert resumed.tokens.optimizer_steps == expected.tokens.optimizer_steps == 6
    assert resumed.tokens.tokens_processed == trainer.state.num_input_tokens_seen
    assert any("resumed" in note for note in resumed.notes)
    written = json.loads((tmp_path / "flops_meter.json").read_text())
    assert written["run"]["status"] == "completed"
    assert written["tokens"]["tokens_processed"] == expected.tokens.tokens_processed


@pytest.mark.slow
def test_resume_from_checkpoint_made_without_the_callback(tmp_path):
    with pytest.raises(RuntimeError, match="simulated crash"):
        run_trainer(tmp_path, [CrashAt(5)], num_train_epochs=2)
    collator = RecordingCollator()
    trainer, _ = run_trainer(
        tmp_path, [FlopMeterCallback()], collator=collator, resume=str(tmp_path / "checkpoint-4")
    )
    report = meter_callback(trainer).meter.report()
    # only steps 5 and 6 were measured, and the report says so instead of posing as complete:
    # a figure known to be partial gets no compute figure and no verdict, with the fix
    assert report.tokens.tokens_processed == sum(collator.non_padding) > 0
    assert report.tokens.optimizer_steps == 2
    assert any("without flopmeter counts" in note for note in report.notes)
    assert report.compute.primary_flops is None and report.verdict.outcome is None
    reason = report.compute.withheld_reason
    assert "optimizer step 4" in reason and "FlopMeterCallback saves its counts" in reason
    written = read_report(tmp_path / "flops_meter.json")
    assert written.compute.withheld_reason == reason
    # saving the next checkpoint did not trip over the callback missing from the old state
    saved = json.loads((tmp_path / "checkpoint-6" / "trainer_state.json").read_text())
    state = saved["stateful_callbacks"]["FlopMeterCallback"]["attributes"]["saved_meter_state"]
    assert state["tokens_processed"] == report.tokens.tokens_processed


@pytest.mark.slow
def test_pad_id_from_tokenizer_when_batches_have_no_mask(tmp_path, monkeypatch):
    sm_dir = tmp_path / "sm"
    monkeypatch.setenv("SM_TRAINING_ENV", "{}")
    monkeypatch.setenv("SM_OUTPUT_DIR", str(sm_dir))
    monkeypatch.delenv("FLOPS_METER_OUT", raising=False)
    collator = RecordingCollator(mask_in_batch=False)
    callback = FlopMeterCallback()
    trainer, _ = run_trainer(
        tmp_path / "out",
        [callback],
        collator=collator,
        num_train_epochs=1,
        eval_strategy="no",
        save_strategy="no",
    )
    report = callback.meter.report()
    assert callback.meter.pad_id == PAD_ID
    assert sum(collator.with_padding) > sum(collator.non_padding)  # padding was there to skip
    assert report.tokens.tokens_processed == sum(collator.non_padding)
    assert report.tokens.tokens_processed == trainer.state.num_input_tokens_seen
    # a SageMaker training job also gets the report in $SM_OUTPUT_DIR/data (uploaded to S3)
    local = json.loads((tmp_path / "out" / "flops_meter.json").read_text())
    assert json.loads((sm_dir / "data" / "flops_meter.json").read_text()) == local


@pytest.mark.slow
def test_lora_counts_are_post_peft(tmp_path, monkeypatch):
    from peft import LoraConfig, get_peft_model

    monkeypatch.setenv("PRETRAIN_FLOPS", "3e24")
    base_total = sum(p.numel() for p in tiny_llama(vocab_size=WORD_VOCAB).parameters())
    model = get_peft_model(
        tiny_llama(vocab_size=WORD_VOCAB),
        LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"]),
    )
    trainable, total = model.get_nb_trainable_parameters()
    callback = FlopMeterCallback()
    run_trainer(
        tmp_path,
        [callback],
        model=model,
        num_train_epochs=1,
        eval_strategy="no",
        save_strategy="no",
    )
    report = callback.meter.report()
    assert (report.model.n_trainable, report.model.n_total) == (trainable, total)
    assert report.model.n_frozen == total - trainable == base_total  # the base model, all frozen
    assert 0 < report.model.n_trainable < report.model.n_total // 10
    assert report.threshold.original_flops == 3e24
    assert report.threshold.original_flops_source == "environment variable PRETRAIN_FLOPS"
    assert report.threshold.kind == "one_third_of_original"


def test_bad_arguments_fail_when_the_callback_is_made(monkeypatch):
    with pytest.raises(ConfigurationError, match="pad_id"):
        FlopMeterCallback(pad_id=-1)
    with pytest.raises(ConfigurationError):
        FlopMeterCallback(pretrain_flops=-5.0)
    monkeypatch.setenv("PRETRAIN_FLOPS", "lots")
    with pytest.raises(ConfigurationError, match="PRETRAIN_FLOPS"):
        FlopMeterCallback()


@pytest.mark.slow
def test_unwritable_explicit_sagemaker_output_fails_before_training(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    callback = FlopMeterCallback(sagemaker_output=blocker / "sub" / "flops_meter.json")
    trainer = hf_trainer(
        tmp_path / "out",
        model=tiny_llama(vocab_size=WORD_VOCAB),
        train_dataset=TokenDataset(TRAIN_ROWS),
        data_collator=RecordingCollator(),
        callbacks=[callback],
        **{**SETTINGS, "eval_strategy": "no", "save_strategy": "no"},
    )
    with pytest.raises(ConfigurationError, match="cannot be written"):
        trainer.train()
    assert trainer.state.global_step == 0
    assert not trainer.model._forward_pre_hooks  # the meter never hooked the model


def test_sagemaker_output_path():
    assert sagemaker_output_path({}) is None
    assert sagemaker_output_path({"HOME": "/root"}) is None
    # where SageMaker uploads from: /opt/ml/output/data, not /opt/ml/output
    assert sagemaker_output_path({"SM_TRAINING_ENV": "{}"}) == Path(
        "/opt/ml/output/data/flops_meter.json"
    )
    assert sagemaker_output_path({"TRAINING_JOB_NAME": "job-1"}) == Path(
        "/opt/ml/output/data/flops_meter.json"
    )
    assert sagemaker_output_path({"SM_MODEL_DIR": "/opt/ml/model", "SM_OUTPUT_DIR": "/x"}) == Path(
        "/x/data/flops_meter.json"
    )
    assert sagemaker_output_path({"SM_OUTPUT_DATA_DIR": "/d", "SM_OUTPUT_DIR": "/x"}) == Path(
        "/d/flops_meter.json"
    )
    # the AWS meter's variable wins, on SageMaker or not
    assert sagemaker_output_path({"FLOPS_METER_OUT": "/y/m.json", "SM_TRAINING_ENV": "{}"}) == Path(
        "/y/m.json"
    )
