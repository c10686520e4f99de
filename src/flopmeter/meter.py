"""FlopMeter: the public face of a metered run, and the wiring of its parts.

The meter owns no arithmetic, no counting and no sequence of its life: its parts are wired and
run by :class:`~flopmeter.run.lifecycle.MeteredRun` (the start, the end, the refresh, SIGTERM,
the checkpoint's state); its hooks (:mod:`flopmeter.run.hooks`) feed the counters, the FLOP
model and the budget (:mod:`flopmeter.budget`); the run's compute and its report come from pure
functions (:mod:`flopmeter.run.measure`, :mod:`flopmeter.run.reporting`).
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Mapping
from types import MappingProxyType
from typing import Any

from torch import nn

from flopmeter.checks import whole_number
from flopmeter.counting.census import Census
from flopmeter.counting.counters import RunCounters
from flopmeter.errors import BudgetExceeded, ConfigurationError, FlopMeterError
from flopmeter.flops.phases import declared_phase
from flopmeter.flops.recorder import FlopModelRecorder
from flopmeter.ledger.sinks import Sink
from flopmeter.options import MeterOptions, meter_signature, validate_bool
from flopmeter.report import FlopReport
from flopmeter.report.context import AttachSection
from flopmeter.run.lifecycle import MeteredRun
from flopmeter.run.measure import status_of
from flopmeter.run.parts import assemble, check_pad_id, default_model_id, default_model_name

__all__ = ["FlopMeter"]

logger = logging.getLogger("flopmeter")


class FlopMeter:
    """Measures the training compute of a PyTorch model while it trains.

    Use it around any training loop (``with FlopMeter(model, pad_id, output="out/") as
    meter:``), or call :meth:`start` and :meth:`stop`. Only training micro-batches count
    (training mode, gradients enabled; recomputation once), added into a small device tensor:
    no host synchronisation per micro-batch.

    The options are :class:`~flopmeter.options.MeterOptions`' (each documented there), given
    as keywords or as one value (``options=MeterOptions(...)``); given both, the keywords win.
    The parent runs, the ledger and the hardware tracker are made from them once, here.

    Args:
        model: The model being trained (the meter hooks its forward pass).
        pad_id, options, **option_values: The padding token id (the option also given by
            position), the options as one value, any other option by name.

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
        self.options = MeterOptions.of(options, pad_id=pad_id, **option_values)
        check_pad_id(model, self.options.pad_id)
        self.model = model
        self.model_name = self.options.model_name or default_model_name(model)
        self.model_id = self.options.model_id or default_model_id(model)  # for the catalogue
        parts = assemble(self.options, self.model_id)
        self.original, self.parents = parts.original, parts.parents  # as the report takes them
        self.counters = RunCounters()
        self.flop_model = FlopModelRecorder(model, measure_every=self.options.measure_every)
        self._run = MeteredRun(self, parts)  # the budget, hooks, lifecycle, file and reporter
        self.run_id = self._run.life.run_id  # this run's id, in its report and ledger record

    @property
    def epochs(self) -> float | None:
        """Epochs trained, when an adapter knows them (it sets this; shown in the report)."""
        return self._run.life.epochs

    @epochs.setter
    def epochs(self, value: float | None) -> None:
        self._run.life.epochs = value

    @property
    def pad_id(self) -> int | None:
        """The padding token id the meter uses."""
        return self.options.pad_id

    @property
    def output(self) -> os.PathLike[str] | None:
        """The report file (the one claimed, once claimed), or ``None``."""
        return self._run.run_file.output

    @property
    def pretrain_flops(self) -> float | None:
        """The original model's training compute, FLOP, or ``None`` when unknown."""
        return self.original.flops

    @property
    def census(self) -> Census | None:
        """The parameter census, taken at the first training forward; ``None`` before it."""
        return self._run.hooks.census

    @property
    def problems(self) -> Mapping[str, str]:
        """Problems in the meter's own hooks so far, by hook (each logged once; training went
        on)."""
        return MappingProxyType(self._run.hooks.problems)

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
        """Registers the hooks and starts the clock (what entering ``with`` does); raises
        ``FlopMeterError`` when started before, ``ConfigurationError`` when ``output`` cannot
        be written."""
        return self.begin(claim_file=True)

    def begin(self, *, claim_file: bool = True) -> FlopMeter:
        """:meth:`start`; ``claim_file=False`` (zero-code metering's seam) counts from now but
        leaves the report file unclaimed until :meth:`claim_file` (a meter the script starts
        before then takes over with no trace of this one: :meth:`stand_down`)."""
        self._run.begin(claim_file=claim_file)
        return self

    def claim_file(self) -> None:
        """Claims the report file (rank 0, once): from now on a SIGTERM leaves an
        ``interrupted`` report there and a kill the last ``running`` one."""
        self._run.claim_file()

    def stand_down(self, reason: str) -> FlopReport | None:
        """Zero-code metering gives way to a meter the script starts (``reason``: why, for the
        attach section). Before its file was claimed: hooks removed, counts dropped, nothing
        written (``None``). After: a final report of this rank's counts (``interrupted``, with
        the reason), written, and the file let go before the other meter claims it."""
        return self._run.stand_down(reason)

    def stop(self, exc: BaseException | None = None) -> FlopReport:
        """Removes the hooks, makes the final report and writes it (what leaving ``with`` does),
        and returns it. ``exc``, the exception that ended training, makes the status ``failed``
        (``interrupted`` for KeyboardInterrupt); the caller re-raises it."""
        if self._run.final is not None:
            return self._run.final
        if self._run.life.status != "running":
            raise FlopMeterError("This FlopMeter was never started.")
        sync = exc is None or isinstance(exc, BudgetExceeded)
        return self._run.end(exc, status=status_of(exc), sync=sync)

    def refresh(self, *, sync: bool = False) -> FlopReport:
        """Makes a running report and writes it to ``output`` (rank 0): what adapters call at
        their log and save steps, and the meter itself every ``refresh_seconds``. One host read
        of the counts; with ``sync`` under torch.distributed, one small collective (every rank
        must call it then, at the same point)."""
        return self._run.refresh(sync=sync)

    # ----------------------------------------------------------------- budget (delegated)
    @property
    def should_stop(self) -> bool:
        """Whether the compute budget says to stop: from the optimizer step after which the next
        would cross it, or from the start of a resumed run already within one step of it."""
        return self._run.budget.should_stop

    @property
    def budget_left(self) -> float | None:
        """The budget less the compute at the guard's last reading, FLOP (``None`` without a
        budget, before a reading, or when the compute is unknown; docs/budget.md)."""
        return self._run.budget.budget_left

    def plan_budget(self, planned_steps: int | None) -> None:
        """The optimizer steps this session plans (adapters: the trainer's ``max_steps``), for
        the budget guard's forecast."""
        self._run.budget.plan(planned_steps)

    # ----------------------------------------------------------------- counts and report
    def recount(self) -> Census:
        """Retakes the parameter census now, for runs that change what trains midway; the
        report uses the new census from now on, and the next micro-batch is profiled again."""
        return self._run.hooks.recount()

    @property
    def attach(self) -> AttachSection | None:
        """How zero-code metering attached this meter (``None``: the script made it)."""
        return self._run.life.attach

    def note_attach(self, attach: AttachSection) -> None:
        """Records how zero-code metering (:mod:`flopmeter.auto`) attached this meter: the
        report's ``attach`` section (and, when micro-batches ran before it, no verdict)."""
        self._run.life.attach = attach

    def add_note(self, note: str) -> None:
        """Adds a note (one sentence) to the report (for adapters: what counts cannot show)."""
        self._run.life.notes.append(str(note))

    def add_copy(self, sink: Sink) -> None:
        """One more copy of the final report, delivered at the end (rank 0) with the ``sinks``
        option's: a :class:`~flopmeter.ledger.sinks.Sink` (``name``, ``put``), e.g. the HF
        callback's :class:`~flopmeter.report.sagemaker.SageMakerCopy`."""
        self._run.archive.add(sink)

    def uncounted(self, reason: str) -> None:
        """Says that compute of this run is in no count (``reason``: what, one sentence): the
        report withholds the figure and the verdict with it rather than judge a part."""
        self._run.life.uncounted.append(str(reason).strip())

    def declare_phase(self, name: str, flops: float | None, source: str) -> None:
        """Declares compute of this run that the meter cannot see (generation in a vLLM server,
        reference log-probs or teacher logits computed before the run), FLOP, with where the
        figure comes from; ``flops=None`` names the phase as not seen (under the
        ``modification`` policy the verdict is then withheld until a figure is declared).

        Raises:
            ConfigurationError: an empty name or source, a name the meter uses, or a figure that
                is not a non-negative number.
        """
        self._run.life.declared_phases.append(declared_phase(name, flops, source))

    def name_model(self, module: nn.Module, name: str) -> None:
        """Names another model of the run (``"reference"``, ``"teacher"``, ``"reward model"``):
        its forward passes while the model trains are its own phase, ``model <name>``, and are
        watched from now on, wherever they run (no discovery needed)."""
        if not isinstance(module, nn.Module) or not isinstance(name, str) or not name.strip():
            raise ConfigurationError("name_model needs an nn.Module and a non-empty name.")
        self.flop_model.forwards.name(module, name.strip())

    def evaluation(self) -> contextlib.AbstractContextManager[None]:
        """``with meter.evaluation():`` marks evaluation explicitly: its forward passes are the
        ``evaluation`` phase (never counted). Once one is marked, only such blocks are
        evaluation; before that, any forward pass while the model is in evaluation mode is."""
        return self.flop_model.forwards.evaluation()

    def evaluation_marked(self) -> None:
        """Says that every evaluation of this run will be marked with :meth:`evaluation` (the
        HF callback marks the Trainer's evaluation loops): from now on the model's mode alone
        never makes a forward pass evaluation."""
        self.flop_model.forwards.explicit_evaluation = True

    def elapsed_seconds(self) -> float:
        """Training time so far on this rank, in seconds, including time before a resume."""
        return self.counters.elapsed_seconds()

    def report(self, *, sync: bool = False) -> FlopReport:
        """The report: final once the meter has stopped, ``running`` before. ``sync``: while
        running under torch.distributed, sum the counts over ranks (every rank must call it);
        without it a running report holds this rank's counts. The final one is always summed."""
        final = self._run.final
        return final if final is not None else self._run.reporter.report(sync=sync)

    # ----------------------------------------------------------------- resume
    def state_dict(self) -> dict[str, Any]:
        """The cumulative counts (plain data) for a checkpoint, with the run's compute (its
        figure, estimate and run id: rank 0's, whose report it is) and largest step for a
        resumed run's budget guard; summed over ranks under torch.distributed (two small
        collectives), so every rank calls it. Restore with :meth:`load_state_dict`."""
        return self._run.state_dict()

    def load_state_dict(self, state: Mapping[str, Any], *, allow_other_model: bool = False) -> None:
        """Continues the counts of a run saved with :meth:`state_dict`: added once to what
        this meter counts (not once per rank). The state is checked first
        (:func:`flopmeter.counting.counters.check_state`, a ``ConfigurationError`` naming the field) and
        must come from the same model (name, parameter count) unless ``allow_other_model``."""
        validate_bool(allow_other_model, "allow_other_model")
        self._run.load_state_dict(state, allow_other_model=allow_other_model)

    def resumed_without_counts(self, step: int) -> None:
        """Says that training resumes at optimizer step ``step`` (> 0) from a checkpoint that
        holds no meter counts (adapters: the Trainer's ``global_step`` at a resume with nothing
        to restore): the report then withholds the run's compute and its verdict, with the
        reason and how to fix it, since the steps before ``step`` are in no count.

        Raises:
            ConfigurationError: ``step`` is not a whole number above 0.
        """
        what = "a whole number above 0"
        if whole_number(step, "step", what=what) == 0:
            raise ConfigurationError(f"step must be {what}, got 0.")
        self.counters.uncounted_steps = int(step)


FlopMeter.__init__.__signature__ = meter_signature(nn.Module)  # type: ignore[attr-defined]
