"""One training micro-batch watched from its forward pass to the end of its backward pass.

The model profile (:class:`~flopmeter.flops.capture.Profiler`) and the dispatch-level samples
(:class:`~flopmeter.flops.sampler.MeasuredSampler`) both observe a training micro-batch over
the same span: from the model's forward pass, through the backward pass that starts from that
forward's outputs. :class:`MicroBatchWindow` is that span, written once:

* :meth:`~MicroBatchWindow.watch_forward` hooks the end of the model's next forward call
  (:func:`~flopmeter.flops._exit_hook.register_exit_hook`), which tells a return from a raise;
* on a return, a gradient hook on every output tensor that needs a gradient (two levels deep
  into tuples, lists, dicts and ``ModelOutput``) sees the backward pass start, and an autograd
  end-of-backward callback sees it end;
* a forward pass that raised closes it, and :meth:`~MicroBatchWindow.close` ends it at any
  time (the backward pass ended, or the optimizer step, the next training forward pass or the
  meter's stop came first); after that it calls nothing, and its hooks leave the model as soon
  as torch allows (after a forward pass that raised, torch iterates the model's hooks without a
  copy, so they go at the next :meth:`~MicroBatchWindow.close`).

What each owner does at each point (build a profile, keep or drop a sample) is the owner's:
the window calls the callables it is given. Nothing here syncs the host with the device.
"""

from __future__ import annotations

import contextlib
import enum
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import torch
from torch import nn

from flopmeter import internals
from flopmeter.flops._exit_hook import register_exit_hook

__all__ = ["MicroBatchWindow", "Outputs", "output_tensors", "runs_compiled"]


def output_tensors(output: Any, depth: int = 0) -> Iterator[torch.Tensor]:
    """Tensors in a model output (a tensor, tuple, list, dict or ModelOutput), two levels deep."""
    if isinstance(output, torch.Tensor):
        yield output
    elif depth < 2:
        if isinstance(output, dict):  # includes transformers' ModelOutput
            values: Iterable[Any] = output.values()
        elif isinstance(output, (tuple, list)):
            values = output
        else:
            return
        for value in values:
            yield from output_tensors(value, depth + 1)


def runs_compiled(model: nn.Module) -> bool:
    """Whether the model's forward pass runs as code compiled by torch.compile (the model was
    compiled as a whole, before or after the meter was attached, or a compiled function calls
    it): module hooks are traced into it, and a dispatch or function mode sees nothing of it."""
    return (
        internals.compiled_module(model)
        or internals.in_compiled_module_call()
        or internals.in_compiled_frame()
    )


class Outputs(enum.Enum):
    """What a forward pass that returned lets the window follow into the backward pass."""

    FOLLOWED = "an output needs a gradient: the backward pass from it is followed"
    NO_GRAD = "the outputs hold tensors, but none needs a gradient"
    NO_TENSOR = "the outputs hold no tensor (None, or an object flopmeter does not read)"
    NOT_FOLLOWED = "the window was asked to end with the forward pass (follow_backward=False)"


class MicroBatchWindow:
    """The observation window of one training micro-batch: its forward pass and its backward.

    Args:
        model: The model whose forward call is watched.
        on_return: Called when a watched forward call returned, with what its outputs let the
            window follow (the gradient hooks are on the outputs by then).
        on_raise: Called when a watched forward call raised (the exception then reaches the
            caller unchanged), the window's last call: it is closed by then. Runs while torch
            iterates the model's forward hooks: it must not remove any of them (:meth:`close`
            from inside it defers their removal).
        on_backward_end: Called when the backward pass that started from a watched forward's
            outputs has ended (an autograd end-of-backward callback).
        on_backward_start: Called once, from the first gradient hook on a watched output (the
            backward pass has started; the forward's work is all done).
        follow_backward: Follow the outputs into the backward pass; when False the outputs are
            not hooked and ``on_return`` is told :attr:`Outputs.NOT_FOLLOWED`.
    """

    def __init__(
        self,
        model: nn.Module,
        *,
        on_return: Callable[[Outputs], None],
        on_raise: Callable[[], None],
        on_backward_end: Callable[[], None],
        on_backward_start: Callable[[], None] | None = None,
        follow_backward: bool = True,
    ) -> None:
        self.model = model
        self._on_return = on_return
        self._on_raise = on_raise
        self._on_backward_end = on_backward_end
        self._on_backward_start = on_backward_start
        self.follow_backward = follow_backward
        #: A watched forward call returned.
        self.returned = False
        #: A watched forward call returned outputs holding no tensor: its backward pass cannot
        #: be seen, so the owner closes the window at the next boundary of the training loop.
        self.blind = False
        #: A gradient hook on a watched output ran: the backward pass has started.
        self.backward_seen = False
        #: The window is closed: nothing more is called.
        self.closed = False
        self._hooks: list[tuple[Any, ...]] = []  # each watched call's two handles
        self._stale: list[Any] = []  # handles of calls that raised, removed at the next close()
        self._raising = False  # inside on_raise: torch is iterating the model's hooks

    @property
    def holds_hooks(self) -> bool:
        """Whether some of the window's forward hooks are still on the model."""
        return bool(self._hooks or self._stale)

    def watch_forward(self) -> MicroBatchWindow:
        """Hooks the end of the model's next forward call (call it before that call starts).

        Called again before the backward pass (gradient accumulation over several forward
        passes), each call's outputs are followed too. Returns the window.
        """
        handles: list[Any] = []

        def on_exit(
            module: nn.Module,
            args: tuple[Any, ...],
            kwargs: dict[str, Any],
            output: Any,
            returned: bool,
        ) -> None:
            self._release(tuple(handles), now=returned)
            if self.closed:
                return
            if returned:
                self._returned(output)
                return
            self._raising = True
            try:
                self.close()  # a forward pass that raised ends the window
                self._on_raise()
            finally:
                self._raising = False

        handles.extend(register_exit_hook(self.model, on_exit))
        self._hooks.append(tuple(handles))
        return self

    def _release(self, handles: tuple[Any, ...], *, now: bool) -> None:
        """Takes one call's handles off the window: removed now after a normal return (torch
        copied the hooks before running them), kept for the next :meth:`close` after a raise."""
        if handles in self._hooks:
            self._hooks.remove(handles)
        if now:
            for handle in handles:
                handle.remove()
        else:
            self._stale.extend(handles)

    def _returned(self, output: Any) -> None:
        self.returned = True
        outputs = self._follow(output)
        if outputs is Outputs.NO_TENSOR:
            self.blind = True
        self._on_return(outputs)

    def _follow(self, output: Any) -> Outputs:
        """Hooks every output tensor that needs a gradient; says what the outputs held."""
        if not self.follow_backward:
            return Outputs.NOT_FOLLOWED
        seen = hooked = False
        for tensor in output_tensors(output):
            seen = True
            if tensor.requires_grad:
                tensor.register_hook(self._on_grad)
                hooked = True
        if hooked:
            return Outputs.FOLLOWED
        return Outputs.NO_GRAD if seen else Outputs.NO_TENSOR

    def _on_grad(self, grad: torch.Tensor) -> None:
        # Runs inside the backward pass: the window closes when that backward pass ends.
        if self.closed or self.backward_seen:
            return
        self.backward_seen = True
        if self._on_backward_start is not None:
            self._on_backward_start()
        with contextlib.suppress(Exception):  # only fails outside a backward pass
            internals.queue_end_of_backward(self._end_backward)

    def _end_backward(self) -> None:
        if not self.closed:
            self._on_backward_end()

    def close(self) -> None:
        """Closes the window (idempotent): nothing more is called, and its hooks leave the model
        (those that may not go yet, after a raise, at the next call)."""
        self.closed = True
        if self._raising:
            for handles in self._hooks:
                self._stale.extend(handles)
            self._hooks.clear()
            return
        for handles in self._hooks:
            for handle in handles:
                handle.remove()
        self._hooks.clear()
        while self._stale:
            self._stale.pop().remove()
