"""The meters running in this process, and who is told when one starts.

Zero-code metering (:mod:`flopmeter.auto`) attaches meters the script did not make; it must
give way to a meter the script makes itself (never two meters counting one run), so it listens
here: :class:`~flopmeter.FlopMeter` calls :func:`starting` before it claims its report file,
:func:`started` once it runs and :func:`stopped` when it ends. Without a listener (the usual
case) the calls cost a list check. Imports nothing of flopmeter.
"""

from __future__ import annotations

import logging
import weakref
from collections.abc import Callable
from typing import Any

__all__ = ["add_listener", "remove_listener", "running", "started", "starting", "stopped"]

logger = logging.getLogger("flopmeter")

_listeners: list[Callable[[Any], None]] = []
_running: weakref.WeakSet[Any] = weakref.WeakSet()


def add_listener(listener: Callable[[Any], None]) -> None:
    """Calls ``listener(meter)`` whenever a meter is about to start (before its file is
    claimed); a listener that raises is logged and never stops the meter."""
    if listener not in _listeners:
        _listeners.append(listener)


def remove_listener(listener: Callable[[Any], None]) -> None:
    """Stops telling ``listener`` (nothing when it was not listening)."""
    if listener in _listeners:
        _listeners.remove(listener)


def starting(meter: Any) -> None:
    """``meter`` is about to start: tells the listeners (never raises)."""
    for listener in list(_listeners):
        try:
            listener(meter)
        except Exception:
            logger.exception("flopmeter: a meter-start listener failed (the meter starts anyway)")


def started(meter: Any) -> None:
    """``meter`` runs now."""
    _running.add(meter)


def stopped(meter: Any) -> None:
    """``meter`` has stopped (or never started)."""
    _running.discard(meter)


def running() -> list[Any]:
    """The meters running in this process now."""
    return list(_running)
