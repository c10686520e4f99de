"""The Lightning adapter on real ``Trainer.fit`` runs (tiny Llama in a LightningModule, CPU).

Expected counts come from the dataset's lengths and from what the collators produced; expected
FLOP from PyTorch's own counter (``FlopCounterMode``) over each training sequence.
"""

from __future__ import annotations

import csv
import json
from itertools import accumulate

import pytest

pytest.importorskip("lightning")
pytest.importorskip("transformers")

import lightning.pytorch as pl
import torch
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.loggers import CSVLogger
from transformers import LlamaForCausalLM

from flopmeter.errors import ConfigurationError
from flopmeter.flops import capture as profile
from flopmeter.integrations.lightning import FlopMeterCallback
from tests.support.batches import PAD_ID, WORD_VOCAB, RecordingCollator, TokenDataset, sequences
from tests.support.models import tiny_llama_config
from tests.support.trainers import lightning_trainer
from tests.support.truth import sequence_truth

EPOCHS = 2
TRAIN_ROWS = sequences(24, seed=5)
VAL_ROWS = sequences(8, seed=6)
BATCH = 4
ACCUMULATE = 2


class CausalLM(pl.LightningModule):
    """Calls its inner Hugging Face model from ``training_step`` (never ``self(...)``)."""

    def __init__(self, model: torch.nn.Module | None = None, crash_at_step: int | None = None):
        super().__init__()
        torch.manual_seed(0)
        if model is None:
            model = LlamaForCausalLM(
                tiny_llama_config(vocab_size=WORD_VOCAB, attn_implementation="eager")
            )
        self.model = model
        self.crash_at_step = crash_at_step

    def training_step(self, batch, batch_idx):
        if self.crash_at_step is not None and self.global_step == self.crash_at_step:
            raise RuntimeError(f"simulated crash at step {self.crash_at_step}")
        if isinstance(batch, (tuple, list)):
            ids, labels = batch
            return self.model(input_ids=ids, labels=labels).loss
        return self.model(**batch).loss

    def validation_step(self, batch, batch_idx):
        return self.model(**batch).loss

    def configure_optimizers(self):
        return torch.optim.AdamW([p for p in self.parameters() if p.requires_grad], lr=1e-3)


def loader(rows, collator, **kwargs):
    return torch.utils.data.DataLoader(
        TokenDataset(rows), batch_size=BATCH, collate_fn=collator, **kwargs
    )


def fit(root, callback, *, module=None, ckpt_path=None, **overrides):
    train_collator, val_collator = RecordingCollator(), RecordingCollator()
    options = dict(
        max_epochs=EPOCHS,
        accumulate_grad_batches=ACCUMULATE,
        val_check_interval=2,
        logger=CSVLogger(str(root)),
        log_every_n_steps=1,
    )
    options.update(overrides)
    trainer = lightning_trainer(
        root,
        [callback, ModelCheckpoint(dirpath=str(root / "ckpt"), every_n_epochs=1, save_top_k=-1)],
        **options,
    )
    trainer.fit(
        module if module is not None else CausalLM(),
        loader(TRAIN_ROWS, train_collator),
        loader(VAL_ROWS, val_collator),
        ckpt_path=ckpt_path,
    )
    return trainer, train_collator, val_collator


class CountingProfiler:
    """Counts the profilers the meter starts (each walks and hooks every module)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.started = 0
        start = profile.Profiler.start

        def counting(profiler):
            self.started += 1
            return start(profiler)

        monkeypatch.setattr(profile.Profiler, "start", counting)


@pytest.fixture(scope="module")
def full_run(tmp_path_factory):
    root = tmp_path_factory.mktemp("pl_full")
    callback = FlopMeterCallback()
    with pytest.MonkeyPatch.context() as monkeypatch:
        profilers = CountingProfiler(monkeypatch)
        trainer, train_collator, val_collator = fit(root, callback)
    callback.profilers_started = profilers.started
    return trainer, callback, train_collator, val_collator, root


@pytest.mark.slow
def test_tokens_equal_independent_counts_with_accumulation_padding_and_validation(full_run):
    trainer, callback, train_collator, val_collator, _ = full_run
    report = callback.meter.report()
    assert report.run.status == "completed"
    assert report.tokens.tokens_processed == EPOCHS * TokenDataset(TRAIN_ROWS).total_tokens()
    assert report.tokens.tokens_processed == sum(train_collator.non_padding)
    assert (
        report.tokens.tokens_seen
        == sum(train_collator.with_padding)
        > report.tokens.tokens_processed
    )
    assert report.tokens.sequences == EPOCHS * len(TRAIN_ROWS)
    assert (
        report.tokens.micro_batches
        == len(train_collator.non_padding)
        == EPOCHS * len(TRAIN_ROWS) // BATCH
    )
    assert (
        report.tokens.optimizer_steps
        == trainer.global_step
        == report.tokens.micro_batches // ACCUMULATE
    )
    assert report.run.epochs == EPOCHS
    # validation (with the sanity check) ran during training and was not counted
    assert len(val_collator.non_padding) > 2 * EPOCHS


@pytest.mark.slow
def test_flops_are_the_training_steps_forward_and_backward(full_run):
    trainer, callback, _, _, _ = full_run
    module = trainer.lightning_module
    report = callback.meter.report()
    assert report.compute.primary_estimate == "transformer"
    assert not any("not recognised" in n for n in report.notes)
    # every training row once per epoch, forward and backward; validation rows not at all
    truth = EPOCHS * sequence_truth(module.model, TRAIN_ROWS)
    transformer = report.compute.estimates["transformer"]
    assert transformer.flops == pytest.approx(truth, rel=1e-9)
    assert report.compute.primary_flops == transformer.flops
    # dispatch-level samples of whole micro-batches (forward and backward) agree
    measured = report.compute.estimates["measured"]
    assert measured.flops is not None
    assert measured.inputs["samples"] >= 2
    assert measured.flops == pytest.approx(truth, rel=1e-6)
    # the model was profiled once, not on every micro-batch
    assert callback.profilers_started == 1
    # the module's own training_step is back
    assert "training_step" not in vars(module)


@pytest.mark.slow
def test_census_and_report_file(full_run):
    trainer, callback, _, _, root = full_run
    report = callback.meter.report()
    n = sum(p.numel() for p in trainer.lightning_module.parameters())
    assert report.model.n_total == report.model.n_trainable == n
    assert report.model.name == "CausalLM"
    written = json.loads((root / "flops_meter.json").read_text())
    assert written["run"]["status"] == "completed"
    assert written["tokens"]["tokens_processed"] == report.tokens.tokens_processed


@pytest.mark.slow
def test_running_compute_goes_to_the_trainers_logger(full_run):
    trainer, _, train_collator, _, _ = full_run
    trainer.logger.save()
    with open(f"{trainer.logger.log_dir}/metrics.csv", newline="") as f:
        rows = [r for r in csv.DictReader(f) if r.get("flopmeter/tokens")]
    logged = {int(r["step"]): float(r["flopmeter/tokens"]) for r in rows}
    # after optimizer step s, the first ACCUMULATE * s training batches have been fed
    fed = list(accumulate(train_collator.non_padding))
    expected = {s: float(fed[ACCUMULATE * s - 1]) for s in range(1, trainer.global_step + 1)}
    assert logged == expected
    assert all(float(r["flopmeter/flops"]) > 0 for r in rows)


@pytest.mark.slow
def test_resume_with_ckpt_path_continues_counts(full_run, tmp_path):
    _, full_callback, _, _, _ = full_run
    expected = full_callback.meter.report()
    crashed, crashing = FlopMeterCallback(), CausalLM(crash_at_step=5)
    with pytest.raises(RuntimeError, match="simulated crash"):
        fit(tmp_path, crashed, module=crashing)
    assert "training_step" not in vars(crashing)  # put back on the exception too
    assert json.loads((tmp_path / "flops_meter.json").read_text())["run"]["status"] == "failed"

    callback = FlopMeterCallback()
    fit(tmp_path, callback, ckpt_path=str(tmp_path / "ckpt" / "epoch=0-step=3.ckpt"))
    resumed = callback.meter.report()
    for field in ("tokens_processed", "tokens_seen", "sequences", "micro_batches"):
        assert getattr(resumed.tokens, field) == getattr(expected.tokens, field), field
    assert resumed.tokens.optimizer_steps == expected.tokens.optimizer_steps == 6
    assert resumed.compute.primary_estimate == "transformer"
    assert resumed.compute.primary_flops == pytest.approx(expected.compute.primary_flops, rel=1e-9)
    written = json.loads((tmp_path / "flops_meter.json").read_text())
    assert (written["run"]["status"], written["tokens"]["tokens_processed"]) == (
        "completed",
        expected.tokens.tokens_processed,
    )


@pytest.mark.slow
def test_tuple_batches_without_mask_use_pad_id_and_lora_counts(tmp_path):
    from peft import LoraConfig, get_peft_model

    class TupleCollator(RecordingCollator):
        def __call__(self, rows):
            batch = super().__call__(rows)
            return batch["input_ids"], batch["labels"]

    torch.manual_seed(0)
    peft_model = get_peft_model(
        LlamaForCausalLM(tiny_llama_config(vocab_size=WORD_VOCAB, attn_implementation="eager")),
        LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"]),
    )
    trainable, total = peft_model.get_nb_trainable_parameters()
    collator = TupleCollator(mask_in_batch=False)
    callback = FlopMeterCallback(pad_id=PAD_ID)
    trainer = lightning_trainer(
        tmp_path, [callback], max_epochs=1, accumulate_grad_batches=ACCUMULATE
    )
    trainer.fit(CausalLM(model=peft_model), loader(TRAIN_ROWS, collator))
    report = callback.meter.report()
    assert sum(collator.with_padding) > sum(collator.non_padding)
    assert report.tokens.tokens_processed == sum(collator.non_padding)
    assert (report.model.n_trainable, report.model.n_total) == (trainable, total)
    assert report.model.n_trainable < report.model.n_total // 10
    # LoRA: frozen base weights get no weight gradient, which the count follows
    assert report.compute.primary_estimate == "transformer"
    assert report.compute.primary_flops == pytest.approx(
        sequence_truth(peft_model, TRAIN_ROWS), rel=1e-9
    )


def test_bad_arguments_fail_when_the_callback_is_made(monkeypatch):
    with pytest.raises(ConfigurationError, match="pad_id"):
        FlopMeterCallback(pad_id="0")
    monkeypatch.setenv("PRETRAIN_FLOPS", "-1")
    with pytest.raises(ConfigurationError, match="PRETRAIN_FLOPS"):
        FlopMeterCallback()


class ManualCausalLM(CausalLM):
    """Manual optimization: backward and step inside ``training_step``, which returns None."""

    def __init__(self):
        super().__init__()
        self.automatic_optimization = False

    def training_step(self, batch, batch_idx):
        optimizer = self.optimizers()
        optimizer.zero_grad()
        self.manual_backward(self.model(**batch).loss)
        optimizer.step()


@pytest.mark.slow
def test_manual_optimization_returning_none_is_profiled(tmp_path):
    collator = RecordingCollator()
    callback = FlopMeterCallback()
    module = ManualCausalLM()
    trainer = lightning_trainer(tmp_path, [callback], max_epochs=1)
    trainer.fit(module, loader(TRAIN_ROWS, collator))
    report = callback.meter.report()
    assert report.tokens.tokens_processed == sum(collator.non_padding)
    assert report.tokens.optimizer_steps == report.tokens.micro_batches == len(TRAIN_ROWS) // BATCH
    # a None output is not read as a failed forward pass: the profile is taken
    assert report.compute.estimates["transformer"].flops == pytest.approx(
        sequence_truth(module.model, TRAIN_ROWS), rel=1e-9
    )
    # backward and step inside training_step: no sample can close on the step's output
    measured = report.compute.estimates["measured"]
    assert measured.flops is None
    assert any("no backward pass seen before the step" in n for n in measured.notes)
    # so no dispatch-level count checks the figure: withheld, naming why
    assert report.compute.primary_estimate is None and report.verdict.outcome is None
    assert "no backward pass seen before the step" in (report.compute.withheld_reason or "")
    assert "training_step" not in vars(module)
