import json
import os
import socket
import subprocess
import sys

import pytest

from flopmeter.cli import main
from tests.support.reports import BAD, merged, valid_data, write_data


def test_threshold_command_prints_value_and_source(capsys):
    assert main(["threshold", "--pretrain-flops", "3.8e25"]) == 0
    out = capsys.readouterr().out
    assert "1.3 × 10^25 FLOP (one_third_of_original)" in out  # 3.8e25 / 3 = 1.27e25
    assert "C(2025) 5045" in out


def test_estimate_command_plans_a_lora_run(capsys):
    # 3.21e9 parameters, 2.4e7 trainable, 1e6 tokens:
    # seed = (4 * 3.21e9 + 2 * 2.4e7) * 1e6 = 1.2888e16 ; 6ND = 1.926e16
    assert main(["estimate", "--params", "3.21e9", "--trainable", "2.4e7", "--tokens", "1e6"]) == 0
    out = capsys.readouterr().out
    assert "1.3e+16 FLOP" in out and "1.9e+16 FLOP" in out
    assert "below_threshold" in out


def test_bad_input_is_a_clear_error(capsys):
    with pytest.raises(SystemExit):
        main(["threshold", "--pretrain-flops", "-1"])
    assert "--pretrain-flops" in capsys.readouterr().err
    assert main(["estimate", "--params", "10", "--trainable", "20", "--tokens", "1"]) == 2


@pytest.mark.slow
def test_show_reads_a_written_report(tmp_path, capsys):
    from flopmeter import FlopMeter
    from tests.support.batches import padded_batch
    from tests.support.models import tiny_llama

    model = tiny_llama()
    with FlopMeter(model, 0, output=tmp_path):
        model(**padded_batch([3, 5], 8)).loss.backward()
    capsys.readouterr()
    # the command in this process (the installed command's own process: the tests below)
    assert main(["show", str(tmp_path / "flops_meter.json"), "--format", "sagemaker"]) == 0
    assert json.loads(capsys.readouterr().out)["tokens_processed"] == 8


# --- every failure is one line, never a traceback -------------------------------------------


def _one_error_line(err: str) -> str:
    """The single stderr line of a failure (asserts there is exactly one, and no traceback)."""
    assert "Traceback" not in err
    lines = err.splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("flopmeter: error: "), err
    return lines[0]


def _cli(*args: str, **kwargs) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "flopmeter.cli", *args], capture_output=True, text=True, **kwargs
    )


@pytest.mark.parametrize("bad", BAD, ids=lambda b: b.id)
def test_show_of_a_bad_file_is_one_error_line_with_status_2(tmp_path, capsys, bad):
    path = bad.make(tmp_path)
    assert main(["show", str(path)]) == 2
    out, err = capsys.readouterr()
    line = _one_error_line(err)
    assert out == ""
    assert str(tmp_path) in line and bad.says in line
    if bad.field is not None:
        assert f"field '{bad.field}'" in line


@pytest.mark.parametrize(
    "make",
    [lambda d: d / "missing.json", lambda d: BAD[2].make(d), lambda d: d],
    ids=["missing", "truncated", "folder"],
)
def test_the_installed_command_shows_no_traceback(tmp_path, make):
    result = _cli("show", str(make(tmp_path)))
    assert result.returncode == 2
    assert str(tmp_path) in _one_error_line(result.stderr)
    assert result.stdout == ""


@pytest.mark.parametrize(
    ("argv", "flag", "value"),
    [
        (["threshold", "--pretrain-flops", "abc"], "--pretrain-flops", "'abc'"),
        (["threshold", "--pretrain-flops", "nan"], "--pretrain-flops", "'nan'"),
        (["threshold", "--pretrain-flops", "-1"], "--pretrain-flops", "'-1'"),
        (["estimate", "--params", "0.5", "--tokens", "1"], "--params", "'0.5'"),
        (["estimate", "--params", "10", "--tokens", "0.5"], "--tokens", "'0.5'"),
        (["estimate", "--params", "-5", "--tokens", "1"], "--params", "'-5'"),
        (["estimate", "--params", "nan", "--tokens", "1"], "--params", "'nan'"),
        (["estimate", "--params", "10", "--tokens", "inf"], "--tokens", "'inf'"),
        (["estimate", "--params", "10", "--trainable", "2.5", "--tokens", "1"], "--trainable", "'2.5'"),
        (["show"], "report", "required"),
        (["report"], "report", "required"),
        (["report", "x.json", "--format", "pdf"], "--format", "invalid choice"),
        (["explode"], "explode", "invalid choice"),
    ],
)  # fmt: skip
def test_an_argument_error_is_one_line_naming_the_flag(capsys, argv, flag, value):
    with pytest.raises(SystemExit) as info:
        main(argv)
    assert info.value.code == 2
    line = _one_error_line(capsys.readouterr().err)
    assert flag in line and value in line
    assert "<lambda>" not in line


def test_pretrain_flops_abc_names_the_flag_not_a_lambda(capsys):
    with pytest.raises(SystemExit):
        main(["threshold", "--pretrain-flops", "abc"])
    assert "--pretrain-flops: not a number of FLOP: 'abc' (or 'catalog')" in capsys.readouterr().err


def test_counts_accept_integral_floats_exactly(capsys):
    assert main(["estimate", "--params", "3.2e9", "--tokens", "12345678901234567891"]) == 0
    out = capsys.readouterr().out
    assert "3,200,000,000 parameters" in out
    assert "12,345,678,901,234,567,891 tokens" in out  # int, not rounded through a float


def test_version(capsys):
    from importlib.metadata import version

    with pytest.raises(SystemExit) as info:
        main(["--version"])
    assert info.value.code == 0
    assert capsys.readouterr().out == f"flopmeter {version('flopmeter')}\n"


def _big_report(folder, **overrides):
    """A valid report whose text is far larger than a pipe's buffer (64 KiB)."""
    notes = [f"note {i}: padding the report so a reader can stop early" for i in range(4000)]
    return write_data(folder, valid_data(notes=notes, **overrides))


def test_a_reader_that_stops_early_gets_no_traceback(tmp_path):
    path = _big_report(tmp_path)
    script = f'"{sys.executable}" -m flopmeter.cli show "{path}" | head -1; exit ${{PIPESTATUS[0]}}'
    result = subprocess.run(["bash", "-c", script], capture_output=True, text=True)
    assert result.stdout.startswith("flopmeter report — hand-made (completed)")
    assert len(result.stdout.splitlines()) == 1
    assert result.stderr == ""  # no traceback, no "Exception ignored ... BrokenPipeError"
    assert result.returncode == 1  # output was cut short: not a success, not bad input


# --- PRETRAIN_FLOPS, as the library reads it ------------------------------------------------


def test_pretrain_flops_from_the_environment_unless_the_flag_is_given(monkeypatch, capsys):
    monkeypatch.setenv("PRETRAIN_FLOPS", "3.8e25")
    assert main(["threshold"]) == 0
    out = capsys.readouterr().out
    assert "1.3 × 10^25 FLOP (one_third_of_original" in out  # 3.8e25 / 3
    assert "PRETRAIN_FLOPS" in out
    assert main(["estimate", "--params", "1e9", "--tokens", "1e6"]) == 0
    assert "threshold                      1.3e+25 FLOP" in capsys.readouterr().out
    # the flag beats the environment variable
    assert main(["threshold", "--pretrain-flops", "6e24"]) == 0
    out = capsys.readouterr().out
    assert "2.0 × 10^24 FLOP (one_third_of_original)" in out  # 6e24 / 3
    assert "PRETRAIN_FLOPS" not in out


def test_an_invalid_environment_variable_is_an_error_naming_it(monkeypatch, capsys):
    monkeypatch.setenv("PRETRAIN_FLOPS", "lots")
    assert main(["threshold"]) == 2
    assert "PRETRAIN_FLOPS" in _one_error_line(capsys.readouterr().err)
    assert main(["threshold", "--pretrain-flops", "1e24"]) == 0  # not read when the flag is given


# --- a running report says it is not final ---------------------------------------------------


def _dead_pid() -> int:
    """The pid of a process that has exited and been reaped."""
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


def _running(folder, **overrides):
    fields = dict(run={"status": "running", "ended_at": None, "hostname": socket.gethostname()})
    return write_data(folder, valid_data(**merged(fields, overrides)))


def test_a_running_report_whose_writer_is_dead_says_it_is_gone(tmp_path, capsys):
    pid = _dead_pid()
    path = _running(tmp_path, run={"pid": pid, "updated_at": "2026-01-01T00:30:00+00:00"})
    assert main(["show", str(path)]) == 0
    out, err = capsys.readouterr()
    first, second = out.splitlines()[:2]
    assert first.startswith("flopmeter: warning: this report is not final")
    assert f"pid {pid}" in first and "is gone" in first and "SIGKILL" in first
    assert "2026-01-01T00:30:00+00:00" in first
    assert second.startswith("flopmeter report — hand-made (running)")
    assert err == ""


def test_a_running_report_as_json_keeps_stdout_json(tmp_path, capsys):
    path = _running(tmp_path, run={"pid": _dead_pid()})
    for fmt in ("json", "sagemaker"):
        assert main(["show", str(path), "--format", fmt]) == 0
        out, err = capsys.readouterr()
        shown = json.loads(out)  # the report (2.0), or the AWS meter's flat keys
        tokens = shown["tokens"]["tokens_processed"] if fmt == "json" else shown["tokens_processed"]
        assert tokens == 5_000_000_000
        assert err.startswith("flopmeter: warning: this report is not final")
        assert "is gone" in err


def test_a_running_report_of_a_live_or_remote_writer_is_not_called_gone(tmp_path, capsys):
    for overrides in (
        dict(run={"pid": os.getpid()}),
        dict(run={"pid": _dead_pid(), "hostname": "elsewhere"}),
    ):
        assert main(["show", str(_running(tmp_path, **overrides))]) == 0
        first = capsys.readouterr().out.splitlines()[0]
        assert first.startswith("flopmeter: warning: this report is not final")
        assert "gone" not in first
    # a final report has no warning
    assert main(["show", str(write_data(tmp_path, valid_data()))]) == 0
    out, err = capsys.readouterr()
    assert out.startswith("flopmeter report — hand-made (completed)")
    assert "warning" not in out + err
