"""FlopMeter: the lifecycle of a metered run, its hooks, and delegation.

The meter owns no arithmetic and no counting: it finds a forward call's tokens
(:mod:`flopmeter.inputs`), hands them to the run's counters (:mod:`flopmeter.counters`) and FLOP
model (:mod:`flopmeter.flops.recorder`), starts and stops the hardware monitor
(:mod:`flopmeter.hardware`), and builds the report from a snapshot with a pure function
(:mod:`flopmeter.reporting`).
"""

from __future__ import annotations

import logging
import math
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
from flopmeter.budget import (
    BudgetExceeded,
    BudgetGuard,
    restored_budget,
    step_rates,
)
from flopmeter.census import Census, take_census
from flopmeter.counters import RunCounters, check_state
from flopmeter.errors import ConfigurationError, FlopMeterError
from flopmeter.flops import compute_estimates
from flopmeter.flops.recorder import FlopModelRecorder
from flopmeter.hardware.options import DEFAULT_INTERVAL_SECONDS
from flopmeter.inputs import TokenLocator, find_token_inputs
from flopmeter.internals import in_backward_pass
from flopmeter.ledger.sinks import DEFAULT_SINK_TIMEOUT_SECONDS
from flopmeter.options import (
    DEFAULT_MEASURE_EVERY,
    DEFAULT_REFRESH_SECONDS,
    MeterOptions,
    validate_bool,
)
from flopmeter.output import DEFAULT_FILENAME, ReportFile
from flopmeter.report import FlopReport
from flopmeter.reporting import (
    RunFacts,
    build_report,
    describe_error,
    hardware_notes,
    partial_counts_reason,
    withheld_reason,
)
from flopmeter.signals import SigtermHook
from flopmeter.tokens import TokenInputError
from flopmeter.types import Status, TokenTotals

__all__ = ["DEFAULT_FILENAME", "FlopMeter", "default_model_id", "default_model_name"]

logger = logging.getLogger("flopmeter")


def _utc_now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


_NO_TOKENS = (
    "a training forward pass had no input_ids, attention_mask, inputs_embeds or integer token "
    "tensor the meter could find"
)


def _status_of(exc: BaseException | None) -> Status:
    """How a run ended: a clean ``SystemExit`` (code 0 or None) is a completed run."""
    if exc is None or (isinstance(exc, SystemExit) and exc.code in (0, None)):
        return "completed"
    if isinstance(exc, BudgetExceeded):  # the guard stopped it, at a step boundary
        return "completed"
    return "interrupted" if isinstance(exc, KeyboardInterrupt) else "failed"


def _exceeded(guard: BudgetGuard, step: int) -> BudgetExceeded:
    """The error of a stopped guard (``budget_action="raise"``); the guard stops only on a known
    total, so ``flops_at_stop`` is set."""
    assert guard.flops_at_stop is not None
    return BudgetExceeded(guard.budget.flops, guard.flops_at_stop, step)


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
                loss = model(**batch).loss
                loss.backward()
                optimizer.step()
                optimizer.zero_grad()
        print(meter.report().to_text())

    Only training micro-batches count: forward passes made while the model is in training mode
    with gradients enabled (evaluation and ``generate()`` do not count), once each (activation
    checkpointing's recomputation does not count again). Counting adds into a small device
    tensor: no host synchronisation per micro-batch. Frameworks without a ``with`` block call
    :meth:`start` and :meth:`stop`.

    Where an option can also come from an environment variable, an explicit argument beats the
    variable, which beats the default (see :mod:`flopmeter.options`).

    Args:
        model: The model being trained (the meter hooks its forward pass).
        pad_id: The padding token id; used when a batch has no ``attention_mask``. ``None``
            with no mask counts every token. In a packed batch a pad-id token that continues a
            document (an EOS that is also the pad id) still counts; see :mod:`flopmeter.tokens`.
        model_name: Name for the report; defaults to the model config's ``name_or_path``.
        pretrain_flops: The original model's training compute, FLOP, or ``"catalog"`` to use
            the bundled catalogue's figure for ``model_id``; defaults to the ``PRETRAIN_FLOPS``
            environment variable (a number or ``catalog``); unknown when neither is set. The
            report's ``pretrain_flops_source`` says which applied (docs/compliance.md).
        model_id: The Hugging Face id of the model being modified, looked up in the catalogue;
            defaults to the model config's ``name_or_path``.
        parent_runs: The reports of earlier runs this run continues (report paths, or run ids
            of reports in the folder of ``output``), read now: the verdict judges this run's
            compute plus theirs.
        original_systemic_risk: Whether the original model is a GPAI model with systemic risk
            (chooses the fallback threshold when ``pretrain_flops`` is unknown).
        output: File (or folder, for ``flops_meter.json``) the report is written to, by rank 0,
            atomically: a ``running`` report at once when the meter starts (the file is this
            run's from then on; a file that is not a flopmeter report, a special file, or a
            file another live run is writing is refused), refreshed while training runs, and
            the final report at the end (also on SIGTERM, as ``interrupted``).
        optimizer: Count only this optimizer's steps; by default any optimizer stepping the
            model's parameters counts.
        nvml: GPU readings through NVML (energy, utilisation, the hardware bound): ``None``
            (default) when NVML initialises, unless ``FLOPMETER_NVML`` says otherwise; ``True``
            to require the ``nvml`` extra, ``False`` for none. See docs/hardware.md.
        peak_flops: Dense peak per GPU in FLOP/s (not TFLOP/s), for GPUs the peak table does
            not know or to replace its figure.
        dtype: Data type of the training's matrix multiplications ("bf16", "fp16", "tf32",
            "fp32", "fp8"), which selects the peak.
        nvml_interval_seconds: Sampling interval of the utilisation thread, seconds.
        measure_every: The ``measured`` estimate counts the FLOP of training micro-batches 1,
            2 and every ``measure_every``-th after at the dispatch level (forward and
            backward); ``0`` turns that sampling off.
        token_inputs: Where the model's forward calls carry the token ids, for models the meter
            cannot read by itself: the keyword name (``"tokens"`` for ``model(tokens=...)``),
            or a function of a forward call's ``(args, kwargs)`` returning the ids tensor (or a
            mapping with ``input_ids`` and ``attention_mask``). By default the meter looks for
            ``input_ids``, then any integer ``[B, T]`` tensor (see :mod:`flopmeter.inputs`). A
            training micro-batch whose tokens it cannot find is counted as unread, and the
            report then gives no compute figure and no verdict.
        refresh_seconds: How often the running report on disk is refreshed, seconds (at the
            first optimizer step after the interval; adapters also refresh at their log and
            save steps).
        budget: A compute budget the run must not cross: FLOP, or ``"threshold"`` (the run's
            threshold / 1.3, less the compute of the runs it continues). The meter then
            predicts each next optimizer step's compute and, at the last step whose total
            stays within the budget, sets :attr:`should_stop` (the adapters stop the trainer
            there) or raises :class:`~flopmeter.budget.BudgetExceeded`. See docs/budget.md.
        budget_action: ``"stop"`` (default) or ``"raise"``.
        ledger: Append the final report (completed, failed or interrupted; rank 0, once) to
            the tamper-evident ledger: ``True`` for ``FLOPMETER_LEDGER`` or the per-user ledger,
            a path for that file, ``False`` for none; by default ``FLOPMETER_LEDGER`` when set.
            See docs/audit-trail.md.
        sinks: Copy the final report to S3 and DynamoDB: ``"s3://bucket/prefix"``,
            ``"dynamodb://table"`` (or a list of them, or sink objects); by default
            ``FLOPMETER_SINKS``. Needs the ``aws`` extra.
        sink_timeout_seconds: How long the end of the run waits for the sinks, seconds (the
            report file is written first; a sink still running after it is given up on).

    Raises:
        ConfigurationError: An argument, ``PRETRAIN_FLOPS`` or ``FLOPMETER_NVML`` is invalid.
        MissingExtraError: ``nvml=True`` (or ``FLOPMETER_NVML=1``) without ``nvidia-ml-py``.
    """

    def __init__(
        self,
        model: nn.Module,
        pad_id: int | None = None,
        *,
        model_name: str | None = None,
        pretrain_flops: float | str | None = None,
        model_id: str | None = None,
        parent_runs: list[str | os.PathLike[str]] | None = None,
        original_systemic_risk: bool = False,
        output: str | os.PathLike[str] | None = None,
        optimizer: torch.optim.Optimizer | None = None,
        nvml: bool | None = None,
        peak_flops: float | None = None,
        dtype: str = "bf16",
        nvml_interval_seconds: float = DEFAULT_INTERVAL_SECONDS,
        measure_every: int = DEFAULT_MEASURE_EVERY,
        token_inputs: TokenLocator | None = None,
        refresh_seconds: float = DEFAULT_REFRESH_SECONDS,
        budget: float | str | None = None,
        budget_action: str = "stop",
        ledger: bool | str | os.PathLike[str] | None = None,
        sinks: Any = None,
        sink_timeout_seconds: float = DEFAULT_SINK_TIMEOUT_SECONDS,
    ) -> None:
        if not isinstance(model, nn.Module):
            raise ConfigurationError(
                f"FlopMeter needs the torch.nn.Module being trained, got {type(model).__name__}."
            )
        # Every argument but the model is an option, validated in one place.
        given = {k: v for k, v in locals().items() if k in MeterOptions.NAMES}
        self.options = MeterOptions.create(**given)
        self.model = model
        self.model_name = self.options.model_name or default_model_name(model)
        #: The id the catalogue looks up, and the original compute the threshold uses.
        self.model_id = self.options.model_id or default_model_id(model)
        self.original = self.options.original_compute(self.model_id)
        #: Epochs trained, when an adapter knows them (shown in the report).
        self.epochs: float | None = None
        self.counters = RunCounters()
        self.flop_model = FlopModelRecorder(model, measure_every=self.options.measure_every)
        self._hardware = self.options.hardware_tracker()
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
        budget = self.options.budget_for(self.original)  # "threshold": the report's threshold
        self._budget_guard = BudgetGuard(budget) if budget is not None else None
        self._restored_budget: tuple[float | None, float | None] = (None, None)
        self._archive = self.options.archive()
        #: This run's id, in its report (and its ledger record).
        self.run_id = uuid.uuid4().hex

    # ----------------------------------------------------------------- options, read-only
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
        except Exception:
            # The training has finished (or failed by itself): a fault in the meter's own
            # report must not stop the user's script from saving its work after the block.
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
            self._file = ReportFile.open(self.options.output, self._build_report(sync=False))
            self._sigterm.install()
        if self._budget_guard is not None:
            self._budget_start(self._budget_guard)
        self._register_hooks()
        self._hardware.start(self.model)  # never raises; reads the energy counters now
        self.counters.start_clock()
        self._status = "running"
        self._next_refresh = time.monotonic() + self.options.refresh_seconds
        return self

    def _register_hooks(self) -> None:
        # torch.compiler.disable: when the model is compiled after the hook is registered,
        # dynamo does not trace the hook (a graph break at the forward's start); it runs
        # eagerly on the real tensors, as it does on an uncompiled or already compiled model.
        self._handles.append(
            self.model.register_forward_pre_hook(
                torch.compiler.disable(self._on_forward_pre), with_kwargs=True
            )
        )
        if self.options.optimizer is not None:
            self._handles.append(self.options.optimizer.register_step_post_hook(self._on_own_step))
        else:
            self._handles.append(register_optimizer_step_post_hook(self._on_any_step))

    def stop(self, exc: BaseException | None = None) -> FlopReport:
        """Removes the hooks, makes the final report and writes it (what leaving ``with`` does).

        Args:
            exc: The exception that ended training, if any: the report's status becomes
                ``failed`` (``interrupted`` for KeyboardInterrupt). The exception is not
                handled here; the caller re-raises it.

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
        # A failed rank must not wait in a collective its peers may never join.
        try:
            self._final = self._build_report(sync=exc is None or isinstance(exc, BudgetExceeded))
            if self._rank_at_start == 0:  # into the ledger first, so the file says if it failed
                self._final = self._archive.seal(self._final)
        finally:  # written if made; the lock is let go either way (the last refresh stays)
            self._close_file()
        if self._rank_at_start == 0:
            for outcome in self._archive.ship(self._final):  # never raises; waits a bounded time
                if not outcome.ok:
                    self._problems.setdefault(f"sink {outcome.sink}", outcome.detail)
        return self._final

    def _close_file(self) -> None:
        """Writes the final report (if made) and lets go of the file."""
        file, self._file = self._file, None
        if file is None:
            return
        if self._final is not None:
            file.write(self._final)
        file.close()

    # ----------------------------------------------------------------- on disk, while running
    def refresh(self, *, sync: bool = False) -> FlopReport:
        """Makes a running report and writes it to ``output`` (rank 0): what adapters call at
        their log and save steps, and the meter itself every ``refresh_seconds``.

        One host read of the counts; with ``sync`` under torch.distributed, one small
        collective (every rank must call it then, at the same point).

        Returns:
            The running report (this rank's counts unless ``sync``).
        """
        report = self.report(sync=sync)
        self._next_refresh = time.monotonic() + self.options.refresh_seconds
        if self._file is not None and self._final is None:
            self._file.write(report)
        return report

    def _on_sigterm(self) -> None:
        """SIGTERM: this rank's counts so far, written as an interrupted report (no collective:
        the other ranks are being stopped too). The run may go on if an earlier handler says
        so; its final report then replaces this one."""
        if self._file is None or self._final is not None:
            return
        report = self._build_report(
            sync=False, status="interrupted", error="SIGTERM: the process was asked to stop"
        )
        self._file.write(self._archive.seal(report))

    # ----------------------------------------------------------------- hooks
    def _on_forward_pre(
        self, module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> None:
        if not (module.training and torch.is_grad_enabled()):
            self.counters.untracked_forwards += 1  # evaluation inside the window: noted
            return
        if in_backward_pass():  # activation-checkpoint recomputation: counted once already
            return
        guard = self._budget_guard
        if guard is not None and guard.stop_step == 0 and guard.budget.action == "raise":
            # a resumed run already at its budget: nothing of this session has trained
            raise _exceeded(guard, 0)
        try:
            if self._census is None:
                self._census = take_census(self.model)
                self.counters.world_at_first_batch = distributed.world_size()
            self.counters.micro_batches += 1
            inputs = find_token_inputs(args, kwargs, self.options.token_inputs)
            ref = inputs.ref
            if ref is None:
                self.counters.add_uncounted("unread", _NO_TOKENS)
                return
            # Device work only: no .item(), .cpu(), host copy or collective per micro-batch.
            rows, cols = self.counters.add_micro_batch(inputs, self.options.pad_id)
            if guard is not None:  # the padded shape as counted: the step's upper bound
                guard.add_shape(rows, cols)
        except TokenInputError as exc:
            self.counters.add_uncounted(exc.kind, str(exc))
            return
        except Exception as exc:  # the meter's own fault: this micro-batch is not counted
            self.counters.add_uncounted("unread", f"{type(exc).__name__}: {exc}")
            self._note_problem("forward", f"{type(exc).__name__}: {exc}", exc)
            return
        try:  # not through _guarded: this runs on every micro-batch
            self.flop_model.on_training_forward(ref, self.counters.micro_batches)
        except Exception as exc:
            self._note_problem("flop model", f"{type(exc).__name__}: {exc}", exc)

    def _on_own_step(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        self._count_step()

    def _count_step(self) -> None:
        self.counters.optimizer_steps += 1
        self._guarded("optimizer", self.flop_model.on_optimizer_step)
        if self._file is not None and time.monotonic() >= self._next_refresh:
            self._guarded("refresh", self.refresh)  # one host read every refresh_seconds
        if self._budget_guard is not None:
            self._budget_step(self._budget_guard)  # may raise BudgetExceeded, by design

    def _on_any_step(self, optimizer: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
        try:
            match = self._optimizer_match.get(id(optimizer))
            if match is None:
                own = {id(p) for p in self.model.parameters()}
                match = any(
                    id(p) in own for group in optimizer.param_groups for p in group["params"]
                )
                self._optimizer_match[id(optimizer)] = match
        except Exception as exc:
            self._note_problem("optimizer", f"{type(exc).__name__}: {exc}", exc)
            return
        if match:
            self._count_step()

    def _guarded(self, where: str, fn: Any, *args: Any) -> None:
        """Runs one of the meter's own steps; a fault is noted, and training goes on."""
        try:
            fn(*args)
        except Exception as exc:
            self._note_problem(where, f"{type(exc).__name__}: {exc}", exc)

    def _note_problem(self, where: str, message: str, exc: BaseException | None = None) -> None:
        """Logs a problem in the meter's own hooks once; training always goes on."""
        if where in self._problems:
            return
        self._problems[where] = message
        logger.warning("flopmeter (%s): %s; training continues", where, message, exc_info=exc)

    # ----------------------------------------------------------------- budget
    @property
    def should_stop(self) -> bool:
        """Whether the compute budget says to stop: ``True`` from the optimizer step after which
        the next step would cross it (a raw loop checks it at its step boundary), or from the
        start of a resumed run whose restored compute is already within one step of it. Always
        ``False`` without a budget."""
        return self._budget_guard is not None and self._budget_guard.stopped

    @property
    def budget_left(self) -> float | None:
        """The budget less the run's compute at the guard's last reading, FLOP; ``None`` without
        a budget, before the first reading, or when the compute is unknown. The guard reads
        rarely far from the budget and at every optimizer step near it (docs/budget.md)."""
        return None if self._budget_guard is None else self._budget_guard.budget_left_flops

    def plan_budget(self, planned_steps: int | None) -> None:
        """Tells the budget guard how many optimizer steps this session plans (adapters: the
        trainer's ``max_steps``); at the first reading that knows a step's compute the guard
        logs what the whole run will use and whether it fits. No effect without a budget."""
        if self._budget_guard is not None:
            self._budget_guard.plan(planned_steps)

    def _budget_step(self, guard: BudgetGuard) -> None:
        """At an optimizer step: read the counts if the guard asks, decide, and act."""
        step = self.counters.optimizer_steps
        if guard.stopped:
            if guard.budget.action == "raise":
                raise _exceeded(guard, step)
            if not guard.overrun_logged:
                guard.overrun_logged = True
                logger.error(
                    "flopmeter: training went on after the compute budget asked it to stop "
                    "(meter.should_stop) at step %s; the budget may be crossed",
                    guard.stop_step,
                )
            return
        try:
            self._budget_bound(guard)
        except Exception as exc:  # no bound: readings fall back to the schedule
            guard.since_reading_flops = None
            self._note_problem("budget", f"{type(exc).__name__}: {exc}", exc)
        if not guard.needs_reading(step):
            return  # the common case: a few float operations, no host read
        try:
            flops, why, step_upper = self._budget_total_flops(guard)
            decision = guard.on_reading(step, flops, why, step_upper)
        except Exception as exc:
            self._note_problem("budget", f"{type(exc).__name__}: {exc}", exc)
            return
        self._budget_say(decision.messages)
        if decision.stop:
            self._budget_stop_note(guard)
        if decision.stop and guard.budget.action == "raise":
            raise _exceeded(guard, step)

    def _budget_stop_note(self, guard: BudgetGuard) -> None:
        """The report's note on a clean stop (a crossing is noted with its error)."""
        at, budget = guard.flops_at_stop, guard.budget.flops
        if at is None or at > budget:
            return
        when = (
            "before this session's first step"
            if guard.stop_step == 0
            else (f"after optimizer step {guard.stop_step} of this session")
        )
        self.add_note(
            f"Compute budget: training stopped {when} at {at:.3e} FLOP, within the budget of "
            f"{budget:.3e} FLOP ({guard.budget.source}); the next step would have crossed it."
        )

    def _budget_say(self, messages: tuple[tuple[str, str], ...]) -> None:
        for level, message in messages:
            logger.log(logging.getLevelName(level.upper()), "flopmeter: %s", message)
            if level == "error":
                self.add_note(f"Compute budget: {message}")

    def _budget_bound(self, guard: BudgetGuard) -> None:
        """Closes the step's upper bound, with the FLOP model's rates (host data only)."""
        observations = self.flop_model.observations()
        key = (id(observations.profile), len(observations.samples), id(self._census))
        if key != guard.rates_key:
            guard.rates_key, guard.rates = key, step_rates(observations, self._census)
        guard.close_step()

    def _budget_start(self, guard: BudgetGuard) -> None:
        """Starts the guard; a resumed run whose saved compute is within one step of the
        budget stops at once (before any step of this session)."""
        flops, step_flops = self._restored_budget if self.counters.resumed else (None, None)
        decision = guard.start(
            resumed=self.counters.resumed,
            local=not distributed.is_distributed(),
            restored_flops=flops,
            restored_step_flops=step_flops,
        )
        self._budget_say(decision.messages)
        if decision.stop:
            self._budget_stop_note(guard)

    def _budget_total_flops(self, guard: BudgetGuard) -> tuple[float | None, str, float | None]:
        """The run's compute now, FLOP, as the report would give it (``None`` with the reason
        when the report would withhold it), and under torch.distributed the ranks' largest step
        bounds summed, FLOP. Under torch.distributed the counts are summed over ranks and the
        largest figure of any rank is taken (two small collectives), so every rank decides on
        the same number. A rank that fails between the two still joins the second (with NaN,
        its figure unknown), so no rank waits in it alone."""
        snapshot = self.counters.snapshot(sync=True)
        try:
            census = self._census or take_census(self.model)
            estimates, primary = compute_estimates(
                census, snapshot.totals, self.flop_model.observations()
            )
            why = withheld_reason(self._facts(), snapshot)
            flops = estimates[primary].flops if why is None else None
        except Exception as exc:  # into the collective as unknown, then said
            flops, why = None, f"the meter could not compute it ({type(exc).__name__}: {exc})"
        if not distributed.is_distributed():
            return flops, why or "", None
        own_upper = guard.own_step_upper_flops
        gathered = distributed.all_gather_floats(
            [math.nan if flops is None else flops, math.nan if own_upper is None else own_upper]
        )
        values = [row[0] for row in gathered]
        uppers = [row[1] for row in gathered]
        flops = None if any(math.isnan(v) for v in values) else max(values)
        if flops is None:
            why = why or "another rank's counts are not complete"
        step_upper = None if any(math.isnan(v) for v in uppers) else sum(uppers)
        return flops, why or "", step_upper

    # ----------------------------------------------------------------- counts
    def recount(self) -> Census:
        """Retakes the parameter census now, for runs that change what trains midway.

        Returns:
            The new census, which the report uses from now on.
        """
        self._census = take_census(self.model)
        self.flop_model.reset_profile()  # profile the next training micro-batch again
        return self._census

    def add_note(self, note: str) -> None:
        """Adds a note to the report (for adapters: something the counts cannot show).

        Args:
            note: One sentence, shown in the report's ``notes``.
        """
        self._notes.append(str(note))

    def elapsed_seconds(self) -> float:
        """Training time so far on this rank, in seconds, including time before a resume."""
        return self.counters.elapsed_seconds()

    # ----------------------------------------------------------------- report
    def report(self, *, sync: bool = False) -> FlopReport:
        """The report: final once the meter has stopped, ``running`` before.

        Args:
            sync: While running under torch.distributed, sum the counts over ranks (every rank
                must call it then). Without it a running report holds this rank's counts
                (``counts_scope="this_rank"``). The final report is always summed.
        """
        if self._final is not None:
            return self._final
        return self._build_report(sync=sync)

    def _build_report(
        self, *, sync: bool, status: Status | None = None, error: str | None = None
    ) -> FlopReport:
        census = self._census or take_census(self.model)
        snapshot = self.counters.snapshot(sync=sync)
        observations = self.flop_model.observations()
        estimates, primary = compute_estimates(census, snapshot.totals, observations)
        facts = self._facts(status, error)
        if snapshot.partial and facts.status == "completed":
            logger.warning(
                "flopmeter: the final report holds this rank's counts only: %s",
                partial_counts_reason(facts),
            )
        hardware = self._hardware.report_fields(
            seconds=snapshot.session_seconds,
            flops_architecture=estimates[primary].flops,
            gather=sync and distributed.is_distributed(),
            extra_notes=hardware_notes(snapshot, self.counters.prior_seconds),
        )
        return build_report(facts, snapshot, census, estimates, primary, observations, hardware)

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
            parent_runs=self.options.parents,
            original_systemic_risk=self.options.original_systemic_risk,
            world_size=max(distributed.world_size(), self.counters.world_at_first_batch or 1),
            census_at_report=self._census is None,
            process_group_alive=distributed.is_distributed(),
            hook_problems=dict(self._problems),
            notes=tuple(self._notes),
            torch_version=torch.__version__,
            flopmeter_version=__version__,
            updated_at=_utc_now(),
            pid=os.getpid(),
            hostname=socket.gethostname(),
            **self._budget_facts(),
        )

    def _budget_facts(self) -> dict[str, Any]:
        """The report's budget fields (empty without a budget)."""
        guard = self._budget_guard
        if guard is None:
            return {}
        return {
            "budget_flops": guard.budget.flops,
            "budget_source": guard.budget.source,
            "flops_at_stop": guard.flops_at_stop,
            "stopped_by_budget": guard.stopped,
        }

    # ----------------------------------------------------------------- resume
    def state_dict(self) -> dict[str, Any]:
        """The cumulative counts, for a checkpoint; restore with :meth:`load_state_dict`.

        Under torch.distributed the counts are summed over ranks, so every rank must call it
        (as frameworks do when they save). The result is plain Python data.
        """
        state = self.counters.state_dict(
            {"started_at": self._started_at, "model": self._model_identity()}
        )
        state.update(self._budget_state(state))
        return state

    def _budget_state(self, state: Mapping[str, Any]) -> dict[str, Any]:
        """The saved counts' compute and largest step, FLOP, for a resumed run's budget guard
        (host arithmetic on the summed counts; empty when not known)."""
        try:
            if state["micro_batches_unread"] or state["micro_batches_inconsistent"]:
                return {}
            totals = TokenTotals(**{k: state[k] for k in TokenTotals.model_fields})
            census = self._census or take_census(self.model)
            estimates, primary = compute_estimates(census, totals, self.flop_model.observations())
            flops = estimates[primary].flops
            steps = state["optimizer_steps"]
            if flops is None or not steps:
                return {}
            guard = self._budget_guard
            known = [flops / steps]  # the mean step; the guard's prediction when it has one
            predicted = guard.next_step_flops() if guard is not None else None
            if predicted is not None:
                known.append(predicted)
            return {"budget_flops_saved": flops, "budget_step_flops_saved": max(known)}
        except Exception as exc:  # the state is saved without them; the guard reads instead
            self._note_problem("budget", f"{type(exc).__name__}: {exc}", exc)
            return {}

    def load_state_dict(self, state: Mapping[str, Any], *, allow_other_model: bool = False) -> None:
        """Continues the counts of a run saved with :meth:`state_dict` (a resumed run).

        The restored totals are added once to what this meter counts from now on (not once per
        rank). Counts this meter made before the call are kept. The state is checked first
        (:func:`flopmeter.counters.check_state`), and it must come from the same model: its
        name and parameter count.

        Args:
            state: What :meth:`state_dict` returned (also after a JSON round trip).
            allow_other_model: Accept a state saved for another model (a run that continues
                on a changed model, knowingly).

        Raises:
            ConfigurationError: ``state`` is not a flopmeter state, holds an impossible value,
                or belongs to another model; the message names the field.
        """
        validate_bool(allow_other_model, "allow_other_model")
        checked = check_state(state)
        saved = state.get("model")
        mine = self._model_identity()
        if saved is not None and saved != mine and not allow_other_model:
            raise ConfigurationError(
                f"FlopMeter state: 'model' is {saved!r}, but this meter measures {mine!r}. "
                "Pass allow_other_model=True to continue its counts on this model anyway."
            )
        self.counters.load_state_dict(state)
        self._started_at = checked["started_at"] or self._started_at
        self._restored_budget = restored_budget(state)

    def _model_identity(self) -> dict[str, Any]:
        """What ties a saved state to its model: the report's name and the parameter count."""
        census = self._census or take_census(self.model)
        return {"name": self.model_name, "n_total": census.n_total}
