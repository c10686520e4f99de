"""The meter's hardware side: whether NVML runs, the monitor's lifecycle, the report fields.

:class:`~flopmeter.meter.FlopMeter` owns one :class:`HardwareTracker`: it is configured (and
validated) when the meter is made, started with the meter, stopped with it (always, also when
training fails) and asked for the report's hardware fields.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from flopmeter import distributed
from flopmeter.hardware.devices import devices_in_use
from flopmeter.hardware.figures import HardwareFigures, combine, summarise, to_vector
from flopmeter.hardware.monitor import NvmlMonitor
from flopmeter.hardware.nvml import import_pynvml
from flopmeter.hardware.options import (
    DEFAULT_INTERVAL_SECONDS,
    nvml_setting,
    validate_interval_seconds,
    validate_peak_flops,
)
from flopmeter.hardware.peaks import normalise_dtype

__all__ = ["HardwareTracker"]


class HardwareTracker:
    """Configures and runs the NVML monitor for a meter; makes the report's hardware fields.

    Args:
        nvml: ``True`` requires NVML (the ``nvml`` extra must be installed), ``False`` turns it
            off, ``None`` (default) leaves it to ``FLOPMETER_NVML`` (``0`` off, ``1`` required)
            and, when that is unset, monitors when NVML initialises. The argument, when given,
            beats the environment variable.
        peak_flops: Dense peak per GPU, FLOP/s, replacing the table's.
        dtype: Data type of the training's matrix multiplications, which selects the peak.
        interval_seconds: Sampling interval of the utilisation thread, seconds.
        environ: Environment (default ``os.environ``).

    Raises:
        ConfigurationError: an argument or ``FLOPMETER_NVML`` is invalid.
        MissingExtraError: NVML is required and ``nvidia-ml-py`` is not installed.
    """

    def __init__(
        self,
        *,
        nvml: bool | None = None,
        peak_flops: float | None = None,
        dtype: str = "bf16",
        interval_seconds: float = DEFAULT_INTERVAL_SECONDS,
        environ: Mapping[str, str] | None = None,
    ) -> None:
        setting = nvml_setting(nvml, os.environ if environ is None else environ)
        self.peak_flops = validate_peak_flops(peak_flops)
        self.dtype = normalise_dtype(dtype)
        self.interval_seconds = validate_interval_seconds(interval_seconds)
        self._environ = environ
        #: Why monitoring is off ("nvml=False", "FLOPMETER_NVML=0"); ``None`` when it is on.
        self.off_reason = setting.source if setting.mode == "off" else None
        self.required = setting.mode == "required"
        if self.required:
            import_pynvml()  # a missing extra is a configuration error, raised now
        self.monitor: NvmlMonitor | None = None
        self._start_error: str | None = None

    @property
    def enabled(self) -> bool:
        """Whether the configuration asks for monitoring (it may still find no GPU)."""
        return self.off_reason is None

    def start(self, model: Any = None) -> None:
        """Starts the monitor on the devices ``model`` is on (never raises)."""
        if not self.enabled or self.monitor is not None:
            return
        try:
            self.monitor = NvmlMonitor(
                interval_seconds=self.interval_seconds,
                choice=devices_in_use(model, self._environ),
                environ=self._environ,
                required=self.required,
            )
            self.monitor.start()
        except Exception as exc:  # never into training
            self._start_error = f"{type(exc).__name__}: {exc}"

    def stop(self) -> None:
        """Stops the monitor and joins its thread (never raises; idempotent)."""
        if self.monitor is not None:
            self.monitor.stop()

    def figures(self, seconds: float) -> HardwareFigures:
        """This rank's figures over ``seconds`` of training."""
        if not self.enabled:
            return HardwareFigures(notes=(f"GPU monitoring is off ({self.off_reason}).",))
        if self._start_error is not None:
            return HardwareFigures(
                notes=(f"The NVML monitor failed to start ({self._start_error}).",)
            )
        if self.monitor is None:
            return HardwareFigures(notes=("The meter has not started: no GPU readings yet.",))
        return summarise(
            self.monitor.readings(),
            seconds,
            dtype=self.dtype,
            peak_flops_override=self.peak_flops,
        )

    def report_fields(
        self,
        *,
        seconds: float,
        primary_flops: float | None,
        gather: bool,
        extra_notes: tuple[str, ...] = (),
    ) -> dict[str, Any]:
        """The fields of the report's hardware section (``FlopReport.hardware``).

        Args:
            seconds: Training time of this session, seconds.
            primary_flops: The report's primary compute figure (summed over ranks when
                ``gather``), FLOP; for ``mfu``.
            gather: Combine every rank's figures (one collective; every rank must call it).
            extra_notes: Notes the meter adds when there are hardware figures.
        """
        try:
            figures = self.figures(seconds)
        except Exception as exc:  # the report must still be made
            figures = HardwareFigures(notes=(f"The hardware figures failed ({exc}).",))
        if gather and self.enabled:
            # Every rank with monitoring enabled makes this call, found GPUs or not: the
            # configuration (not the hardware found) decides, so no rank waits alone.
            vectors = distributed.all_gather_floats(to_vector(figures))
            figures = combine(figures, vectors, distributed.rank())
        if extra_notes and (figures.bound_flops is not None or figures.energy_joules is not None):
            figures = HardwareFigures(
                **{**figures.__dict__, "notes": (*figures.notes, *extra_notes)}
            )
        return figures.report_fields(primary_flops)
