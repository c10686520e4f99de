"""The NVML monitor: energy, utilisation and power of the GPUs this process uses.

* Devices: the ones this process trains on, not every GPU of the node (see
  :mod:`flopmeter.hardware.devices`).
* Energy: NVML's total-energy counter (mJ since the driver loaded) read when the monitor starts
  and when it stops, an exact difference. A GPU without the counter gets its power (mW)
  sampled and integrated (trapezoids), and the reading says so.
* Utilisation: NVML's GPU utilisation (the share of time in which a kernel was running, not a
  FLOP efficiency) sampled by one daemon thread every ``interval_seconds``
  (:mod:`flopmeter.hardware.sampling`), and once more at stop.
* Nothing here raises into training: NVML being absent, failing to start or failing mid-run
  becomes a note and a missing (``None``) reading for the devices concerned.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from types import ModuleType
from typing import Literal

from flopmeter.errors import ConfigurationError, MissingExtraError
from flopmeter.hardware.devices import (
    CounterStart,
    DeviceChoice,
    devices_in_use,
    open_device,
    select_handles,
)
from flopmeter.hardware.nvml import Nvml, NvmlFailure, import_pynvml
from flopmeter.hardware.options import DEFAULT_INTERVAL_SECONDS
from flopmeter.hardware.readings import MonitorReadings, device_reading
from flopmeter.hardware.sampling import DeviceSamples, Sampler

__all__ = [
    "NvmlMonitor",
]

logger = logging.getLogger("flopmeter")


class NvmlMonitor:
    """Reads energy at start and stop and samples utilisation in one daemon thread.

    Args:
        interval_seconds: Sampling interval of the utilisation (and fallback power) thread, s.
        choice: The devices to monitor (default: :func:`devices_in_use` without a model).
        nvml: The ``pynvml`` module to use (default: imported on :meth:`start`).
        environ: Environment for ``CUDA_VISIBLE_DEVICES`` (default ``os.environ``).
        required: Log NVML being unavailable as a warning (else at INFO level).

    Raises:
        ConfigurationError: ``interval_seconds`` is not a positive finite number.

    Nothing raises into the caller after construction: problems become :attr:`notes`.
    """

    def __init__(
        self,
        *,
        interval_seconds: float = DEFAULT_INTERVAL_SECONDS,
        choice: DeviceChoice | None = None,
        nvml: ModuleType | None = None,
        environ: Mapping[str, str] | None = None,
        required: bool = False,
    ) -> None:
        self.required = bool(required)
        if not (isinstance(interval_seconds, (int, float)) and math.isfinite(interval_seconds)):
            raise ConfigurationError(
                f"interval_seconds must be a number, got {interval_seconds!r}."
            )
        if interval_seconds <= 0:
            raise ConfigurationError(f"interval_seconds must be positive, got {interval_seconds}.")
        self.interval_seconds = float(interval_seconds)
        self._choice = choice
        self._module = nvml
        self._environ = environ
        self._nvml: Nvml | None = None
        self._sampler: Sampler | None = None
        self._end_mj: dict[int, int | None] = {}  # by device position, read at stop
        self._notes: list[str] = []
        self._notes_lock = threading.Lock()
        self._phase: Literal["new", "running", "stopped"] = "new"
        self._t_start: float | None = None
        self._t_stop: float | None = None

    # ------------------------------------------------------------------ notes
    @property
    def notes(self) -> list[str]:
        """The monitor's notes so far."""
        return list(self._notes)

    @property
    def running(self) -> bool:
        """Whether the monitor has started and not stopped."""
        return self._phase == "running"

    @property
    def sampler(self) -> Sampler | None:
        """The sampler (``None`` before start or when no device was selected)."""
        return self._sampler

    @property
    def thread(self) -> threading.Thread | None:
        """The sampling thread (``None`` before start or when nothing is sampled)."""
        return self._sampler.thread if self._sampler is not None else None

    def _note(self, text: str, *, unavailable: bool = False) -> None:
        """Keeps ``text`` for the report and logs it once.

        NVML being unavailable is expected on a machine without an NVIDIA GPU: that is logged
        at INFO unless monitoring was required; problems with GPUs that exist are warnings.
        """
        with self._notes_lock:
            if text in self._notes:
                return
            self._notes.append(text)
        level = logging.INFO if unavailable and not self.required else logging.WARNING
        logger.log(level, "flopmeter (nvml): %s", text)

    @contextmanager
    def _guard(self, failed: str) -> Iterator[None]:
        """Turns an exception (a bug of flopmeter's) into a note: never into training."""
        try:
            yield
        except Exception as exc:
            self._note(f"The NVML monitor failed {failed} ({type(exc).__name__}: {exc}).")

    # ------------------------------------------------------------------ lifecycle
    def start(self) -> bool:
        """Initialises NVML, selects the devices, reads the energy counters, starts sampling.

        Returns:
            Whether monitoring runs (NVML initialised and at least one device selected).
        """
        if self._phase != "new":
            return self._is_monitoring()
        self._phase = "running"
        self._t_start = time.monotonic()
        with self._guard("to start"):
            self._start()
        if self._sampler is None:  # no device to monitor, or the start failed
            self._shutdown()
        return self._is_monitoring()

    def _is_monitoring(self) -> bool:
        return self._phase == "running" and self._nvml is not None and self._nvml.is_open

    def _start(self) -> None:
        nvml = self._open_nvml()
        if nvml is None:
            return
        choice = self._choice or devices_in_use(environ=self._environ)
        selection = select_handles(nvml, choice, self._environ)
        if isinstance(selection, NvmlFailure):
            self._note(f"The NVML monitor failed to start ({selection.reason}).")
            return
        for note in selection.notes:
            self._note(note)
        if not selection.devices:
            self._note(
                "No GPU readings: no GPU visible to this process was found in NVML.",
                unavailable=True,
            )
            return
        # The window starts now; a baseline power sample is stamped with its start.
        self._t_start = t_start = time.monotonic()
        devices = [
            open_device(
                nvml, v, t_start=t_start, interval_seconds=self.interval_seconds, note=self._note
            )
            for v in selection.devices
        ]
        self._sampler = Sampler(
            nvml,
            devices,
            interval_seconds=self.interval_seconds,
            t_start=t_start,
            note=self._note,
        )
        self._sampler.start()

    def _open_nvml(self) -> Nvml | None:
        """Imports ``pynvml`` and initialises NVML; ``None`` (with a note) when either fails."""
        try:
            module = self._module or import_pynvml()
        except MissingExtraError as exc:
            self._note(f"No GPU readings: {exc}.", unavailable=True)
            return None
        self._module = module
        nvml = Nvml(module)
        failure = nvml.init()
        if failure is not None:
            self._note(_init_failure_note(failure), unavailable=True)
            return None
        self._nvml = nvml
        return nvml

    def stop(self) -> None:
        """Stops sampling (the thread is joined), takes the last readings, shuts NVML down.

        Idempotent; never raises.
        """
        if self._phase != "running":
            self._phase = "stopped"
            return
        self._phase = "stopped"
        with self._guard("while stopping"):
            self._stop()
        if self._t_stop is None:
            self._t_stop = time.monotonic()
        self._shutdown()

    def _stop(self) -> None:
        sampler, nvml = self._sampler, self._nvml
        if sampler is None or nvml is None:
            return
        sampler.stop()
        # The window ends now; the last samples are stamped with its end.
        self._t_stop = time.monotonic()
        sampler.final_sample(self._t_stop)
        for pos, samples in enumerate(sampler.samples):
            if not isinstance(samples.device.energy, CounterStart):
                continue
            end = nvml.energy_mj(samples.device.handle)
            if isinstance(end, NvmlFailure):
                self._note(
                    f"{samples.device.title}: no energy reading: the energy counter could not "
                    f"be read at the end ({end.reason})."
                )
                end = None
            self._end_mj[pos] = end

    def _shutdown(self) -> None:
        if self._nvml is not None:
            self._nvml.shutdown()

    # ------------------------------------------------------------------ results
    def readings(self) -> MonitorReadings:
        """The readings: final after :meth:`stop`, up to now while running."""
        sampler = self._sampler
        if sampler is None or not sampler.samples:
            return MonitorReadings(available=False, notes=tuple(self._notes))
        end = self._t_stop if self._t_stop is not None else time.monotonic()
        window = max(0.0, end - (self._t_start or end))
        devices = tuple(
            device_reading(
                samples,
                end_mj=self._end_energy(pos, samples),
                samples_usable=not sampler.abandoned,
                note=self._note,
            )
            for pos, samples in enumerate(sampler.samples)
        )
        return MonitorReadings(True, devices, tuple(self._notes), window)

    def _end_energy(self, pos: int, samples: DeviceSamples) -> int | None:
        """The counter at the window's end, mJ: read at stop, or now while running."""
        if pos in self._end_mj or not isinstance(samples.device.energy, CounterStart):
            return self._end_mj.get(pos)
        if self._is_monitoring() and self._nvml is not None:
            end = self._nvml.energy_mj(samples.device.handle)
            return None if isinstance(end, NvmlFailure) else end
        return None


def _init_failure_note(failure: NvmlFailure) -> str:
    """The note for NVML failing to initialise; plain words when there is simply no NVIDIA GPU."""
    if failure.kind == "library_not_found":
        return (
            "Not measured: no NVIDIA GPU driver was found on this machine (its NVML library is "
            "not installed), so there are no GPU hardware or energy figures; the training "
            f"compute does not depend on them. Detail: {failure.reason}."
        )
    return f"No GPU readings: NVML could not initialise ({failure.reason})."
