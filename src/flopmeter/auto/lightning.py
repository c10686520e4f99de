"""Zero-code attach to the Lightning Trainer: every ``Trainer`` gets the callback when built.

:func:`patch_trainer_module` (run by the import watch once ``lightning.pytorch.trainer.trainer``
or ``pytorch_lightning.trainer.trainer`` is imported) wraps ``Trainer.__init__``, so every
subclass that calls ``super().__init__`` passes through it. After the original ``__init__``, a
:class:`~flopmeter.integrations.lightning.FlopMeterCallback` made from the environment's options
is put into ``trainer.callbacks`` before the checkpoint callbacks (where Lightning's callback
connector keeps them: last, so that they save what the others updated), unless the trainer holds
one already (the script's own: ``explicit`` is recorded). Its class is the one a script passes
(Lightning stores a callback's state under its class name, so ``fit(ckpt_path=...)`` continues
the counts with or without zero-code); it stands down at ``on_train_start`` when a meter the
script made itself runs, and its hooks never raise into the job.

What it cannot see: a subclass that never calls ``Trainer.__init__``, a ``trainer.callbacks``
list replaced after ``__init__``, and ``pytorch_lightning`` without the ``lightning`` package
(the callback is a ``lightning.pytorch`` one: recorded as ``not_attached``). A LightningModule
whose ``configure_callbacks`` returns a ``FlopMeterCallback`` replaces this one (Lightning's
rule for a callback type the module gives too): the script's own meter then wins.
"""

from __future__ import annotations

import functools
from types import ModuleType
from typing import Any

from flopmeter.auto.attaching import guarded, qualified_name
from flopmeter.auto.job import record
from flopmeter.auto.watch import after_init

__all__ = ["EVENTS", "patch_trainer_module"]

#: The callback's hooks guarded for the job (an exception is recorded, never raised).
EVENTS = (
    "on_train_start",
    "on_train_batch_end",
    "on_train_end",
    "on_exception",
    "teardown",
    "state_dict",
    "load_state_dict",
)


def patch_trainer_module(module: ModuleType) -> None:
    """Wraps ``module.Trainer.__init__`` so that each trainer built gets the callback.

    Called by the import watch once a Lightning trainer module is imported; idempotent; never
    raises (a failure is recorded as ``problem`` and the Trainer stays as it was).
    """
    with guarded(f"patching {module.__name__}.Trainer"):
        after_init(module.Trainer, attach, "attaching to a Lightning Trainer")


def attach(trainer: Any) -> None:
    """Adds the zero-code callback to ``trainer`` (a built Lightning ``Trainer``) unless it has
    a ``FlopMeterCallback`` already; never raises."""
    with guarded(f"attaching to {qualified_name(trainer)}"):
        if not _is_lightning_pytorch(trainer):
            record(
                "not_attached",
                trainer_class=qualified_name(trainer),
                reason="a pytorch_lightning Trainer: flopmeter's Lightning callback needs the "
                "lightning package (pip install lightning)",
            )
            return
        from flopmeter.auto.env_options import options_from_env
        from flopmeter.integrations._adapter import ZeroCode, guard_events
        from flopmeter.integrations.lightning import FlopMeterCallback

        callbacks = trainer.callbacks
        present = [cb for cb in callbacks if isinstance(cb, FlopMeterCallback)]
        if any(cb._adapter.zero_code is not None for cb in present):
            return  # attached already (an __init__ that ran twice)
        if present:
            record(
                "explicit",
                report=None,  # known when its meter starts
                trainer_class=qualified_name(trainer),
                reason="the script passed its own FlopMeterCallback to the Trainer",
            )
            return
        callback = FlopMeterCallback(**options_from_env())
        callback._adapter.zero_code = ZeroCode(
            "lightning_trainer",
            trainer,
            f"the LightningModule {qualified_name(trainer)} fits",
            rival=functools.partial(_has_own_callback, callback=callback),
            shown=lambda view: view.module,  # the meter's module is a view of the LightningModule
        )
        stand_down = functools.partial(_stand_down, callback)
        guard_events(callback, EVENTS, begin="on_train_start", on_stand_down=stand_down)
        callbacks.insert(_before_checkpoints(callbacks), callback)


def _is_lightning_pytorch(trainer: Any) -> bool:
    """Whether ``trainer`` is a ``lightning.pytorch`` Trainer (or a subclass of one)."""
    return any(c.__module__.startswith("lightning.pytorch.") for c in type(trainer).__mro__)


def _before_checkpoints(callbacks: list[Any]) -> int:
    """Where a callback goes in Lightning's list: before the first checkpoint callback."""
    from lightning.pytorch.callbacks import Checkpoint

    for index, callback in enumerate(callbacks):
        if isinstance(callback, Checkpoint):
            return index
    return len(callbacks)


def _has_own_callback(trainer: Any, *, callback: Any) -> bool:
    """Whether the script put a ``FlopMeterCallback`` of its own into the trainer's list."""
    return any(
        type(cb) is type(callback) and cb is not callback and cb._adapter.zero_code is None
        for cb in trainer.callbacks
    )


def _stand_down(callback: Any, trainer: Any, pl_module: Any) -> None:
    """Beside the script's own ``FlopMeterCallback`` a zero-code one that stood down leaves the
    trainer's list (a new list: the hook being called goes on over the old one), so that one
    state is saved under the class name, the script's."""
    if _has_own_callback(trainer, callback=callback):
        trainer.callbacks = [cb for cb in trainer.callbacks if cb is not callback]
