"""A stand-in for nvidia-ml-py's ``pynvml`` module, for machines without an NVIDIA driver.

Tests put this folder first on ``sys.path`` so that ``import pynvml`` inside flopmeter finds it.
It mirrors the real module's API for what flopmeter uses: the same function names and return
types (str names and UUIDs, mJ energy as int, mW power as int, a ``c_nvmlUtilization_t``
structure, ``nvmlDeviceIsMigDeviceHandle`` returning a ``c_uint`` like the real one), the same
error codes, and the same ``NVMLError`` class with one generated subclass per code
(``NVMLError_NotSupported``, ``NVMLError_GpuIsLost``, ...), raised the same way
(``NVMLError(code)`` returns the subclass).

Tests configure it through :data:`state` (a :class:`FakeNvml`): the devices, their readings,
failures to inject. Subprocesses configure it through the ``FAKE_NVML_CONFIG`` environment
variable (JSON, see :meth:`FakeNvml.from_json`). It records the calls it answers so that tests
can check what flopmeter asked, and wait (without sleeping) until the sampling thread has read
a device a given number of times.
"""

from __future__ import annotations

import json
import os
import string
import sys
import threading
from collections import Counter
from ctypes import Structure, c_uint
from dataclasses import dataclass, field
from typing import Any

# ----------------------------------------------------------------------------- constants
NVML_SUCCESS = 0
NVML_ERROR_UNINITIALIZED = 1
NVML_ERROR_INVALID_ARGUMENT = 2
NVML_ERROR_NOT_SUPPORTED = 3
NVML_ERROR_NO_PERMISSION = 4
NVML_ERROR_ALREADY_INITIALIZED = 5
NVML_ERROR_NOT_FOUND = 6
NVML_ERROR_INSUFFICIENT_SIZE = 7
NVML_ERROR_INSUFFICIENT_POWER = 8
NVML_ERROR_DRIVER_NOT_LOADED = 9
NVML_ERROR_TIMEOUT = 10
NVML_ERROR_IRQ_ISSUE = 11
NVML_ERROR_LIBRARY_NOT_FOUND = 12
NVML_ERROR_FUNCTION_NOT_FOUND = 13
NVML_ERROR_CORRUPTED_INFOROM = 14
NVML_ERROR_GPU_IS_LOST = 15
NVML_ERROR_RESET_REQUIRED = 16
NVML_ERROR_OPERATING_SYSTEM = 17
NVML_ERROR_LIB_RM_VERSION_MISMATCH = 18
NVML_ERROR_IN_USE = 19
NVML_ERROR_MEMORY = 20
NVML_ERROR_NO_DATA = 21
NVML_ERROR_UNKNOWN = 999

NVML_DEVICE_MIG_DISABLE = 0x0
NVML_DEVICE_MIG_ENABLE = 0x1


# ----------------------------------------------------------------------------- errors
class NVMLError(Exception):
    """Same shape as the real one: ``NVMLError(code)`` is an instance of the code's subclass."""

    _valClassMapping: dict[int, type] = {}  # noqa: RUF012 (the real module's name and shape)
    _errcode_to_string: dict[int, str] = {  # noqa: RUF012
        NVML_ERROR_UNINITIALIZED: "Uninitialized",
        NVML_ERROR_INVALID_ARGUMENT: "Invalid Argument",
        NVML_ERROR_NOT_SUPPORTED: "Not Supported",
        NVML_ERROR_NO_PERMISSION: "Insufficient Permissions",
        NVML_ERROR_ALREADY_INITIALIZED: "Already Initialized",
        NVML_ERROR_NOT_FOUND: "Not Found",
        NVML_ERROR_DRIVER_NOT_LOADED: "Driver Not Loaded",
        NVML_ERROR_TIMEOUT: "Timeout",
        NVML_ERROR_LIBRARY_NOT_FOUND: "NVML Shared Library Not Found",
        NVML_ERROR_FUNCTION_NOT_FOUND: "Function Not Found",
        NVML_ERROR_GPU_IS_LOST: "GPU is lost",
        NVML_ERROR_UNKNOWN: "Unknown Error",
    }

    def __new__(cls, value: int) -> NVMLError:
        if cls is NVMLError:
            cls = NVMLError._valClassMapping.get(value, cls)
        obj = Exception.__new__(cls)
        obj.value = value  # type: ignore[attr-defined]
        return obj

    def __str__(self) -> str:
        return self._errcode_to_string.get(self.value, f"NVML Error with code {self.value}")  # type: ignore[attr-defined]

    def __eq__(self, other: object) -> bool:
        return self.value == getattr(other, "value", None)  # type: ignore[attr-defined]

    __hash__ = Exception.__hash__


def _extract_errors_as_classes() -> None:
    """NVML_ERROR_GPU_IS_LOST -> NVMLError_GpuIsLost, as the real module names them."""
    module = sys.modules[__name__]
    for err_name in [x for x in dir(module) if x.startswith("NVML_ERROR_")]:
        class_name = "NVMLError_" + string.capwords(
            err_name.replace("NVML_ERROR_", ""), "_"
        ).replace("_", "")
        value = getattr(module, err_name)

        def gen_new(val: int) -> Any:
            def new(typ: type, *args: Any) -> NVMLError:
                return NVMLError.__new__(typ, val)

            return new

        cls = type(class_name, (NVMLError,), {"__new__": gen_new(value)})
        cls.__module__ = __name__
        setattr(module, class_name, cls)
        NVMLError._valClassMapping[value] = cls


_extract_errors_as_classes()


class c_nvmlUtilization_t(Structure):
    _fields_ = [("gpu", c_uint), ("memory", c_uint)]


class c_nvmlDevice_t:
    """An opaque device handle (the real one is a ctypes pointer)."""

    def __init__(self, gpu: FakeGpu, mig: FakeMig | None = None) -> None:
        self.gpu = gpu
        self.mig = mig

    def __repr__(self) -> str:
        return f"<fake nvml handle {self.mig.uuid if self.mig else self.gpu.uuid}>"


# ----------------------------------------------------------------------------- state
@dataclass
class FakeMig:
    """A MIG instance of a GPU."""

    uuid: str
    profile: str = "1g.5gb"


@dataclass
class FakeGpu:
    """One device and what it answers.

    ``None`` for ``energy_mj``, ``power_mw`` or ``utilization`` makes the call raise
    ``NVMLError_NotSupported``. ``utilization`` is either one percentage or a list read in order
    (the last value repeats). ``fail_after`` maps a function name to the number of calls it
    answers before raising ``NVMLError_GpuIsLost`` for good.
    """

    name: str = "NVIDIA H100 80GB HBM3"
    uuid: str = "GPU-00000000-0000-0000-0000-000000000000"
    energy_mj: int | None = 1_000_000
    power_mw: int | None = 300_000
    utilization: int | list[int] | None = 50
    mig_mode: int | None = NVML_DEVICE_MIG_DISABLE
    migs: list[FakeMig] = field(default_factory=list)
    fail_after: dict[str, int] = field(default_factory=dict)
    calls: Counter[str] = field(default_factory=Counter)
    utilization_returned: list[int] = field(default_factory=list)


class FakeNvml:
    """The fake driver's state: devices, init failures, call records."""

    def __init__(self) -> None:
        self.gpus: list[FakeGpu] = []
        self.init_error: int | None = None
        self.init_calls = 0
        self.shutdown_calls = 0
        self.refcount = 0
        self._cond = threading.Condition()
        self.errors_raised: list[tuple[str, int]] = []

    def reset(self, gpus: list[FakeGpu] | None = None, init_error: int | None = None) -> FakeNvml:
        """Replaces the devices and clears the records."""
        with self._cond:
            self.gpus = list(gpus or [])
            self.init_error = init_error
            self.init_calls = self.shutdown_calls = self.refcount = 0
            self.errors_raised = []
        return self

    @classmethod
    def from_json(cls, text: str) -> FakeNvml:
        """``{"gpus": [{"name": ..., "uuid": ..., "energy_mj": ...}, ...], "init_error": null}``."""
        data = json.loads(text)
        gpus = []
        for g in data.get("gpus", []):
            migs = [FakeMig(**m) for m in g.pop("migs", [])]
            gpus.append(FakeGpu(**g, migs=migs))
        return cls().reset(gpus, data.get("init_error"))

    def eight_gpus(self, name: str = "NVIDIA H100 80GB HBM3") -> list[FakeGpu]:
        """Eight identical GPUs with distinct UUIDs (``GPU-<i>...``), installed as the devices."""
        gpus = [
            FakeGpu(name=name, uuid=f"GPU-{i}{i}{i}{i}{i}{i}{i}{i}-aaaa-bbbb-cccc-{i:012d}")
            for i in range(8)
        ]
        self.reset(gpus)
        return gpus

    # -- records
    def record(self, gpu: FakeGpu, func: str) -> None:
        with self._cond:
            gpu.calls[func] += 1
            self._cond.notify_all()

    def wait_for(self, gpu: FakeGpu, func: str, calls: int, timeout: float = 10.0) -> bool:
        """Blocks until ``func`` was called ``calls`` times on ``gpu`` (True) or ``timeout``."""
        with self._cond:
            return self._cond.wait_for(lambda: gpu.calls[func] >= calls, timeout)

    def wait_for_error(self, count: int = 1, timeout: float = 10.0) -> bool:
        """Blocks until ``count`` injected errors were raised (True) or ``timeout``."""
        with self._cond:
            return self._cond.wait_for(lambda: len(self.errors_raised) >= count, timeout)


state = FakeNvml()
if os.environ.get("FAKE_NVML_CONFIG"):
    state = FakeNvml.from_json(os.environ["FAKE_NVML_CONFIG"])


# ----------------------------------------------------------------------------- helpers
def _raise(code: int) -> None:
    raise NVMLError(code)


def _check_init() -> None:
    if state.refcount <= 0:
        _raise(NVML_ERROR_UNINITIALIZED)


def _gpu(handle: Any) -> FakeGpu:
    _check_init()
    if not isinstance(handle, c_nvmlDevice_t):
        _raise(NVML_ERROR_INVALID_ARGUMENT)
    return handle.gpu


def _answer(handle: Any, func: str) -> FakeGpu:
    gpu = _gpu(handle)
    limit = gpu.fail_after.get(func)
    if limit is not None and gpu.calls[func] >= limit:
        with state._cond:
            state.errors_raised.append((func, NVML_ERROR_GPU_IS_LOST))
            state._cond.notify_all()
        _raise(NVML_ERROR_GPU_IS_LOST)
    state.record(gpu, func)
    return gpu


def _decode(value: str | bytes) -> str:
    return value.decode() if isinstance(value, bytes) else value


# ----------------------------------------------------------------------------- API
def nvmlInitWithFlags(flags: int) -> None:
    state.init_calls += 1
    if state.init_error is not None:
        _raise(state.init_error)
    state.refcount += 1


def nvmlInit() -> None:
    nvmlInitWithFlags(0)


def nvmlShutdown() -> None:
    _check_init()
    state.shutdown_calls += 1
    state.refcount -= 1


def nvmlDeviceGetCount() -> int:
    _check_init()
    return len(state.gpus)


def nvmlDeviceGetHandleByIndex(index: int) -> c_nvmlDevice_t:
    _check_init()
    if not 0 <= int(index) < len(state.gpus):
        _raise(NVML_ERROR_INVALID_ARGUMENT)
    return c_nvmlDevice_t(state.gpus[int(index)])  # in MIG mode: the parent GPU


def nvmlDeviceGetHandleByUUID(uuid: str | bytes) -> c_nvmlDevice_t:
    _check_init()
    text = _decode(uuid)
    for gpu in state.gpus:
        if gpu.uuid == text:
            return c_nvmlDevice_t(gpu)
        for mig in gpu.migs:
            if mig.uuid == text:
                return c_nvmlDevice_t(gpu, mig)
    _raise(NVML_ERROR_NOT_FOUND)
    raise AssertionError  # unreachable


def nvmlDeviceGetName(handle: Any) -> str:
    gpu = _answer(handle, "nvmlDeviceGetName")
    if handle.mig is not None:
        return f"{gpu.name} MIG {handle.mig.profile}"
    return gpu.name


def nvmlDeviceGetUUID(handle: Any) -> str:
    gpu = _answer(handle, "nvmlDeviceGetUUID")
    return handle.mig.uuid if handle.mig is not None else gpu.uuid


def nvmlDeviceGetTotalEnergyConsumption(handle: Any) -> int:
    gpu = _answer(handle, "nvmlDeviceGetTotalEnergyConsumption")
    if gpu.energy_mj is None or handle.mig is not None:
        _raise(NVML_ERROR_NOT_SUPPORTED)
    return int(gpu.energy_mj)  # type: ignore[arg-type]


def nvmlDeviceGetPowerUsage(handle: Any) -> int:
    gpu = _answer(handle, "nvmlDeviceGetPowerUsage")
    if gpu.power_mw is None or handle.mig is not None:
        _raise(NVML_ERROR_NOT_SUPPORTED)
    return int(gpu.power_mw)  # type: ignore[arg-type]


def nvmlDeviceGetUtilizationRates(handle: Any) -> c_nvmlUtilization_t:
    gpu = _answer(handle, "nvmlDeviceGetUtilizationRates")
    if gpu.utilization is None or handle.mig is not None:
        _raise(NVML_ERROR_NOT_SUPPORTED)
    if isinstance(gpu.utilization, list):
        n = len(gpu.utilization_returned)
        value = gpu.utilization[min(n, len(gpu.utilization) - 1)]
    else:
        value = gpu.utilization
    gpu.utilization_returned.append(int(value))
    util = c_nvmlUtilization_t()
    util.gpu = int(value)
    util.memory = 0
    return util


def nvmlDeviceIsMigDeviceHandle(handle: Any) -> c_uint:
    _gpu(handle)
    return c_uint(1 if handle.mig is not None else 0)  # the real one returns the c_uint too


def nvmlDeviceGetMigMode(handle: Any) -> list[int]:
    gpu = _gpu(handle)
    if handle.mig is not None:
        _raise(NVML_ERROR_INVALID_ARGUMENT)
    if gpu.mig_mode is None:
        _raise(NVML_ERROR_NOT_SUPPORTED)
    return [int(gpu.mig_mode), int(gpu.mig_mode)]  # type: ignore[arg-type]


def nvmlDeviceGetDeviceHandleFromMigDeviceHandle(handle: Any) -> c_nvmlDevice_t:
    gpu = _gpu(handle)
    if handle.mig is None:
        _raise(NVML_ERROR_INVALID_ARGUMENT)
    return c_nvmlDevice_t(gpu)
