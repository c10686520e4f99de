"""Puts the fake ``pynvml`` of this folder in place of the real one, for one test.

Tests import this as ``fake_nvml.install`` (``tests/`` is on ``sys.path`` under pytest).
"""

from __future__ import annotations

import sys
from pathlib import Path
from types import ModuleType

import pytest

FAKE_DIR = Path(__file__).parent


def use_fake_nvml(monkeypatch: pytest.MonkeyPatch) -> ModuleType:
    """Imports the fake as ``pynvml`` with a fresh state; ``monkeypatch`` undoes it afterwards.

    The environment variables that steer device selection and monitoring are cleared.
    """
    monkeypatch.syspath_prepend(str(FAKE_DIR))
    monkeypatch.delitem(sys.modules, "pynvml", raising=False)
    for var in ("CUDA_VISIBLE_DEVICES", "LOCAL_RANK", "FLOPMETER_NVML"):
        monkeypatch.delenv(var, raising=False)
    import pynvml

    assert Path(pynvml.__file__) == FAKE_DIR / "pynvml.py"
    pynvml.state.reset()
    return pynvml
