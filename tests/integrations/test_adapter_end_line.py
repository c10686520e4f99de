"""A framework callback says where it wrote the report: one line on stderr at the end (rank 0),
the line ``flopmeter run`` prints; none under a zero-code job, whose end prints every report."""

from __future__ import annotations

import pytest

pytest.importorskip("transformers")

from flopmeter.auto import SWITCH_ENV
from flopmeter.integrations.hf import FlopMeterCallback
from tests.support.batches import WORD_VOCAB, RecordingCollator, TokenDataset
from tests.support.models import tiny_llama
from tests.support.text import word_tokenizer
from tests.support.trainers import hf_trainer

pytestmark = pytest.mark.slow

ROWS = [[5, 6, 7, 8], [9, 10, 11, 12]]


def _train(out):
    trainer = hf_trainer(
        out,
        model=tiny_llama(vocab_size=WORD_VOCAB),
        train_dataset=TokenDataset(ROWS),
        data_collator=RecordingCollator(),
        processing_class=word_tokenizer(),
        callbacks=[FlopMeterCallback()],
        per_device_train_batch_size=2,
        max_steps=1,
        save_strategy="no",
        remove_unused_columns=False,
    )
    trainer.train()


def test_the_hf_callback_says_where_its_report_is(tmp_path, capsys, monkeypatch):
    monkeypatch.delenv(SWITCH_ENV, raising=False)
    _train(tmp_path)
    lines = [x for x in capsys.readouterr().err.splitlines() if "flopmeter: report:" in x]
    assert len(lines) == 1, lines
    assert str(tmp_path / "flops_meter.json") in lines[0] and "(completed, " in lines[0]


def test_no_line_of_its_own_inside_a_zero_code_job(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv(SWITCH_ENV, "1")
    _train(tmp_path)
    assert "flopmeter: report:" not in capsys.readouterr().err
    assert (tmp_path / "flops_meter.json").is_file()
