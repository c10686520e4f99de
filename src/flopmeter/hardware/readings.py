"""What the monitor measured: one :class:`DeviceReading` per device, within :class:`MonitorReadings`.

* Energy: the difference of NVML's total-energy counter (mJ) between the window's start and end,
  exact; for a GPU without the counter, its sampled power integrated with trapezoids.
* Utilisation: the mean of the samples, reported only when sampling covered the whole window.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from flopmeter.hardware.devices import CounterStart, PowerStart
from flopmeter.hardware.sampling import DeviceSamples


@dataclass(frozen=True)
class DeviceReading:
    """What the monitor measured on one device.

    Attributes:
        label: How the device was found ("cuda:0 (GPU 3)").
        name: The name NVML reports; ``None`` when it could not be read.
        uuid: The NVML UUID.
        mig: Whether it is a MIG instance (or a GPU in MIG mode): no whole-GPU readings then.
        energy_joules: Energy over the monitored window, J; ``None`` when not measured.
        energy_source: ``"energy counter"`` (exact) or ``"sampled power"`` (integrated).
        utilization: Mean sampled GPU utilisation, a fraction in [0, 1]; ``None`` when not
            measured over the whole window.
        utilization_samples: Number of utilisation samples taken.
    """

    label: str
    name: str | None
    uuid: str | None
    mig: bool
    energy_joules: float | None
    energy_source: str | None
    utilization: float | None
    utilization_samples: int


@dataclass(frozen=True)
class MonitorReadings:
    """All devices' readings and the monitor's notes.

    Attributes:
        available: Whether NVML was running and devices were selected.
        devices: One reading per monitored device.
        notes: Why readings are missing or how they were obtained.
        window_seconds: The monitored window, seconds (start to stop, or to now).
    """

    available: bool
    devices: tuple[DeviceReading, ...] = ()
    notes: tuple[str, ...] = ()
    window_seconds: float = 0.0


def trapezoid_joules(samples: Sequence[tuple[float, float]]) -> float | None:
    """Integrates power samples ``(seconds, watts)`` over time, J; ``None`` with fewer than two."""
    if len(samples) < 2:
        return None
    total = 0.0
    for (t0, p0), (t1, p1) in itertools.pairwise(samples):
        total += (t1 - t0) * (p0 + p1) / 2.0
    return total


def device_reading(
    samples: DeviceSamples,
    *,
    end_mj: int | None,
    samples_usable: bool,
    note: Callable[[str], None],
) -> DeviceReading:
    """One device's reading.

    Args:
        samples: The device, its sampling state and samples.
        end_mj: Its energy counter at the window's end, mJ; ``None`` when not read.
        samples_usable: ``False`` when the sampling thread was abandoned: no sample is used.
        note: Receives a note when the counter went backwards.
    """
    usable = samples_usable and not samples.failed
    utilization = list(samples.utilization)
    energy, source = _energy(samples, end_mj, usable, note)
    return DeviceReading(
        label=samples.device.label,
        name=samples.device.name,
        uuid=samples.device.uuid,
        mig=samples.device.mig,
        energy_joules=energy,
        energy_source=source,
        utilization=sum(utilization) / len(utilization) if usable and utilization else None,
        utilization_samples=len(utilization),
    )


def _energy(
    samples: DeviceSamples, end_mj: int | None, usable: bool, note: Callable[[str], None]
) -> tuple[float | None, str | None]:
    """Energy over the window, J, and how it was measured; ``(None, None)`` when unknown."""
    baseline = samples.device.energy
    if isinstance(baseline, CounterStart):
        if end_mj is None:
            return None, None
        if end_mj < baseline.start_mj:
            note(
                f"{samples.device.title}: the energy counter went backwards (driver "
                "reloaded?): no energy reading."
            )
            return None, None
        return (end_mj - baseline.start_mj) / 1000.0, "energy counter"
    if isinstance(baseline, PowerStart) and usable:
        joules = trapezoid_joules(list(samples.power))
        if joules is not None:
            return joules, "sampled power"
    return None, None
