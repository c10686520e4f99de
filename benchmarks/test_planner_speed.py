"""Wall time of ``flopmeter estimate``, each in a fresh interpreter, as a user runs it.

``--params`` is pure arithmetic (no torch, no transformers: tests/test_cli_fast.py checks
``sys.modules``); ``MODEL`` builds a bundled model on meta once and costs the five methods on
that build, with ``--no-cache`` (a first run); ``MODEL, cached`` is the same command again, its
plan read from the on-disk plan cache (docs/planner.md, Speed), which the benchmark fills once
before timing. Each round is one subprocess, so the interpreter's start and every import are in
the figure; the cache is a temporary folder (``FLOPMETER_CACHE_DIR``), never the user's. Run:
``.venv/bin/python -m pytest benchmarks/test_planner_speed.py --benchmark-only``; ``make
bench`` runs it with the rest.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

#: The bundled model the MODEL benchmarks plan (16 blocks; the docs' example).
MODEL = "llama-3.2-1b"
_PLAN = ["estimate", MODEL, "--tokens", "1e9", "--format", "json"]
#: What each benchmark runs after ``python -m flopmeter.cli``.
COMMANDS = {
    "params": ["estimate", "--params", "7e9", "--trainable", "24M", "--tokens", "1e9"],
    "model": [*_PLAN, "--no-cache"],
    "model_cached": _PLAN,
}
#: What each benchmark times, in words (the benchmarks page shows it).
WHAT = {
    "params": "bare numbers: no torch, no transformers",
    "model": "a first run (--no-cache): imports, the model on meta, five methods",
    "model_cached": "the same plan again, read from the plan cache",
}
#: Rounds (one subprocess each): the model plan takes seconds, the others well under one.
ROUNDS = {"params": 5, "model": 2, "model_cached": 5}


def _run(argv: list[str], env: dict[str, str]) -> str:
    done = subprocess.run(
        [sys.executable, "-m", "flopmeter.cli", *argv],
        capture_output=True,
        text=True,
        check=False,
        env=env,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


@pytest.mark.slow
@pytest.mark.parametrize("form", list(COMMANDS))
def test_estimate_wall_time(benchmark, form, tmp_path):
    env = {**os.environ, "FLOPMETER_CACHE_DIR": str(tmp_path / "cache")}
    # the cached form's first run makes the plan and fills the cache; the rounds timed read it
    fresh = _run(COMMANDS[form], env) if form == "model_cached" else None
    out = benchmark.pedantic(_run, args=(COMMANDS[form], env), rounds=ROUNDS[form], iterations=1)
    benchmark.extra_info["command"] = "flopmeter " + " ".join(COMMANDS[form])
    benchmark.extra_info["description"] = f"{WHAT[form]}: flopmeter " + " ".join(COMMANDS[form])
    if form == "params":
        assert "planned run: 7,000,000,000 parameters" in out
        return
    # the plan it timed is a real one: five methods, each with a figure; the cached one is
    # the first run's, byte for byte
    methods = json.loads(out)["methods"]
    assert [m["method"] for m in methods] == ["full", "lora", "qlora", "spectrum", "freeze"]
    assert all(m["flops"] > 0 and m["estimate"] == "transformer" for m in methods)
    assert fresh is None or out == fresh
