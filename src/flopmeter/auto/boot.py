"""Zero-code metering's start in each Python process (from the ``flopmeter-auto.pth`` file or
``flopmeter run``'s ``sitecustomize``): when ``FLOPMETER_AUTO`` is on, installs the import
watch (:mod:`flopmeter.auto.watch`) and nothing heavier; the hooks attach when their framework
is imported. Never raises: a failure is one line on stderr and the process goes on unmetered.
"""

from __future__ import annotations

import os
import sys

from flopmeter.auto import SWITCH_ENV, switched_on

__all__ = ["HOOKS", "boot"]

#: What runs after each module is imported: ``"package.module:function"``, called with it.
HOOKS: dict[str, tuple[str, ...]] = {
    "torch": ("flopmeter.auto.raw:patch_torch",),
    "transformers.trainer": ("flopmeter.auto.hf:patch_trainer_module",),
    "lightning.pytorch.trainer.trainer": ("flopmeter.auto.lightning:patch_trainer_module",),
    "pytorch_lightning.trainer.trainer": ("flopmeter.auto.lightning:patch_trainer_module",),
}

_booted = False


def boot(launcher: str = "environment") -> None:
    """Switches zero-code metering on in this process, once, when ``FLOPMETER_AUTO`` is on.

    Args:
        launcher: What switched it on: ``"flopmeter run"`` or ``"environment"`` (used when the
            job has not said it already).
    """
    global _booted
    if _booted or not switched_on(os.environ.get(SWITCH_ENV)):
        return
    _booted = True
    try:
        from flopmeter.auto import watch

        watch.install(HOOKS)
    except Exception as exc:  # never the job's problem
        print(f"flopmeter: zero-code metering is off: {type(exc).__name__}: {exc}", file=sys.stderr)
