"""TRL's SFTTrainer runs unchanged with the Hugging Face callback, LoRA applied by TRL itself."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("trl")
pytest.importorskip("peft")

from datasets import Dataset
from peft import LoraConfig

from flopmeter.integrations.hf import FlopMeterCallback
from tests.support.batches import WORD_VOCAB
from tests.support.models import tiny_llama
from tests.support.text import texts, word_tokenizer
from tests.support.trainers import sft_trainer

pytestmark = pytest.mark.slow

EPOCHS = 2


def test_sft_trainer_with_peft_config(tmp_path):
    tokenizer = word_tokenizer()
    model = tiny_llama(vocab_size=WORD_VOCAB, eos_token_id=tokenizer.eos_token_id)
    base_total = sum(p.numel() for p in model.parameters())
    callback = FlopMeterCallback()
    trainer = sft_trainer(
        tmp_path,
        model=model,
        train_dataset=Dataset.from_dict({"text": texts(16, seed=3)}),
        eval_dataset=Dataset.from_dict({"text": texts(4, seed=4)}),
        processing_class=tokenizer,
        peft_config=LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"]),
        callbacks=[callback],
        per_device_train_batch_size=4,
        gradient_accumulation_steps=2,
        num_train_epochs=EPOCHS,
        max_length=32,
        eval_strategy="steps",
        eval_steps=2,
        logging_steps=1,
        save_strategy="no",
        include_num_input_tokens_seen="non_padding",
    )
    trainer.train()

    report = callback.meter.report()
    # what TRL tokenized (with its EOS and truncation), once per epoch; evaluation not counted
    lengths = [len(ids) for ids in trainer.train_dataset["input_ids"]]
    assert report.tokens.tokens_processed == EPOCHS * sum(lengths)
    assert report.tokens.tokens_processed == trainer.state.num_input_tokens_seen
    assert report.tokens.sequences == EPOCHS * len(lengths)
    # the model TRL wrapped with LoRA, not the one handed to SFTTrainer
    trainable, total = trainer.model.get_nb_trainable_parameters()
    assert (report.model.n_trainable, report.model.n_total) == (trainable, total)
    assert report.model.n_frozen == total - trainable == base_total
    assert report.model.n_trainable < report.model.n_total // 10
    assert callback.meter.pad_id == tokenizer.pad_token_id
    # TRL turns activation checkpointing on by default: recomputed forwards did not count twice
    assert trainer.args.gradient_checkpointing
    written = json.loads((tmp_path / "flops_meter.json").read_text())
    assert written["tokens"]["tokens_processed"] == report.tokens.tokens_processed
    assert written["model"]["n_trainable"] == trainable


def test_sft_trainer_full_fine_tuning_with_its_defaults_is_cross_checked(tmp_path):
    """TRL's defaults on full fine-tuning: the fused LM head (a custom autograd function that
    recomputes the logits in its backward) and activation checkpointing. The measured samples
    are kept, and the cross-check agrees with the transformer estimate."""
    tokenizer = word_tokenizer()
    model = tiny_llama(vocab_size=WORD_VOCAB, eos_token_id=tokenizer.eos_token_id)
    callback = FlopMeterCallback(measure_every=1)
    trainer = sft_trainer(
        tmp_path,
        model=model,
        train_dataset=Dataset.from_dict({"text": texts(16, seed=3)}),
        processing_class=tokenizer,
        peft_config=None,
        callbacks=[callback],
        per_device_train_batch_size=4,
        num_train_epochs=1,
        max_length=32,
        save_strategy="no",
    )
    trainer.train()
    report = callback.meter.report()
    measured = report.compute.estimates["measured"]
    assert measured.inputs["samples"] == 4, measured.notes  # every micro-batch, none dropped
    assert not any("dropped" in note for note in measured.notes), measured.notes
    ratio = report.compute.measured_to_transformer_ratio
    assert ratio is not None and abs(ratio - 1) < 0.05, ratio
    assert trainer.args.gradient_checkpointing  # recomputed layers not counted twice
