"""The sampling thread: utilisation (and power, for GPUs without an energy counter) per device.

One daemon thread (``flopmeter-nvml``) samples every device still sampled every
``interval_seconds``, waiting on a :class:`threading.Event` so that :meth:`Sampler.stop` wakes
it at once; the monitor takes one last sample at stop. Each device's sampling is in exactly one
state (:data:`SampleState`): still reading some quantities, done (nothing left to read, the
samples stand) or failed (the samples no longer cover the window and are not reported).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from flopmeter.hardware.devices import MonitoredDevice, PowerStart
from flopmeter.hardware.nvml import Nvml, NvmlFailure

#: How long :meth:`Sampler.stop` waits for the sampling thread, seconds.
JOIN_TIMEOUT_SECONDS = 10.0


@dataclass(frozen=True)
class Reading:
    """The device is sampled; at least one of the two is ``True``.

    Attributes:
        utilization: Utilisation is read (``False`` once the device says it has none).
        power: Power is read (the device has no energy counter).
    """

    utilization: bool
    power: bool


@dataclass(frozen=True)
class Done:
    """Nothing (left) to read on the device; its samples stand."""


@dataclass(frozen=True)
class Failed:
    """Sampling the device failed; its samples do not cover the window and are not used.

    Attributes:
        reason: What failed, for the note.
    """

    reason: str


SampleState = Reading | Done | Failed


@dataclass
class DeviceSamples:
    """One device's samples and sampling state.

    Written by the sampling thread while it runs and by the monitor once it is joined; read
    (copied) by the monitor for readings while running.

    Attributes:
        device: The device.
        state: Where its sampling stands.
        utilization: Utilisation samples, fractions in [0, 1].
        power: Power samples ``(time.monotonic() seconds, watts)``, from the baseline on.
    """

    device: MonitoredDevice
    state: SampleState = field(init=False)
    utilization: list[float] = field(default_factory=list)
    power: list[tuple[float, float]] = field(default_factory=list)

    def __post_init__(self) -> None:
        baseline = self.device.energy
        sampled_power = isinstance(baseline, PowerStart)
        if isinstance(baseline, PowerStart):
            self.power.append((baseline.seconds, baseline.watts))
        self.state = Done() if self.device.mig else Reading(True, sampled_power)

    @property
    def failed(self) -> bool:
        """Whether sampling this device failed."""
        return isinstance(self.state, Failed)


class Sampler:
    """Samples the devices in one daemon thread, and once more at stop.

    Args:
        nvml: The open NVML session.
        devices: The monitored devices.
        interval_seconds: Sampling interval, s.
        t_start: Start of the monitored window, ``time.monotonic()`` seconds.
        note: Receives each note (from the thread too).
    """

    def __init__(
        self,
        nvml: Nvml,
        devices: Sequence[MonitoredDevice],
        *,
        interval_seconds: float,
        t_start: float,
        note: Callable[[str], None],
    ) -> None:
        self._nvml = nvml
        self.samples = tuple(DeviceSamples(d) for d in devices)
        self._interval = interval_seconds
        self._t_start = t_start
        self._note = note
        self._stop_event = threading.Event()
        self.thread: threading.Thread | None = None
        #: The thread did not stop within :data:`JOIN_TIMEOUT_SECONDS`: no sample is used.
        self.abandoned = False

    def _active(self) -> bool:
        return any(isinstance(s.state, Reading) for s in self.samples)

    def start(self) -> None:
        """Starts the thread when any device is sampled (never raises)."""
        if not self._active():
            return
        try:
            self.thread = threading.Thread(target=self._run, name="flopmeter-nvml", daemon=True)
            self.thread.start()
        except Exception as exc:  # no thread: the process may be out of threads
            self.thread = None
            self._note(f"The NVML sampling thread could not start ({exc}): no utilisation.")
            self._fail_active("the sampling thread could not start")

    def stop(self) -> None:
        """Wakes and joins the thread (up to :data:`JOIN_TIMEOUT_SECONDS`)."""
        self._stop_event.set()
        if self.thread is None:
            return
        self.thread.join(JOIN_TIMEOUT_SECONDS)
        if self.thread.is_alive():
            self.abandoned = True
            self._note(
                f"The NVML sampling thread did not stop within {JOIN_TIMEOUT_SECONDS:g} s "
                "(an NVML call hangs); it is left as a daemon and its samples are not used."
            )

    def final_sample(self, at: float) -> None:
        """The last samples, stamped ``at`` (the window's end), unless the thread hangs."""
        if not self.abandoned:
            self.sample(at)

    def sample(self, at: float | None = None) -> bool:
        """Samples every device still sampled, stamped ``at`` (default: now).

        Returns:
            Whether any device is still sampled.
        """
        for samples in self.samples:
            if isinstance(samples.state, Reading):
                self._sample_device(samples, samples.state, at)
        return self._active()

    def _run(self) -> None:
        try:
            while not self._stop_event.wait(self._interval):
                if not self.sample():
                    return
        except Exception as exc:  # a bug of flopmeter's: never raise in the thread either
            error = f"{type(exc).__name__}: {exc}"
            self._note(f"The NVML sampling thread stopped: {error}.")
            self._fail_active(f"the sampling thread failed ({error})")

    def _fail_active(self, reason: str) -> None:
        for samples in self.samples:
            if isinstance(samples.state, Reading):
                samples.state = Failed(reason)

    def _sample_device(self, samples: DeviceSamples, state: Reading, at: float | None) -> None:
        handle, title = samples.device.handle, samples.device.title
        now = time.monotonic() if at is None else at
        if state.utilization:
            util = self._nvml.utilization(handle)
            if not isinstance(util, NvmlFailure):
                samples.utilization.append(util)
            elif samples.utilization or util.kind != "not_supported":
                self._fail(samples, "utilisation", util, now)
                return
            else:
                state = Reading(utilization=False, power=state.power)
                self._note(f"{title} does not report utilisation ({util.reason}).")
        if state.power:
            watts = self._nvml.power_watts(handle)
            if isinstance(watts, NvmlFailure):
                self._fail(samples, "power", watts, now)
                return
            samples.power.append((time.monotonic() if at is None else at, watts))
        samples.state = state if state.utilization or state.power else Done()

    def _fail(self, samples: DeviceSamples, what: str, failure: NvmlFailure, now: float) -> None:
        elapsed = now - self._t_start
        reason = f"reading its {what} failed after {elapsed:.1f} s ({failure.reason})"
        samples.state = Failed(reason)
        self._note(
            f"{samples.device.title}: {reason}; sampling of this GPU stopped, its "
            "utilisation (and sampled-power energy) is not reported."
        )
