"""What the meter's hooks do at each training event (the hot path and the optimizer step).

:class:`TrainingHooks` holds the bodies of the hooks :class:`~flopmeter.FlopMeter` registers:
the forward pre-hook (read a training micro-batch's inputs: its tokens, decoder stream, images,
audio or float sample; add them into the device buffers and the shape counts, hand its shape to
the budget and the batch with its units to the FLOP model; no host read), and the optimizer
step hooks (count the step, let the FLOP model close its sample, refresh the report on disk when
due, let the budget decide). It also keeps the problems of the meter's own hooks: each is logged
once, noted in the report, and training goes on. See docs/architecture.md, "The hot path".
"""

from __future__ import annotations

import contextlib
import logging
import math
import time
from collections.abc import Callable
from typing import Any

import torch
from torch import nn
from torch.optim.optimizer import register_optimizer_step_post_hook

from flopmeter import distributed
from flopmeter.budget.controller import RunBudget
from flopmeter.counting.call_plan import CallPlans
from flopmeter.counting.census import Census, take_census
from flopmeter.counting.counters import RunCounters
from flopmeter.counting.inputs import ModelInputFacts, model_input_facts
from flopmeter.errors import BudgetExceeded
from flopmeter.flops.recorder import FlopModelRecorder
from flopmeter.internals import graph_task_id
from flopmeter.options import MeterOptions
from flopmeter.run.engines import EngineStep, stepping_engine
from flopmeter.safe_text import describe_error, redact
from flopmeter.tokens.batch import TokenInputError

__all__ = ["TrainingHooks"]

logger = logging.getLogger("flopmeter")

# Looked up once: the forward pre-hook runs on every micro-batch.
_is_compiling = torch.compiler.is_compiling
#: One call, where ``is_compiling`` makes two; under Dynamo both read True (folded, unguarded).
_is_dynamo_compiling = torch.compiler.is_dynamo_compiling
_grad_enabled = torch.is_grad_enabled
_graph_task_id = graph_task_id()
_monotonic = time.monotonic


def _nothing(*args: Any) -> None:
    """What the hook hands over to under tracing before it is registered: nothing."""


class _NeverQuiet:
    """A refresh clock that is always due: every optimizer step takes the full path."""

    next_due = -math.inf


class TrainingHooks:
    """The bodies of a meter's hooks, and the problems they met.

    Args:
        model: The model the meter hooks.
        counters: The run's counters.
        flop_model: The run's FLOP model recorder.
        budget: The run's budget (a ``BudgetController`` or ``NullBudget``).
        options: The meter's options (where the tokens are, the pad id).
        after_step: Called at each counted optimizer step, after the FLOP model (the meter's
            refresh of the report on disk when due).

    Attributes:
        census: The parameter census, taken at the first training micro-batch (``None``
            before); :meth:`recount` takes it again.
        problems: Problems in the meter's own hooks, by hook.
    """

    def __init__(
        self,
        model: nn.Module,
        counters: RunCounters,
        flop_model: FlopModelRecorder,
        budget: RunBudget,
        options: MeterOptions,
        after_step: Callable[[], None],
    ) -> None:
        self.model, self.counters, self.flop_model = model, counters, flop_model
        self.budget = budget
        self.token_inputs, self.pad_id = options.token_inputs, options.pad_id
        self.after_step = after_step
        self.census: Census | None = None
        #: The model's tensor-parallel split, read at the census (``None``: none).
        self.model_parallel: distributed.ModelParallel | None = None
        #: What the model's config says of its inputs (read at the census).
        self.input_facts = ModelInputFacts()
        self._trainable: frozenset[str] | None = None  # what trained at the census
        self.problems: dict[str, str] = {}
        #: Per optimizer: its steps are the model's (True), not (False), or a DeepSpeed engine's.
        self._optimizer_match: dict[int, bool | EngineStep] = {}
        #: The calls' plans by structure (forgotten at each census: the input facts change).
        self.plans = CallPlans(self.token_inputs, self.pad_id)
        self._handles: list[Any] = []
        self._eager_forward_pre: Callable[..., None] = _nothing  # set by register()
        #: Where the report file's next refresh time is (``next_due``, ``time.monotonic()``
        #: seconds; the run's ``RunFile``); until it is set, every step is a full one.
        self.refresh_clock: Any = _NeverQuiet
        #: Steps numbered below this are quiet: nothing due but their count (see
        #: :meth:`count_step`); and the micro-batches the last quiet step settled, not yet
        #: handed to the FLOP model (0: none).
        self._quiet_steps_below = 0
        self._unsettled = 0
        #: The optimizer whose steps may be quiet: the last one counted as the model's own.
        self._quiet_optimizer: Any = None

    def register(self, optimizer: torch.optim.Optimizer | None) -> None:
        """Registers the forward pre-hook on the model and the step hook: ``optimizer``'s, or
        the global one filtered to optimizers holding the model's parameters."""
        pre = self.on_forward_pre
        # What a trace of the hook calls: the hook itself, never traced (a graph break).
        self._eager_forward_pre = torch.compiler.disable(pre)
        self._handles.append(self.model.register_forward_pre_hook(pre, with_kwargs=True))
        self.guarded("flop model", self.flop_model.start)
        if optimizer is not None:
            self._handles.append(optimizer.register_step_post_hook(self.on_own_step))
        else:
            self._handles.append(register_optimizer_step_post_hook(self.on_any_step))

    def remove(self) -> None:
        """Removes every hook :meth:`register` added."""
        for handle in self._handles:
            handle.remove()
        self._handles.clear()
        self._quiet_optimizer = None

    def census_now(self) -> Census:
        """The census of the first training micro-batch (or of the last :meth:`recount`);
        before one, a census of the model as it is now (not kept: the first micro-batch takes
        its own)."""
        return self.census or take_census(self.model)

    def recount(self) -> Census:
        """Takes the census again, and has the next training micro-batch profiled again."""
        self.census = take_census(self.model)
        self._trainable = self._trainable_names()
        self.input_facts = model_input_facts(self.model)
        self.plans.forget()
        self.counters.planned.forget()  # their hot paths too (made from the plans)
        self.flop_model.reset_profile()
        self._read_split()
        return self.census

    def _read_split(self) -> None:
        """How the model is split over ranks that share its micro-batches (tensor parallel):
        a rank that is not the first of them feeds copies, left out of the sums over ranks."""
        try:
            split = distributed.model_parallel(self.model)
        except Exception as exc:  # the meter never breaks training: the split is not known
            self.note_problem("split", describe_error(exc), exc)
            split = distributed.ModelParallel(0, True, distributed.unread_split(exc))
        self.model_parallel = split
        self.counters.peer_copy = split is not None and not split.first

    def _trainable_names(self) -> frozenset[str]:
        """The names of the parameters that train now (host attributes only, no device read)."""
        return frozenset(n for n, p in self.model.named_parameters() if p.requires_grad)

    def trainable_changed(self) -> str | None:
        """How the parameters that train differ from those at the census, in words; ``None``
        when they do not (or no census was taken). Read when a report or a budget reading is
        made: a walk over the parameters' ``requires_grad``, never per micro-batch."""
        if self._trainable is None:
            return None
        now = self._trainable_names()
        if now == self._trainable:
            return None
        started, stopped = len(now - self._trainable), len(self._trainable - now)
        return (
            f"{started} parameter tensor(s) train that did not, {stopped} no longer train; "
            f"{len(self._trainable)} trained at the census, {len(now)} now"
        )

    def on_forward_pre(
        self, module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> None:
        """The forward pre-hook: device work only on the model's training micro-batches.

        This runs on every micro-batch, so it is kept short: a call whose structure was seen
        before is counted from its plan (:mod:`flopmeter.counting.call_plan`), and nothing here is
        wrapped. Under ``torch.compile`` (a model compiled after the meter started) the hook is
        not traced: tracing reaches its ``torch.compiler.disable``d copy, which runs eagerly.
        """
        if (
            not _is_dynamo_compiling()  # first: a trace reads nothing of the meter's state
            and module.training
            and (counters := self.counters).micro_batches + 1 < self.flop_model.quiet_below
            and _grad_enabled()
            and _graph_task_id() == -1
        ):
            # The hot path: a training call (not a recomputation), nothing for the FLOP model
            # to see; counted here when its structure was learned.
            budget = self.budget
            if not budget.active:
                if counters.planned.take(args, kwargs) is not None:
                    return None
            else:
                budget.check_forward()
                shape = counters.planned.take(args, kwargs)
                if shape is not None:
                    budget.add_shape(*shape)
                    return None
        return self._forward(module, args, kwargs)

    def _forward(self, module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        """A forward call the hot path did not take: traced (handed to the hook's eager copy),
        not a training call, an activation-checkpoint recomputation, or a training call."""
        if _is_compiling():
            return self._eager_forward_pre(module, args, kwargs)
        if not (module.training and _grad_enabled()):
            return self._untracked(module, args, kwargs)
        if _graph_task_id() != -1:  # activation-checkpoint recomputation: counted once already
            return None
        return self._training_forward(args, kwargs)

    def _training_forward(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        """A training micro-batch the hot path did not take: counted from its call plan (the
        census first, at the first one), then shown to the FLOP model when it must see it."""
        counters, budget = self.counters, self.budget
        budget.check_forward()  # a resumed run at its budget (raise) trains nothing
        counted = None  # the micro-batch is in micro_batches once its tokens are (or it failed)
        try:
            if self.census is None:
                self._first_batch()
            counted = False
            # Shapes only, no host read: device work (or one copy on CPU) per micro-batch.
            shape, ref, units = self.plans.count(counters, args, kwargs, self.input_facts)
            counters.micro_batches += 1  # after its tokens: a SIGTERM report never splits them
            counted = True
            budget.add_shape(*shape)
        except TokenInputError as exc:
            counters.micro_batches += 1
            counters.add_uncounted(exc.kind, str(exc))
            return None
        except Exception as exc:  # the meter's own fault: this micro-batch is not counted
            if counted is False:
                counters.micro_batches += 1
            counters.add_uncounted("unread", describe_error(exc))
            self.note_problem("forward", describe_error(exc), exc)
            return None
        flop_model = self.flop_model
        if units.text and counters.micro_batches < flop_model.quiet_below:
            return None  # nothing to profile or sample for a text micro-batch until then
        self._quiet_steps_below = 0  # a sample may open: the next step is seen in full
        try:  # not through guarded(): this runs on every micro-batch
            if self._unsettled:  # what quiet steps settled, before a sample reads it
                flop_model.settled(self._unsettled)
                self._unsettled = 0
            flop_model.on_training_forward(ref, counters.micro_batches, units=units)
        except Exception as exc:
            self.note_problem("flop model", describe_error(exc), exc)
        return None

    def _untracked(self, module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        """A forward call that is not a training call (evaluation inside the window): noted, and
        its compute watched by phase (generation, scoring, evaluation)."""
        self.counters.untracked_forwards += 1
        try:
            forwards = self.flop_model.forwards
            forwards.trained_call(module, args, kwargs)
            if forwards.end_hooked:  # the next training call removes it: not a hot one
                self.flop_model.quiet_below = 0
        except Exception as exc:
            self.note_problem("flop model", describe_error(exc), exc)

    def _first_batch(self) -> None:
        """At the first training micro-batch: the census, and what the model's config says of
        its inputs."""
        self.census = take_census(self.model)
        self._trainable = self._trainable_names()
        self.counters.world_at_first_batch = distributed.world_size()
        self.input_facts = model_input_facts(self.model)
        self.plans.forget()
        self.counters.planned.forget()  # their hot paths too (made from the plans)
        self._read_split()

    def on_own_step(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        """The step hook of the optimizer the meter was given (quiet steps as
        :meth:`on_any_step`'s)."""
        self._any_step(optimizer, args, kwargs, own=True)

    def on_any_step(
        self, optimizer: torch.optim.Optimizer, args: Any, kwargs: Any, own: bool = False
    ) -> None:
        """The global optimizer step hook: counts the optimizers holding the model's
        parameters, or stepped by a DeepSpeed engine of the model (decided once per
        optimizer); ``own``: the optimizer the meter was given.

        A quiet step (numbered below what the last full step found: no budget, nothing for the
        FLOP model, no refresh of the report due; an optimizer known as the model's) is only
        counted; the micro-batches it settles wait for the FLOP model's next call."""
        counters = self.counters
        if (
            optimizer is self._quiet_optimizer
            and counters.optimizer_steps + 1 < self._quiet_steps_below
            and _monotonic() < self.refresh_clock.next_due
        ):
            counters.optimizer_steps += 1
            self._unsettled = counters.micro_batches
            return
        self._on_step(optimizer, own=own)

    #: :meth:`on_any_step` itself, for :meth:`on_own_step` (whatever wraps the public name).
    _any_step = on_any_step

    def _on_step(self, optimizer: Any, *, own: bool) -> None:
        """Counts ``optimizer``'s step when it is the model's: its own (given, or holding the
        model's parameters), counted each time; or a DeepSpeed engine's, whose ZeRO optimizer
        steps it once per parameter group within one model step, counted once per model step
        (:class:`~flopmeter.run.engines.EngineStep`), its budget stop raised at the next
        training forward rather than between two groups' updates."""
        try:
            match = self._optimizer_match.get(id(optimizer))
            if match is None:
                engine = stepping_engine(optimizer, self.model, skip=2)
                if engine is None:
                    own = own or self._holds_model_parameters(optimizer)
                match = self._optimizer_match[id(optimizer)] = engine or own
        except Exception as exc:
            self.note_problem("optimizer", describe_error(exc), exc)
            return
        if match is True:
            self._quiet_optimizer = optimizer  # its next steps may be quiet
            self.count_step()
        elif isinstance(match, EngineStep) and match.first_of_model_step():
            # a budget stop is raised again at the next training forward (check_forward)
            with contextlib.suppress(BudgetExceeded):
                self.count_step()

    def _holds_model_parameters(self, optimizer: Any) -> bool:
        own = {id(p) for p in self.model.parameters()}
        groups = optimizer.param_groups
        return any(id(p) in own for group in groups for p in group["params"])

    def count_step(self) -> None:
        """One optimizer step of the model: counted; the budget may raise ``BudgetExceeded``.

        Then the steps before the next one anything is due at are quiet (:meth:`on_any_step`):
        none with a budget (its guard bounds every step)."""
        counters = self.counters
        counters.optimizer_steps += 1
        step = counters.optimizer_steps
        micro_batches = counters.micro_batches  # each has had its backward pass
        self._quiet_steps_below, self._unsettled = 0, 0
        self.guarded("optimizer", lambda: self._flop_model_step(step, micro_batches))
        self.guarded("refresh", self.after_step)
        self.budget.on_step(step)  # may raise BudgetExceeded

    def _flop_model_step(self, step: int, micro_batches: int) -> None:
        """The FLOP model's part of a full step, and the quiet steps after it."""
        flop_model = self.flop_model
        flop_model.on_optimizer_step(micro_batches, step=step)
        if not self.budget.active:
            self._quiet_steps_below = flop_model.quiet_steps_below()

    def guarded(self, where: str, fn: Callable[[], Any]) -> None:
        """Runs one of the meter's own steps; a fault is noted, and training goes on."""
        try:
            fn()
        except Exception as exc:
            self.note_problem(where, describe_error(exc), exc)

    def note_problem(self, where: str, message: str, exc: BaseException | None = None) -> None:
        """Logs a problem in the meter's own hooks once; training always goes on."""
        if where not in self.problems:
            self.problems[where] = message = redact(message)
            logger.warning("flopmeter (%s): %s; training continues", where, message, exc_info=exc)
