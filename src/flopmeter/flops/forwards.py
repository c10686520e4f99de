"""The forward passes of a run that are not the trained model's training passes, watched.

A post-training run feeds its updates with more than the trained model's own training forward
and backward (docs/methodology.md, "Phases"):

* the trained model's forward passes without gradients while it trains (``model.training``
  true): generation of completions (a call with a key-value cache, ``past_key_values``), and
  scoring (old log-probabilities, a reference made by disabling its adapter);
* other models' forward passes while the trained model trains: a reference model, a teacher, a
  reward model. They are found as modules that run at the top of the module stack (no module
  around them) and are neither the trained model, part of it, nor a wrapper of it.
* forward passes of either kind while the trained model is in evaluation mode are evaluation.

:class:`ForwardWatch` puts a forward pre-hook and a forward hook on the trained model (for its
calls that are not training calls) and on every other model it finds. Finding them needs a
global module hook, which puts every module call on PyTorch's slower path, so it is on only in
*discovery windows*: from the start to the end of optimizer step 2, then over the interval
before every ``every``-th step. A model first seen later had calls before that the watch did
not see: its phase says so and its figure is withheld.

Each watched call adds its units (:mod:`flopmeter.flops.phases`) to its form's tally, from
shapes alone. A call whose units are outside what the form's samples cover (and calls 1, 2 and
every ``every``-th of a form, as checks) runs under a counting mode, and its FLOP become a
sample. When the trained model's own training sample is open (a teacher forward between the
student's forward and its backward), that sample's counter hands the call's operators here
through :func:`current_call` instead of counting them as training work: each operator is the
work of the model that runs it, whatever the order of the lines.
"""

from __future__ import annotations

import contextlib
import logging
import sys
import weakref
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch import nn

from flopmeter import internals
from flopmeter.flops._exit_hook import eager, register_exit_hook
from flopmeter.flops.call_units import call_units, uses_cache
from flopmeter.flops.phases import FormTally, PhaseTally
from flopmeter.flops.watched_call import (
    WatchedCall,
    call_counter,
    sample_counter_on_top,
    thread_state,
)

logger = logging.getLogger("flopmeter")

__all__ = [
    "DISCOVERY_STEPS",
    "EVALUATION",
    "GENERATION",
    "MAX_FORM_SAMPLES",
    "SCORING",
    "ForwardWatch",
]

#: The trained model's no-grad forward passes with a key-value cache, while it trains.
GENERATION = "generation"
#: The trained model's other no-grad forward passes while it trains.
SCORING = "scoring"
#: Forward passes (the trained model's or another's) while the trained model is in evaluation
#: mode: diagnostic, never counted (Commission guidelines, Annex A.1, para. 122).
EVALUATION = "evaluation"
#: Optimizer steps from the start over which other models are looked for.
DISCOVERY_STEPS = 2
#: Dispatch samples one form keeps at most (its units span at most 4 dimensions; the rest
#: are checks).
MAX_FORM_SAMPLES = 12

_graph_task_id = internals.graph_task_id()


class ForwardWatch:
    """Watches the forward passes of a run that are not the trained model's training passes.

    Args:
        model: The trained model.
        every: Check each form again at its ``every``-th call, and look for other models again
            over the interval before every ``every``-th optimizer step; ``0``: no sampling.
        on_problem: Called with an exception raised in the watch's own code (training goes on).
    """

    def __init__(
        self,
        model: nn.Module,
        *,
        every: int,
        on_problem: Callable[[BaseException], None] | None = None,
    ) -> None:
        self.model = model
        self.every = every
        self.on_problem = on_problem
        #: What was seen of each phase, by phase name.
        self.tallies: dict[str, PhaseTally] = {}
        self._kinds: weakref.WeakKeyDictionary[nn.Module, str] = weakref.WeakKeyDictionary()
        self._own: set[int] = set()
        self._own_params: set[int] = set()
        self._handles: list[Any] = []
        self._global: list[Any] = []
        #: The trained model's end hook while one is on (:meth:`trained_call`), and the hook.
        self._end: Any = None
        self._end_hook = eager(self._trained_end)
        self._names: dict[int, str] = {}
        self.steps = 0
        self.started = False
        #: Set once an adapter or the user marks evaluation explicitly (:meth:`evaluation`):
        #: from then on only calls inside such a window are evaluation, whatever the mode.
        self.explicit_evaluation = False
        self._evaluating = 0

    @contextlib.contextmanager
    def evaluation(self) -> Iterator[None]:
        """A window of evaluation, marked by whoever runs it (the HF callback around the
        Trainer's evaluation loop). Once one is marked, the trained model's mode no longer
        decides: a trainer that generates its training data with the model in evaluation mode
        (TRL's GKD) is then counted as generation."""
        self.explicit_evaluation = True
        self._evaluating += 1
        try:
            yield
        finally:
            self._evaluating -= 1

    def _in_evaluation(self) -> bool:
        if self.explicit_evaluation:
            return self._evaluating > 0
        return not self.model.training

    # ------------------------------------------------------------------ lifecycle
    def start(self) -> None:
        """Hooks the trained model and opens the first discovery window."""
        if self.started:
            return
        self.started = True
        self._own = {id(m) for m in self.model.modules()}
        self._own_params = {id(p) for p in self.model.parameters()}
        # The trained model's calls that are not training calls reach the watch through the
        # meter's own forward pre-hook (:meth:`trained_call`); their end, through one plain
        # forward hook that the first of them registers and the next training call removes
        # (:meth:`unhook_end`): a training call pays nothing for it.
        self._discover(True)

    def stop(self) -> None:
        """Removes every hook (the meter's stop). Open calls are left to close themselves."""
        self._discover(False)
        self.unhook_end()
        for handle in self._handles:
            handle.remove()
        self._handles.clear()
        self.started = False

    def on_step(self, step: int) -> None:
        """The trained model's optimizer step ``step`` (1-based) has ended: look for other
        models over the next interval when it is a discovery interval."""
        self.steps = step
        nxt = step + 1
        self._discover(nxt <= DISCOVERY_STEPS or (self.every > 0 and nxt % self.every == 0))

    def quiet_steps_below(self) -> int:
        """The first step number after :attr:`steps` whose :meth:`on_step` opens or closes a
        discovery window (the steps before it only count); ``steps + 1`` while one is open."""
        n = self.steps + 1
        if self._global or n + 1 <= DISCOVERY_STEPS:
            return n
        if self.every <= 0:
            return sys.maxsize
        return n + (-(n + 1)) % self.every  # on_step(n) opens one when (n + 1) % every == 0

    def name(self, module: nn.Module, name: str) -> None:
        """Names another model's phase (``"reference"``, ``"teacher"``, ``"reward model"``):
        its calls are watched from now on, whether or not a discovery window saw it."""
        if id(module) in self._own or module is self.model:
            return
        self._names[id(module)] = name
        if self._kinds.get(module) != "root":
            self._kinds[module] = "root"
            self._hook(module)
            self._tally(self._phase_of(module)).modules.append(_describe(module))

    # ------------------------------------------------------------------ discovery
    def _discover(self, on: bool) -> None:
        if on and not self._global:
            thread_state.depth = 0
            mm = torch.nn.modules.module
            self._global = [
                mm.register_module_forward_pre_hook(self._global_pre),
                mm.register_module_forward_hook(
                    self._global_post, with_kwargs=True, always_call=True
                ),
            ]
        elif not on and self._global:
            for handle in self._global:
                handle.remove()
            self._global = []

    def _global_pre(self, module: nn.Module, args: Any) -> None:
        depth = getattr(thread_state, "depth", 0)
        thread_state.depth = depth + 1
        if depth != 0 or _graph_task_id() != -1:
            return  # inside another module, or a recomputation inside a backward pass
        try:
            kind = self._kinds.get(module)
            if kind is None:
                kind = self._kinds[module] = self._classify(module)
                if kind in ("root", "inner"):
                    self._found(module, kind)
        except Exception as exc:
            self._problem(exc)

    def _global_post(self, module: nn.Module, args: Any, kwargs: Any, output: Any) -> None:
        thread_state.depth = max(getattr(thread_state, "depth", 1) - 1, 0)

    def _classify(self, module: nn.Module) -> str:
        """What a module at the top of the module stack is: ``own`` (the trained model),
        ``inner`` (a part of it called on its own: the model inside a PEFT wrapper that TRL
        generates with), ``wrapper`` (holds the trained model or shares its parameters: DDP
        around the module a Lightning view holds), ``none`` (no parameters), or ``root``
        (another model: its parameters are not the trained model's)."""
        if module is self.model:
            return "own"
        first = next(module.parameters(), None)
        if first is None:
            return "none"
        if id(module) in self._own:
            return "inner"
        if id(first) in self._own_params or any(m is self.model for m in module.modules()):
            return "wrapper"  # holds the trained model, or modules of it (DDP around a view)
        return "root"

    def _found(self, module: nn.Module, kind: str = "root") -> None:
        """Another model (or a part of the trained model called on its own), first seen now
        (in a discovery window): hooked from its next call; this call, already started, is
        watched from the global hook's side."""
        tally = self._tally(self._phase_of(module))  # an inner module's: scoring, for the note
        if kind != "inner":
            tally.modules.append(_describe(module))
        if self.steps >= DISCOVERY_STEPS:
            tally.notes.append(
                f"first seen after optimizer step {self.steps}: its calls before then were not "
                "watched"
            )
        self._hook(module)
        # Its forward pre-hooks were read before this one added its own: open the call here.
        self._open(module, (), {}, units_later=True)

    # ------------------------------------------------------------------ the calls
    def _hook(self, module: nn.Module) -> None:
        pre = eager(self._pre)  # never traced into a compiled graph, one test otherwise
        self._handles.append(module.register_forward_pre_hook(pre, with_kwargs=True))
        self._handles.extend(register_exit_hook(module, self._post, hot=True))

    def _trained(self, module: nn.Module) -> bool:
        """Whether ``module`` is the trained model, or a part of it called on its own."""
        return module is self.model or self._kinds.get(module) == "inner"

    def _phase_of(self, module: nn.Module) -> str:
        if self._trained(module):
            return SCORING
        name = self._names.get(id(module))
        return f"model {name}" if name else f"model {type(module).__name__} #{_index(module)}"

    def _tally(self, phase: str) -> PhaseTally:
        tally = self.tallies.get(phase)
        if tally is None:
            tally = self.tallies[phase] = PhaseTally()
        return tally

    def trained_call(
        self, module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> None:
        """The trained model's forward call that is not a training call (the meter's forward
        pre-hook hands it over): watched until its end."""
        if self.started:
            if self._end is None:  # torch reads the forward hooks after the pre-hooks
                self._end = self.model.register_forward_hook(
                    self._end_hook, with_kwargs=True, always_call=True
                )
            self._pre(module, args, kwargs)

    @property
    def end_hooked(self) -> bool:
        """Whether the trained model's end hook is on (a call that is not a training call
        registered it; the next training call should remove it: :meth:`unhook_end`)."""
        return self._end is not None

    def unhook_end(self) -> None:
        """Removes the end hook :meth:`trained_call` registered, if any: from a training call's
        forward pre-hook (torch reads the forward hooks after the pre-hooks, and never inside
        an exception's loop over them) or at the stop."""
        if self._end is not None:
            self._end.remove()
            self._end = None

    def _trained_end(
        self, module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any], output: Any
    ) -> None:
        stack = getattr(thread_state, "stack", None)
        if stack and stack[-1].module is module:
            # always called: ``None`` is what torch passes after a raise (a forward without
            # gradients that returns None is taken as one that raised: its sample is dropped)
            self._post(module, args, kwargs, output, output is not None)

    def _pre(self, module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        if module.training and torch.is_grad_enabled() and self._trained(module):
            return  # a training call: the meter's own hooks count it
        if torch.compiler.is_compiling() or _graph_task_id() != -1:
            return  # traced, or recomputed inside a backward pass (counted where it first ran)
        if getattr(thread_state, "stack", None):
            return  # inside a watched call (or opened by the global hook for this very call)
        self._open(module, args, kwargs)

    def _open(
        self, module: nn.Module, args: Any, kwargs: Any, *, units_later: bool = False
    ) -> None:
        try:
            call = WatchedCall(module, None, ())
            if not units_later:
                self._place(call, args, kwargs)
            stack = getattr(thread_state, "stack", None)
            if stack is None:
                stack = thread_state.stack = []
            stack.append(call)
            self._begin_sample(call, units_later)
        except Exception as exc:
            self._problem(exc)

    def _place(self, call: WatchedCall, args: Any, kwargs: Any, *, after: bool = False) -> None:
        """Files the call under its phase and form, with its units (``after``: read at the
        call's end)."""
        module = call.module
        form_key, units = call_units(tuple(args), dict(kwargs), after=after)
        if self._in_evaluation():
            phase = EVALUATION
        elif self._trained(module):
            phase = GENERATION if uses_cache(kwargs) else SCORING
        else:
            phase = self._phase_of(module)
        tally = self._tally(phase)
        own = self._trained(module)
        where = " (the trained model)" if module is self.model else " (inside the trained model)"
        described = _describe(module) + (where if own else "")
        if (own or phase == EVALUATION) and described not in tally.modules:
            tally.modules.append(described)
        form = tally.forms.get(form_key)
        if form is None:
            form = tally.forms[form_key] = FormTally()
        call.form, call.units = form, units

    def _due(self, call: WatchedCall) -> bool:
        form = call.form
        if form is None:
            return len(self._global) > 0  # a first call: its units come at its end
        if self.every <= 0 or len(form.samples) >= MAX_FORM_SAMPLES:
            return False
        n = form.calls + 1
        return not form.covers(call.units) or n <= 2 or n % self.every == 0

    def _begin_sample(self, call: WatchedCall, first: bool) -> None:
        if self.every <= 0 or not self._due(call):
            return
        empty = internals.dispatch_stack_empty()
        sample = None if empty else sample_counter_on_top()
        if sample is not None and not sample.closed:
            call.sampling = True  # the training sample's counter hands the operators over
        elif empty or sample is not None:
            # our own mode (above a closed training sample's, which counts nothing: it leaves
            # the stack only after this call's mode has, at the next training forward or step)
            call.counter = call_counter()
            call.counter.__enter__()
            call.sampling = True
        elif call.form is not None:
            call.form.lost += 1

    def _post(
        self,
        module: nn.Module,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        output: Any,
        returned: bool,
    ) -> None:
        stack = getattr(thread_state, "stack", None)
        if not stack or stack[-1].module is not module:
            return
        call = stack.pop()
        if not returned:
            call.sampling = False  # a forward that raised: its count is partial
        try:
            self._close(call, args, kwargs)
        except Exception as exc:
            self._problem(exc)

    def _close(self, call: WatchedCall, args: Any, kwargs: Any) -> None:
        counter = call.counter
        if counter is not None:
            if internals.current_dispatch_mode() is counter.mode:
                counter.__exit__(None, None, None)
            else:  # a mode the call left above ours: ours stays (counting nothing), untrusted
                call.sampling = False
                self._problem(RuntimeError("a dispatch mode was left above the watch's own"))
            if counter.flopmeter_failed:
                call.sampling = False
        if call.form is None:
            self._place(call, args, kwargs, after=True)
        form = call.form
        assert form is not None
        if call.sampling:
            form.samples.append((call.units, call.flops))
        elif counter is not None and form is not None:
            form.lost += 1
        form.add(call.units)

    def _problem(self, exc: BaseException) -> None:
        if self.on_problem is not None:
            self.on_problem(exc)
        else:
            logger.warning("flopmeter (forwards): %s", exc)


_indices: weakref.WeakKeyDictionary[nn.Module, int] = weakref.WeakKeyDictionary()


def _index(module: nn.Module) -> int:
    """A small number for another model of this process, in the order they were first seen."""
    index = _indices.get(module)
    if index is None:
        index = _indices[module] = len(_indices) + 1
    return index


def _describe(module: nn.Module) -> str:
    n = sum(p.numel() for p in module.parameters())
    return f"{type(module).__name__} ({n:,} parameters)"
