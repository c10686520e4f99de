"""A machine without an NVIDIA GPU: the report says plainly that nothing was measured.

The fake pynvml fails ``nvmlInit`` with NVML_ERROR_LIBRARY_NOT_FOUND, as the real binding
does where the driver's libnvidia-ml is absent; another init failure keeps the NVML wording.
"""

from __future__ import annotations

import pytest

from fake_nvml.install import use_fake_nvml
from flopmeter.hardware.monitor import NvmlMonitor
from flopmeter.render.text import render_text
from tests.support.reports import valid_report


@pytest.fixture
def nvml(monkeypatch: pytest.MonkeyPatch):
    return use_fake_nvml(monkeypatch)


def _notes_after_failed_init(nvml, error: int) -> list[str]:
    nvml.state.reset([nvml.FakeGpu()], init_error=error)
    monitor = NvmlMonitor(interval_seconds=0.005)
    assert monitor.start() is False
    monitor.stop()
    return list(monitor.notes)


def test_no_nvml_library_is_said_in_plain_words_with_the_detail_kept(nvml):
    (note,) = _notes_after_failed_init(nvml, nvml.NVML_ERROR_LIBRARY_NOT_FOUND)
    assert note.startswith("Not measured: no NVIDIA GPU driver was found on this machine")
    assert "NVML Shared Library Not Found" in note  # the detail, for debugging
    text = render_text(valid_report(hardware={"notes": [note]}))
    hardware = text.split("\nHardware and energy\n")[1].split("\n\n")[0]
    assert "not measured" in hardware and "no NVIDIA GPU driver" in hardware


def test_another_init_failure_keeps_the_nvml_wording(nvml):
    (note,) = _notes_after_failed_init(nvml, nvml.NVML_ERROR_DRIVER_NOT_LOADED)
    assert "NVML could not initialise" in note and "Driver Not Loaded" in note
