"""PyTorch Lightning adapter: ``Trainer(..., callbacks=[FlopMeterCallback()])``.

The callback translates Lightning's hooks into :class:`~flopmeter.FlopMeter` calls and holds no
counting logic of its own:

* ``on_train_start``: a meter is created for the LightningModule (its parameters as they train:
  after PEFT wrapping, freezing, strategy setup) and started, and the module's
  ``training_step`` is routed through the module the meter hooks: the instance attribute
  ``training_step`` is set to a wrapper that calls that module with the batch, and the module's
  ``forward`` runs the original ``training_step`` and returns its result. So each training
  micro-batch is one forward call of the hooked module: the meter finds ``input_ids`` /
  ``attention_mask`` in the batch as in any forward pass (once per micro-batch, so
  ``accumulate_grad_batches`` is counted right), and its FLOP model (the profile of the layers
  that run, the dispatch-level samples) sees the model's forward pass inside that call and the
  backward pass from the returned loss. Lightning's strategies (DDP included) look
  ``training_step`` up on the instance, so they call the wrapper. Validation, test and predict
  go through other methods and are not counted.
* ``on_train_end`` / ``on_exception`` / ``teardown``: the original ``training_step`` is put
  back.
* ``on_train_batch_end``: with a compute ``budget``, ``trainer.should_stop`` at the optimizer
  step where the meter's guard says stop (Lightning ends the epoch there, and its
  ``ModelCheckpoint`` saves that step at the epoch's end).
* ``on_train_batch_end``: on the optimizer steps Lightning logs (every ``log_every_n_steps``),
  and only then, the counts are summed over ranks and sent to the trainer's loggers.
* ``state_dict`` / ``load_state_dict``: the cumulative counts, summed over ranks, travel in
  Lightning checkpoints, so ``trainer.fit(..., ckpt_path=...)`` continues them.
* ``on_train_end``: the meter stops; the final report (summed over ranks) is written once, by
  rank 0. ``on_exception`` writes a ``failed``/``interrupted`` report without a collective.
"""

from __future__ import annotations

import functools
import logging
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

from torch import nn

from flopmeter.errors import MissingExtraError
from flopmeter.integrations._adapter import (
    LOG_FIELDS,
    AdapterCallback,
    MeterAdapter,
    fp32_matmul_dtype,
    log_values,
)
from flopmeter.internals import restore_instance_attribute, set_instance_attribute
from flopmeter.options import validate_bool
from flopmeter.report.output_path import DEFAULT_FILENAME
from flopmeter.run.parts import default_model_name

try:
    import lightning.pytorch as pl
except ImportError:  # pragma: no cover - exercised in a test that hides lightning
    raise MissingExtraError(
        "lightning", "lightning", "flopmeter.integrations.lightning (the Lightning callback)"
    ) from None

__all__ = ["LOG_KEYS", "FlopMeterCallback"]

logger = logging.getLogger("flopmeter")

#: Metrics the callback sends to the trainer's loggers: compute (FLOP), non-padding tokens, and
#: the compute as a fraction of the threshold. A metric is left out when its value is unknown.
LOG_KEYS = tuple(f"flopmeter/{field}" for field in LOG_FIELDS)


class _BatchView(nn.Module):
    """What the meter hooks: the LightningModule (for the census), around its ``training_step``.

    ``view(tokens, args, kwargs)`` runs ``training_step(*args, **kwargs)`` (the original one)
    and returns its output, ``None`` included (a skipped batch, or manual optimization: the core
    tells a forward that returned ``None`` from one that raised). ``tokens`` is the batch, or for a
    tuple/list batch its first element, so that the meter's forward pre-hook reads it as it
    reads any forward call. Its ``training`` flag follows the LightningModule's.
    """

    def __init__(self, module: nn.Module, training_step: Callable[..., Any]) -> None:
        super().__init__()
        self.module = module
        self.training_step = training_step

    def forward(self, tokens: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        return self.training_step(*args, **kwargs)


class FlopMeterCallback(AdapterCallback, pl.Callback):
    """Measures a Lightning ``Trainer.fit`` run with a :class:`FlopMeter`.

    What is counted: every training batch Lightning hands to ``training_step`` (non-padding
    tokens from ``attention_mask``, else ``input_ids != pad_id``) and the LightningModule's
    parameters as they train. A batch is a mapping with ``input_ids`` (and ``attention_mask``),
    a tensor of ids, or a tuple/list whose first element is the ids (the other elements are not
    read: give ``pad_id``, or use a mapping with ``attention_mask``, to leave padding out). Validation (including the sanity check), test and predict are not counted.

    Args:
        pad_id: The padding token id, used for batches without an ``attention_mask``.
        log_compute: Send the running compute to the trainer's loggers every
            ``log_every_n_steps`` optimizer steps.
        **meter_options: Any other :class:`~flopmeter.FlopMeter` option, passed through
            unchanged (``pretrain_flops``, ``model_name``, ``original_systemic_risk``,
            ``peak_flops``, ``nvml``, ``measure_every``, ``optimizer``, ...). By default
            ``output`` is ``trainer.default_root_dir/flops_meter.json``, ``model_name`` the
            ``name_or_path`` of the module's ``config`` (or of its ``model.config``), and
            ``dtype`` follows the trainer's precision (``bf16-mixed`` gives ``bf16``, ...).

    Attributes:
        meter: The :class:`FlopMeter` of the current (or last) run; ``None`` before training.

    Raises:
        ConfigurationError: a meter option (or ``PRETRAIN_FLOPS``) is invalid.
    """

    def __init__(
        self, pad_id: int | None = None, *, log_compute: bool = True, **meter_options: Any
    ) -> None:
        self._adapter = MeterAdapter(pad_id=pad_id, **meter_options)
        self.log_compute = validate_bool(log_compute, "log_compute")
        self._view: _BatchView | None = None
        self._patched: pl.LightningModule | None = None
        self._instance_step: Any = None  # a training_step set on the instance before ours
        self._restored: dict[str, Any] | None = None
        self._last_step = 0

    # ------------------------------------------------------------------ checkpoint state
    def state_dict(self) -> dict[str, Any]:
        """The meter's cumulative counts, summed over ranks (Lightning calls it on every rank
        when it saves a checkpoint); the running report on disk is refreshed then too."""
        if self.meter is not None:
            if self._running:
                self.meter.refresh(sync=True)  # every rank saves together: one collective
            return {"meter": self.meter.state_dict()}
        return {"meter": self._restored} if self._restored else {}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Keeps the counts of a checkpoint, to continue them when training starts."""
        self._restored = state_dict.get("meter") or None

    # ------------------------------------------------------------------ hooks
    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        """Creates and starts the meter on the module as it trains."""
        self._unpatch()
        self._view = _BatchView(pl_module, pl_module.training_step)
        self._adapter.begin(
            self._view,
            model_name=default_model_name(pl_module),
            output=Path(trainer.default_root_dir) / DEFAULT_FILENAME,
            dtype=_precision_of(trainer),
        )
        if self._restored or trainer.global_step > 0:
            self._adapter.resume(self._restored, trainer.global_step)
        self._last_step = trainer.global_step
        self._adapter.start()
        self._patch(pl_module, self._view)
        self._plan_budget(trainer)
        if self.meter is not None and self.meter.should_stop:
            # a resumed run already within one step of its budget: Lightning checks this
            # before its first batch, so no step of this fit runs
            trainer.should_stop = True

    def on_train_batch_end(
        self,
        trainer: pl.Trainer,
        pl_module: pl.LightningModule,
        outputs: Any,
        batch: Any,
        batch_idx: int,
    ) -> None:
        """Logs the compute, summed over ranks, on the optimizer steps Lightning logs."""
        step = trainer.global_step
        if step == self._last_step:
            return
        self._last_step = step
        if self.meter is not None and self.meter.should_stop:
            trainer.should_stop = True  # the budget guard, the same on every rank
        every = trainer.log_every_n_steps
        # the same decision on every rank: same step, same trainer configuration
        if not (self.log_compute and self._running and trainer.loggers and every):
            return
        if step % every:
            return
        self._log(trainer, step)

    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        """Stops the meter: the final report is summed over ranks and written by rank 0."""
        self._unpatch()
        self._adapter.end(float(trainer.current_epoch))

    def on_exception(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, exception: BaseException
    ) -> None:
        """Writes a ``failed`` (or ``interrupted``) report of this rank's counts."""
        self._unpatch()
        self._adapter.end(float(trainer.current_epoch), exception)

    def teardown(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        """Puts the original ``training_step`` back (if training ended some other way)."""
        self._unpatch()

    # ------------------------------------------------------------------ helpers
    def _patch(self, pl_module: pl.LightningModule, view: _BatchView) -> None:
        """Sets ``pl_module.training_step`` (on the instance) to a call of ``view``."""

        def training_step(*args: Any, **kwargs: Any) -> Any:
            if not self._running:  # the meter stopped: nothing to see
                return view.training_step(*args, **kwargs)
            batch = args[0] if args else kwargs.get("batch")
            if isinstance(batch, (tuple, list)) and batch:
                batch = batch[0]  # (ids, labels, ...): the rest is not a mask to trust
            view.training = pl_module.training
            return view(batch, args, kwargs)

        functools.update_wrapper(training_step, view.training_step)
        self._instance_step = set_instance_attribute(pl_module, "training_step", training_step)
        self._patched = pl_module

    def _unpatch(self) -> None:
        """Restores the ``training_step`` the module had before :meth:`_patch` (idempotent)."""
        module, self._patched = self._patched, None
        if module is None:
            return
        restore_instance_attribute(module, "training_step", self._instance_step)
        self._instance_step = None

    def _plan_budget(self, trainer: pl.Trainer) -> None:
        """Tells the budget guard the optimizer steps the fit plans (when Lightning knows)."""
        if self._adapter.options.budget is None:
            return  # no budget: nothing to forecast, and Lightning's estimate is not asked for
        try:
            planned = trainer.estimated_stepping_batches
        except Exception:  # no estimate for this setup: the guard works without a forecast
            return
        if self.meter is not None and isinstance(planned, (int, float)) and math.isfinite(planned):
            self.meter.plan_budget(int(planned) - trainer.global_step)

    def _log(self, trainer: pl.Trainer, step: int) -> None:
        assert self.meter is not None
        report = self.meter.refresh(sync=True)  # every rank is here at this step; on disk too
        if not trainer.is_global_zero:
            return
        metrics = log_values(report, "flopmeter/")
        for lightning_logger in trainer.loggers:
            lightning_logger.log_metrics(metrics, step=step)


def _precision_of(trainer: pl.Trainer) -> str | None:
    """The data type of the trainer's matrix multiplications (its precision setting), for the
    peak FLOP/s; ``None`` when the setting names none the peak table knows."""
    precision = str(getattr(trainer, "precision", ""))
    if precision.startswith("bf16"):
        return "bf16"
    if precision.startswith("16"):
        return "fp16"
    if precision.startswith("32"):
        return fp32_matmul_dtype()
    if precision.startswith("transformer-engine"):
        return "fp8"
    return None
