"""The NVML monitor: energy, utilisation and power of the GPUs this process uses.

* Devices: the ones this process trains on, not every GPU of the node (see
  :func:`devices_in_use`), mapped to NVML through ``CUDA_VISIBLE_DEVICES`` (indices, ``GPU-``
  UUIDs or unique UUID prefixes, ``MIG-`` UUIDs) or, once torch has initialised CUDA, through the
  device's UUID.
* Energy: NVML's total-energy counter (mJ since the driver loaded) read when the monitor starts
  and when it stops, an exact difference. A GPU without the counter gets its power (mW)
  sampled and integrated (trapezoids), and the reading says so.
* Utilisation: NVML's GPU utilisation (the share of time in which a kernel was running, not a
  FLOP efficiency) sampled by one daemon thread every ``interval_seconds``, and once more at stop.
* Nothing here raises into training: NVML being absent, failing to start or failing mid-run
  becomes a note and a missing (``None``) reading for the devices concerned.

``pynvml`` (the ``nvidia-ml-py`` package) is imported when a monitor starts, never at import.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import math
import os
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any, Literal

from flopmeter.errors import ConfigurationError, MissingExtraError

logger = logging.getLogger("flopmeter")

#: Environment variable that turns the monitor off (``0``) or requires it (``1``).
NVML_ENV = "FLOPMETER_NVML"
#: Default sampling interval of the utilisation thread, seconds.
DEFAULT_INTERVAL_SECONDS = 1.0
#: How long :meth:`NvmlMonitor.stop` waits for the sampling thread, seconds.
JOIN_TIMEOUT_SECONDS = 10.0

_OFF = {"0", "false", "no", "off"}
_ON = {"1", "true", "yes", "on"}


def import_pynvml() -> ModuleType:
    """Imports ``pynvml`` (from the ``nvidia-ml-py`` package).

    Raises:
        MissingExtraError: the package is not installed (extra ``nvml``).
    """
    try:
        import pynvml
    except ImportError:
        raise MissingExtraError("nvidia-ml-py", "nvml", "GPU monitoring through NVML") from None
    return pynvml


def nvml_from_env(environ: Mapping[str, str] | None = None) -> bool | None:
    """Reads :data:`NVML_ENV`: ``False`` for 0/false/no/off, ``True`` for 1/true/yes/on.

    Returns:
        ``None`` when the variable is unset or empty.

    Raises:
        ConfigurationError: any other value.
    """
    env = os.environ if environ is None else environ
    raw = env.get(NVML_ENV, "").strip().lower()
    if not raw:
        return None
    if raw in _OFF:
        return False
    if raw in _ON:
        return True
    raise ConfigurationError(
        f"{NVML_ENV}={env.get(NVML_ENV)!r} is not understood: use 0 to turn GPU monitoring off "
        "or 1 to require it."
    )


# ----------------------------------------------------------------------------- devices
def parse_visible_devices(value: str | None) -> list[int | str] | None:
    """The entries of ``CUDA_VISIBLE_DEVICES`` as CUDA reads them.

    Integers (``"2,5"``), or ``GPU-``/``MIG-`` UUIDs and UUID prefixes. As in CUDA, parsing stops
    at the first entry that does not fit (a negative or non-numeric index, an entry without the
    first entry's prefix), and a repeated entry makes the list empty.

    Returns:
        ``None`` when the variable is unset (every device is visible), else the entries
        (empty: no device is visible).
    """
    if value is None:
        return None
    value = value.strip()
    if value.startswith(("GPU-", "MIG-")):
        prefix = value[:4]
        uuids: list[int | str] = []
        for elem in value.split(","):
            elem = elem.strip()
            if not elem.startswith(prefix):
                break
            if elem in uuids:
                return []
            uuids.append(elem)
        return uuids
    indices: list[int | str] = []
    for elem in value.split(","):
        digits = ""
        for ch in elem.strip():
            if not ch.isdigit():
                break
            digits += ch
        if not digits:  # empty, negative or not a number: CUDA stops here
            break
        index = int(digits)
        if index in indices:
            return []
        indices.append(index)
    return indices


ChoiceSource = Literal["explicit", "model", "torch", "local_rank", "visible"]


@dataclass(frozen=True)
class DeviceChoice:
    """Which CUDA devices (indices as torch numbers them) this process uses, and why.

    Attributes:
        indices: torch's device indices; ``None`` means every visible device.
        uuids: For each index, the device UUID torch reports (only once CUDA is initialised):
            the exact link to NVML, whatever the device ordering.
        source: How the choice was made.
        reason: The same, in words, for the report.
    """

    indices: tuple[int, ...] | None
    uuids: tuple[str | None, ...] | None = None
    source: ChoiceSource = "visible"
    reason: str = "no better information: every visible GPU"


def _torch_uuids(indices: Sequence[int]) -> tuple[str | None, ...] | None:
    try:
        import torch

        if not (torch.cuda.is_available() and torch.cuda.is_initialized()):
            return None
        out: list[str | None] = []
        for i in indices:
            uuid = getattr(torch.cuda.get_device_properties(i), "uuid", None)
            out.append(str(uuid) if uuid is not None else None)
        return tuple(out)
    except Exception:
        return None


def devices_in_use(
    model: Any = None,
    environ: Mapping[str, str] | None = None,
    devices: Sequence[int] | None = None,
) -> DeviceChoice:
    """The CUDA devices this process trains on, in this order of evidence.

    1. ``devices``, when given.
    2. The devices holding the model's parameters and buffers (a model spread over several GPUs
       counts all of them).
    3. torch's current CUDA device, once this process has initialised CUDA.
    4. ``LOCAL_RANK`` (set by torchrun and most launchers: one GPU per process).
    5. Otherwise every visible device (``CUDA_VISIBLE_DEVICES``), with a note saying so.

    Args:
        model: The model being trained (a ``torch.nn.Module``), or ``None``.
        environ: Environment to read (default ``os.environ``).
        devices: Explicit torch device indices.
    """
    env = os.environ if environ is None else environ
    if devices is not None:
        idx = tuple(int(d) for d in devices)
        return DeviceChoice(idx, _torch_uuids(idx), "explicit", f"devices given: {list(idx)}")
    if model is not None:
        try:
            found: set[int] = set()
            for tensor in (*model.parameters(), *model.buffers()):
                if tensor.device.type == "cuda":
                    found.add(tensor.device.index or 0)
            if found:
                idx = tuple(sorted(found))
                where = ", ".join(f"cuda:{i}" for i in idx)
                return DeviceChoice(
                    idx, _torch_uuids(idx), "model", f"the model's parameters are on {where}"
                )
        except Exception:
            pass
    try:
        import torch

        if torch.cuda.is_available() and torch.cuda.is_initialized():
            current = torch.cuda.current_device()
            return DeviceChoice(
                (current,),
                _torch_uuids((current,)),
                "torch",
                f"torch's current CUDA device (cuda:{current})",
            )
    except Exception:
        pass
    local_rank = env.get("LOCAL_RANK", "").strip()
    if local_rank.isdigit():
        return DeviceChoice((int(local_rank),), None, "local_rank", f"LOCAL_RANK={local_rank}")
    return DeviceChoice(None)


def _value(result: Any) -> Any:
    """A ctypes scalar's value (``nvmlDeviceIsMigDeviceHandle`` returns the ``c_uint``)."""
    return getattr(result, "value", result)


@dataclass
class _Visible:
    label: str
    handle: Any


def _visible_handles(
    nvml: ModuleType, environ: Mapping[str, str]
) -> tuple[list[_Visible], list[str]]:
    """The devices CUDA shows this process, in CUDA's order, as NVML handles."""
    notes: list[str] = []
    count = int(nvml.nvmlDeviceGetCount())
    raw = environ.get("CUDA_VISIBLE_DEVICES")
    entries = parse_visible_devices(raw)
    if entries is None:
        return [
            _Visible(f"GPU {i}", nvml.nvmlDeviceGetHandleByIndex(i)) for i in range(count)
        ], notes
    visible: list[_Visible] = []
    all_uuids: list[str] | None = None
    for entry in entries:
        if isinstance(entry, int):
            if entry >= count:
                notes.append(
                    f"CUDA_VISIBLE_DEVICES={raw!r} names GPU {entry}, which NVML does not have "
                    f"({count} GPUs); CUDA stops reading the list there."
                )
                break
            visible.append(_Visible(f"GPU {entry}", nvml.nvmlDeviceGetHandleByIndex(entry)))
        elif entry.startswith("GPU-"):
            if all_uuids is None:
                all_uuids = [
                    str(nvml.nvmlDeviceGetUUID(nvml.nvmlDeviceGetHandleByIndex(i)))
                    for i in range(count)
                ]
            matches = [i for i, u in enumerate(all_uuids) if u.startswith(entry)]
            if len(matches) != 1:
                notes.append(
                    f"CUDA_VISIBLE_DEVICES entry {entry!r} matches "
                    f"{'no' if not matches else 'more than one'} GPU; CUDA stops reading the "
                    "list there."
                )
                break
            visible.append(_Visible(entry, nvml.nvmlDeviceGetHandleByIndex(matches[0])))
        else:  # MIG-...
            try:
                visible.append(_Visible(entry, nvml.nvmlDeviceGetHandleByUUID(entry)))
            except nvml.NVMLError as exc:
                notes.append(
                    f"CUDA_VISIBLE_DEVICES entry {entry!r}: NVML has no such MIG device ({exc})."
                )
                break
    return visible, notes


def select_handles(
    nvml: ModuleType, choice: DeviceChoice, environ: Mapping[str, str] | None = None
) -> tuple[list[_Visible], list[str]]:
    """The NVML handles of the chosen devices, and notes on what could not be matched."""
    env = os.environ if environ is None else environ
    visible, notes = _visible_handles(nvml, env)
    if choice.indices is None:
        if visible:
            notes.append(
                f"Which GPU this process trains on is not known (the model is not on a GPU when "
                f"the meter starts, CUDA is not initialised, no LOCAL_RANK): all {len(visible)} "
                "visible GPU(s) are monitored. Move the model to its GPU before starting the meter."
            )
        return visible, notes
    chosen: list[_Visible] = []
    for pos, index in enumerate(choice.indices):
        uuid = choice.uuids[pos] if choice.uuids is not None else None
        if uuid:
            for candidate in (uuid, f"GPU-{uuid}", f"MIG-{uuid}"):
                try:
                    chosen.append(
                        _Visible(f"cuda:{index}", nvml.nvmlDeviceGetHandleByUUID(candidate))
                    )
                    break
                except nvml.NVMLError:
                    continue
            else:
                uuid = None
            if uuid:
                continue
        if index < len(visible):
            chosen.append(_Visible(f"cuda:{index} ({visible[index].label})", visible[index].handle))
        elif choice.source == "local_rank" and len(visible) == 1:
            # One GPU per process through CUDA_VISIBLE_DEVICES: the rank's only GPU.
            chosen.append(_Visible(f"cuda:0 ({visible[0].label})", visible[0].handle))
        else:
            notes.append(
                f"{choice.reason}, but only {len(visible)} GPU(s) are visible: cuda:{index} is "
                "not monitored."
            )
    return chosen, notes


# ----------------------------------------------------------------------------- readings
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


@dataclass
class _Device:
    label: str
    handle: Any
    name: str | None = None
    uuid: str | None = None
    mig: bool = False
    energy_start_mj: int | None = None
    energy_end_mj: int | None = None
    energy_error: str | None = None
    power_fallback: bool = False
    power_samples: list[tuple[float, float]] = field(default_factory=list)
    util_samples: list[float] = field(default_factory=list)
    util_supported: bool = True
    sampling: bool = True
    sampling_error: str | None = None


def trapezoid_joules(samples: Sequence[tuple[float, float]]) -> float | None:
    """Integrates power samples ``(seconds, watts)`` over time, J; ``None`` with fewer than two."""
    if len(samples) < 2:
        return None
    total = 0.0
    for (t0, p0), (t1, p1) in itertools.pairwise(samples):
        total += (t1 - t0) * (p0 + p1) / 2.0
    return total


class NvmlMonitor:
    """Reads energy at start and stop and samples utilisation in one daemon thread.

    Args:
        interval_seconds: Sampling interval of the utilisation (and fallback power) thread.
        choice: The devices to monitor (default: :func:`devices_in_use` without a model).
        nvml: The ``pynvml`` module to use (default: imported on :meth:`start`).
        environ: Environment for ``CUDA_VISIBLE_DEVICES`` (default ``os.environ``).
        required: Log NVML being unavailable as a warning (else at INFO level).

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
        self._nvml = nvml
        self._environ = environ
        self._devices: list[_Device] = []
        self._notes: list[str] = []
        self._stop_event = threading.Event()
        self._thread: threading.Thread | None = None
        self._initialised = False
        self._state: Literal["new", "running", "stopped"] = "new"
        self._t_start: float | None = None
        self._t_stop: float | None = None
        self._thread_error: str | None = None
        self._thread_abandoned = False

    # ------------------------------------------------------------------ notes
    @property
    def notes(self) -> list[str]:
        """The monitor's notes so far."""
        return list(self._notes)

    @property
    def running(self) -> bool:
        """Whether the monitor has started and not stopped."""
        return self._state == "running"

    @property
    def thread(self) -> threading.Thread | None:
        """The sampling thread (``None`` before start or when nothing is sampled)."""
        return self._thread

    def _note(self, text: str, *, unavailable: bool = False) -> None:
        """Keeps ``text`` for the report and logs it once.

        NVML being unavailable is expected on a machine without an NVIDIA GPU: that is logged
        at INFO unless monitoring was required; problems with GPUs that exist are warnings.
        """
        if text not in self._notes:
            self._notes.append(text)
            level = logging.INFO if unavailable and not self.required else logging.WARNING
            logger.log(level, "flopmeter (nvml): %s", text)

    # ------------------------------------------------------------------ lifecycle
    def start(self) -> bool:
        """Initialises NVML, selects the devices, reads the energy counters, starts sampling.

        Returns:
            Whether monitoring runs (NVML initialised and at least one device selected).
        """
        if self._state != "new":
            return self._state == "running" and self._initialised
        self._state = "running"
        self._t_start = time.monotonic()
        try:
            return self._start()
        except Exception as exc:  # never into training
            self._note(f"The NVML monitor failed to start ({type(exc).__name__}: {exc}).")
            self._shutdown()
            return False

    def _start(self) -> bool:
        try:
            nvml = self._nvml or import_pynvml()
        except MissingExtraError as exc:
            self._note(f"No GPU readings: {exc}.", unavailable=True)
            return False
        self._nvml = nvml
        try:
            nvml.nvmlInit()
        except Exception as exc:
            self._note(
                f"No GPU readings: NVML could not initialise ({_describe(exc)}).", unavailable=True
            )
            return False
        self._initialised = True
        choice = self._choice or devices_in_use(environ=self._environ)
        handles, notes = select_handles(nvml, choice, self._environ)
        for note in notes:
            self._note(note)
        if not handles:
            self._note(
                "No GPU readings: no GPU visible to this process was found in NVML.",
                unavailable=True,
            )
            self._shutdown()
            return False
        # The window starts now; a baseline power sample is stamped with its start.
        self._t_start = time.monotonic()
        self._devices = [self._open(v.label, v.handle) for v in handles]
        if any(d.sampling for d in self._devices):
            try:
                self._thread = threading.Thread(
                    target=self._run, name="flopmeter-nvml", daemon=True
                )
                self._thread.start()
            except Exception as exc:
                self._thread = None
                self._note(f"The NVML sampling thread could not start ({exc}): no utilisation.")
                for dev in self._devices:
                    dev.sampling = False
                    dev.sampling_error = "the sampling thread could not start"
        return True

    def _open(self, label: str, handle: Any) -> _Device:
        nvml = self._nvml
        assert nvml is not None
        dev = _Device(label, handle)
        try:
            dev.name = str(nvml.nvmlDeviceGetName(handle))
        except Exception as exc:
            self._note(f"{label}: NVML did not give the device name ({_describe(exc)}).")
        try:
            dev.uuid = str(nvml.nvmlDeviceGetUUID(handle))
        except Exception:
            dev.uuid = None
        dev.mig = _is_mig(nvml, handle)
        if dev.mig:
            dev.sampling = False
            self._note(
                f"{label} ({dev.name}) is a MIG instance (or a GPU in MIG mode): NVML's energy, "
                "power and utilisation "
                "are whole-GPU readings that do not belong to one instance, so none is reported "
                "for it, and the whole GPU's peak does not apply to it."
            )
            return dev
        try:
            dev.energy_start_mj = int(nvml.nvmlDeviceGetTotalEnergyConsumption(handle))
        except Exception as exc:
            dev.power_fallback = True
            try:
                watts = float(nvml.nvmlDeviceGetPowerUsage(handle)) / 1000.0
                dev.power_samples.append((self._t_start or time.monotonic(), watts))
                self._note(
                    f"{label} ({dev.name}) has no energy counter ({_describe(exc)}): its energy "
                    f"is integrated from power sampled every {self.interval_seconds:g} s, an "
                    "approximation."
                )
            except Exception as exc2:
                dev.energy_error = (
                    f"neither the energy counter ({_describe(exc)}) nor power "
                    f"({_describe(exc2)}) can be read"
                )
                self._note(f"{label} ({dev.name}): no energy reading: {dev.energy_error}.")
                dev.power_fallback = False
        return dev

    def stop(self) -> None:
        """Stops sampling (the thread is joined), takes the last readings, shuts NVML down.

        Idempotent; never raises.
        """
        if self._state != "running":
            self._state = "stopped"
            return
        self._state = "stopped"
        try:
            self._stop_event.set()
            if not self._devices or self._nvml is None:
                return
            if self._thread is not None:
                self._thread.join(JOIN_TIMEOUT_SECONDS)
                if self._thread.is_alive():
                    self._thread_abandoned = True
                    self._note(
                        f"The NVML sampling thread did not stop within {JOIN_TIMEOUT_SECONDS:g} s "
                        "(an NVML call hangs); it is left as a daemon and its samples are not used."
                    )
            # The window ends now; the last samples are stamped with its end.
            self._t_stop = time.monotonic()
            if not self._thread_abandoned:
                self._sample(at=self._t_stop)
            for dev in self._devices:
                if dev.energy_start_mj is not None:
                    try:
                        dev.energy_end_mj = int(
                            self._nvml.nvmlDeviceGetTotalEnergyConsumption(dev.handle)  # type: ignore[union-attr]
                        )
                    except Exception as exc:
                        dev.energy_error = (
                            f"the energy counter could not be read at the end ({_describe(exc)})"
                        )
                        self._note(
                            f"{dev.label} ({dev.name}): no energy reading: {dev.energy_error}."
                        )
        except Exception as exc:
            self._note(f"The NVML monitor failed while stopping ({type(exc).__name__}: {exc}).")
        finally:
            if self._t_stop is None:
                self._t_stop = time.monotonic()
            self._shutdown()

    def _shutdown(self) -> None:
        if self._initialised and self._nvml is not None:
            self._initialised = False
            with contextlib.suppress(Exception):
                self._nvml.nvmlShutdown()

    # ------------------------------------------------------------------ sampling
    def _run(self) -> None:
        try:
            while not self._stop_event.wait(self.interval_seconds):
                if not self._sample():
                    return
        except Exception as exc:  # never raise in the thread either
            self._thread_error = f"{type(exc).__name__}: {exc}"
            self._note(f"The NVML sampling thread stopped: {self._thread_error}.")
            for dev in self._devices:
                if dev.sampling:
                    dev.sampling = False
                    dev.sampling_error = f"the sampling thread failed ({self._thread_error})"

    def _sample(self, at: float | None = None) -> bool:
        """Samples every device still sampled; returns whether any still is."""
        nvml = self._nvml
        assert nvml is not None
        for dev in self._devices:
            if not dev.sampling:
                continue
            now = time.monotonic() if at is None else at
            if dev.util_supported:
                try:
                    util = nvml.nvmlDeviceGetUtilizationRates(dev.handle)
                    dev.util_samples.append(float(util.gpu) / 100.0)
                except Exception as exc:
                    if dev.util_samples or not _not_supported(nvml, exc):
                        self._stop_device(dev, "utilisation", exc, now)
                        continue
                    dev.util_supported = False
                    self._note(
                        f"{dev.label} ({dev.name}) does not report utilisation ({_describe(exc)})."
                    )
            if dev.power_fallback:
                try:
                    watts = float(nvml.nvmlDeviceGetPowerUsage(dev.handle)) / 1000.0
                    dev.power_samples.append((time.monotonic() if at is None else at, watts))
                except Exception as exc:
                    self._stop_device(dev, "power", exc, now)
                    continue
            if not dev.util_supported and not dev.power_fallback:
                dev.sampling = False
        return any(d.sampling for d in self._devices)

    def _stop_device(self, dev: _Device, what: str, exc: BaseException, now: float) -> None:
        dev.sampling = False
        elapsed = now - (self._t_start or now)
        dev.sampling_error = f"reading its {what} failed after {elapsed:.1f} s ({_describe(exc)})"
        self._note(
            f"{dev.label} ({dev.name}): {dev.sampling_error}; sampling of this GPU stopped, its "
            "utilisation (and sampled-power energy) is not reported."
        )

    # ------------------------------------------------------------------ results
    def readings(self) -> MonitorReadings:
        """The readings: final after :meth:`stop`, up to now while running."""
        if not self._devices:
            return MonitorReadings(available=False, notes=tuple(self._notes))
        end = self._t_stop if self._t_stop is not None else time.monotonic()
        window = max(0.0, end - (self._t_start or end))
        out = []
        for dev in self._devices:
            energy, source = self._energy(dev)
            util = None
            if (
                dev.util_supported
                and not dev.mig
                and dev.util_samples
                and dev.sampling_error is None
                and not self._thread_abandoned
            ):
                util = sum(dev.util_samples) / len(dev.util_samples)
            out.append(
                DeviceReading(
                    label=dev.label,
                    name=dev.name,
                    uuid=dev.uuid,
                    mig=dev.mig,
                    energy_joules=energy,
                    energy_source=source,
                    utilization=util,
                    utilization_samples=len(dev.util_samples),
                )
            )
        return MonitorReadings(True, tuple(out), tuple(self._notes), window)

    def _energy(self, dev: _Device) -> tuple[float | None, str | None]:
        if dev.mig:
            return None, None
        if dev.energy_start_mj is not None:
            end = dev.energy_end_mj
            if end is None and self._state == "running" and self._initialised:
                try:
                    end = int(self._nvml.nvmlDeviceGetTotalEnergyConsumption(dev.handle))  # type: ignore[union-attr]
                except Exception:
                    end = None
            if end is None:
                return None, None
            if end < dev.energy_start_mj:
                self._note(
                    f"{dev.label} ({dev.name}): the energy counter went backwards (driver "
                    "reloaded?): no energy reading."
                )
                return None, None
            return (end - dev.energy_start_mj) / 1000.0, "energy counter"
        if dev.power_fallback and dev.sampling_error is None and not self._thread_abandoned:
            joules = trapezoid_joules(list(dev.power_samples))
            return (joules, "sampled power") if joules is not None else (None, None)
        return None, None


def _is_mig(nvml: ModuleType, handle: Any) -> bool:
    try:
        if bool(_value(nvml.nvmlDeviceIsMigDeviceHandle(handle))):
            return True
    except Exception:
        pass
    try:
        current = nvml.nvmlDeviceGetMigMode(handle)[0]
        return int(_value(current)) == int(getattr(nvml, "NVML_DEVICE_MIG_ENABLE", 1))
    except Exception:
        return False


def _not_supported(nvml: ModuleType, exc: BaseException) -> bool:
    code = getattr(nvml, "NVML_ERROR_NOT_SUPPORTED", 3)
    return isinstance(exc, nvml.NVMLError) and getattr(exc, "value", None) == code


def _describe(exc: BaseException) -> str:
    name = type(exc).__name__
    text = str(exc)
    return f"{name}: {text}" if text and text != name else name
