"""Hugging Face Trainer (and TRL) adapter: ``Trainer(..., callbacks=[FlopMeterCallback()])``.

The callback translates the Trainer's events into :class:`~flopmeter.FlopMeter` calls and holds
no counting logic of its own:

* ``on_train_begin``: the meter is made on the model as the Trainer trains it (after PEFT
  wrapping and ``accelerator.prepare``) and started; a resumed run's saved counts are restored
  first. Evaluation runs in ``eval()`` mode under ``no_grad`` and is not counted.
* ``on_step_end`` / ``on_epoch_end``: on the steps where the Trainer is about to log or save,
  and only then, the counts are summed over ranks (one small collective, at the same point on
  every rank) for the log line and for the checkpoint. With a compute ``budget``, at the step
  where the meter's guard says stop: ``control.should_training_stop`` and, unless
  ``save_strategy="no"``, ``control.should_save`` (the checkpoint of that step).
* ``on_log``: ``flopmeter_flops``, ``_tokens`` and ``_ratio_to_threshold`` join the Trainer's
  logs. The counts travel in ``trainer_state.json`` (``ExportableState``): nothing ``on_save``.
* ``on_train_end``: the meter stops; rank 0 writes the report to ``args.output_dir`` (and on
  SageMaker to ``/opt/ml/output/data/flops_meter.json``, uploaded to S3; with ``aws_keys=True``
  with the AWS FlopsMeterCallback's keys, the full report beside it).
"""

from __future__ import annotations

import atexit
import functools
import logging
import os
import sys
import weakref
from pathlib import Path
from typing import Any

from flopmeter import distributed
from flopmeter.errors import BudgetExceeded, ConfigurationError, MissingExtraError
from flopmeter.integrations._adapter import (
    LOG_FIELDS,
    AdapterCallback,
    MeterAdapter,
    fp32_matmul_dtype,
    log_values,
    pad_id_of,
)
from flopmeter.integrations.trl import name_trainer_models
from flopmeter.internals import find_caller_local, set_instance_attribute
from flopmeter.options import validate_bool
from flopmeter.report.output_path import DEFAULT_FILENAME, check_writable
from flopmeter.report.sagemaker import (  # a zero-code job's end uses them too
    SageMakerCopy,
    sagemaker_output_path,
)

try:
    from transformers.trainer import Trainer
    from transformers.trainer_callback import (
        CallbackHandler,
        DefaultFlowCallback,
        ExportableState,
        TrainerCallback,
        TrainerControl,
        TrainerState,
    )
    from transformers.training_args import TrainingArguments
except ImportError:  # pragma: no cover - exercised in a test that hides transformers
    raise MissingExtraError(
        "transformers", "hf", "flopmeter.integrations.hf (the Hugging Face Trainer callback)"
    ) from None

__all__ = [
    "LOG_KEYS",
    "FlopMeterCallback",
]

logger = logging.getLogger("flopmeter")

#: Keys the callback adds to the Trainer's training logs: compute (FLOP), non-padding tokens,
#: and the compute as a fraction of the threshold. A key is left out when its value is unknown.
LOG_KEYS = tuple(f"flopmeter_{field}" for field in LOG_FIELDS)


class FlopMeterCallback(AdapterCallback, TrainerCallback, ExportableState):
    """Measures a Hugging Face ``Trainer`` (or TRL ``SFTTrainer``) run with a :class:`FlopMeter`.

    Use it with one line::

        trainer = Trainer(model=model, args=args, ..., callbacks=[FlopMeterCallback()])

    What is counted: the training micro-batches of the model the Trainer trains, after PEFT
    wrapping, non-padding tokens (from ``attention_mask``, else ``input_ids != pad_id``), and the
    parameters as the Trainer trains them (a LoRA run's trainable count is the adapters').
    Evaluation, prediction and ``generate()`` are not counted. Counts survive a resume.

    Args:
        pad_id: The padding token id; by default the Trainer's tokenizer's (``processing_class``,
            or its ``tokenizer``), else the model config's.
        sagemaker_output: A second file the final report is written to; by default
            ``FLOPS_METER_OUT``, or ``/opt/ml/output/data/flops_meter.json``
            (``$SM_OUTPUT_DATA_DIR``, uploaded by SageMaker) on a SageMaker training job, else
            none.
        aws_keys: Write that second file with the AWS FlopsMeterCallback's keys
            (``Flops_architecture``, ``exceeds_30pct``, ``pct_of_pretrain``, ...; see
            :func:`aws_keyed_report`) for pipelines that parse them, and the full report beside
            it as ``flopmeter_report.json``. The report in ``args.output_dir`` stays the full one.
        log_compute: Add the running compute to the Trainer's logs.
        **meter_options: Any other :class:`~flopmeter.FlopMeter` option, passed through
            unchanged (``pretrain_flops``, ``model_name``, ``original_systemic_risk``,
            ``peak_flops``, ``nvml``, ``measure_every``, ``optimizer``, ...). By default
            ``output`` is ``args.output_dir/flops_meter.json`` and ``dtype`` follows the
            Trainer's precision (``bf16``, ``fp16``, else ``tf32`` or ``fp32``).

    Attributes:
        meter: The :class:`FlopMeter` of the current (or last) run; ``None`` before training.

    Raises:
        ConfigurationError: a meter option (or ``PRETRAIN_FLOPS``) is invalid.
    """

    def __init__(
        self,
        pad_id: int | None = None,
        *,
        sagemaker_output: str | os.PathLike[str] | None = None,
        aws_keys: bool = False,
        log_compute: bool = True,
        **meter_options: Any,
    ) -> None:
        self._adapter = MeterAdapter(pad_id=pad_id, **meter_options)
        self.sagemaker_output = None if sagemaker_output is None else os.fspath(sagemaker_output)
        self.aws_keys = validate_bool(aws_keys, "aws_keys")
        self.log_compute = validate_bool(log_compute, "log_compute")
        # Counts summed over ranks at the last save step: what state() puts in the checkpoint.
        self.saved_meter_state: dict[str, Any] | None = None
        self._saved_at_step: int | None = None
        self._pending_logs: dict[str, float] | None = None
        self._extra_output: Path | None = None
        self._global_step = 0
        self._exit_hook_registered = False
        self._budget_saved_step: int | None = None  # the step whose budget save was asked

    # ------------------------------------------------------------------ ExportableState
    def state(self) -> dict[str, Any]:
        """What the Trainer stores for this callback in a checkpoint's ``trainer_state.json``.

        ``args`` recreate the callback (the options given to it that JSON can hold);
        ``attributes.saved_meter_state`` holds the meter's cumulative counts, summed over ranks.
        Called by the Trainer on the process that saves, so no collective happens here:
        single-process runs read the meter now, distributed runs use the counts summed on every
        rank at this step's ``on_step_end``.
        """
        meter_state = self.saved_meter_state
        if self.meter is not None and not distributed.is_distributed():
            meter_state = self.meter.state_dict()  # no collective in a single process
        elif self._running and self._saved_at_step != self._global_step:
            logger.warning(
                "flopmeter: a checkpoint is saved at step %d, but the counts were last summed "
                "over ranks at step %s; a run resumed from it continues from those counts",
                self._global_step,
                self._saved_at_step,
            )
        args = self._adapter.json_options()
        args.update(
            sagemaker_output=self.sagemaker_output,
            aws_keys=self.aws_keys,
            log_compute=self.log_compute,
        )
        return {"args": args, "attributes": {"saved_meter_state": meter_state}}

    # ------------------------------------------------------------------ events
    def on_init_end(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any
    ) -> None:
        """Wraps the Trainer's ``train`` so that a run that raises has its ``failed`` report on
        disk, with the real exception, by the time ``train()`` raises (the Trainer has no
        exception event)."""
        trainer = find_caller_local("self", lambda value: isinstance(value, Trainer), skip=1)
        if trainer is not None:
            self._wrap_train(trainer)
            self._wrap_evaluation(trainer)
            self._trainer = weakref.ref(trainer)

    def _wrap_train(self, trainer: Trainer) -> None:
        original = trainer.train
        if getattr(original, "_flopmeter_wrapped", False):
            return

        @functools.wraps(original)
        def train(*args: Any, **kwargs: Any) -> Any:
            try:
                return original(*args, **kwargs)
            except BaseException as exc:
                self._end_with(exc)
                raise

        train._flopmeter_wrapped = True  # type: ignore[attr-defined]
        set_instance_attribute(trainer, "train", train)

    def _wrap_evaluation(self, trainer: Trainer) -> None:
        """Marks the Trainer's evaluation and prediction loops as evaluation for the meter's
        phases (a trainer may generate its training data with the model in evaluation mode:
        the mode alone does not say)."""
        for name in ("evaluation_loop", "prediction_loop"):
            original = getattr(trainer, name, None)
            if original is None or getattr(original, "_flopmeter_wrapped", False):
                continue

            def loop(*args: Any, _original: Any = original, **kwargs: Any) -> Any:
                meter = self.meter
                if meter is None or not self._running:
                    return _original(*args, **kwargs)
                with meter.evaluation():
                    return _original(*args, **kwargs)

            loop._flopmeter_wrapped = True  # type: ignore[attr-defined]
            set_instance_attribute(trainer, name, functools.wraps(original)(loop))

    def _end_with(self, exc: BaseException) -> None:
        """Stops a run that ended with ``exc`` (never raises: the user's exception goes on)."""
        if not self._running:
            return
        try:
            self._adapter.end(self.meter.epochs if self.meter else None, exc)
        except Exception:
            logger.exception("flopmeter could not write its report")

    def on_train_begin(
        self,
        args: TrainingArguments,
        state: TrainerState,
        control: TrainerControl,
        model: Any = None,
        processing_class: Any = None,
        **kwargs: Any,
    ) -> None:
        """Creates and starts the meter on the model as the Trainer will train it."""
        self._move_before_reporters()
        self._adapter.begin(
            model,
            pad_id=pad_id_of(processing_class or kwargs.get("tokenizer"), model),
            output=Path(args.output_dir or ".") / DEFAULT_FILENAME,
            dtype=_precision_of(args),
        )
        self._extra_output = self._choose_extra_output()
        if self._extra_output is not None and distributed.rank() == 0 and self.meter is not None:
            self.meter.add_copy(SageMakerCopy(self._extra_output, aws_keys=self.aws_keys))
        self._global_step = state.global_step
        self.saved_meter_state = None
        self._saved_at_step = None
        self._pending_logs = None
        if state.global_step > 0:
            self.saved_meter_state = _saved_counts(state, type(self).__name__)
            self._adapter.resume(self.saved_meter_state, state.global_step)
        # transformers (5.x) fails at save time for a stateful callback missing from a resumed
        # trainer_state.json; make sure this one is there.
        name = type(self).__name__
        if isinstance(state.stateful_callbacks, dict) and name not in state.stateful_callbacks:
            state.stateful_callbacks[name] = self.state()
        self._adapter.start()
        trainer = self._trainer() if getattr(self, "_trainer", None) is not None else None
        if trainer is not None and self.meter is not None:
            name_trainer_models(self.meter, trainer)
            self.meter.evaluation_marked()  # the evaluation loops are wrapped (on_init_end)
        self._budget_saved_step = None
        meter = self.meter
        if meter is not None and meter.should_stop:
            # A resumed run already within one step of its budget: the Trainer runs a step
            # before it looks at should_training_stop, so the only way to train nothing more
            # is to end train() here (the report: completed, stopped by the budget).
            control.should_training_stop = True
            budget = meter.report().budget  # should_stop: a budget guard, so a budget section
            raise BudgetExceeded(budget.budget_flops, budget.flops_at_stop or 0.0, 0)  # type: ignore[union-attr]
        if state.max_steps and state.max_steps > 0:  # the plan, for the budget guard's forecast
            self.meter.plan_budget(state.max_steps - state.global_step)
        if not self._exit_hook_registered:
            atexit.register(self._stop_at_exit)
            self._exit_hook_registered = True

    def on_step_end(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any
    ) -> None:
        """Sums the counts over ranks on the steps the Trainer logs or saves (and only then)."""
        self._sync_point(args, state, control)

    def on_epoch_end(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any
    ) -> None:
        """As :meth:`on_step_end`, for epoch-based logging and saving."""
        self._sync_point(args, state, control)

    def on_log(
        self,
        args: TrainingArguments,
        state: TrainerState,
        control: TrainerControl,
        logs: dict[str, float] | None = None,
        **kwargs: Any,
    ) -> None:
        """Adds the running compute to the training log line made at this step."""
        pending, self._pending_logs = self._pending_logs, None
        if not pending or logs is None or any(k.startswith("eval_") for k in logs):
            return
        logs.update(pending)
        history = state.log_history
        if history and history[-1].get("step") == state.global_step:
            history[-1].update(pending)  # trainer_state.json keeps what the loggers saw

    def on_train_end(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any
    ) -> None:
        """Stops the meter: the final report is summed over ranks and written by rank 0."""
        self._adapter.end(state.epoch)

    # ------------------------------------------------------------------ helpers
    def _sync_point(self, args: Any, state: TrainerState, control: TrainerControl) -> None:
        self._global_step = state.global_step
        meter = self.meter
        if meter is None or not self._running:
            return
        meter.epochs = state.epoch
        if meter.should_stop:  # the budget guard decided at this optimizer step, on every rank
            control.should_training_stop = True
            strategy = _strategy(getattr(args, "save_strategy", ""))
            if strategy != "no" and self._budget_saved_step != state.global_step:
                # the checkpoint of the last step within the budget, once (on_epoch_end follows)
                control.should_save = True
                self._budget_saved_step = state.global_step
        # DefaultFlowCallback runs first and has set the flags the same way on every rank.
        saves = control.should_save or (
            _strategy(getattr(args, "save_strategy", "")) == "best" and control.should_evaluate
        )
        if control.should_log or saves:
            report = meter.refresh(sync=True)  # the report on disk too (one collective)
            if self.log_compute and control.should_log:
                self._pending_logs = log_values(report, "flopmeter_")
        if saves and distributed.is_distributed():
            self.saved_meter_state = meter.state_dict()
            self._saved_at_step = state.global_step

    def _choose_extra_output(self) -> Path | None:
        explicit = self.sagemaker_output is not None
        path = Path(self.sagemaker_output).expanduser() if explicit else sagemaker_output_path()
        if path is None or distributed.rank() != 0:
            return path
        if path.is_dir():
            path = path / DEFAULT_FILENAME
        try:
            check_writable(path)
        except ConfigurationError as exc:
            if explicit:
                raise
            logger.warning("flopmeter: no SageMaker copy of the report: %s", exc)
            return None
        return path

    def _stop_at_exit(self) -> None:
        """Writes a report (``failed``, this rank's counts) when the process exits mid-run."""
        exc = getattr(sys, "last_value", None)
        if not isinstance(exc, BaseException):
            exc = RuntimeError("the process exited before the Trainer's on_train_end")
        self._end_with(exc)

    def _move_before_reporters(self) -> None:
        """Moves this callback right after ``DefaultFlowCallback`` in the Trainer's list.

        The Trainer calls ``on_log`` on its reporting callbacks (TensorBoard, W&B, ...) before
        the user's; running first lets them see the compute this callback adds. The list is
        found in the caller's frames (``CallbackHandler.call_event``); if it is not there,
        the compute still reaches the callbacks after this one and ``state.log_history``.
        """
        owner = find_caller_local("self", lambda value: isinstance(value, CallbackHandler), skip=1)
        if owner is None:
            return
        callbacks = owner.callbacks
        if not any(cb is self for cb in callbacks):
            return
        here = next(i for i, cb in enumerate(callbacks) if cb is self)
        flow = [i for i, cb in enumerate(callbacks) if isinstance(cb, DefaultFlowCallback)]
        target = flow[-1] + 1 if flow else 0
        if here > target:
            callbacks.insert(target, callbacks.pop(here))


def _strategy(value: Any) -> str:
    """A Trainer strategy (``SaveStrategy.NO`` or ``"no"``) as its lower-case value: ``str()``
    of the enum is ``"SaveStrategy.NO"`` on Python 3.11."""
    return str(getattr(value, "value", value)).lower()


def _precision_of(args: TrainingArguments) -> str:
    """The data type of the Trainer's matrix multiplications, for the peak FLOP/s."""
    if getattr(args, "bf16", False):
        return "bf16"
    if getattr(args, "fp16", False):
        return "fp16"
    return "tf32" if getattr(args, "tf32", None) else fp32_matmul_dtype()


def _saved_counts(state: TrainerState, name: str) -> dict[str, Any] | None:
    """The counts a checkpoint's ``trainer_state.json`` holds for this callback, if any."""
    stored = (state.stateful_callbacks or {}).get(name)
    if isinstance(stored, list):
        stored = stored[0] if stored else None
    return (stored or {}).get("attributes", {}).get("saved_meter_state") or None
