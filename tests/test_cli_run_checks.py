"""``flopmeter run`` refuses, before the command starts, what a meter would refuse only once made
(an output that cannot be written, a parent that is not a report, a ledger that is not one) and
names a bad flag as the user typed it: exit 2, one line, and the command never runs. A pad id the
model cannot embed is refused when the meter is made."""

from __future__ import annotations

import sys

import pytest

from flopmeter.cli import main


@pytest.fixture
def marker(tmp_path):
    """A command that leaves a file when it runs."""
    path = tmp_path / "ran"
    return path, [sys.executable, "-c", f"open({str(path)!r}, 'w').close()"]


def _run(capsys, argv, env=None, monkeypatch=None):
    for key, value in (env or {}).items():
        monkeypatch.setenv(key, value)
    status = main(["run", *argv])
    return status, capsys.readouterr().err.strip()


@pytest.mark.parametrize(
    ("flags", "env", "says"),
    [
        (["--pad-id", "abc"], {}, "--pad-id must be"),
        (["--output", "/proc/no-such-folder/r.json"], {}, "cannot be written to output"),
        ([], {"FLOPMETER_OUTPUT": "/dev/null"}, "not a regular file"),
        (["--output", "{text}/r.json"], {}, "cannot be written to output"),
        (["--ledger", "{text}"], {}, "is not a flopmeter ledger"),
        (["--parent-run", "{text}"], {}, "not valid JSON"),
    ],
)
def test_a_bad_option_is_refused_before_the_command_starts(
    tmp_path, capsys, monkeypatch, marker, flags, env, says
):
    text = tmp_path / "notes.txt"
    text.write_text("not a report, a ledger or a folder\n")
    flags = [f.replace("{text}", str(text)) for f in flags]
    ran, cmd = marker
    status, err = _run(capsys, [*flags, "--", *cmd], env, monkeypatch)
    assert status == 2, err
    assert says in err and "\n" not in err and "unexpected" not in err
    assert not ran.exists()  # the command never started


def test_the_pad_id_is_named_by_its_variable_when_the_environment_set_it(
    capsys, monkeypatch, marker
):
    ran, cmd = marker
    status, err = _run(capsys, ["--", *cmd], {"FLOPMETER_PAD_ID": "abc"}, monkeypatch)
    assert status == 2 and "FLOPMETER_PAD_ID" in err and "--pad-id" not in err
    assert not ran.exists()


def test_a_pad_id_outside_the_models_vocabulary_is_refused_when_the_meter_is_made():
    """Without an attention mask no token would be padding (the meter would count 1.70x the
    tokens on the issue's batches): refused, naming the vocabulary; a model without one, and
    the vocabulary's last id, are accepted."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from flopmeter import ConfigurationError, FlopMeter

    config = LlamaConfig(
        vocab_size=256, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
        num_attention_heads=4,
    )  # fmt: skip
    model = LlamaForCausalLM(config)
    with pytest.raises(ConfigurationError, match=r"pad_id=300 .* vocabulary of 256"):
        FlopMeter(model, 300)
    with pytest.raises(ConfigurationError, match="vocabulary of 256"):
        FlopMeter(model, 256)
    assert FlopMeter(model, 255).pad_id == 255
    assert FlopMeter(torch.nn.Linear(2, 2), 300).pad_id == 300  # no vocabulary to judge by
