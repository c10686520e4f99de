"""scripts/gpu_check.py on a machine without a GPU: its arguments, where its results go, and
that without CUDA it checks nothing, says why, exits 2 and still writes its JSON (a GPU check
that checked nothing must not pass for one that passed)."""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "gpu_check.py"


def _script():
    spec = importlib.util.spec_from_file_location("gpu_check_script", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_arguments_defaults_and_refusals(capsys):
    gpu_check = _script()
    args = gpu_check.parse_args([])
    assert (args.seconds, args.dtype, args.hidden, args.json) == (45.0, "bf16", 2048, None)
    assert gpu_check.parse_args(["--json", "r.json", "--seconds", "5"]).json == Path("r.json")
    for bad in (["--seconds", "0"], ["--hidden", "100"], ["--batch", "0"], ["--dtype", "fp8"]):
        with pytest.raises(SystemExit) as stop:
            gpu_check.parse_args(bad)
        assert stop.value.code == 2
    assert "--hidden must be a multiple of 128" in capsys.readouterr().err


def test_results_path_from_the_flag_or_out():
    gpu_check = _script()
    args = argparse.Namespace(json=None)
    assert gpu_check.json_path(args, {}) is None
    assert gpu_check.json_path(args, {"OUT": "/o"}) == Path("/o/gpu_check.json")
    args.json = Path("mine.json")
    assert gpu_check.json_path(args, {"OUT": "/o"}) == Path("mine.json")


def test_summary_of_a_run_and_of_none():
    gpu_check = _script()
    assert gpu_check.summary({"ran": False, "reason": "why"}) == [
        "gpu_check: nothing checked (why)"
    ]
    lines = gpu_check.summary(
        {
            "ran": True,
            "device": "GPU",
            "torch": "2.x",
            "hardware": {"ok": False, "missing": ["energy_joules"]},
            "overhead": {
                "sync_debug": {"triton": {"ok": True}, "torch": {"ok": False}},
                "step_overhead_1b": {"median_ratio": 1.0042, "bare_step_ms": 250.0},
                "kernel": [{"batch": "8x512", "triton_us": 9.5, "naive_us": 30.25}],
            },
            "status": 1,
        }
    )
    assert lines[1] == "  hardware readings: NOT OK (missing: ['energy_joules'])"
    assert "  sync-debug (torch): FAIL" in lines
    assert "  1B step ratio: 1.0042 (bare 250.0 ms)" in lines
    assert "  token stats 8x512: triton 9.5 us, naive 30.2 us" in lines
    assert not gpu_check._overhead_ok({"sync_debug": {"torch": {"ok": False}}})
    assert not gpu_check._overhead_ok({"error": "boom"})
    assert gpu_check._overhead_ok({"sync_debug": {"torch": {"ok": True}}, "kernel": []})


def _run(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "OUT": str(tmp_path), "CUDA_VISIBLE_DEVICES": ""}
    return subprocess.run(
        [sys.executable, str(SCRIPT), *args],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
        timeout=300,
    )


@pytest.mark.slow
def test_without_cuda_it_checks_nothing_exits_2_and_writes_why(tmp_path):
    done = _run(tmp_path)
    assert done.returncode == 2, done.stderr
    assert "gpu_check: ERROR: torch sees no CUDA GPU" in done.stderr
    results = json.loads((tmp_path / "gpu_check.json").read_text())
    assert results["ran"] is False and results["status"] == 2
    assert results["reason"].startswith("torch sees no CUDA GPU")
    assert "hardware" not in results and "overhead" not in results


@pytest.mark.slow
def test_dry_run_imports_everything_it_would_run(tmp_path):
    done = _run(tmp_path, "--dry-run", "--json", str(tmp_path / "dry.json"))
    assert done.returncode == 0, done.stderr
    results = json.loads((tmp_path / "dry.json").read_text())
    assert results["ran"] is False and results["status"] == 0
    assert results["transformers"] and results["torch"]
    assert Path(results["flopmeter_from"]).name == "flopmeter"
