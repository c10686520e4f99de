"""GPU hardware: the dense peak FLOP/s table and the NVML monitor.

``pynvml`` is imported only when a monitor starts.
"""

from flopmeter.hardware.devices import DeviceChoice, devices_in_use, parse_visible_devices
from flopmeter.hardware.figures import HardwareFigures, summarise
from flopmeter.hardware.monitor import NvmlMonitor
from flopmeter.hardware.peaks import (
    DTYPES,
    PEAK_TABLE,
    PeakEntry,
    known_gpu_names,
    normalise_dtype,
    normalise_gpu_name,
    peak_entry,
    peak_flops,
)
from flopmeter.hardware.readings import DeviceReading, MonitorReadings
from flopmeter.hardware.tracker import HardwareTracker, validate_peak_flops

__all__ = [
    "DTYPES",
    "PEAK_TABLE",
    "DeviceChoice",
    "DeviceReading",
    "HardwareFigures",
    "HardwareTracker",
    "MonitorReadings",
    "NvmlMonitor",
    "PeakEntry",
    "devices_in_use",
    "known_gpu_names",
    "normalise_dtype",
    "normalise_gpu_name",
    "parse_visible_devices",
    "peak_entry",
    "peak_flops",
    "summarise",
    "validate_peak_flops",
]
