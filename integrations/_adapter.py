"""What the framework adapters share: one meter per training run, options passed through.

:class:`MeterAdapter` is held by each framework callback. It validates the user's meter options
when the callback is made (before any training), fills in what the framework knows (the pad id,
the output folder, the training precision) for the options the user did not give, and makes,
resumes, logs and stops the :class:`~flopmeter.FlopMeter` of each run. It holds no counting
logic: the callbacks translate framework events into these calls.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from typing import Any

import torch
from torch import nn

from flopmeter.errors import ConfigurationError
from flopmeter.meter import FlopMeter
from flopmeter.options import MeterOptions, validate_pad_id
from flopmeter.report import FlopReport

__all__ = ["AdapterCallback", "MeterAdapter", "fp32_matmul_dtype", "log_values", "pad_id_of"]

logger = logging.getLogger("flopmeter")

#: The three running figures the adapters log: compute (FLOP), non-padding tokens, and the
#: compute as a fraction of the threshold.
LOG_FIELDS = ("flops", "tokens", "ratio_to_threshold")


def log_values(report: FlopReport, prefix: str) -> dict[str, float]:
    """The running figures of ``report`` keyed ``prefix + field``; unknown ones left out."""
    values = {
        "flops": report.compute.primary_flops,
        "tokens": report.tokens.tokens_processed,
        "ratio_to_threshold": report.verdict.ratio_to_threshold,
    }
    return {prefix + k: float(v) for k, v in values.items() if v is not None}


def fp32_matmul_dtype() -> str:
    """``"tf32"`` when torch runs float32 matmuls on TF32 tensor cores, else ``"fp32"``."""
    if torch.get_float32_matmul_precision() != "highest":
        return "tf32"
    return "tf32" if torch.backends.cuda.matmul.allow_tf32 else "fp32"


def pad_id_of(processing_class: Any, model: Any) -> int | None:
    """The pad id of a tokenizer (or a processor's ``tokenizer``), else the model config's;
    ``None`` when none has a usable one."""
    config = getattr(model, "config", None)
    for source in (processing_class, getattr(processing_class, "tokenizer", None), config):
        try:
            pad = validate_pad_id(getattr(source, "pad_token_id", None))
        except ConfigurationError:
            continue  # not a usable id: look further
        if pad is not None:
            return pad
    return None


class MeterAdapter:
    """One :class:`FlopMeter` per training run, for a framework callback.

    Args:
        options: The user's meter options as one value (``MeterOptions``), or ``None``.
        **option_values: Any :class:`~flopmeter.options.MeterOptions` option by name; given
            with ``options``, they win over its options. Validated now, once.

    Raises:
        ConfigurationError: an option (or ``PRETRAIN_FLOPS``, ``FLOPMETER_NVML``) is invalid.
    """

    def __init__(self, options: MeterOptions | None = None, **option_values: Any) -> None:
        self.options = MeterOptions.of(options, **option_values)
        self.meter: FlopMeter | None = None
        self.running = False

    def begin(self, model: nn.Module, **defaults: Any) -> FlopMeter:
        """Makes the meter of a new run (not started); ``defaults`` fill the options the user
        did not give. A run still open is stopped first, as failed."""
        if self.meter is not None and self.running:
            self.running = False
            self.meter.stop(RuntimeError("a new training run began before this one ended"))
        self.meter = FlopMeter(model, options=self.options.with_defaults(**defaults))
        return self.meter

    def json_options(self) -> dict[str, Any]:
        """The options the user gave that JSON can hold (paths as text), to make the callback
        again from a checkpoint; the others are left out."""
        values = {k: _json_value(v) for k, v in self.options.given_values().items()}
        return {k: v for k, v in values.items() if v is not None}

    def start(self) -> None:
        """Starts the meter made by :meth:`begin`."""
        assert self.meter is not None
        self.meter.start()
        self.running = True

    def resume(self, saved: Mapping[str, Any] | None, step: int) -> None:
        """Continues a checkpoint's counts, or notes that the checkpoint at ``step`` had none."""
        assert self.meter is not None
        if saved:
            self.meter.load_state_dict(saved)
            return
        logger.warning(
            "flopmeter: training resumes at step %d from a checkpoint without flopmeter counts; "
            "the report withholds the run's compute and verdict (the steps before are in no "
            "count)",
            step,
        )
        self.meter.resumed_without_counts(step)  # the report withholds, saying why

    def end(self, epochs: float | None, exc: BaseException | None = None) -> FlopReport | None:
        """Stops the meter of the run (idempotent): the final report, or ``None`` if none ran."""
        if self.meter is None or not self.running:
            return None
        self.running = False
        self.meter.epochs = epochs
        return self.meter.stop(exc)


class AdapterCallback:
    """What both framework callbacks expose of their :class:`MeterAdapter` (``self._adapter``)."""

    _adapter: MeterAdapter

    @property
    def meter(self) -> FlopMeter | None:
        """The meter of the current (or last) run; ``None`` before training."""
        return self._adapter.meter

    @property
    def _running(self) -> bool:
        return self._adapter.running


def _json_value(value: Any) -> Any:
    """``value`` if JSON can hold it (a path as text, a list of them), else ``None``."""
    if isinstance(value, os.PathLike):
        return os.fspath(value)
    if isinstance(value, list):
        items = [_json_value(v) for v in value]
        return None if None in items else items
    return value if isinstance(value, (str, int, float, bool)) else None
