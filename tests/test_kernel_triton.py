"""The Triton token-statistics kernel, run on the CPU by Triton's interpreter, against the torch
reference and an independent count (cases in ``tests/_triton_interpreted_cases.py``).

The cases run in a child pytest process with ``TRITON_INTERPRET=1``: Triton reads the variable
when it is first imported, so it cannot be switched on inside a session that may already have
imported Triton (torch.compile does), and the parent session's Triton stays the real one.
Skipped only where Triton is not installed.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("triton", reason="the triton package is not installed")

CASES = Path(__file__).with_name("_triton_interpreted_cases.py")


@pytest.mark.slow
def test_triton_kernel_under_the_interpreter_matches_the_reference(tmp_path):
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            str(CASES),
            "-q",
            "-p",
            "no:cacheprovider",
            f"--basetemp={tmp_path / 'child'}",
        ],
        cwd=CASES.parent.parent,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    tail = (result.stdout + result.stderr)[-6000:]
    assert result.returncode == 0, tail
    assert " passed" in result.stdout and "skipped" not in result.stdout, tail
