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

import logging
from collections.abc import Callable
from typing import Any

import torch
from torch import nn
from torch.optim.optimizer import register_optimizer_step_post_hook

from flopmeter import distributed
from flopmeter.budget import RunBudget
from flopmeter.census import Census, take_census
from flopmeter.counters import RunCounters
from flopmeter.flops.recorder import FlopModelRecorder
from flopmeter.inputs import ModelInputFacts, model_input_facts, read_call
from flopmeter.internals import in_backward_pass
from flopmeter.options import MeterOptions
from flopmeter.safe_text import describe_error, redact
from flopmeter.tokens import TokenInputError

__all__ = ["TrainingHooks", "said"]

logger = logging.getLogger("flopmeter")


def said(exc: BaseException) -> str:
    """``"Type: message"`` of a fault in the meter's own code, bounded, credentials redacted
    (:func:`flopmeter.safe_text.describe_error`)."""
    return describe_error(exc)


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
        #: What the model's config says of its inputs (read at the census).
        self.input_facts = ModelInputFacts()
        self._trainable: frozenset[str] | None = None  # what trained at the census
        self.problems: dict[str, str] = {}
        self._optimizer_match: dict[int, bool] = {}
        self._handles: list[Any] = []

    def register(self, optimizer: torch.optim.Optimizer | None) -> None:
        """Registers the forward pre-hook on the model and the step hook: ``optimizer``'s, or
        the global one filtered to optimizers holding the model's parameters."""
        # torch.compiler.disable: a model compiled after this does not trace the hook.
        hook = torch.compiler.disable(self.on_forward_pre)
        self._handles.append(self.model.register_forward_pre_hook(hook, with_kwargs=True))
        if optimizer is not None:
            self._handles.append(optimizer.register_step_post_hook(self.on_own_step))
        else:
            self._handles.append(register_optimizer_step_post_hook(self.on_any_step))

    def remove(self) -> None:
        """Removes every hook :meth:`register` added."""
        for handle in self._handles:
            handle.remove()
        self._handles.clear()

    def recount(self) -> Census:
        """Takes the census again, and has the next training micro-batch profiled again."""
        self.census = take_census(self.model)
        self._trainable = self._trainable_names()
        self.input_facts = model_input_facts(self.model)
        self.flop_model.reset_profile()
        return self.census

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
        """The forward pre-hook: device work only on the model's training micro-batches."""
        if not (module.training and torch.is_grad_enabled()):
            self.counters.untracked_forwards += 1  # evaluation inside the window: noted
            return
        if in_backward_pass():  # activation-checkpoint recomputation: counted once already
            return
        self.budget.check_forward()  # a resumed run at its budget (raise) trains nothing
        try:
            if self.census is None:
                self.census = take_census(self.model)
                self._trainable = self._trainable_names()
                self.counters.world_at_first_batch = distributed.world_size()
                self.input_facts = model_input_facts(self.model)
            self.counters.micro_batches += 1
            # Shapes only (no value read); unreadable or ambiguous: TokenInputError, unread.
            call = read_call(args, kwargs, self.token_inputs, self.input_facts)
            # Device work only: no .item(), .cpu(), host copy or collective per micro-batch.
            self.budget.add_shape(*self.counters.add_call(call, self.pad_id))
        except TokenInputError as exc:
            self.counters.add_uncounted(exc.kind, str(exc))
            return
        except Exception as exc:  # the meter's own fault: this micro-batch is not counted
            self.counters.add_uncounted("unread", said(exc))
            self.note_problem("forward", said(exc), exc)
            return
        try:  # not through guarded(): this runs on every micro-batch
            self.flop_model.on_training_forward(
                call.ref, self.counters.micro_batches, units=call.units
            )
        except Exception as exc:
            self.note_problem("flop model", said(exc), exc)

    def on_own_step(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        """The step hook of the optimizer the meter was given."""
        self.count_step()

    def on_any_step(self, optimizer: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
        """The global optimizer step hook: counts the optimizers holding the model's
        parameters (decided once per optimizer)."""
        try:
            match = self._optimizer_match.get(id(optimizer))
            if match is None:
                own = {id(p) for p in self.model.parameters()}
                groups = optimizer.param_groups
                match = any(id(p) in own for group in groups for p in group["params"])
                self._optimizer_match[id(optimizer)] = match
        except Exception as exc:
            self.note_problem("optimizer", said(exc), exc)
            return
        if match:
            self.count_step()

    def count_step(self) -> None:
        """One optimizer step of the model: counted; the budget may raise ``BudgetExceeded``."""
        self.counters.optimizer_steps += 1
        self.guarded("optimizer", self.flop_model.on_optimizer_step)
        self.guarded("refresh", self.after_step)
        self.budget.on_step(self.counters.optimizer_steps)  # may raise BudgetExceeded

    def guarded(self, where: str, fn: Callable[[], Any]) -> None:
        """Runs one of the meter's own steps; a fault is noted, and training goes on."""
        try:
            fn()
        except Exception as exc:
            self.note_problem(where, said(exc), exc)

    def note_problem(self, where: str, message: str, exc: BaseException | None = None) -> None:
        """Logs a problem in the meter's own hooks once; training always goes on."""
        if where not in self.problems:
            self.problems[where] = message = redact(message)
            logger.warning("flopmeter (%s): %s; training continues", where, message, exc_info=exc)
