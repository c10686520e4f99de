"""FlopMeter: the context manager that wires hooks, keeps the counts and makes the report.

It owns wiring and state only; arithmetic lives in pure functions (``flopmeter.flops``,
``flopmeter.compliance``), token counting in ``flopmeter.tokens``.
"""

from __future__ import annotations

import logging
import math
import operator
import os
import tempfile
import time
from collections.abc import Mapping
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.optim.optimizer import register_optimizer_step_post_hook

from flopmeter import distributed
from flopmeter.census import Census, take_census
from flopmeter.compliance import (
    PRETRAIN_FLOPS_ENV,
    determine_threshold,
    pretrain_flops_from_env,
    validate_pretrain_flops,
    verdict,
)
from flopmeter.errors import ConfigurationError, FlopMeterError
from flopmeter.flops import compute_estimates, estimate_notes, measured_ratio, n_active
from flopmeter.flops.measured import DEFAULT_MEASURE_EVERY, MeasuredSampler
from flopmeter.flops.profile import ModelProfile, Profiler
from flopmeter.hardware.nvml import DEFAULT_INTERVAL_SECONDS
from flopmeter.hardware.tracker import HardwareTracker
from flopmeter.report import FlopReport, Status, TokenTotals
from flopmeter.tokens import (
    SLOT_SEQUENCES,
    SLOT_SUM_SQ_LEN,
    SLOT_TOKENS,
    SLOT_TOKENS_SEEN,
    accumulate_token_stats,
    new_buffer,
)

logger = logging.getLogger("flopmeter")

#: The file name used when ``output`` is a folder.
DEFAULT_FILENAME = "flops_meter.json"
_STATE_FORMAT = "flopmeter.meter/1"
#: Training micro-batches the model profile is tried on before the meter gives up on it (a
#: profiler walks and hooks every module, so it is not restarted on every micro-batch).
_MAX_PROFILE_ATTEMPTS = 3


def _utc_now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


def _in_backward() -> bool:
    """True while autograd runs a backward pass (activation-checkpoint recomputation)."""
    task_id = getattr(torch._C, "_current_graph_task_id", None)
    return task_id is not None and task_id() != -1


def _input_source(args: tuple[Any, ...], kwargs: dict[str, Any]) -> Mapping[str, Any]:
    """Where a forward call's named inputs are: its keyword arguments (Hugging Face style), or
    a mapping passed as the first argument."""
    if "input_ids" not in kwargs and args and isinstance(args[0], Mapping):
        return args[0]
    return kwargs


def _find_token_inputs(
    args: tuple[Any, ...], kwargs: dict[str, Any], source: Mapping[str, Any]
) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """Finds ``(input_ids, attention_mask)`` in a forward call's arguments.

    Named inputs first (``source``, from :func:`_input_source`), then positional tensors: an
    integer first argument is the ids, and a second argument of the same shape is the mask.
    ``inputs_embeds`` (``[B, T, H]``) stands in for ids of ``[B, T]``.
    """
    ids = source.get("input_ids")
    mask = source.get("attention_mask")
    if ids is None and source is kwargs and args and isinstance(args[0], torch.Tensor):
        first = args[0]
        if not first.is_floating_point():
            ids = first
            second = args[1] if len(args) > 1 else None
            if mask is None and isinstance(second, torch.Tensor) and second.shape == first.shape:
                mask = second
    if ids is None and mask is None:
        embeds = source.get("inputs_embeds")
        if isinstance(embeds, torch.Tensor) and embeds.dim() == 3:
            # Every position of [B, T, H] embeddings is a token: an all-ones mask, as a
            # zero-copy view.
            mask = torch.ones((), dtype=torch.bool, device=embeds.device).expand(embeds.shape[:2])
    if not isinstance(ids, torch.Tensor):
        ids = None
    if not isinstance(mask, torch.Tensor):
        mask = None
    return ids, mask


#: Keyword names under which packed batches pass their document offsets (flash-attention
#: varlen style; Hugging Face's DataCollatorWithFlattening uses ``cu_seq_lens_q``).
_CU_SEQLENS_KEYS = ("cu_seqlens", "cu_seq_lens_q", "cu_seqlens_q")


def _find_packing_inputs(
    source: Mapping[str, Any], ref: torch.Tensor
) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """Finds ``(position_ids, cu_seqlens)`` of a packed batch among a call's named inputs.

    ``position_ids`` are kept only when they can describe ``ref``'s tokens (1-D or 2-D with the
    same last dimension; e.g. the 3-D positions of multimodal rotary embeddings are not
    document markers).
    """
    pos = source.get("position_ids")
    if not (
        isinstance(pos, torch.Tensor)
        and 1 <= pos.dim() <= 2
        and pos.shape[-1] == ref.shape[-1]
        and ref.dim() <= 2
    ):
        pos = None
    cu = None
    if pos is None:
        for key in _CU_SEQLENS_KEYS:
            value = source.get(key)
            if isinstance(value, torch.Tensor):
                cu = value
                break
    return pos, cu


def validate_pad_id(pad_id: object) -> int | None:
    """Checks a padding token id: ``None`` or a non-negative integer.

    Raises:
        ConfigurationError: anything else (the message names ``pad_id``).
    """
    if pad_id is None:
        return None
    if isinstance(pad_id, bool):
        raise ConfigurationError(f"pad_id must be a non-negative integer or None, got {pad_id!r}.")
    try:
        value = operator.index(pad_id)  # type: ignore[arg-type]
    except TypeError:
        raise ConfigurationError(
            f"pad_id must be a non-negative integer token id or None, got {pad_id!r} "
            f"({type(pad_id).__name__})."
        ) from None
    if value < 0:
        raise ConfigurationError(f"pad_id must be a non-negative token id, got {value}.")
    return value


def _resolve_output(output: str | os.PathLike[str] | None) -> Path | None:
    """The file the report goes to; a folder (existing, or named with a trailing slash) gets
    ``flops_meter.json`` inside it."""
    if output is None:
        return None
    raw = os.fspath(output)
    path = Path(raw).expanduser()
    if path.is_dir() or raw.endswith(("/", os.sep)):
        path = path / DEFAULT_FILENAME
    return path


def check_writable(path: Path) -> None:
    """Fails now, not after hours of training, when ``path`` cannot be written."""
    if path.is_dir():
        raise ConfigurationError(f"output {str(path)!r} is a folder where a file is needed.")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=path.parent, prefix=".flopmeter-check-"):
            pass
    except OSError as exc:
        raise ConfigurationError(
            f"The report cannot be written to {str(path)!r}: {exc.strerror or exc}. "
            "Choose a folder this process can write to."
        ) from None


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

    Args:
        model: The model being trained (the meter hooks its forward pass).
        pad_id: The padding token id; used when a batch has no ``attention_mask``. ``None``
            with no mask counts every token. In a packed batch a pad-id token that continues a
            document (an EOS that is also the pad id) still counts; see :mod:`flopmeter.tokens`.
        model_name: Name for the report; defaults to the model config's ``name_or_path``.
        pretrain_flops: The original model's training compute, FLOP; defaults to the
            ``PRETRAIN_FLOPS`` environment variable; unknown when neither is set.
        original_systemic_risk: Whether the original model is a GPAI model with systemic risk
            (chooses the fallback threshold when ``pretrain_flops`` is unknown).
        output: File (or folder, for ``flops_meter.json``) the final report is written to, by
            rank 0, atomically. Checked for writability on entry.
        optimizer: Count only this optimizer's steps; by default any optimizer stepping the
            model's parameters counts.
        nvml: GPU readings through NVML (energy, utilisation, the hardware bound): ``None``
            (default) when NVML initialises, ``True`` to require the ``nvml`` extra, ``False``
            for none. ``FLOPMETER_NVML=0`` turns them off. See docs/hardware.md.
        peak_flops: Dense peak per GPU in FLOP/s (not TFLOP/s), for GPUs the peak table does
            not know or to replace its figure.
        dtype: Data type of the training's matrix multiplications ("bf16", "fp16", "tf32",
            "fp32", "fp8"), which selects the peak.
        nvml_interval_seconds: Sampling interval of the utilisation thread, seconds.
        measure_every: The ``measured`` estimate counts the FLOP of training micro-batches 1,
            2 and every ``measure_every``-th after at the dispatch level (forward and
            backward); ``0`` turns that sampling off.

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
        pretrain_flops: float | None = None,
        original_systemic_risk: bool = False,
        output: str | os.PathLike[str] | None = None,
        optimizer: torch.optim.Optimizer | None = None,
        nvml: bool | None = None,
        peak_flops: float | None = None,
        dtype: str = "bf16",
        nvml_interval_seconds: float = DEFAULT_INTERVAL_SECONDS,
        measure_every: int = DEFAULT_MEASURE_EVERY,
    ) -> None:
        if not isinstance(model, nn.Module):
            raise ConfigurationError(
                f"FlopMeter needs the torch.nn.Module being trained, got {type(model).__name__}."
            )
        if optimizer is not None and not isinstance(optimizer, torch.optim.Optimizer):
            raise ConfigurationError(
                f"optimizer must be a torch.optim.Optimizer, got {type(optimizer).__name__}."
            )
        if (
            isinstance(measure_every, bool)
            or not isinstance(measure_every, int)
            or measure_every < 0
        ):
            raise ConfigurationError(
                f"measure_every must be a non-negative integer (0 turns sampling off), "
                f"got {measure_every!r}."
            )
        self.model = model
        self.pad_id = validate_pad_id(pad_id)
        self.model_name = model_name or self._default_model_name(model)
        if pretrain_flops is not None:
            self.pretrain_flops = validate_pretrain_flops(pretrain_flops)
            self.pretrain_flops_source: str | None = "argument"
        else:
            self.pretrain_flops = pretrain_flops_from_env()
            self.pretrain_flops_source = (
                f"environment variable {PRETRAIN_FLOPS_ENV}"
                if self.pretrain_flops is not None
                else None
            )
        self.original_systemic_risk = bool(original_systemic_risk)
        self.output = _resolve_output(output)
        self.optimizer = optimizer
        self.epochs: float | None = None
        self._hardware = HardwareTracker(
            nvml=nvml, peak_flops=peak_flops, dtype=dtype, interval_seconds=nvml_interval_seconds
        )
        self._untracked_forwards = 0

        self._state = "new"
        self._handles: list[Any] = []
        self._buffers: dict[torch.device, torch.Tensor] = {}
        self._micro_batches = 0
        self._optimizer_steps = 0
        self._census: Census | None = None
        self._optimizer_match: dict[int, bool] = {}
        self._hook_errors: dict[str, str] = {}
        self._rank_at_start = 0
        self._world_at_first_batch: int | None = None
        self._t0: float | None = None
        self._elapsed_seconds = 0.0
        self._started_at: str | None = None
        self._ended_at: str | None = None
        self._status: Status = "running"
        self._error: str | None = None
        self._final: FlopReport | None = None
        self._prior = TokenTotals()
        self._prior_steps = 0
        self._prior_seconds = 0.0
        self._notes: list[str] = []
        # FLOP model (issue 3): the profile of the first training micro-batch, and the samples.
        self._profiler: Profiler | None = None
        self._profile: ModelProfile | None = None
        self._profile_attempts = 0  # micro-batches a Profiler was started on
        self._sampler = MeasuredSampler(every=measure_every)

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
        if self._state == "running":
            raise FlopMeterError("This FlopMeter is already running.")
        if self._state == "finished":
            raise FlopMeterError(
                "This FlopMeter has finished and cannot be entered again. Create a new one; "
                "to continue its counts, pass meter.state_dict() to the new one's "
                "load_state_dict()."
            )
        self._rank_at_start = distributed.rank()
        if self.output is not None and self._rank_at_start == 0:
            check_writable(self.output)
        # torch.compiler.disable: when the model is compiled after the hook is registered,
        # dynamo does not trace the hook (a graph break at the forward's start); it runs
        # eagerly on the real tensors, as it does on an uncompiled or already compiled model.
        self._handles.append(
            self.model.register_forward_pre_hook(
                torch.compiler.disable(self._on_forward_pre), with_kwargs=True
            )
        )
        if self.optimizer is not None:
            self._handles.append(self.optimizer.register_step_post_hook(self._on_own_step))
        else:
            self._handles.append(register_optimizer_step_post_hook(self._on_any_step))
        self._started_at = self._started_at or _utc_now()
        self._hardware.start(self.model)  # never raises; reads the energy counters now
        self._t0 = time.monotonic()
        self._state = "running"
        return self

    def stop(self, exc: BaseException | None = None) -> FlopReport:
        """Removes the hooks, makes the final report and writes it (what leaving ``with`` does).

        Args:
            exc: The exception that ended training, if any: the report's status becomes
                ``failed`` (``interrupted`` for KeyboardInterrupt). The exception is not
                handled here; the caller re-raises it.

        Returns:
            The final report (also available from :meth:`report`).
        """
        if self._state != "running":
            if self._final is not None:
                return self._final
            raise FlopMeterError("This FlopMeter was never started.")
        self._hardware.stop()  # first, whatever follows: the sampling thread is joined
        for handle in self._handles:
            handle.remove()
        self._handles.clear()
        self._stop_flop_model()
        self._elapsed_seconds += time.monotonic() - (self._t0 or time.monotonic())
        self._t0 = None
        self._ended_at = _utc_now()
        if exc is None:
            self._status = "completed"
        elif isinstance(exc, KeyboardInterrupt):
            self._status = "interrupted"
        else:
            self._status = "failed"
        if exc is not None:
            self._error = f"{type(exc).__name__}: {exc}"
        self._state = "finished"
        # A failed rank must not wait in a collective its peers may never join.
        self._final = self._build_report(sync=exc is None)
        self._write_final()
        return self._final

    def _write_final(self) -> None:
        if self.output is None or self._final is None or self._rank_at_start != 0:
            return
        try:
            self._final.write_json(self.output)
        except OSError:
            logger.exception("flopmeter could not write its report to %s", self.output)

    # ----------------------------------------------------------------- hooks
    def _on_forward_pre(
        self, module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> None:
        if not (module.training and torch.is_grad_enabled()):
            self._untracked_forwards += 1  # evaluation inside the window: noted in the report
            return
        if _in_backward():
            return
        try:
            if self._census is None:
                self._census = take_census(self.model)
                self._world_at_first_batch = distributed.world_size()
            source = _input_source(args, kwargs)
            ids, mask = _find_token_inputs(args, kwargs, source)
            self._micro_batches += 1
            ref = ids if ids is not None else mask
            if ref is None:
                self._note_hook_error(
                    "inputs",
                    "a training forward pass had no input_ids, attention_mask or inputs_embeds "
                    "the meter could find; its tokens were not counted",
                )
                return
            device = ref.device
            buffer = self._buffers.get(device)
            if buffer is None:
                buffer = self._buffers[device] = new_buffer(device)
            position_ids, cu_seqlens = _find_packing_inputs(source, ref)
            # Device work only: no .item(), .cpu(), host copy or collective per micro-batch.
            accumulate_token_stats(
                buffer,
                input_ids=ids,
                attention_mask=mask,
                pad_id=self.pad_id,
                position_ids=position_ids,
                cu_seqlens=cu_seqlens,
            )
            self._flop_model_pre(ref)
        except Exception as exc:
            self._note_hook_error("forward", f"{type(exc).__name__}: {exc}", exc)

    def _flop_model_pre(self, ref: torch.Tensor) -> None:
        """Profiles the first training micro-batch and opens dispatch-level samples.

        After the first micro-batch this is a few attribute tests and an integer modulo, unless
        the micro-batch is sampled. A profile whose forward pass did not complete is tried again
        on the next micro-batch, on at most ``_MAX_PROFILE_ATTEMPTS`` micro-batches in all; then
        the meter gives up (starting a profiler walks and hooks every module: no per-step cost).
        """
        try:
            if self._profile is None and self._profile_attempts <= _MAX_PROFILE_ATTEMPTS:
                profiler = self._profiler
                if profiler is not None and profiler.profile is not None:
                    self._profile = profiler.profile
                elif profiler is None or profiler.failed:
                    if profiler is not None:
                        profiler.remove()
                    if self._profile_attempts < _MAX_PROFILE_ATTEMPTS:
                        self._profiler = Profiler(self.model, batch_tokens=ref.numel()).start()
                    else:
                        logger.warning(
                            "flopmeter: the model profile failed on %d training micro-batches; "
                            "not trying again",
                            self._profile_attempts,
                        )
                    self._profile_attempts += 1  # past the limit: given up, nothing more here
            sampler = self._sampler
            if sampler.active or sampler.due(self._micro_batches):
                sampler.on_training_forward(self.model, ref, self._micro_batches)
        except Exception as exc:
            self._note_hook_error("flop model", f"{type(exc).__name__}: {exc}", exc)

    def _stop_flop_model(self) -> None:
        try:
            self._sampler.stop()
            if self._sampler.active:
                logger.warning(
                    "flopmeter: its FLOP-counting mode could not leave the dispatch stack "
                    "(another mode was entered above it and is still active)"
                )
            if self._profiler is not None:
                self._profiler.remove()
        except Exception as exc:
            self._note_hook_error("flop model", f"{type(exc).__name__}: {exc}", exc)

    def _current_profile(self) -> tuple[ModelProfile | None, str | None]:
        if self._profile is None and self._profiler is not None:
            self._profile = self._profiler.profile
        if self._profile is not None:
            return self._profile, None
        if self._profiler is None:
            return None, "no training micro-batch with input_ids or attention_mask was seen"
        if self._profiler.failed:
            if self._profile_attempts > _MAX_PROFILE_ATTEMPTS:
                return None, (
                    f"the model profile was tried on {_MAX_PROFILE_ATTEMPTS} training forward "
                    "passes and none completed (given up)"
                )
            return None, "the first training forward pass did not complete"
        return None, "the first training forward pass has not finished"

    def _on_own_step(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        self._optimizer_steps += 1
        if self._sampler.active:
            self._sampler.on_optimizer_step()

    def _on_any_step(self, optimizer: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
        try:
            key = id(optimizer)
            match = self._optimizer_match.get(key)
            if match is None:
                own = {id(p) for p in self.model.parameters()}
                match = any(
                    id(p) in own for group in optimizer.param_groups for p in group["params"]
                )
                self._optimizer_match[key] = match
            if match:
                self._optimizer_steps += 1
                if self._sampler.active:
                    self._sampler.on_optimizer_step()
        except Exception as exc:
            self._note_hook_error("optimizer", f"{type(exc).__name__}: {exc}", exc)

    def _note_hook_error(self, where: str, message: str, exc: BaseException | None = None) -> None:
        """Logs a problem in the meter's own hooks once; training always goes on."""
        if where in self._hook_errors:
            return
        self._hook_errors[where] = message
        logger.warning("flopmeter (%s): %s; training continues", where, message, exc_info=exc)

    # ----------------------------------------------------------------- counts
    def recount(self) -> Census:
        """Retakes the parameter census now, for runs that change what trains midway.

        Returns:
            The new census, which the report uses from now on.
        """
        self._census = take_census(self.model)
        self._profile = None  # profile the next training micro-batch again
        self._profile_attempts = 0
        if self._profiler is not None:
            self._profiler.remove()
            self._profiler = None
        return self._census

    def add_note(self, note: str) -> None:
        """Adds a note to the report (for adapters: something the counts cannot show).

        Args:
            note: One sentence, shown in the report's ``notes``.
        """
        self._notes.append(str(note))

    def _local_counts(self) -> list[int]:
        stats = [0, 0, 0, 0]
        for buffer in self._buffers.values():
            values = buffer.tolist()  # the one host read, at report time
            for i, slot in enumerate(
                (SLOT_TOKENS, SLOT_TOKENS_SEEN, SLOT_SEQUENCES, SLOT_SUM_SQ_LEN)
            ):
                stats[i] += int(values[slot])
        return [*stats, self._micro_batches]

    def _totals(self, sync: bool) -> tuple[TokenTotals, int, float, str]:
        """Counts so far (restored ones included), optimizer steps, seconds, and their scope.

        With ``sync`` under torch.distributed, counts are summed over ranks; steps and seconds
        are the largest of any rank (every rank steps together; the slowest rank's time is the
        run's).
        """
        sums = self._local_counts()
        seconds = self.elapsed_seconds()
        steps = self._optimizer_steps
        scope = "this_rank"
        if sync and distributed.is_distributed():
            # Seconds travel as whole microseconds in the int64 collective.
            sums, (steps, micros) = distributed.all_reduce_counts(
                sums, [steps, round(seconds * 1e6)]
            )
            seconds = micros / 1e6
            scope = "all_ranks"
        elif distributed.world_size() == 1 and not self._world_at_first_batch_gt1():
            scope = "all_ranks"
        tokens, seen, sequences, sum_sq, micro = sums
        p = self._prior
        totals = TokenTotals(
            tokens_processed=p.tokens_processed + tokens,
            tokens_seen=p.tokens_seen + seen,
            sequences=p.sequences + sequences,
            sum_sq_seq_len=p.sum_sq_seq_len + sum_sq,
            micro_batches=p.micro_batches + micro,
        )
        return totals, self._prior_steps + steps, seconds, scope

    def _world_at_first_batch_gt1(self) -> bool:
        return (self._world_at_first_batch or 1) > 1

    def _elapsed_this_process(self) -> float:
        running = time.monotonic() - self._t0 if self._t0 is not None else 0.0
        return self._elapsed_seconds + running

    def elapsed_seconds(self) -> float:
        """Training time so far on this rank, in seconds, including time before a resume."""
        return self._prior_seconds + self._elapsed_this_process()

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

    def _build_report(self, *, sync: bool) -> FlopReport:
        census = self._census or take_census(self.model)
        totals, steps, seconds, scope = self._totals(sync)
        profile, profile_reason = self._current_profile()
        estimates, primary = compute_estimates(
            census,
            totals,
            profile=profile,
            profile_reason=profile_reason,
            samples=self._sampler.samples,
            sampling_reason=self._sampler.sampling_note(),
            unknown_ops=self._sampler.unknown_ops,
        )
        flops = estimates[primary].flops
        threshold = determine_threshold(
            self.pretrain_flops, original_systemic_risk=self.original_systemic_risk
        )
        notes = [f"Problem in the meter's {k} hook: {v}." for k, v in self._hook_errors.items()]
        notes.extend(self._notes)
        partial = scope == "this_rank" and self._world_at_first_batch_gt1()
        if partial and self._state == "finished":
            if self._status == "failed" and distributed.is_distributed():
                why = "the run failed, and a failed rank makes no collective"
            else:
                why = (
                    "torch.distributed was no longer initialised when the meter stopped (leave "
                    "the FlopMeter block before destroy_process_group)"
                )
            notes.append(
                f"Counts are this rank's only: {why}. The threshold comparison is withheld; "
                "sum the ranks' reports for the run's compute."
            )
            if self._status == "completed":
                logger.warning("flopmeter: the final report holds this rank's counts only: %s", why)
        if self._census is None:
            notes.append("No training forward pass was seen; the census was taken at report time.")
        if self._prior.micro_batches or self._prior_steps:
            notes.append("Counts include those restored with load_state_dict (a resumed run).")
        notes.extend(estimate_notes(estimates, primary, profile, profile_reason))
        return FlopReport(
            model_name=self.model_name,
            status=self._status,
            error=self._error,
            started_at=self._started_at,
            ended_at=self._ended_at,
            training_duration_seconds=seconds,
            n_total=census.n_total,
            n_trainable=census.n_trainable,
            n_frozen=census.n_frozen,
            n_embedding=census.n_embedding,
            n_active=n_active(census, profile),
            tokens_processed=totals.tokens_processed,
            tokens_seen=totals.tokens_seen,
            sequences=totals.sequences,
            sum_sq_seq_len=totals.sum_sq_seq_len,
            micro_batches=totals.micro_batches,
            optimizer_steps=steps,
            epochs=self.epochs,
            flops_architecture=flops,
            primary_estimate=primary,
            estimates=estimates,
            measured_to_transformer_ratio=measured_ratio(estimates),
            pretrain_flops=self.pretrain_flops,
            pretrain_flops_source=self.pretrain_flops_source,
            threshold_value=threshold.value,
            threshold_type=threshold.kind,
            threshold_source=threshold.source,
            ratio_to_threshold=None if flops is None or partial else flops / threshold.value,
            exceeds_threshold=None if flops is None or partial else threshold.exceeded_by(flops),
            verdict=None if flops is None or partial else verdict(flops, threshold.value),
            world_size=max(distributed.world_size(), self._world_at_first_batch or 1),
            counts_scope=scope,  # type: ignore[arg-type]
            **self._hardware_fields(flops, sync),
            torch_version=torch.__version__,
            flopmeter_version=_version(),
            notes=notes,
        )

    def _hardware_fields(self, flops: float | None, sync: bool) -> dict[str, Any]:
        notes: list[str] = []
        if self._untracked_forwards:
            notes.append(
                f"{self._untracked_forwards} forward passes in evaluation mode or without "
                "gradients ran inside the metered window: their time and energy are in the "
                "hardware figures (not in the token counts)."
            )
        if self._prior_seconds:
            notes.append("The hardware figures cover this session only, not the resumed part.")
        return self._hardware.report_fields(
            seconds=self._elapsed_this_process(),
            flops_architecture=flops,
            gather=sync and distributed.is_distributed(),
            extra_notes=tuple(notes),
        )

    # ----------------------------------------------------------------- resume
    def state_dict(self) -> dict[str, Any]:
        """The cumulative counts, for a checkpoint; restore with :meth:`load_state_dict`.

        Under torch.distributed the counts are summed over ranks, so every rank must call it
        (as frameworks do when they save). The result is plain Python data.
        """
        totals, steps, seconds, _ = self._totals(sync=True)
        return {
            "format": _STATE_FORMAT,
            **totals.model_dump(),
            "optimizer_steps": steps,
            "training_duration_seconds": seconds,
            "started_at": self._started_at,
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Continues the counts of a run saved with :meth:`state_dict` (a resumed run).

        The restored totals are added once to what this meter counts from now on (not once per
        rank). Counts this meter made before the call are kept.

        Raises:
            ConfigurationError: ``state`` is not a flopmeter state.
        """
        if not isinstance(state, Mapping) or state.get("format") != _STATE_FORMAT:
            raise ConfigurationError(f"Not a FlopMeter state (expected format {_STATE_FORMAT!r}).")
        try:
            self._prior = TokenTotals(**{k: int(state[k]) for k in TokenTotals.model_fields})
            self._prior_steps = int(state["optimizer_steps"])
            seconds = float(state["training_duration_seconds"])
        except (KeyError, TypeError, ValueError) as exc:
            raise ConfigurationError(f"Incomplete FlopMeter state: {exc}") from None
        if not math.isfinite(seconds) or seconds < 0:
            raise ConfigurationError("FlopMeter state has an invalid training duration.")
        self._prior_seconds = seconds
        self._started_at = state.get("started_at") or self._started_at

    # ----------------------------------------------------------------- helpers
    @staticmethod
    def _default_model_name(model: nn.Module) -> str:
        config = getattr(model, "config", None)
        name = getattr(config, "name_or_path", None) or getattr(config, "_name_or_path", None)
        return str(name) if name else type(model).__name__


def _version() -> str:
    from flopmeter import __version__

    return __version__
