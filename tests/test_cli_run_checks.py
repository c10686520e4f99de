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


# ---------------------------------------------------------------- the command's Python


def test_the_python_of_a_command_is_read_with_its_options(tmp_path):
    from flopmeter.cli.command_python import python_of_command

    env = {"PATH": ""}
    got = python_of_command(["/x/python3.11", "-u", "-X", "dev", "-W", "error", "t.py", "-S"], env)
    assert got == ("/x/python3.11", ["-u", "-X", "dev", "-W", "error"])
    assert python_of_command(["python", "-m", "torch.distributed.run", "-S"], env) == (
        "python",
        [],
    )
    assert python_of_command(["/bin/true"], env) is None
    script = tmp_path / "torchrun"
    script.write_text("#!/usr/bin/env -S python3 -I\nprint('hi')\n")
    assert python_of_command([str(script)], env) == ("python3", ["-I"])
    script.write_text("#!/bin/sh\necho hi\n")
    assert python_of_command([str(script)], env) is None


@pytest.mark.parametrize("flag", ["-S", "-uS"])
def test_a_python_without_site_is_refused_before_it_trains(capsys, monkeypatch, marker, flag):
    """``python -S`` runs neither the sitecustomize nor the .pth: it would train unmetered."""
    ran, cmd = marker
    status, err = _run(capsys, ["--", cmd[0], flag, *cmd[1:]], {}, monkeypatch)
    assert status == 2, err
    assert "with -S" in err and "\n" not in err and "unexpected" not in err
    assert not ran.exists()


def _python_without_flopmeter(tmp_path):
    """A virtual environment of its own (no pip, no flopmeter), as another project's."""
    import subprocess
    import venv

    folder = tmp_path / "other-env"
    venv.EnvBuilder(with_pip=False).create(folder)
    python = folder / "bin" / "python"
    probe = [str(python), "-c", "import importlib.util as u; print(u.find_spec('flopmeter'))"]
    env = {"PATH": "/usr/bin:/bin"}  # no PYTHONPATH: what the other project's Python sees
    assert subprocess.run(probe, env=env, capture_output=True, text=True).stdout.strip() == "None"
    return python


@pytest.mark.slow
def test_a_python_of_another_environment_is_refused_before_it_trains(
    tmp_path, capsys, monkeypatch, marker
):
    """A Python that cannot import flopmeter (and a console script whose #! names it) would
    train unmetered and end with no report: refused, naming that Python."""
    ran, cmd = marker
    python = _python_without_flopmeter(tmp_path)
    monkeypatch.delenv("PYTHONPATH", raising=False)
    status, err = _run(capsys, ["--", str(python), *cmd[1:]], {}, monkeypatch)
    assert status == 2, err
    assert f"does not start in {python}" in err and "not installed" in err and "\n" not in err
    script = tmp_path / "train-tool"
    script.write_text(f"#!{python}\nopen({str(ran)!r}, 'w').close()\n")
    script.chmod(0o755)
    status, err = _run(capsys, ["--", str(script)], {}, monkeypatch)
    assert status == 2 and f"does not start in {python}" in err, err
    assert not ran.exists()
    # this environment's Python, with the same command: it starts
    status, err = _run(capsys, ["--", *cmd], {}, monkeypatch)
    assert status == 0 and ran.exists(), err
