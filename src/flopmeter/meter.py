"""FlopMeter: the lifecycle of a metered run, its hooks, and delegation.

The meter owns no arithmetic and no counting: it finds a forward call's tokens
(:mod:`flopmeter.inputs`), hands them to the run's counters (:mod:`flopmeter.counters`), FLOP
model (:mod:`flopmeter.flops.recorder`) and budget (:mod:`flopmeter.budget`), starts and stops
the hardware monitor (:mod:`flopmeter.hardware`), takes the run's compute with one pure function
(:func:`flopmeter.measure.measure`) and builds the report with another
(:mod:`flopmeter.reporting`).
"""

from __future__ import annotations

import inspect
import logging
import os
import socket
import time
import uuid
from collections.abc import Mapping
from datetime import datetime, timezone
from types import MappingProxyType
from typing import Any

import torch
from torch import nn
from torch.optim.optimizer import register_optimizer_step_post_hook

from flopmeter import distributed
from flopmeter.budget import BudgetExceeded, budget_controller
from flopmeter.census import Census, take_census
from flopmeter.counters import CountSnapshot, RunCounters, check_state
from flopmeter.errors import ConfigurationError, FlopMeterError
from flopmeter.flops.recorder import FlopModelRecorder
from flopmeter.inputs import find_token_inputs
from flopmeter.internals import in_backward_pass
from flopmeter.measure import Measurement, compose_notes, measure
from flopmeter.options import MeterOptions, validate_bool
from flopmeter.output import DEFAULT_FILENAME, ReportFile
from flopmeter.report import FlopReport
from flopmeter.reporting import (
    RunFacts,
    build_report,
    describe_error,
    hardware_notes,
    partial_counts_reason,
)
from flopmeter.run_parts import assemble
from flopmeter.signals import SigtermHook
from flopmeter.tokens import TokenInputError
from flopmeter.types import Status

__all__ = ["DEFAULT_FILENAME", "FlopMeter", "default_model_id", "default_model_name"]

logger = logging.getLogger("flopmeter")

_NO_TOKENS = (
    "a training forward pass had no input_ids, attention_mask, inputs_embeds or integer token "
    "tensor the meter could find"
)


def _utc_now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


def _status_of(exc: BaseException | None) -> Status:
    """How a run ended: a clean ``SystemExit`` (code 0 or None), or a stop by the budget
    guard at a step boundary, is a completed run."""
    if exc is None or (isinstance(exc, SystemExit) and exc.code in (0, None)):
        return "completed"
    if isinstance(exc, BudgetExceeded):
        return "completed"
    return "interrupted" if isinstance(exc, KeyboardInterrupt) else "failed"


def default_model_id(model: nn.Module) -> str | None:
    """The ``name_or_path`` of the model's ``config`` (or of its ``model.config``, as in a
    LightningModule holding a Hugging Face model): the id the catalogue looks up; ``None``."""
    for holder in (model, getattr(model, "model", None)):
        config = getattr(holder, "config", None)
        name = getattr(config, "name_or_path", None) or getattr(config, "_name_or_path", None)
        if name:
            return str(name)
    return None


def default_model_name(model: nn.Module) -> str:
    """:func:`default_model_id`, else the model's class name."""
    return default_model_id(model) or type(model).__name__


class FlopMeter:
    """Measures the training compute of a PyTorch model while it trains.

    Use it around any training loop::

        with FlopMeter(model, pad_id=tokenizer.pad_token_id, output="out/") as meter:
            for batch in loader:
                model(**batch).loss.backward()
                optimizer.step()
                optimizer.zero_grad()
        print(meter.report().to_text())

    Only training micro-batches count: forward passes in training mode with gradients enabled
    (evaluation and ``generate()`` do not count), once each (activation checkpointing's
    recomputation does not count again). Counting adds into a small device tensor: no host
    synchronisation per micro-batch. Frameworks without a ``with`` block call :meth:`start` and
    :meth:`stop`.

    The options are those of :class:`~flopmeter.options.MeterOptions` (each documented there),
    given as keywords (``FlopMeter(model, 0, output="out/", budget=4e22)``) or as one value
    (``FlopMeter(model, options=MeterOptions(...))``). Given both, the keywords win over the
    value's options. An explicit argument beats its environment variable, which beats the
    default. The parent runs, the ledger and the hardware tracker are made from the options
    once, here.

    Args:
        model: The model being trained (the meter hooks its forward pass).
        pad_id: The padding token id (an option, the one also given by position).
        options: The options as one value.
        **option_values: Any other option, by name (see :class:`MeterOptions`).

    Raises:
        ConfigurationError: An option, ``PRETRAIN_FLOPS`` or ``FLOPMETER_NVML`` is invalid, a
            parent run cannot be read, or the ledger cannot be opened.
        MissingExtraError: ``nvml=True`` (or ``FLOPMETER_NVML=1``) without ``nvidia-ml-py``.
    """

    def __init__(
        self,
        model: nn.Module,
        pad_id: int | None = None,
        *,
        options: MeterOptions | None = None,
        **option_values: Any,
    ) -> None:
        if not isinstance(model, nn.Module):
            raise ConfigurationError(
                f"FlopMeter needs the torch.nn.Module being trained, got {type(model).__name__}."
            )
        if options is not None and not isinstance(options, MeterOptions):
            raise ConfigurationError(f"options must be MeterOptions, got {type(options).__name__}.")
        keywords = {"pad_id": pad_id, **option_values} if pad_id is not None else option_values
        self.options = options.with_values(**keywords) if options else MeterOptions(**keywords)
        self.model = model
        self.model_name = self.options.model_name or default_model_name(model)
        #: The id the catalogue looks up.
        self.model_id = self.options.model_id or default_model_id(model)
        parts = assemble(self.options, self.model_id)
        #: The original compute the threshold uses, and the parent runs as read.
        self.original, self.parents = parts.original, parts.parents
        self._archive, self._hardware = parts.archive, parts.hardware
        #: Epochs trained, when an adapter knows them (shown in the report).
        self.epochs: float | None = None
        self.counters = RunCounters()
        self.flop_model = FlopModelRecorder(model, measure_every=self.options.measure_every)
        self._budget = budget_controller(
            parts.budget,
            read_compute=lambda: self._measure(sync=True),
            observations=self.flop_model.observations,
            census=lambda: self._census,
            on_problem=lambda exc: self._note_problem("budget", _said(exc), exc),
        )
        self._status: Status | None = None  # None: not started; "running"; then the outcome
        self._error: str | None = None
        self._started_at: str | None = None
        self._ended_at: str | None = None
        self._final: FlopReport | None = None
        self._census: Census | None = None
        self._handles: list[Any] = []
        self._optimizer_match: dict[int, bool] = {}
        self._problems: dict[str, str] = {}
        self._notes: list[str] = []
        self._rank_at_start = 0
        self._file: ReportFile | None = None
        self._sigterm = SigtermHook(self._on_sigterm)
        self._next_refresh = 0.0
        #: This run's id, in its report (and its ledger record).
        self.run_id = uuid.uuid4().hex

    @property
    def pad_id(self) -> int | None:
        """The padding token id the meter uses."""
        return self.options.pad_id

    @property
    def output(self) -> os.PathLike[str] | None:
        """The report file (a path), or ``None``."""
        return self.options.output

    @property
    def pretrain_flops(self) -> float | None:
        """The original model's training compute, FLOP, or ``None`` when unknown."""
        return self.original.flops

    @property
    def problems(self) -> Mapping[str, str]:
        """Problems in the meter's own hooks so far, by hook (each logged once; training went
        on). Empty when all went well."""
        return MappingProxyType(self._problems)

    # ----------------------------------------------------------------- lifecycle
    def __enter__(self) -> FlopMeter:
        self.start()
        return self

    def __exit__(self, exc_type: Any, exc: BaseException | None, tb: Any) -> None:
        try:
            self.stop(exc)
        except Exception:  # the training has finished: the user's script must go on
            logger.exception("flopmeter could not make its final report")

    def start(self) -> FlopMeter:
        """Registers the hooks and starts the clock (what entering the ``with`` block does).

        Raises:
            FlopMeterError: the meter was already started or has finished.
            ConfigurationError: ``output`` cannot be written.
        """
        if self._status == "running":
            raise FlopMeterError("This FlopMeter is already running.")
        if self._status is not None:
            raise FlopMeterError(
                "This FlopMeter has finished and cannot be entered again. Create a new one; "
                "to continue its counts, pass meter.state_dict() to the new one's "
                "load_state_dict()."
            )
        self._rank_at_start = distributed.rank()
        self._started_at = self._started_at or _utc_now()
        if self.options.output is not None and self._rank_at_start == 0:
            # From now on the file is this run's: a running report replaces whatever was there.
            self._file = ReportFile.open(self.options.output, self._report(sync=False))
            self._sigterm.install()
        self._budget.start(resumed=self.counters.resumed)
        # torch.compiler.disable: a model compiled after this does not trace the hook.
        hook = torch.compiler.disable(self._on_forward_pre)
        self._handles.append(self.model.register_forward_pre_hook(hook, with_kwargs=True))
        if self.options.optimizer is not None:
            own_step = self.options.optimizer.register_step_post_hook(self._on_own_step)
            self._handles.append(own_step)
        else:
            self._handles.append(register_optimizer_step_post_hook(self._on_any_step))
        self._hardware.start(self.model)  # never raises; reads the energy counters now
        self.counters.start_clock()
        self._status = "running"
        self._next_refresh = time.monotonic() + self.options.refresh_seconds
        return self

    def stop(self, exc: BaseException | None = None) -> FlopReport:
        """Removes the hooks, makes the final report and writes it (what leaving ``with`` does).

        Args:
            exc: The exception that ended training, if any: the report's status becomes
                ``failed`` (``interrupted`` for KeyboardInterrupt); the caller re-raises it.

        Returns:
            The final report (also available from :meth:`report`).
        """
        if self._final is not None:
            return self._final
        if self._status != "running":
            raise FlopMeterError("This FlopMeter was never started.")
        self._hardware.stop()  # first, whatever follows: the sampling thread is joined
        for handle in self._handles:
            handle.remove()
        self._handles.clear()
        self._guarded("flop model", self.flop_model.stop)
        self.counters.stop_clock()
        self._ended_at = _utc_now()
        self._status = _status_of(exc)
        if exc is not None and self._status != "completed":
            self._error = describe_error(exc)
        self._sigterm.uninstall()
        try:  # a failed rank must not wait in a collective its peers may never join
            self._final = self._report(sync=exc is None or isinstance(exc, BudgetExceeded))
        finally:  # written if made; the lock is let go either way (the last refresh stays)
            file, self._file = self._file, None
            if file is not None and self._final is not None:
                file.write(self._final)
            if file is not None:
                file.close()
        if self._rank_at_start == 0:
            for outcome in self._archive.ship(self._final):  # never raises; waits a bounded time
                if not outcome.ok:
                    self._problems.setdefault(f"sink {outcome.sink}", outcome.detail)
        return self._final

    def refresh(self, *, sync: bool = False) -> FlopReport:
        """Makes a running report and writes it to ``output`` (rank 0): what adapters call at
        their log and save steps, and the meter itself every ``refresh_seconds``. One host read
        of the counts; with ``sync`` under torch.distributed, one small collective (every rank
        must call it then, at the same point)."""
        report = self.report(sync=sync)
        self._next_refresh = time.monotonic() + self.options.refresh_seconds
        if self._file is not None and self._final is None:
            self._file.write(report)
        return report

    def _on_sigterm(self) -> None:
        """SIGTERM: this rank's counts so far, written as an interrupted report (no collective:
        the other ranks are being stopped too); an earlier handler may let the run go on."""
        if self._file is not None and self._final is None:
            error = "SIGTERM: the process was asked to stop"
            self._file.write(self._report(sync=False, status="interrupted", error=error))

    # ----------------------------------------------------------------- hooks
    def _on_forward_pre(self, module: nn.Module, args: tuple[Any, ...], kwargs: dict) -> None:
        if not (module.training and torch.is_grad_enabled()):
            self.counters.untracked_forwards += 1  # evaluation inside the window: noted
            return
        if in_backward_pass():  # activation-checkpoint recomputation: counted once already
            return
        self._budget.check_forward()  # a resumed run at its budget (raise) trains nothing
        try:
            if self._census is None:
                self._census = take_census(self.model)
                self.counters.world_at_first_batch = distributed.world_size()
            self.counters.micro_batches += 1
            inputs = find_token_inputs(args, kwargs, self.options.token_inputs)
            if inputs.ref is None:
                self.counters.add_uncounted("unread", _NO_TOKENS)
                return
            # Device work only: no .item(), .cpu(), host copy or collective per micro-batch.
            self._budget.add_shape(*self.counters.add_micro_batch(inputs, self.options.pad_id))
        except TokenInputError as exc:
            self.counters.add_uncounted(exc.kind, str(exc))
            return
        except Exception as exc:  # the meter's own fault: this micro-batch is not counted
            self.counters.add_uncounted("unread", _said(exc))
            self._note_problem("forward", _said(exc), exc)
            return
        try:  # not through _guarded: this runs on every micro-batch
            self.flop_model.on_training_forward(inputs.ref, self.counters.micro_batches)
        except Exception as exc:
            self._note_problem("flop model", _said(exc), exc)

    def _on_own_step(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        self._count_step()

    def _count_step(self) -> None:
        self.counters.optimizer_steps += 1
        self._guarded("optimizer", self.flop_model.on_optimizer_step)
        if self._file is not None and time.monotonic() >= self._next_refresh:
            self._guarded("refresh", self.refresh)  # one host read every refresh_seconds
        self._budget.on_step(self.counters.optimizer_steps)  # may raise BudgetExceeded

    def _on_any_step(self, optimizer: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
        try:
            match = self._optimizer_match.get(id(optimizer))
            if match is None:
                own = {id(p) for p in self.model.parameters()}
                groups = optimizer.param_groups
                match = any(id(p) in own for group in groups for p in group["params"])
                self._optimizer_match[id(optimizer)] = match
        except Exception as exc:
            self._note_problem("optimizer", _said(exc), exc)
            return
        if match:
            self._count_step()

    def _guarded(self, where: str, fn: Any) -> None:
        """Runs one of the meter's own steps; a fault is noted, and training goes on."""
        try:
            fn()
        except Exception as exc:
            self._note_problem(where, _said(exc), exc)

    def _note_problem(self, where: str, message: str, exc: BaseException | None = None) -> None:
        """Logs a problem in the meter's own hooks once; training always goes on."""
        if where not in self._problems:
            self._problems[where] = message
            logger.warning("flopmeter (%s): %s; training continues", where, message, exc_info=exc)

    # ----------------------------------------------------------------- budget (delegated)
    @property
    def should_stop(self) -> bool:
        """Whether the compute budget says to stop: ``True`` from the optimizer step after which
        the next step would cross it (a raw loop checks it at its step boundary), or from the
        start of a resumed run already within one step of it. ``False`` without a budget."""
        return self._budget.should_stop

    @property
    def budget_left(self) -> float | None:
        """The budget less the run's compute at the guard's last reading, FLOP; ``None`` without
        a budget, before the first reading, or when the compute is unknown (docs/budget.md)."""
        return self._budget.budget_left

    def plan_budget(self, planned_steps: int | None) -> None:
        """Tells the budget guard how many optimizer steps this session plans (adapters: the
        trainer's ``max_steps``), for its forecast. No effect without a budget."""
        self._budget.plan(planned_steps)

    # ----------------------------------------------------------------- counts and report
    def recount(self) -> Census:
        """Retakes the parameter census now, for runs that change what trains midway; the
        report uses the new census from now on, and the next micro-batch is profiled again."""
        self._census = take_census(self.model)
        self.flop_model.reset_profile()
        return self._census

    def add_note(self, note: str) -> None:
        """Adds a note (one sentence) to the report's ``notes`` (for adapters: something the
        counts cannot show)."""
        self._notes.append(str(note))

    def elapsed_seconds(self) -> float:
        """Training time so far on this rank, in seconds, including time before a resume."""
        return self.counters.elapsed_seconds()

    def report(self, *, sync: bool = False) -> FlopReport:
        """The report: final once the meter has stopped, ``running`` before.

        Args:
            sync: While running under torch.distributed, sum the counts over ranks (every rank
                must call it then). Without it a running report holds this rank's counts
                (``counts_scope="this_rank"``). The final report is always summed.
        """
        return self._final if self._final is not None else self._report(sync=sync)

    def _measure(
        self, *, sync: bool, snapshot: CountSnapshot | None = None, facts: RunFacts | None = None
    ) -> Measurement:
        """The run's compute now (one host read; one collective when ``sync`` and distributed)."""
        census = self._census or take_census(self.model)
        snapshot = snapshot or self.counters.snapshot(sync=sync)
        return measure(census, snapshot, self.flop_model.observations(), facts or self._facts())

    def _report(
        self, *, sync: bool, status: Status | None = None, error: str | None = None
    ) -> FlopReport:
        """A report of the run now; the final one (and SIGTERM's) sealed into the ledger on
        rank 0 first, and made again with the archive's note when that fails."""
        facts = self._facts(status, error)
        m = self._measure(sync=sync, facts=facts)
        if m.snapshot.partial and facts.status == "completed":
            why = partial_counts_reason(facts)
            logger.warning("flopmeter: the final report holds this rank's counts only: %s", why)
        hardware = self._hardware.report_fields(
            seconds=m.snapshot.session_seconds,
            flops_architecture=m.estimate_flops,
            gather=sync and distributed.is_distributed(),
            extra_notes=hardware_notes(m.snapshot, self.counters.prior_seconds),
        )
        parts = (m.snapshot, m.census, m.estimates, m.primary, m.observations, hardware)
        report = build_report(facts, *parts)
        ending = status is not None or self._status not in (None, "running")
        if ending and self._rank_at_start == 0 and not self._archive.seal(report):
            report = build_report(self._facts(status, error), *parts)  # with the ledger's note
        return report

    def _facts(self, status: Status | None = None, error: str | None = None) -> RunFacts:
        from flopmeter import __version__

        return RunFacts(
            run_id=self.run_id,
            model_name=self.model_name,
            status=status or self._status or "running",
            error=error or self._error,
            started_at=self._started_at,
            ended_at=self._ended_at,
            epochs=self.epochs,
            pretrain_flops=self.original.flops,
            pretrain_flops_source=self.original.source,
            catalog=self.original.catalog,
            threshold_notes=self.original.notes,
            parent_runs=self.parents,
            original_systemic_risk=self.options.original_systemic_risk,
            world_size=max(distributed.world_size(), self.counters.world_at_first_batch or 1),
            census_at_report=self._census is None,
            process_group_alive=distributed.is_distributed(),
            hook_problems=dict(self._problems),
            notes=compose_notes(self._notes, self._budget.notes(), self._archive.notes()),
            torch_version=torch.__version__,
            flopmeter_version=__version__,
            updated_at=_utc_now(),
            pid=os.getpid(),
            hostname=socket.gethostname(),
            **self._budget.facts(),
        )

    # ----------------------------------------------------------------- resume
    def state_dict(self) -> dict[str, Any]:
        """The cumulative counts, for a checkpoint; restore with :meth:`load_state_dict`.

        Under torch.distributed the counts are summed over ranks, so every rank must call it
        (as frameworks do when they save). The result is plain Python data, with the run's
        compute and largest step for a resumed run's budget guard when they are known.
        """
        snapshot = self.counters.snapshot(sync=True)
        identity = {"started_at": self._started_at, "model": self._model_identity()}
        state = self.counters.state_dict(identity, snapshot=snapshot)
        try:
            flops = self._measure(sync=True, snapshot=snapshot).flops
            state.update(self._budget.saved(flops, snapshot.optimizer_steps))
        except Exception as exc:  # the state is saved without them; the guard reads instead
            self._note_problem("budget", _said(exc), exc)
        return state

    def load_state_dict(self, state: Mapping[str, Any], *, allow_other_model: bool = False) -> None:
        """Continues the counts of a run saved with :meth:`state_dict` (a resumed run).

        The restored totals are added once to what this meter counts from now on (not once per
        rank); counts made before the call are kept. The state is checked first
        (:func:`flopmeter.counters.check_state`), and must come from the same model (its name
        and parameter count) unless ``allow_other_model``.

        Raises:
            ConfigurationError: ``state`` is not a flopmeter state, holds an impossible value,
                or belongs to another model; the message names the field.
        """
        validate_bool(allow_other_model, "allow_other_model")
        checked = check_state(state)
        saved, mine = state.get("model"), self._model_identity()
        if saved is not None and saved != mine and not allow_other_model:
            raise ConfigurationError(
                f"FlopMeter state: 'model' is {saved!r}, but this meter measures {mine!r}. "
                "Pass allow_other_model=True to continue its counts on this model anyway."
            )
        self.counters.load_state_dict(state)
        self._started_at = checked["started_at"] or self._started_at
        self._budget.restore(state)

    def _model_identity(self) -> dict[str, Any]:
        """What ties a saved state to its model: the report's name and the parameter count."""
        census = self._census or take_census(self.model)
        return {"name": self.model_name, "n_total": census.n_total}


def _said(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"


def _signature() -> inspect.Signature:
    """``FlopMeter``'s signature as help() and editors show it: every option by name, from the
    one list (:data:`flopmeter.options.OPTION_NAMES`)."""
    keyword = inspect.Parameter.KEYWORD_ONLY
    fields = MeterOptions.model_fields
    params = [
        inspect.Parameter("self", inspect.Parameter.POSITIONAL_OR_KEYWORD),
        inspect.Parameter("model", inspect.Parameter.POSITIONAL_OR_KEYWORD, annotation=nn.Module),
        inspect.Parameter("pad_id", inspect.Parameter.POSITIONAL_OR_KEYWORD, default=None),
        inspect.Parameter("options", keyword, default=None, annotation="MeterOptions | None"),
    ]
    for name in MeterOptions.NAMES:
        if name != "pad_id":
            info = fields[name]
            params.append(inspect.Parameter(name, keyword, default=info.default))
    return inspect.Signature(params, return_annotation=None)


FlopMeter.__init__.__signature__ = _signature()  # type: ignore[attr-defined]
