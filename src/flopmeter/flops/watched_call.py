"""One watched forward call and how its operators are counted: by its own counting mode,
or handed to it by the trained model's training sample (:func:`current_call`), so each
operator is the work of the model that runs it (:mod:`flopmeter.flops.forwards`)."""

from __future__ import annotations

import threading
from typing import Any

from torch import nn

from flopmeter import internals
from flopmeter.flops.aten_ops import measured_formulas
from flopmeter.flops.phases import FormTally

__all__ = ["WatchedCall", "call_counter", "current_call", "sample_counter_on_top", "thread_state"]

#: What the watch keeps per thread: ``.stack``, the watched calls open on it; ``.depth``.
thread_state = threading.local()


def current_call() -> WatchedCall | None:
    """The watched call now running on this thread (its operators are its own work), or None."""
    stack = getattr(thread_state, "stack", None)
    return stack[-1] if stack else None


class WatchedCall:
    """One watched forward call: its phase's form, its units, and its count when sampled."""

    __slots__ = ("counter", "flops", "form", "module", "sampling", "units")

    def __init__(self, module: nn.Module, form: FormTally | None, units: tuple[float, ...]):
        self.module = module
        self.form = form
        self.units = units
        self.sampling = False
        self.flops = 0
        self.counter: Any = None  # this call's own counting mode, when it pushed one

    def add(self, flops: int) -> None:
        """Adds one operator's FLOP (only while the call is sampled)."""
        if self.sampling:
            self.flops += flops


def _count_into_call(mode: Any, func_packet: Any, out: Any, args: Any, kwargs: Any) -> None:
    call = current_call()
    if call is None or not call.sampling:
        return
    formula = mode.flop_registry.get(func_packet)
    if formula is None:
        return
    try:
        call.add(int(formula(*args, **kwargs, out_val=out)))
    except Exception as exc:  # a formula must never fail the user's operator
        call.sampling = False
        mode.flopmeter_failed = f"{type(exc).__name__}: {exc}"


_mode_class: type | None = None


def call_counter() -> Any:
    """A counting mode that adds each operator's FLOP to :func:`current_call` (a sampled call's
    own count, when no training sample is open)."""
    global _mode_class
    if _mode_class is None:
        _mode_class = internals.flop_counter_class(_count_into_call)
    mode = _mode_class(display=False, custom_mapping=measured_formulas())
    mode.flopmeter_failed = None
    return mode


def sample_counter_on_top() -> Any:
    """The trained model's training sample whose mode is the innermost dispatch mode (its
    counter routes a watched call's operators to :func:`current_call` while it counts), or
    ``None``."""
    counter = getattr(internals.current_dispatch_mode(), "counter", None)
    if getattr(counter, "flopmeter_routes_calls", False):
        return counter.flopmeter_counter
    return None
