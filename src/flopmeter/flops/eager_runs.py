"""A compiled model's sampled micro-batches, run through its eager module.

A dispatch-level count sees nothing inside code compiled by ``torch.compile``, so a sampled
micro-batch of a compiled model runs eagerly instead: :class:`EagerRuns` sets torch.compile's
stance to ``"force_eager"`` (``torch.compiler.set_stance``, public) from before that
micro-batch's forward call to the end of its backward pass, then puts the stance back as it was.
What then runs is the compiled module's own eager module (the module ``torch.compile`` wraps, or
the module the meter holds), on the same inputs and parameters: the same math and the same
gradients into the same parameters, no extra forward pass (the sampled call itself runs
eagerly), and nothing is recompiled (the compiled graphs stay cached for the next micro-batch).
The FLOP of a fused kernel are those of the eager operators it fuses.

The sample's counting mode must be pushed, and popped, outside every compiled call: dynamo's
wrapper restores on return the dispatch keys it was entered with, so a mode pushed inside it
would miss the backward pass. When the meter's hook runs before the compiled call (the meter
holds what ``torch.compile(model)`` returned, whose hooks run outside its compiled forward, or a
model some of whose modules are compiled) the stance is set there, for this micro-batch. When
it runs inside it (the meter holds the module that an outer ``torch.compile(model)`` wraps: the
Trainer's ``torch_compile``, a model compiled after the meter was attached), the compiled code
already runs: the stance is set one micro-batch ahead, and a relay hook on that outer module
pushes the mode before the sampled call and pops it at the next call
(:meth:`EagerRuns.prepare_next`). Inside ``module.compile()`` or a compiled function that calls the
model there is no outer module to relay from: those samples are skipped, with the reason.
While the stance is forced every compiled call in the process runs eagerly, for that
micro-batch only.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from flopmeter import internals
from flopmeter.flops.counter import SampleCounter

logger = logging.getLogger("flopmeter")

__all__ = ["MAX_RETRIES", "NO_RELAY", "EagerRuns", "compiled_before", "why_not_eager"]

#: Eager samples dropped for spanning forward passes outside them that a run retries on the
#: next micro-batch (a micro-batch set to run eagerly ahead can be the second of several
#: forward passes before one backward pass).
MAX_RETRIES = 8

#: Why a micro-batch whose forward runs inside compiled code with no outer module compiled by
#: ``torch.compile(module)`` to relay its counter from is not sampled.
NO_RELAY = (
    "the model is compiled (torch.compile) and its forward runs inside compiled code it cannot "
    "be sampled from: module.compile() or a compiled function calls it (a model compiled as "
    "torch.compile(model) is sampled eagerly)"
)


def why_not_eager() -> str | None:
    """Why this torch cannot run a compiled model's micro-batch eagerly, else None."""
    if not hasattr(torch.compiler, "set_stance"):
        return "this torch has no torch.compiler.set_stance"
    return None


def compiled_before(model: nn.Module) -> bool:
    """Whether compiled code will run ``model``'s forward call after its pre-hook, which runs
    outside it: the model is what ``torch.compile`` returned, or one of its modules is compiled
    (``torch.compile(module)`` inside it, ``module.compile()``; a walk over the modules)."""
    return internals.in_compiled_module_call() or any(
        internals.compiled_module(m) for m in model.modules()
    )


class EagerRuns:
    """Holds torch.compile's stance at ``"force_eager"`` over sampled micro-batches.

    Attributes:
        settle: The sampler's: takes a finished sample's counter off the stack; returns whether
            a sample is still open (called by the relay hook, outside compiled code).
        pending: A counter the relay hook pushed, not yet counting, before the compiled call of
            a micro-batch set to run eagerly; the sample that begins inside it takes it.
        owed: The next training micro-batch is sampled whatever the rate: one was moved to it,
            or an eager sample was dropped for spanning forward passes outside it (it began
            between accumulated forward passes), at most :data:`MAX_RETRIES` times a run.
        runs: Samples begun on a micro-batch that ran eagerly in place of compiled code.
        moved: Sampled micro-batches that were due while compiled code already ran, moved to
            the next micro-batch.
        unavailable: Why the stance cannot be forced (this torch has no
            ``torch.compiler.set_stance``, or setting it failed), else None.
    """

    def __init__(self) -> None:
        self._held: Any = None  # the set_stance object, while the stance is forced
        self._since = 0  # the micro-batch at whose pre-hook it was forced
        self._relay: tuple[nn.Module, Any] | None = None  # the outer module and its hook's handle
        self.settle: Callable[[], bool] = lambda: False
        self.pending: SampleCounter | None = None
        self.runs = 0
        self.moved = 0
        self.owed = False
        self.retries = 0
        self.unavailable: str | None = why_not_eager()

    @property
    def forced(self) -> bool:
        """Whether flopmeter holds the stance at ``"force_eager"`` now."""
        return self._held is not None

    def forced_before(self, micro_batch: int) -> bool:
        """Whether the stance was forced before micro-batch ``micro_batch``'s call began."""
        return self._held is not None and self._since < micro_batch

    def arm(self, micro_batch: int) -> bool:
        """Forces the stance to eager, at micro-batch ``micro_batch``'s pre-hook (kept if already
        forced). Returns whether it is forced; when it cannot be, :attr:`unavailable` says why."""
        if self._held is not None:
            self._since = micro_batch
            return True
        if self.unavailable is not None:
            return False
        try:
            self._held = torch.compiler.set_stance("force_eager")
        except Exception as exc:  # inside a region being traced: the meter never breaks training
            self.unavailable = f"torch.compiler.set_stance failed ({type(exc).__name__}: {exc})"
            return False
        self._since = micro_batch
        return True

    def release(self, *, before: int | None = None) -> None:
        """Puts the stance back as it was before :meth:`arm` (idempotent). ``before``: only when
        it was forced at a micro-batch numbered below it (not for the one about to run)."""
        held = self._held
        if held is None or (before is not None and self._since >= before):
            return
        self._held = None
        try:
            held.__exit__(None, None, None)
        except Exception as exc:  # never into training; a stance left forced runs eagerly
            logger.warning("flopmeter: torch.compile's stance could not be put back: %s", exc)

    def counter_for(self, model: nn.Module, micro_batch: int) -> SampleCounter | str | None:
        """The entered counter for a sample that begins at micro-batch ``micro_batch``'s pre-hook
        (the stance forced first when compiled code would run the call); a reason (a skip) when
        it cannot begin; None when it moves to the next micro-batch."""
        counter, self.pending, self.owed = self.pending, None, False
        if counter is None and internals.in_compiled_frame():
            # a counter pushed inside a compiled call would miss the backward pass
            if not self.forced_before(micro_batch) and self.prepare_next(micro_batch):
                self.moved += 1
                self.owed = True
                return None
            return NO_RELAY
        if self.forced_before(micro_batch) or compiled_before(model):
            if not self.arm(micro_batch):
                return (
                    "the model is compiled (torch.compile) and cannot run eagerly for a sample: "
                    f"{self.unavailable}"
                )
            self.runs += 1
        if counter is None:
            counter = SampleCounter()
            counter.enter()
        counter.closed = False
        return counter

    def owe(self, micro_batch: int) -> None:
        """An eager sample begun at micro-batch ``micro_batch`` was dropped for spanning forward
        passes outside it: the next micro-batch runs eagerly and is sampled (:attr:`owed`)."""
        if self.retries < MAX_RETRIES and self.arm(micro_batch):
            self.retries += 1
            self.owed = True

    def prepare_next(self, micro_batch: int) -> bool:
        """When this pre-hook runs inside an outer module's compiled forward, sets the next
        micro-batch to run eagerly, its counter pushed by a relay hook on that module (removed
        when no longer wanted). Returns whether it did."""
        outer = internals.compiled_call_module()
        if outer is None or not self.arm(micro_batch):
            return False
        if self._relay is None or self._relay[0] is not outer:
            self.drop_relay()
            self._relay = (outer, outer.register_forward_pre_hook(self._relay_hook))
        return True

    def _relay_hook(self, outer: nn.Module, args: Any) -> None:
        """Before each call of the outer module, outside its compiled code: a finished sample's
        counter leaves the stack; a counter, not yet counting, is pushed for a micro-batch set to
        run eagerly; the hook goes once neither is wanted."""
        try:
            busy = self.settle()
            if not (outer.training and torch.is_grad_enabled()) or busy:
                return
            if not self.forced:
                self.drop_pending()
                self.drop_relay()
            elif self.pending is None and internals.dispatch_stack_empty():
                counter = SampleCounter()
                counter.enter()
                counter.closed = True  # it counts from the model's pre-hook on
                self.pending = counter
        except Exception as exc:  # the meter never breaks training
            logger.warning("flopmeter (measured): %s; the relay hook goes", exc)
            self.drop_relay()

    def drop_pending(self) -> None:
        """Pops a pending counter no sample took (call it outside compiled code)."""
        counter = self.pending
        if counter is not None and counter.on_top():
            self.pending = None
            counter.exit()

    def drop_relay(self) -> None:
        """Removes the relay hook, if any (idempotent)."""
        relay, self._relay = self._relay, None
        if relay is not None:
            relay[1].remove()

    def stop(self) -> None:
        """Drops the pending counter and the relay hook, and puts the stance back (the meter's
        stop)."""
        self.drop_pending()
        self.drop_relay()
        self.release()

    def note(self) -> str | None:
        """The report's note when sampled micro-batches ran eagerly (or were to), else None."""
        moved = (
            f"{self.moved} sampled micro-batch(es) came due inside a compiled call, whose rest "
            "runs compiled, and moved to the next micro-batch"
        )
        if not self.runs:
            return f"{moved}, to run eagerly; none ran." if self.moved else None
        also = f"; {moved}" if self.moved else ""
        return (
            "The sampled micro-batches ran eagerly, not compiled: same math; fused kernels "
            f"count the same FLOP ({self.runs} run through the eager module{also})."
        )
