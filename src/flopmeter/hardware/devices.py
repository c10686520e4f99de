"""Which GPUs this process trains on, and their NVML handles.

* :func:`devices_in_use`: the CUDA devices (torch's indices) from the model, torch, ``LOCAL_RANK``
  or, failing those, every visible device.
* :func:`parse_visible_devices`: ``CUDA_VISIBLE_DEVICES`` read the way CUDA reads it.
* :func:`select_handles`: the chosen devices as NVML handles, through the UUID torch reports or
  the position in ``CUDA_VISIBLE_DEVICES`` (indices, ``GPU-`` UUIDs or unique UUID prefixes,
  ``MIG-`` UUIDs).
* :func:`open_device`: what the monitor keeps of a selected device (name, UUID, MIG, energy
  baseline).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from flopmeter.hardware.nvml import Nvml, NvmlFailure


# ----------------------------------------------------------------------------- choice
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
    entries: list[int | str] = []
    uuid_prefix = value[:4] if value.startswith(("GPU-", "MIG-")) else None
    for elem in value.split(","):
        entry = _visible_entry(elem.strip(), uuid_prefix)
        if entry is None:  # CUDA stops here
            break
        if entry in entries:
            return []
        entries.append(entry)
    return entries


def _visible_entry(elem: str, uuid_prefix: str | None) -> int | str | None:
    """One entry: a UUID (with the list's prefix), a leading number (as ``strtoul``), or ``None``."""
    if uuid_prefix is not None:
        return elem if elem.startswith(uuid_prefix) else None
    digits = ""
    for ch in elem:
        if not ch.isdigit():
            break
        digits += ch
    return int(digits) if digits else None  # empty, negative or not a number: None


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
    except Exception:  # torch without CUDA support, or a device it cannot describe
        return None


def _model_devices(model: Any) -> tuple[int, ...]:
    """The CUDA device indices of the model's parameters and buffers (sorted; may be empty)."""
    try:
        found = {
            tensor.device.index or 0
            for tensor in (*model.parameters(), *model.buffers())
            if tensor.device.type == "cuda"
        }
    except Exception:  # not a torch module after all: no evidence
        return ()
    return tuple(sorted(found))


def _torch_current_device() -> int | None:
    """torch's current CUDA device, once this process has initialised CUDA."""
    try:
        import torch

        if torch.cuda.is_available() and torch.cuda.is_initialized():
            return int(torch.cuda.current_device())
    except Exception:  # torch without CUDA support
        pass
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
    idx = _model_devices(model) if model is not None else ()
    if idx:
        where = ", ".join(f"cuda:{i}" for i in idx)
        return DeviceChoice(
            idx, _torch_uuids(idx), "model", f"the model's parameters are on {where}"
        )
    current = _torch_current_device()
    if current is not None:
        reason = f"torch's current CUDA device (cuda:{current})"
        return DeviceChoice((current,), _torch_uuids((current,)), "torch", reason)
    local_rank = env.get("LOCAL_RANK", "").strip()
    if local_rank.isdigit():
        return DeviceChoice((int(local_rank),), None, "local_rank", f"LOCAL_RANK={local_rank}")
    return DeviceChoice(None)


# ----------------------------------------------------------------------------- handles
@dataclass(frozen=True)
class VisibleDevice:
    """A device found in NVML.

    Attributes:
        label: How it was found ("GPU 3", a UUID, "cuda:0 (GPU 3)").
        handle: Its NVML handle.
    """

    label: str
    handle: Any


@dataclass(frozen=True)
class Selection:
    """Devices found in NVML, and notes on what could not be matched."""

    devices: tuple[VisibleDevice, ...]
    notes: tuple[str, ...] = ()


class _NodeUuids:
    """Every GPU's UUID, read from NVML once and only when a ``GPU-`` entry needs them."""

    def __init__(self, nvml: Nvml, count: int) -> None:
        self._nvml, self._count = nvml, count
        self._uuids: list[str] | NvmlFailure | None = None

    def get(self) -> list[str] | NvmlFailure:
        if self._uuids is None:
            uuids: list[str] = []
            for i in range(self._count):
                handle = self._nvml.handle_by_index(i)
                uuid = handle if isinstance(handle, NvmlFailure) else self._nvml.uuid(handle)
                if isinstance(uuid, NvmlFailure):
                    self._uuids = uuid
                    return uuid
                uuids.append(uuid)
            self._uuids = uuids
        return self._uuids


def _visible_entry_handle(
    nvml: Nvml, entry: int | str, count: int, raw: str | None, node: _NodeUuids
) -> VisibleDevice | NvmlFailure | str:
    """One ``CUDA_VISIBLE_DEVICES`` entry in NVML; a ``str`` is a note: CUDA stops there."""
    if isinstance(entry, int):
        if entry >= count:
            return (
                f"CUDA_VISIBLE_DEVICES={raw!r} names GPU {entry}, which NVML does not have "
                f"({count} GPUs); CUDA stops reading the list there."
            )
        handle = nvml.handle_by_index(entry)
        return handle if isinstance(handle, NvmlFailure) else VisibleDevice(f"GPU {entry}", handle)
    if entry.startswith("GPU-"):
        uuids = node.get()
        if isinstance(uuids, NvmlFailure):
            return uuids
        matches = [i for i, u in enumerate(uuids) if u.startswith(entry)]
        if len(matches) != 1:
            return (
                f"CUDA_VISIBLE_DEVICES entry {entry!r} matches "
                f"{'no' if not matches else 'more than one'} GPU; CUDA stops reading the "
                "list there."
            )
        handle = nvml.handle_by_index(matches[0])
        return handle if isinstance(handle, NvmlFailure) else VisibleDevice(entry, handle)
    handle = nvml.handle_by_uuid(entry)  # MIG-...
    if isinstance(handle, NvmlFailure):
        return (
            f"CUDA_VISIBLE_DEVICES entry {entry!r}: NVML has no such MIG device ({handle.message})."
        )
    return VisibleDevice(entry, handle)


def visible_devices(nvml: Nvml, environ: Mapping[str, str]) -> Selection | NvmlFailure:
    """The devices CUDA shows this process, in CUDA's order, as NVML handles.

    Returns:
        The devices and notes, or the failure of an NVML call that every mapping needs.
    """
    count = nvml.device_count()
    if isinstance(count, NvmlFailure):
        return count
    raw = environ.get("CUDA_VISIBLE_DEVICES")
    entries = parse_visible_devices(raw)
    node = _NodeUuids(nvml, count)
    found: list[VisibleDevice] = []
    for entry in range(count) if entries is None else entries:
        result = _visible_entry_handle(nvml, entry, count, raw, node)
        if isinstance(result, str):
            return Selection(tuple(found), (result,))
        if isinstance(result, NvmlFailure):
            return result
        found.append(result)
    return Selection(tuple(found))


def _by_torch_uuid(nvml: Nvml, uuid: str | None, index: int) -> VisibleDevice | None:
    """The device with the UUID torch reports (torch may leave out the ``GPU-`` prefix)."""
    if not uuid:
        return None
    for candidate in (uuid, f"GPU-{uuid}", f"MIG-{uuid}"):
        handle = nvml.handle_by_uuid(candidate)
        if not isinstance(handle, NvmlFailure):
            return VisibleDevice(f"cuda:{index}", handle)
    return None


def _by_position(
    visible: Sequence[VisibleDevice], choice: DeviceChoice, index: int
) -> VisibleDevice | None:
    """torch's device ``index`` as the ``index``-th visible device."""
    if index < len(visible):
        return VisibleDevice(f"cuda:{index} ({visible[index].label})", visible[index].handle)
    if choice.source == "local_rank" and len(visible) == 1:
        # One GPU per process through CUDA_VISIBLE_DEVICES: the rank's only GPU.
        return VisibleDevice(f"cuda:0 ({visible[0].label})", visible[0].handle)
    return None


def select_handles(
    nvml: Nvml, choice: DeviceChoice, environ: Mapping[str, str] | None = None
) -> Selection | NvmlFailure:
    """The NVML handles of the chosen devices, and notes on what could not be matched.

    Returns:
        The selection, or the failure of an NVML call that every mapping needs (counting the
        GPUs, a handle by index).
    """
    visible = visible_devices(nvml, os.environ if environ is None else environ)
    if isinstance(visible, NvmlFailure):
        return visible
    notes = list(visible.notes)
    if choice.indices is None:
        if visible.devices:
            notes.append(
                f"Which GPU this process trains on is not known (the model is not on a GPU when "
                f"the meter starts, CUDA is not initialised, no LOCAL_RANK): all "
                f"{len(visible.devices)} visible GPU(s) are monitored. Move the model to its GPU "
                "before starting the meter."
            )
        return Selection(visible.devices, tuple(notes))
    chosen: list[VisibleDevice] = []
    for pos, index in enumerate(choice.indices):
        uuid = choice.uuids[pos] if choice.uuids is not None else None
        device = _by_torch_uuid(nvml, uuid, index) or _by_position(visible.devices, choice, index)
        if device is not None:
            chosen.append(device)
        else:
            notes.append(
                f"{choice.reason}, but only {len(visible.devices)} GPU(s) are visible: "
                f"cuda:{index} is not monitored."
            )
    return Selection(tuple(chosen), tuple(notes))


# ----------------------------------------------------------------------------- opened devices
@dataclass(frozen=True)
class CounterStart:
    """Energy from NVML's total-energy counter: its value when the window started, mJ."""

    start_mj: int


@dataclass(frozen=True)
class PowerStart:
    """Energy from sampled power (no energy counter): the first sample, at the window's start.

    Attributes:
        seconds: ``time.monotonic()`` of the sample, s.
        watts: Board power, W.
    """

    seconds: float
    watts: float


#: How a device's energy is measured; ``None``: it is not (a MIG instance, or neither the
#: counter nor power can be read).
EnergyBaseline = CounterStart | PowerStart | None


@dataclass(frozen=True)
class MonitoredDevice:
    """A selected device as the monitor opened it.

    Attributes:
        label: How the device was found ("cuda:0 (GPU 3)").
        handle: Its NVML handle.
        name: The name NVML reports; ``None`` when it could not be read.
        uuid: The NVML UUID; ``None`` when it could not be read.
        mig: Whether it is a MIG instance (or a GPU in MIG mode): no whole-GPU readings then.
        energy: How its energy is measured.
    """

    label: str
    handle: Any
    name: str | None
    uuid: str | None
    mig: bool
    energy: EnergyBaseline

    @property
    def title(self) -> str:
        """Label and name, as notes name the device: ``"cuda:0 (NVIDIA H200)"``."""
        return f"{self.label} ({self.name})"


def open_device(
    nvml: Nvml,
    visible: VisibleDevice,
    *,
    t_start: float,
    interval_seconds: float,
    note: Callable[[str], None],
) -> MonitoredDevice:
    """Reads a device's name, UUID, MIG state and energy baseline; problems go to ``note``.

    Args:
        nvml: The NVML session.
        visible: The device.
        t_start: Start of the monitored window, ``time.monotonic()`` seconds (stamps a power
            baseline).
        interval_seconds: The sampling interval, s (named in the sampled-power note).
        note: Receives each note.
    """
    label, handle = visible.label, visible.handle
    name = nvml.name(handle)
    if isinstance(name, NvmlFailure):
        note(f"{label}: NVML did not give the device name ({name.reason}).")
        name = None
    uuid = nvml.uuid(handle)
    device = MonitoredDevice(
        label,
        handle,
        name,
        None if isinstance(uuid, NvmlFailure) else uuid,
        mig=nvml.is_mig(handle),
        energy=None,
    )
    if device.mig:
        note(
            f"{device.title} is a MIG instance (or a GPU in MIG mode): NVML's energy, "
            "power and utilisation are whole-GPU readings that do not belong to one instance, "
            "so none is reported for it, and the whole GPU's peak does not apply to it."
        )
        return device
    energy = _energy_baseline(nvml, device, t_start, interval_seconds, note)
    return MonitoredDevice(label, handle, device.name, device.uuid, False, energy)


def _energy_baseline(
    nvml: Nvml,
    device: MonitoredDevice,
    t_start: float,
    interval_seconds: float,
    note: Callable[[str], None],
) -> EnergyBaseline:
    """The energy counter now, else power now (with a note), else ``None`` (with a note)."""
    start_mj = nvml.energy_mj(device.handle)
    if not isinstance(start_mj, NvmlFailure):
        return CounterStart(start_mj)
    watts = nvml.power_watts(device.handle)
    if not isinstance(watts, NvmlFailure):
        note(
            f"{device.title} has no energy counter ({start_mj.reason}): its energy is "
            f"integrated from power sampled every {interval_seconds:g} s, an approximation."
        )
        return PowerStart(t_start, watts)
    note(
        f"{device.title}: no energy reading: neither the energy counter ({start_mj.reason}) "
        f"nor power ({watts.reason}) can be read."
    )
    return None
