"""The hardware figures of a run: pure arithmetic on the monitor's readings.

* ``bound_flops`` (``HardwareFigures.bound_flops``): sum over GPUs of seconds x dense peak FLOP/s (utilisation 1.0), an upper
  bound on what the hardware could have computed in the time.
* ``utilization_weighted_bound_flops``: the same, each GPU weighted by its mean sampled NVML
  utilisation. Still an upper bound: NVML utilisation is the share of time in which any kernel
  ran, not the share of peak FLOP/s reached.
* ``mfu``: the primary compute (``compute.primary_flops``) / ``bound_flops``.
* ``energy_joules`` / ``energy_kwh``: summed over GPUs; ``average_power_watts`` is that energy
  over the monitored window (all GPUs together).

A figure that cannot be made is ``None`` and a note says why, never 0.
"""

from __future__ import annotations

import math
import zlib
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from flopmeter.hardware.peaks import normalise_dtype, peak_entry
from flopmeter.hardware.readings import DeviceReading, MonitorReadings

#: Joules in one kilowatt-hour.
JOULES_PER_KWH = 3.6e6


def hardware_bound_flops(seconds: float, peaks_flops_per_second: Sequence[float]) -> float:
    """Sum over GPUs of ``seconds`` x peak: the hardware upper bound, FLOP."""
    return sum(seconds * peak for peak in peaks_flops_per_second)


def utilization_weighted_flops(
    seconds: float, peaks_flops_per_second: Sequence[float], utilizations: Sequence[float]
) -> float:
    """Sum over GPUs of ``seconds`` x peak x mean utilisation (a fraction), FLOP."""
    if len(peaks_flops_per_second) != len(utilizations):
        raise ValueError("one utilisation per GPU is needed")
    return sum(
        seconds * peak * util
        for peak, util in zip(peaks_flops_per_second, utilizations, strict=True)
    )


def joules_to_kwh(joules: float | None) -> float | None:
    """J to kWh (``None`` stays ``None``)."""
    return None if joules is None else joules / JOULES_PER_KWH


def model_flops_utilization(primary_flops: float | None, bound_flops: float | None) -> float | None:
    """``primary_flops / bound_flops``; ``None`` when either is unknown or the bound is 0."""
    if primary_flops is None or bound_flops is None or bound_flops <= 0:
        return None
    return primary_flops / bound_flops


@dataclass(frozen=True)
class HardwareFigures:
    """The hardware side of a report (one rank's, or all ranks' once combined).

    Attributes:
        gpu_name: The GPU model; ``None`` when unknown or when the GPUs differ.
        gpu_count: GPUs monitored.
        peak_flops_per_second: Dense peak per GPU used, FLOP/s (``None`` when GPUs differ).
        bound_flops: Sum over GPUs of seconds x peak, FLOP.
        utilization_weighted_bound_flops: The same weighted by mean utilisation, FLOP.
        energy_joules: Energy of the GPUs over the window, J.
        average_power_watts: ``energy_joules`` over the window, W (all GPUs together).
        notes: How figures were obtained and why any is missing.
    """

    gpu_name: str | None = None
    gpu_count: int | None = None
    peak_flops_per_second: float | None = None
    bound_flops: float | None = None
    utilization_weighted_bound_flops: float | None = None
    energy_joules: float | None = None
    average_power_watts: float | None = None
    notes: tuple[str, ...] = field(default_factory=tuple)

    def report_fields(self, primary_flops: float | None) -> dict[str, Any]:
        """The fields of the report's hardware section (``FlopReport.hardware``), with ``mfu``
        and ``energy_kwh`` derived; ``primary_flops`` is the primary compute, FLOP."""
        return {
            "gpu_name": self.gpu_name,
            "gpu_count": self.gpu_count,
            "peak_flops_per_second": self.peak_flops_per_second,
            "bound_flops": self.bound_flops,
            "utilization_weighted_bound_flops": self.utilization_weighted_bound_flops,
            "mfu": model_flops_utilization(primary_flops, self.bound_flops),
            "energy_joules": self.energy_joules,
            "energy_kwh": joules_to_kwh(self.energy_joules),
            "average_power_watts": self.average_power_watts,
            "notes": list(self.notes),
        }


def summarise(
    readings: MonitorReadings,
    seconds: float,
    *,
    dtype: str = "bf16",
    peak_flops_override: float | None = None,
) -> HardwareFigures:
    """One rank's figures from its monitor's readings.

    Args:
        readings: The monitor's readings.
        seconds: Training time the hardware bound covers, seconds.
        dtype: Data type whose peak applies (see :func:`flopmeter.hardware.peaks.normalise_dtype`).
        peak_flops_override: A peak per GPU (FLOP/s) the user gave; replaces the table's.
    """
    notes = list(readings.notes)
    if not readings.available or not readings.devices:
        return HardwareFigures(notes=tuple(notes))
    dtype = normalise_dtype(dtype)
    devices = readings.devices
    names = [d.name for d in devices]
    gpu_name = names[0] if len(set(names)) == 1 else None
    if len(set(names)) > 1:
        listed = ", ".join(sorted({n or "unknown" for n in names}))
        notes.append(f"The GPUs differ ({listed}): gpu_name and peak_flops_per_second are null.")

    peaks = _device_peaks(devices, dtype, peak_flops_override, notes)
    peak_common = peaks[0] if len(set(peaks)) == 1 else None
    flops_hw, flops_util = _bounds(devices, peaks, seconds, notes)
    energy, power = _energy_and_power(devices, readings.window_seconds, notes)
    return HardwareFigures(
        gpu_name=gpu_name,
        gpu_count=len(devices),
        peak_flops_per_second=peak_common,
        bound_flops=flops_hw,
        utilization_weighted_bound_flops=flops_util,
        energy_joules=energy,
        average_power_watts=power,
        notes=tuple(notes),
    )


def _device_peaks(
    devices: Sequence[DeviceReading],
    dtype: str,
    peak_flops_override: float | None,
    notes: list[str],
) -> list[float | None]:
    """Each device's peak, FLOP/s (``None``: unknown, with a note saying why)."""
    peaks: list[float | None] = []
    for dev in devices:
        if peak_flops_override is not None:
            peaks.append(peak_flops_override)
            continue
        entry = None if dev.mig else peak_entry(dev.name)
        peak = None if entry is None else entry.flops_per_second(dtype)
        peaks.append(peak)
        if peak is None:
            if dev.mig:
                why = "a MIG instance has a fraction of the GPU"
            elif entry is None:
                why = f"{dev.name!r} is not in the peak table"
            else:
                why = f"the table has no {dtype} figure for {entry.product} ({entry.note})"
            notes.append(
                f"No peak FLOP/s for {dev.label} ({why}): bound_flops is null; pass "
                "peak_flops= (dense FLOP/s per GPU) to the meter or to its framework callback."
            )
    if peak_flops_override is not None:
        notes.append(f"Peak FLOP/s given by the user: {peak_flops_override:.4g} per GPU.")
    return peaks


def _bounds(
    devices: Sequence[DeviceReading],
    peaks: Sequence[float | None],
    seconds: float,
    notes: list[str],
) -> tuple[float | None, float | None]:
    """The hardware bound and its utilisation-weighted form, FLOP (``None`` when unknown)."""
    known_peaks = [p for p in peaks if p is not None]
    if len(known_peaks) != len(peaks):
        return None, None
    flops_hw = hardware_bound_flops(seconds, known_peaks)
    utils = [d.utilization for d in devices]
    if all(u is not None for u in utils):
        return flops_hw, utilization_weighted_flops(seconds, known_peaks, utils)  # type: ignore[arg-type]
    missing = ", ".join(d.label for d in devices if d.utilization is None)
    notes.append(
        f"No utilisation over the whole run for {missing}: "
        "utilization_weighted_bound_flops is null."
    )
    return flops_hw, None


def _energy_and_power(
    devices: Sequence[DeviceReading], window_seconds: float, notes: list[str]
) -> tuple[float | None, float | None]:
    """Total energy, J, and average power over the window, W (``None`` when unknown)."""
    energies = [d.energy_joules for d in devices]
    energy = None
    power = None
    if all(e is not None for e in energies):
        energy = float(sum(energies))  # type: ignore[arg-type]
        if window_seconds > 0:
            power = energy / window_seconds
    else:
        missing = ", ".join(d.label for d in devices if d.energy_joules is None)
        notes.append(f"energy_joules is null: no energy reading for {missing}.")
    if any(d.energy_source == "sampled power" for d in devices) and energy is not None:
        notes.append("Energy is partly integrated from sampled power, not the energy counter.")
    return energy, power


# ----------------------------------------------------------------------------- ranks
#: Positions in the vector one rank sends at report time.
VECTOR_FIELDS: tuple[str, ...] = (
    "gpu_count",
    "bound_flops",
    "utilization_weighted_bound_flops",
    "energy_joules",
    "average_power_watts",
    "peak_flops_per_second",
    "gpu_name_key",
    "notes",
)


def _name_key(name: str | None) -> float:
    return -1.0 if name is None else float(zlib.crc32(name.encode("utf-8")))


def to_vector(figures: HardwareFigures) -> list[float]:
    """The figures as floats for one collective; ``NaN`` stands for a missing figure."""

    def num(v: float | None) -> float:
        return math.nan if v is None else float(v)

    return [
        num(figures.gpu_count),
        num(figures.bound_flops),
        num(figures.utilization_weighted_bound_flops),
        num(figures.energy_joules),
        num(figures.average_power_watts),
        num(figures.peak_flops_per_second),
        _name_key(figures.gpu_name),
        _name_key("\n".join(figures.notes)) if figures.notes else -1.0,  # the notes, as a key
    ]


def combine(
    local: HardwareFigures, vectors: Sequence[Sequence[float]], rank: int
) -> HardwareFigures:
    """All ranks' figures, each rank's GPUs counted once.

    Sums counts, bounds, energy and power over ranks. A figure missing on any rank is missing in
    the total (a note names the ranks). The name and peak are kept when every rank has the same.

    Args:
        local: This rank's figures (its notes are kept, the others' are counted).
        vectors: Every rank's :func:`to_vector`, in rank order.
        rank: This rank.
    """
    if not vectors:
        return local
    cols = list(zip(*vectors, strict=True))
    notes = list(local.notes)

    def total(i: int) -> float | None:
        values = cols[i]
        missing = [r for r, v in enumerate(values) if math.isnan(v)]
        if missing and len(missing) < len(values):
            notes.append(
                f"{VECTOR_FIELDS[i]} is null: missing on rank(s) "
                f"{', '.join(map(str, missing))} of {len(values)}."
            )
        return None if missing else float(sum(values))

    count = total(0)
    flops_hw = total(1)
    flops_util = total(2)
    energy = total(3)
    power = total(4)

    name_keys = set(cols[6])
    gpu_name = local.gpu_name if len(name_keys) == 1 else None
    if len(name_keys) > 1:
        notes.append("The ranks' GPUs differ (or are unknown on some): gpu_name is null.")
    peaks = cols[5]
    peak = local.peak_flops_per_second
    if any(math.isnan(p) for p in peaks) or len(set(peaks)) != 1:
        peak = None
    mine = cols[7][rank] if rank < len(cols[7]) else -1.0
    others = [r for r, key in enumerate(cols[7]) if key not in (-1.0, mine) and r != rank]
    if others:  # ranks whose notes say the same as this rank's (NVML absent) are not news
        notes.append(
            f"Rank(s) {', '.join(map(str, others))} noted other hardware problems than this "
            "rank's (see their logs)."
        )
    return HardwareFigures(
        gpu_name=gpu_name,
        gpu_count=None if count is None else round(count),
        peak_flops_per_second=peak,
        bound_flops=flops_hw,
        utilization_weighted_bound_flops=flops_util,
        energy_joules=energy,
        average_power_watts=power,
        notes=tuple(notes),
    )
