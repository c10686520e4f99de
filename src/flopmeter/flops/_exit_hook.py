"""A forward hook that runs when a module's forward call ends, and says how it ended.

An ``always_call=True`` forward hook also runs when the forward pass raised, with an output of
``None`` then; but a forward may return ``None`` itself (a Lightning ``training_step`` in manual
optimization, a model that keeps its loss on ``self``). So the output does not say how the call
ended. :func:`register_exit_hook` registers two hooks together: a plain forward hook, which torch
runs only after a normal return, records that return; the always-call hook right after it reads
(and clears) that record. Registered together, they are adjacent in the module's hook order, so
on a normal return nothing runs between them; the record is per thread (modules replicated by
``nn.DataParallel`` share their hooks across threads), and a nested or repeated call of the
module is paired with its own return.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

__all__ = ["ExitHook", "eager", "register_exit_hook"]

#: ``hook(module, args, kwargs, output, returned)``; ``returned`` is False when the forward
#: raised (or a forward hook that runs before these two did).
ExitHook = Callable[[nn.Module, tuple[Any, ...], dict[str, Any], Any, bool], None]


def eager(fn: Callable[..., Any]) -> Callable[..., Any]:
    """``fn`` as a hook that runs eagerly and costs one test outside tracing: under
    ``torch.compile``'s tracing it hands over to a ``torch.compiler.disable``d copy (a graph
    break; the copy runs eagerly on the real values), and otherwise calls ``fn`` itself (a
    disabled function costs tens of microseconds per call even when nothing is traced)."""
    traced = torch.compiler.disable(fn)
    is_compiling = torch.compiler.is_compiling

    def hook(*args: Any) -> Any:
        if is_compiling():
            return traced(*args)
        return fn(*args)

    return hook


def register_exit_hook(module: nn.Module, hook: ExitHook, *, hot: bool = False) -> tuple[Any, Any]:
    """Registers ``hook`` to run at the end of every forward call of ``module``.

    ``hot``: the hooks stay on every call of the module for the whole run (the forward watch's
    on the trained model), so they are :func:`eager` rather than always disabled.

    Returns:
        The two handles, in registration order. After a normal return they may be removed from
        inside ``hook``; after an exception torch iterates the module's hooks without a copy, so
        they must be removed later (removing any of the module's forward hooks then would break
        torch's loop).
    """
    state = threading.local()

    def on_return(mod: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any], out: Any) -> None:
        state.returned = True

    def on_exit(mod: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any], out: Any) -> None:
        returned = getattr(state, "returned", False)
        state.returned = False
        hook(mod, args, kwargs, out, returned)

    # Never traced (torch.compiler.disable): when the module is compiled as a whole after these
    # hooks were registered, dynamo would trace them into the graph (handles removed there, a
    # profile built from fake tensors). A graph break at the forward's end instead, until the
    # hooks are removed; they run eagerly on the real output.
    wrap = eager if hot else torch.compiler.disable
    first = module.register_forward_hook(wrap(on_return), with_kwargs=True)
    second = module.register_forward_hook(wrap(on_exit), with_kwargs=True, always_call=True)
    return first, second
