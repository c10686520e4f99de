import json
import subprocess
import sys

import pytest

from flopmeter.cli import main


def test_threshold_command_prints_value_and_source(capsys):
    assert main(["threshold", "--pretrain-flops", "3.8e25"]) == 0
    out = capsys.readouterr().out
    assert "1.3e+25 FLOP (one_third_of_original)" in out  # 3.8e25 / 3 = 1.27e25
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


def test_show_reads_a_written_report(tmp_path):
    from flopmeter import FlopMeter
    from tests.conftest import padded_batch, tiny_llama

    model = tiny_llama()
    with FlopMeter(model, 0, output=tmp_path):
        model(**padded_batch([3, 5], 8)).loss.backward()
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "flopmeter.cli",
            "show",
            str(tmp_path / "flops_meter.json"),
            "--format",
            "sagemaker",
        ],
        capture_output=True,
        text=True,
        check=True,
    )
    assert json.loads(result.stdout)["tokens_processed"] == 8
