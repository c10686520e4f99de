"""The one door to NVML: every call flopmeter makes, and the only place NVML errors are caught.

Each call returns its value or an :class:`NvmlFailure` (a typed reason), never raises: the
monitor decides what a failure means (a note, a missing reading, a fallback) without writing
its own ``except``. ``pynvml`` (the ``nvidia-ml-py`` package) is imported when a monitor starts,
never at import.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from types import ModuleType
from typing import Any, Literal, TypeVar

from flopmeter.errors import MissingExtraError

# Re-exported: meter.py and users import these from here.

__all__ = [
    "FailureKind",
    "Nvml",
    "NvmlFailure",
    "import_pynvml",
]

T = TypeVar("T")

#: ``not_supported``: the device lacks the reading; ``not_found``: no such device;
#: ``gpu_lost``: the device fell off the bus; ``library_not_found``: no NVIDIA driver's NVML
#: library on this machine (a machine without an NVIDIA GPU); ``nvml_error``: any other NVML error code;
#: ``unexpected``: an exception that is not an ``NVMLError`` (a broken binding, a bad value).
FailureKind = Literal[
    "not_supported", "not_found", "gpu_lost", "library_not_found", "nvml_error", "unexpected"
]

# NVML error constants (with their values, for bindings that lack a name) -> kind.
_KINDS: tuple[tuple[str, int, FailureKind], ...] = (
    ("NVML_ERROR_NOT_SUPPORTED", 3, "not_supported"),
    ("NVML_ERROR_NOT_FOUND", 6, "not_found"),
    ("NVML_ERROR_GPU_IS_LOST", 15, "gpu_lost"),
    ("NVML_ERROR_LIBRARY_NOT_FOUND", 12, "library_not_found"),
)


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


@dataclass(frozen=True)
class NvmlFailure:
    """Why an NVML call gave no value.

    Attributes:
        kind: The class of failure (see :data:`FailureKind`).
        error: The exception's class name (``"NVMLError_GpuIsLost"``).
        message: The exception's text (``"GPU is lost"``).
    """

    kind: FailureKind
    error: str
    message: str

    @property
    def reason(self) -> str:
        """Class and text, for notes: ``"NVMLError_GpuIsLost: GPU is lost"``."""
        if self.message and self.message != self.error:
            return f"{self.error}: {self.message}"
        return self.error


def failure_of(module: ModuleType, exc: BaseException) -> NvmlFailure:
    """Maps an exception raised by an NVML call to an :class:`NvmlFailure`."""
    error, message = type(exc).__name__, str(exc)
    nvml_error = getattr(module, "NVMLError", None)
    if not (isinstance(nvml_error, type) and isinstance(exc, nvml_error)):
        return NvmlFailure("unexpected", error, message)
    code = getattr(exc, "value", None)
    for name, default, kind in _KINDS:
        if code == getattr(module, name, default):
            return NvmlFailure(kind, error, message)
    return NvmlFailure("nvml_error", error, message)


def _value(result: Any) -> Any:
    """A ctypes scalar's value (``nvmlDeviceIsMigDeviceHandle`` returns the ``c_uint``)."""
    return getattr(result, "value", result)


class Nvml:
    """``pynvml`` behind typed results; one NVML session (``init`` to ``shutdown``).

    Every method returns its value (in the unit its name or docstring states) or an
    :class:`NvmlFailure`; none raises.

    Args:
        module: The ``pynvml`` module (the real one or a stand-in with the same API).
    """

    def __init__(self, module: ModuleType) -> None:
        self.module = module
        self._open = False

    def call(self, func: str, *args: Any, convert: Callable[[Any], T]) -> T | NvmlFailure:
        """``pynvml.<func>(*args)`` passed through ``convert``, or the failure."""
        try:
            return convert(getattr(self.module, func)(*args))
        except Exception as exc:  # the one place NVML errors are caught
            return failure_of(self.module, exc)

    # ------------------------------------------------------------------ session
    @property
    def is_open(self) -> bool:
        """Whether :meth:`init` succeeded and :meth:`shutdown` has not run since."""
        return self._open

    def init(self) -> NvmlFailure | None:
        """``nvmlInit``; ``None`` on success."""
        result = self.call("nvmlInit", convert=lambda _: None)
        self._open = result is None
        return result

    def shutdown(self) -> None:
        """``nvmlShutdown`` once per successful :meth:`init` (idempotent; a failure is ignored)."""
        if self._open:
            self._open = False
            self.call("nvmlShutdown", convert=lambda _: None)

    # ------------------------------------------------------------------ devices
    def device_count(self) -> int | NvmlFailure:
        """Number of GPUs NVML sees (every GPU of the node)."""
        return self.call("nvmlDeviceGetCount", convert=int)

    def handle_by_index(self, index: int) -> Any | NvmlFailure:
        """The handle of NVML's GPU ``index``."""
        return self.call("nvmlDeviceGetHandleByIndex", index, convert=_same)

    def handle_by_uuid(self, uuid: str) -> Any | NvmlFailure:
        """The handle of the GPU or MIG instance with this UUID (``GPU-...``/``MIG-...``)."""
        return self.call("nvmlDeviceGetHandleByUUID", uuid, convert=_same)

    def name(self, handle: Any) -> str | NvmlFailure:
        """The device name ("NVIDIA H200", "NVIDIA A100-SXM4-40GB MIG 1g.5gb")."""
        return self.call("nvmlDeviceGetName", handle, convert=str)

    def uuid(self, handle: Any) -> str | NvmlFailure:
        """The device UUID."""
        return self.call("nvmlDeviceGetUUID", handle, convert=str)

    def is_mig(self, handle: Any) -> bool:
        """Whether ``handle`` is a MIG instance or a GPU in MIG mode (``False`` when unknown)."""
        is_mig = self.call("nvmlDeviceIsMigDeviceHandle", handle, convert=lambda r: bool(_value(r)))
        if is_mig is True:  # a failure falls through to the MIG mode
            return True
        enabled = int(getattr(self.module, "NVML_DEVICE_MIG_ENABLE", 1))
        mode = self.call("nvmlDeviceGetMigMode", handle, convert=lambda r: int(_value(r[0])))
        return mode == enabled

    # ------------------------------------------------------------------ readings
    def energy_mj(self, handle: Any) -> int | NvmlFailure:
        """The total-energy counter, mJ since the driver loaded."""
        return self.call("nvmlDeviceGetTotalEnergyConsumption", handle, convert=int)

    def power_watts(self, handle: Any) -> float | NvmlFailure:
        """Board power now, W (NVML gives mW)."""
        return self.call("nvmlDeviceGetPowerUsage", handle, convert=lambda mw: float(mw) / 1000.0)

    def utilization(self, handle: Any) -> float | NvmlFailure:
        """GPU utilisation over NVML's last sample period, a fraction in [0, 1]."""
        return self.call(
            "nvmlDeviceGetUtilizationRates", handle, convert=lambda u: float(u.gpu) / 100.0
        )


def _same(value: T) -> T:
    return value
