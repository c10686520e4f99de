"""Both adapters append the run's final report to the ledger (once), and the Hugging Face
callback's SageMaker drop-in: the copy SageMaker uploads, with the AWS meter's keys on request."""

from __future__ import annotations

import json

import pytest
import torch

from flopmeter.errors import ConfigurationError
from flopmeter.integrations.hf import FlopMeterCallback
from flopmeter.ledger.store import Ledger
from flopmeter.report.reading import read_report
from tests.support.batches import WORD_VOCAB, RecordingCollator, TokenDataset, sequences
from tests.support.models import tiny_llama
from tests.support.text import word_tokenizer
from tests.support.trainers import hf_trainer, lightning_module, lightning_trainer

ROWS = sequences(8, seed=3)


def _train_hf(output_dir, callback) -> RecordingCollator:
    collator = RecordingCollator()
    hf_trainer(
        output_dir,
        model=tiny_llama(vocab_size=WORD_VOCAB),
        train_dataset=TokenDataset(ROWS),
        data_collator=collator,
        processing_class=word_tokenizer(),
        callbacks=[callback],
        per_device_train_batch_size=4, num_train_epochs=1, save_strategy="no",
        eval_strategy="no", remove_unused_columns=False, logging_steps=1,
    ).train()  # fmt: skip
    return collator


@pytest.mark.slow
def test_the_hf_callback_appends_the_final_report_once(tmp_path, monkeypatch):
    for name in ("SM_TRAINING_ENV", "SM_OUTPUT_DIR", "TRAINING_JOB_NAME", "FLOPS_METER_OUT"):
        monkeypatch.delenv(name, raising=False)
    ledger = tmp_path / "ledger.sqlite"
    callback = FlopMeterCallback(ledger=ledger)
    collator = _train_hf(tmp_path / "out", callback)
    records = Ledger(ledger, create=False).records()
    assert [r.run_id for r in records] == [callback.meter.run_id]
    report = records[0].report()
    assert report["run"]["status"] == "completed"
    assert report["tokens"]["tokens_processed"] == sum(
        collator.non_padding
    )  # the collator's own count
    assert report == json.loads((tmp_path / "out" / "flops_meter.json").read_text())


@pytest.mark.slow
def test_on_sagemaker_aws_keys_puts_the_aws_file_where_sagemaker_uploads(tmp_path, monkeypatch):
    monkeypatch.setenv("TRAINING_JOB_NAME", "sft-job-7")
    monkeypatch.setenv("SM_OUTPUT_DATA_DIR", str(tmp_path / "opt-ml-output-data"))
    monkeypatch.setenv("PRETRAIN_FLOPS", "6e23")
    monkeypatch.delenv("FLOPS_METER_OUT", raising=False)
    callback = FlopMeterCallback(aws_keys=True)
    collator = _train_hf(tmp_path / "out", callback)
    uploaded = tmp_path / "opt-ml-output-data"
    aws = json.loads((uploaded / "flops_meter.json").read_text())
    full = read_report(uploaded / "flopmeter_report.json")  # the full report, strictly read
    assert full.model_dump() == read_report(tmp_path / "out" / "flops_meter.json").model_dump()
    # the AWS meter's keys, with numbers as numbers and the values of the full report
    assert aws["tokens_processed"] == sum(collator.non_padding) == full.tokens.tokens_processed
    assert aws["Flops_architecture"] == full.compute.primary_flops > 0
    assert aws["N_total"] == sum(p.numel() for p in callback.meter.model.parameters())
    assert aws["Flops_original"] == 6e23
    assert aws["pct_of_pretrain"] == pytest.approx(full.compute.primary_flops / 6e23)
    assert aws["exceeds_30pct"] is False
    assert aws["threshold_value"] == pytest.approx(2e23)
    assert aws["training_job_name"] == "sft-job-7"
    assert aws["run_id"] == callback.meter.run_id


def test_aws_keys_must_be_a_bool():
    with pytest.raises(ConfigurationError, match="aws_keys"):
        FlopMeterCallback(aws_keys="yes")


@pytest.mark.slow
def test_the_lightning_callback_appends_the_final_report_once(tmp_path):

    from flopmeter.integrations.lightning import FlopMeterCallback as LightningCallback

    ledger = tmp_path / "ledger.sqlite"
    callback = LightningCallback(ledger=ledger)
    collator = RecordingCollator()
    trainer = lightning_trainer(tmp_path, [callback], max_epochs=1)
    loader = torch.utils.data.DataLoader(TokenDataset(ROWS), batch_size=4, collate_fn=collator)
    module = lightning_module(
        tiny_llama(vocab_size=WORD_VOCAB, attn_implementation="eager"),
        lambda parameters: torch.optim.SGD(parameters, lr=1e-2),
    )
    trainer.fit(module, loader)
    records = Ledger(ledger, create=False).records()
    assert [r.run_id for r in records] == [callback.meter.run_id]
    assert records[0].report()["tokens"]["tokens_processed"] == sum(collator.non_padding)
