"""Zero-code attach to the Hugging Face Trainer: every ``Trainer`` gets the callback when built.

:func:`patch_trainer_module` (run by the import watch once ``transformers.trainer`` is
imported) wraps ``Trainer.__init__`` of the base class, so every subclass that calls
``super().__init__`` passes through it (TRL's ``SFTTrainer``, axolotl's, LLaMA-Factory's).
After the original ``__init__``, a :class:`~flopmeter.integrations.hf.FlopMeterCallback` made
from the environment's options (:func:`~flopmeter.auto.env_options.options_from_env`) is added,
unless the trainer already holds one (the script's own: ``explicit`` is recorded). It is the same
class as the one a script passes (a checkpoint stores a callback's state by its class name, so a
run resumed with or without zero-code keeps its counts), marked as zero-code in its adapter
(:class:`~flopmeter.integrations._adapter.ZeroCode`): its report has the ``attach`` section,
it stands down at ``on_train_begin`` when a meter the script made itself runs (a ``with
FlopMeter(...)`` around ``trainer.train()``), and its events never raise into the job.

What it cannot see: a subclass that never calls ``Trainer.__init__``, and a callback list
replaced after ``__init__`` (the callback is then gone: the job's report says nothing attached).
Nothing heavy is imported here: the callback's module is imported when the first Trainer is
built (the hook runs while ``transformers`` is still importing).
"""

from __future__ import annotations

import functools
from types import ModuleType
from typing import Any

from flopmeter.auto.attaching import guarded, qualified_name
from flopmeter.auto.job import record
from flopmeter.auto.watch import after_init

__all__ = ["EVENTS", "patch_trainer_module"]

#: The callback's events guarded for the job (an exception is recorded, never raised).
EVENTS = ("on_train_begin", "on_step_end", "on_epoch_end", "on_log", "on_train_end")


def patch_trainer_module(module: ModuleType) -> None:
    """Wraps ``module.Trainer.__init__`` so that each trainer built gets the callback.

    Called by the import watch once ``module`` (``transformers.trainer``) is imported;
    idempotent; never raises (a failure is recorded as ``problem`` and the Trainer stays as it
    was).
    """
    with guarded("patching transformers.trainer.Trainer"):
        after_init(module.Trainer, attach, "attaching to a Trainer")


def attach(trainer: Any) -> None:
    """Adds the zero-code callback to ``trainer`` (a built ``Trainer``) unless it has a
    ``FlopMeterCallback`` already; never raises."""
    with guarded(f"attaching to {qualified_name(trainer)}"):
        from flopmeter.auto.env_options import options_from_env
        from flopmeter.integrations._adapter import ZeroCode, guard_events
        from flopmeter.integrations.hf import FlopMeterCallback

        present = [
            cb for cb in trainer.callback_handler.callbacks if isinstance(cb, FlopMeterCallback)
        ]
        if any(cb._adapter.zero_code is not None for cb in present):
            return  # attached already (an __init__ that ran twice)
        if present:
            record(
                "explicit",
                report=None,  # known when its meter starts (its output option, or output_dir)
                trainer_class=qualified_name(trainer),
                reason="the script passed its own FlopMeterCallback to the Trainer",
            )
            return
        callback = FlopMeterCallback(**options_from_env())
        callback._adapter.zero_code = ZeroCode(
            "hf_trainer",
            trainer,
            f"the model {qualified_name(trainer)} trains (after any PEFT wrapping)",
            rival=functools.partial(_has_own_callback, callback=callback),
        )
        stand_down = functools.partial(_stand_down, callback)
        guard_events(callback, EVENTS, begin="on_train_begin", on_stand_down=stand_down)
        trainer.add_callback(callback)
        callback._wrap_train(trainer)  # what its on_init_end would have done


def _has_own_callback(trainer: Any, *, callback: Any) -> bool:
    """Whether the script added a ``FlopMeterCallback`` of its own after ``__init__``."""
    return any(
        type(cb) is type(callback) and cb is not callback and cb._adapter.zero_code is None
        for cb in trainer.callback_handler.callbacks
    )


def _stand_down(callback: Any, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
    """What a zero-code callback that stood down leaves in the trainer.

    Beside the script's own ``FlopMeterCallback`` it leaves the trainer's list (a new list: the
    event being sent goes on over the old one) and the trainer's state (both have the same
    class name: the checkpoint would hold a list of two states, and a resume would read this
    one's empty state first). Beside a running ``FlopMeter`` it stays, and keeps an entry in a
    resumed ``trainer_state.json`` (transformers fails at save time for a stateful callback
    missing there).
    """
    trainer = callback._adapter.zero_code.trainer()
    name = type(callback).__name__
    stored = state.stateful_callbacks
    if trainer is not None and _has_own_callback(trainer, callback=callback):
        handler = trainer.callback_handler
        handler.callbacks = [cb for cb in handler.callbacks if cb is not callback]
        entry = stored.get(name) if isinstance(stored, dict) else None
        if isinstance(entry, list) and state.global_step == 0:  # built with this one first
            rest = entry[1:]
            stored[name] = rest[0] if len(rest) == 1 else rest
        return
    if isinstance(stored, dict) and name not in stored:
        stored[name] = {"args": {}, "attributes": {"saved_meter_state": None}}
