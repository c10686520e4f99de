"""Wall time of ``flopmeter estimate``, each in a fresh interpreter, as a user runs it.

``--params`` is pure arithmetic (no torch, no transformers: tests/test_cli_fast.py checks
``sys.modules``); ``MODEL`` builds a bundled model on meta once and costs the five methods on
that build (docs/planner.md, Speed). Each round is one subprocess, so the interpreter's start
and every import are in the figure. Run: ``.venv/bin/python -m pytest
benchmarks/test_planner_speed.py --benchmark-only``; ``make bench`` runs it with the rest.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

#: The bundled model the MODEL benchmark plans (16 blocks; the docs' example).
MODEL = "llama-3.2-1b"
#: What each benchmark runs after ``python -m flopmeter.cli``.
COMMANDS = {
    "params": ["estimate", "--params", "7e9", "--trainable", "24M", "--tokens", "1e9"],
    "model": ["estimate", MODEL, "--tokens", "1e9", "--format", "json"],
}
#: Rounds (one subprocess each): the model plan takes seconds, the bare numbers well under one.
ROUNDS = {"params": 5, "model": 2}


def _run(argv: list[str]) -> str:
    done = subprocess.run(
        [sys.executable, "-m", "flopmeter.cli", *argv], capture_output=True, text=True, check=False
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


@pytest.mark.slow
@pytest.mark.parametrize("form", list(COMMANDS))
def test_estimate_wall_time(benchmark, form):
    out = benchmark.pedantic(_run, args=(COMMANDS[form],), rounds=ROUNDS[form], iterations=1)
    benchmark.extra_info["command"] = "flopmeter " + " ".join(COMMANDS[form])
    if form == "model":  # the plan it timed is a real one: five methods, each with a figure
        methods = json.loads(out)["methods"]
        assert [m["method"] for m in methods] == ["full", "lora", "qlora", "spectrum", "freeze"]
        assert all(m["flops"] > 0 and m["estimate"] == "transformer" for m in methods)
    else:
        assert "planned run: 7,000,000,000 parameters" in out
