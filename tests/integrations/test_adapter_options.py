"""Both adapters pass every meter option through, and know the training precision themselves.

Real Trainer and Lightning runs (tiny Llama, CPU, a few steps): what reaches the meter is read
back from the meter's public ``options`` and from the report the run wrote.
"""

from __future__ import annotations

import inspect
import json

import pytest

pytest.importorskip("transformers")
pytest.importorskip("lightning")

import torch

from flopmeter import FlopMeter
from flopmeter.errors import ConfigurationError
from flopmeter.integrations import hf, lightning
from flopmeter.options import OPTION_NAMES, MeterOptions
from tests.support.batches import WORD_VOCAB, RecordingCollator, TokenDataset, sequences
from tests.support.models import tiny_llama
from tests.support.text import word_tokenizer
from tests.support.trainers import hf_trainer, lightning_module, lightning_trainer

ROWS = sequences(8, seed=11)
PEAK = 1.5e14  # FLOP/s, a GPU the table does not know


def _hf_run(tmp_path, callback, **overrides):
    trainer = hf_trainer(
        tmp_path,
        model=tiny_llama(vocab_size=WORD_VOCAB),
        train_dataset=TokenDataset(ROWS),
        data_collator=RecordingCollator(),
        processing_class=word_tokenizer(),
        callbacks=[callback],
        per_device_train_batch_size=4,
        max_steps=2,
        save_strategy="no",
        remove_unused_columns=False,
        **overrides,
    )
    trainer.train()
    return json.loads((tmp_path / "flops_meter.json").read_text())


def _lightning_run(tmp_path, callback, **overrides):
    trainer = lightning_trainer(tmp_path, [callback], max_steps=2, **overrides)
    loader = torch.utils.data.DataLoader(
        TokenDataset(ROWS), batch_size=4, collate_fn=RecordingCollator()
    )
    module = lightning_module(
        tiny_llama(vocab_size=WORD_VOCAB, attn_implementation="eager"),
        lambda parameters: torch.optim.SGD(parameters, lr=1e-3),
    )
    trainer.fit(module, loader)
    return json.loads((tmp_path / "flops_meter.json").read_text())


def test_every_meter_option_is_an_option_of_both_adapters():
    meter_options = [
        p for p in inspect.signature(FlopMeter).parameters if p not in ("self", "model", "options")
    ]
    assert sorted(meter_options) == sorted(OPTION_NAMES)
    assert len(OPTION_NAMES) == 21
    for callback in (hf.FlopMeterCallback, lightning.FlopMeterCallback):
        made = callback(nvml=False, peak_flops=PEAK, measure_every=0, dtype="fp16")
        assert made.meter is None  # made when training begins
        with pytest.raises(ConfigurationError, match="peak_flop"):
            callback(peak_flop=PEAK)  # a typo is named, not ignored
        with pytest.raises(ConfigurationError, match="measure_every"):
            callback(measure_every=-1)


@pytest.mark.slow
def test_hf_options_reach_the_meter_and_precision_follows_the_trainer(tmp_path):
    callback = hf.FlopMeterCallback(
        nvml=False, peak_flops=PEAK, measure_every=0, model_name="tiny/opts"
    )
    report = _hf_run(tmp_path / "bf16", callback, bf16=True)
    options = callback.meter.options
    assert (options.peak_flops, options.measure_every, options.nvml) == (PEAK, 0, False)
    assert options.dtype == "bf16"  # from TrainingArguments(bf16=True)
    assert report["model"]["name"] == "tiny/opts"
    assert report["compute"]["estimates"]["measured"]["flops"] is None  # sampling off, as asked
    assert "GPU monitoring is off (nvml=False)." in report["hardware"]["notes"]

    plain = hf.FlopMeterCallback(nvml=False)
    _hf_run(tmp_path / "fp32", plain)
    assert plain.meter.options.dtype == "fp32"  # float32 matmuls at "highest" precision

    chosen = hf.FlopMeterCallback(nvml=False, dtype="fp8")
    _hf_run(tmp_path / "given", chosen, bf16=True)
    assert chosen.meter.options.dtype == "fp8"  # what the user says wins


@pytest.mark.slow
def test_lightning_options_reach_the_meter_and_precision_follows_the_trainer(tmp_path):
    callback = lightning.FlopMeterCallback(nvml=False, peak_flops=PEAK, measure_every=0)
    report = _lightning_run(tmp_path / "bf16", callback, precision="bf16-mixed")
    options = callback.meter.options
    assert (options.peak_flops, options.measure_every, options.dtype) == (PEAK, 0, "bf16")
    assert report["compute"]["estimates"]["measured"]["flops"] is None

    chosen = lightning.FlopMeterCallback(nvml=False, dtype="tf32")
    _lightning_run(tmp_path / "given", chosen, precision="bf16-mixed")
    assert chosen.meter.options.dtype == "tf32"


def test_explicit_argument_beats_the_environment(monkeypatch):
    monkeypatch.setenv("PRETRAIN_FLOPS", "3e24")
    assert MeterOptions().pretrain_flops == 3e24
    given = MeterOptions(pretrain_flops=6e24)
    assert (given.pretrain_flops, given.pretrain_flops_source) == (6e24, "argument")
    assert given.with_defaults(pretrain_flops=1e24).pretrain_flops == 6e24
    assert MeterOptions().with_defaults(dtype="fp16").dtype == "fp16"


@pytest.mark.slow
def test_parent_reports_are_read_once_per_run_through_an_adapter(tmp_path, monkeypatch):
    """The options travel as one value (no options -> kwargs -> options round trip), and the
    meter reads the parents once when it is made."""
    import flopmeter.report.parent_runs as parent_runs

    model = torch.nn.Embedding(10, 4)
    with FlopMeter(model, 0, output=tmp_path / "parent.json", nvml=False):
        model(torch.tensor([[1, 2, 3]])).sum().backward()
    reads = []
    original = parent_runs.read_report

    def counted(path, *args, **kwargs):
        reads.append(str(path))
        return original(path, *args, **kwargs)

    monkeypatch.setattr(parent_runs, "read_report", counted)
    callback = hf.FlopMeterCallback(nvml=False, parent_runs=[tmp_path / "parent.json"])
    assert reads == []  # the options read nothing
    report = _hf_run(tmp_path / "child", callback)
    assert reads == [str(tmp_path / "parent.json")]  # once, when the meter was made
    assert [p["run_id"] for p in report["lineage"]["parent_runs"]] == [
        callback.meter.parents[0].run_id
    ]
