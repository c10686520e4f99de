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

While the meter writes a final report (SIGTERM's, or the stop's: the file, then the ledger),
the Python handlers of other signals are held (:func:`held_signals`): a signal that comes then
is handled right after, as it would have been. PyTorch's DataLoader raises from its SIGCHLD
handler when a worker dies (a job's whole process group gets SIGTERM), and that exception,
raised in the middle of the write, left the file ``running`` or the ledger without the record.
"""

from __future__ import annotations

import logging
import os
import signal
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

__all__ = ["SigtermHook", "held_signals"]

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
        # other signals held through the report and the handler before (a signal noted then
        # is handled after both, if the process is still there: SIGTERM's default ends it)
        with held_signals():
            try:
                if self._callback is not None:
                    self._callback()
            except Exception:
                logger.exception("flopmeter could not write its report on SIGTERM")
            self._hand_on(signum, frame)

    def _hand_on(self, signum: int, frame: Any) -> None:
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


#: Signals never held: Ctrl-C keeps its own handling (the ledger append notes it), SIGTERM is
#: the hook's own.
_NOT_HELD = frozenset({signal.SIGINT, signal.SIGTERM})


@contextmanager
def held_signals() -> Iterator[None]:
    """Holds the Python handlers of other signals while the body runs (the main thread only;
    elsewhere a no-op): each is replaced by one that notes the signal, and put back after, when
    the noted signals are handled by it, in order. An exception a handler raises then (the
    DataLoader's worker error) is raised here, after the body, as it would have been before."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    noted: list[tuple[int, Any]] = []

    def note(signum: int, frame: Any) -> None:
        noted.append((signum, frame))

    held: dict[int, Any] = {}
    for signum in signal.valid_signals() - _NOT_HELD:
        try:
            handler = signal.getsignal(signum)
            if callable(handler):
                held[signum] = signal.signal(signum, note)
        except (ValueError, OSError, TypeError):
            continue
    try:
        yield
    finally:
        for signum, handler in held.items():
            try:
                if signal.getsignal(signum) is note:
                    signal.signal(signum, handler)
            except (ValueError, OSError):
                continue
        for signum, frame in noted:
            handler = held.get(signum)
            if callable(handler):
                handler(signum, frame)
