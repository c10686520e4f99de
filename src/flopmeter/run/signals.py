"""SIGTERM: write what the meter knows before the process ends, then do what was done before.

SLURM, Kubernetes and SageMaker (spot interruptions) send SIGTERM some seconds before they kill
a job. :class:`SigtermHook` puts a handler in front of whatever handler was installed (Python's
default, Lightning's, Accelerate's, the user's): it runs the meter's callback (write an
``interrupted`` report), then hands the signal on:

* to the earlier Python handler, called as it would have been (it may stop training cleanly,
  as Lightning's does, and the meter's final report then replaces the interrupted one);
* with the default disposition, by restoring it and sending SIGTERM again, so the process ends
  as it would have (killed by SIGTERM);
* when SIGTERM was ignored, nowhere: the run goes on.

Python runs signal handlers in the main thread only, so the hook is installed only from there.
SIGKILL and ``os._exit`` cannot be caught: after them the last refreshed report (status
``running``) is what is on disk.
"""

from __future__ import annotations

import logging
import os
import signal
import threading
from collections.abc import Callable
from typing import Any

__all__ = ["SigtermHook"]

logger = logging.getLogger("flopmeter")


class SigtermHook:
    """Runs ``callback`` on SIGTERM before the handler that was there.

    Args:
        callback: Called with no argument when SIGTERM arrives; its exceptions are logged,
            never raised (the signal still goes on).
    """

    def __init__(self, callback: Callable[[], None]) -> None:
        self._callback: Callable[[], None] | None = callback
        self._previous: Any = None
        self._installed = False

    @property
    def installed(self) -> bool:
        """Whether the hook is the process's SIGTERM handler now (as far as it knows)."""
        return self._installed

    def install(self) -> bool:
        """Installs the hook; a no-op off the main thread or where signals are unavailable.

        Returns:
            Whether it was installed.
        """
        if self._installed or threading.current_thread() is not threading.main_thread():
            return False
        try:
            self._previous = signal.signal(signal.SIGTERM, self._handle)
        except (ValueError, OSError, AttributeError):  # no SIGTERM or not allowed here
            return False
        self._installed = True
        return True

    def uninstall(self) -> None:
        """Puts the earlier handler back, if the hook is still the one installed; else (a
        later handler was installed over it) the hook stays in the chain with no callback, so
        it holds nothing of the run, and the next hook of this class to leave skips it."""
        if not self._installed:
            return
        self._installed, self._callback = False, None
        self._previous = _past_spent(self._previous)
        try:
            if signal.getsignal(signal.SIGTERM) == self._handle:
                signal.signal(signal.SIGTERM, self._previous)
        except (ValueError, OSError):  # off the main thread: leave it; it only chains
            pass

    def _handle(self, signum: int, frame: Any) -> None:
        try:
            if self._callback is not None:
                self._callback()
        except Exception:
            logger.exception("flopmeter could not write its report on SIGTERM")
        previous = _past_spent(self._previous)
        if callable(previous):
            previous(signum, frame)
        elif previous == signal.SIG_IGN:
            return
        else:  # SIG_DFL (or unknown, None): end the process the way SIGTERM would have
            self.uninstall()
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
            os.kill(os.getpid(), signal.SIGTERM)


def _past_spent(handler: Any) -> Any:
    """``handler``, or what it hands on to when it is a hook that has left (no callback):
    meters stopped in the order they started leave no chain of spent handlers."""
    while True:
        hook = getattr(handler, "__self__", None)
        if not isinstance(hook, SigtermHook) or hook._installed or hook._callback is not None:
            return handler
        handler = hook._previous
