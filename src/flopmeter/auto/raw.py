"""Zero-code metering of a raw PyTorch loop: the model found by its first optimizer.

:func:`patch_torch` runs at the end of ``import torch`` (the import watch) and only wraps two
functions, importing nothing of the meter:

* ``torch.optim.Optimizer.__init__`` (every optimizer class passes through it): when the first
  optimizer of the process has been built, the module it trains is found
  (:func:`flopmeter.auto.raw_model.find_model`) and a :class:`~flopmeter.FlopMeter` starts on
  it, before the loop's first forward, as ``with FlopMeter(model)`` after building the
  optimizer would. Its report file is claimed only at that optimizer's first step: a meter the
  script starts before then (the edited script) takes over with no trace of this one;
  one it starts later finds this one's final report kept aside, as any other run's;
* ``torch.distributed.destroy_process_group``: the meter stops first (the final report sums
  the ranks: every rank calls it at the same point, and the collective needs the group).

At process exit (``atexit``) a meter still running stops: ``failed`` with the error when the
script died of an exception (this rank's counts), else ``completed`` (summed over the ranks
when the group is still up). No meter attaches when the optimizer is built inside a Hugging
Face or Lightning ``Trainer`` (their own zero-code paths meter those), or when a meter the
script made is running; and when any other meter starts, this one stands down.
"""

from __future__ import annotations

import atexit
import functools
import logging
import os
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

from flopmeter.auto.job import problem, record
from flopmeter.auto.watch import WRAPPED, after_init
from flopmeter.internals import find_caller_local

__all__ = ["patch_torch"]

logger = logging.getLogger("flopmeter")

_TRAINERS = (
    ("transformers.trainer", "Trainer"),
    ("lightning.pytorch.trainer.trainer", "Trainer"),
    ("pytorch_lightning.trainer.trainer", "Trainer"),
)


class _State:
    """This process's zero-code raw-loop metering (one per process)."""

    def __init__(self) -> None:
        self.patched = False
        self.first_seen = False  # the first optimizer of the process was looked at
        self.meter: Any = None  # the zero-code meter, while it runs
        self.optimizer_name = ""
        self.claim_handle: Any = None
        self.committed = False  # the meter's file claimed (rank 0) and its start recorded
        self.noted: set[int] = set()  # later optimizers already noted
        self.pid = os.getpid()  # the process the meter attached in (a forked child is not it)
        self.loose_names: list[str] = []  # earlier optimizers no module holds the tensors of
        self.loose_steps = 0  # their steps, so far
        self.loose_told: Any = None  # the meter told of them


_state = _State()


def patch_torch(module: ModuleType) -> None:
    """Called by the import watch once ``torch`` is imported: wraps the optimizer's
    constructor and ``destroy_process_group`` (idempotent; never raises)."""
    if _state.patched:
        return
    _state.patched = True
    try:
        optimizer_cls = module.optim.Optimizer
        after_init(optimizer_cls, _on_optimizer, "optimizer attach")
        dist = getattr(module, "distributed", None)
        destroy = getattr(dist, "destroy_process_group", None)
        if destroy is not None and not getattr(destroy, WRAPPED, False):
            dist.destroy_process_group = _wrap_destroy(destroy)
    except Exception as exc:  # the job goes on unmetered
        logger.warning("flopmeter: zero-code raw-loop metering is off: %s", exc)


def _wrap_destroy(original: Any) -> Any:
    @functools.wraps(original)
    def destroy_process_group(*args: Any, **kwargs: Any) -> Any:
        group = args[0] if args else kwargs.get("group")
        if group is None and _state.meter is not None:
            _stop(sys.exc_info()[1], "destroy_process_group")
        return original(*args, **kwargs)

    setattr(destroy_process_group, WRAPPED, True)
    return destroy_process_group


def _stepped(optimizer: Any) -> list[Any]:
    out: dict[int, Any] = {}
    for group in optimizer.param_groups:
        for p in group["params"]:
            out.setdefault(id(p), p)
    return list(out.values())


def _inside_trainer() -> str | None:
    """The Hugging Face or Lightning Trainer class building this optimizer, if one is in the
    caller's frames (only classes already imported are looked for)."""
    classes = tuple(
        cls
        for name, attr in _TRAINERS
        if isinstance(cls := getattr(sys.modules.get(name), attr, None), type)
    )
    if not classes:
        return None
    owner = find_caller_local("self", lambda v: isinstance(v, classes), skip=2, depth=None)
    return None if owner is None else type(owner).__name__


def _on_optimizer(optimizer: Any) -> None:
    if _state.first_seen:
        _note_later(optimizer)
        return
    _state.first_seen = True
    if _inside_trainer() is not None:
        return  # the Trainer's own zero-code path meters it
    from flopmeter.auto.attaching import attach_section, explicit_meters

    name = type(optimizer).__name__
    explicit = explicit_meters()
    if explicit:
        output = explicit[0].output
        record("explicit", report=None if output is None else os.path.abspath(output))
        return
    from flopmeter.auto.raw_model import find_model, parameter_count

    stepped = _stepped(optimizer)
    found = find_model(stepped)
    if found.module is None:
        reason = f"the first optimizer ({name}) was built, but {found.reason}"
        logger.warning("flopmeter: zero-code metering did not attach: %s", reason)
        record("not_attached", method="optimizer", reason=reason)
        _keep_looking(optimizer)
        return
    model = found.module
    unseen = any(getattr(p, "grad", None) is not None for p in stepped)
    sentence = (
        f"{type(model).__name__} ({parameter_count(model):,} parameters): the module holding "
        f"every parameter the first {name} steps, found when it was built"
    )
    if found.ambiguous > 1:
        sentence += f" (one of {found.ambiguous} unrelated modules holding them all)"
    if unseen:
        sentence += (
            "; its parameters had gradients already, so training micro-batches ran before "
            "the meter and are in no count"
        )
    meter = _make_meter(model, name)
    if meter is None:
        return
    meter.note_attach(
        attach_section("optimizer", sentence, model=model, unseen_micro_batches=unseen)
    )
    from flopmeter.run import events as meter_events

    meter_events.add_listener(_on_meter_starting)
    _state.meter, _state.optimizer_name, _state.pid = meter, name, os.getpid()
    _tell_loose()
    meter.begin(claim_file=False)
    _state.claim_handle = optimizer.register_step_pre_hook(_on_first_step)
    atexit.register(_at_exit)


def _keep_looking(optimizer: Any) -> None:
    """An optimizer no module holds the tensors of (a throwaway LBFGS over a bare tensor)
    leaves the search open: the next optimizer built is looked at as the first. Its steps are
    counted; a meter that attaches later says that compute is in no count (withheld verdict)."""
    _state.first_seen = False
    _state.loose_names.append(type(optimizer).__name__)
    optimizer.register_step_post_hook(_on_loose_step)


def _on_loose_step(optimizer: Any, args: Any, kwargs: Any) -> None:
    _state.loose_steps += 1
    _tell_loose()


def _tell_loose() -> None:
    """The zero-code meter told, once, that a loose optimizer stepped (compute in no count)."""
    meter = _state.meter
    if meter is None or not _state.loose_steps or _state.loose_told is meter:
        return
    _state.loose_told = meter
    names = " and ".join(sorted(set(_state.loose_names)))
    meter.uncounted(
        f"an optimizer no module holds the tensors of ({names}) stepped: the compute of what "
        "trains those tensors"
    )


def _make_meter(model: Any, optimizer_name: str) -> Any:
    from flopmeter import FlopMeter
    from flopmeter.auto import default_report_folder
    from flopmeter.auto.env_options import options_from_env
    from flopmeter.auto.raw_model import pad_id_of_model
    from flopmeter.report.output_path import DEFAULT_FILENAME

    options = options_from_env()
    if options.get("pad_id") is None:
        options["pad_id"] = pad_id_of_model(model)
    if options.get("output") is None:
        options["output"] = Path(default_report_folder()) / DEFAULT_FILENAME
    try:
        return FlopMeter(model, **options)
    except Exception as exc:
        reason = f"the meter could not be made for the first {optimizer_name}: {exc}"
        logger.warning("flopmeter: zero-code metering did not attach: %s", reason)
        record("not_attached", method="optimizer", reason=reason)
        return None


def _note_later(optimizer: Any) -> None:
    meter = _state.meter
    if meter is None or id(optimizer) in _state.noted:
        return
    _state.noted.add(id(optimizer))
    metered = {id(p) for p in meter.model.parameters()}
    outside = [p for p in _stepped(optimizer) if id(p) not in metered]
    if outside:
        meter.uncounted(
            f"a later optimizer ({type(optimizer).__name__}) steps {len(outside)} parameter "
            f"tensors outside the metered {type(meter.model).__name__}: the compute of what "
            "trains them"
        )


def _commit() -> None:
    """The zero-code meter's report file claimed (rank 0) and its start recorded."""
    meter = _state.meter
    if _state.claim_handle is not None:
        _state.claim_handle.remove()
        _state.claim_handle = None
    if meter is None or _state.committed:
        return
    _state.committed = True
    try:
        meter.claim_file()
    except Exception as exc:  # its file cannot be written: no meter rather than no report
        _state.meter = None
        meter.stand_down(f"its report file could not be claimed: {exc}")
        record("not_attached", method="optimizer", reason=f"the report file: {exc}")
        return
    attach = meter.attach
    record(
        "attached",
        method="optimizer",
        report=None if meter.output is None else os.path.abspath(meter.output),
        trainer_class=None,
        model_class=None if attach is None else attach.model_class,
    )


def _on_first_step(optimizer: Any, args: Any, kwargs: Any) -> None:
    try:
        meter = _state.meter
        if meter is not None and meter.census is None:  # no training forward of it yet
            meter.add_note(
                f"No training forward of the metered {type(meter.model).__name__} came before "
                "the first optimizer step: the loop may call the model through another module "
                "than the one found, whose compute is then in no count."
            )
        _commit()
    except Exception as exc:
        problem("first optimizer step", exc)


def _on_meter_starting(other: Any) -> None:
    meter = _state.meter
    if meter is None or other is meter:
        return
    try:
        from flopmeter.auto.attaching import is_zero_code

        if is_zero_code(other):
            reason = f"stood down: the {other.attach.method} zero-code meter took over"
        else:
            output = None if other.output is None else os.path.abspath(other.output)
            reason = f"stood down: the script started its own FlopMeter (report: {output})"
            record("explicit", report=output)
        _state.meter = None
        if _state.claim_handle is not None:
            _state.claim_handle.remove()
            _state.claim_handle = None
        meter.stand_down(reason)
    except Exception as exc:
        problem("standing down", exc)


def _stop(exc: BaseException | None, where: str) -> None:
    """Stops the zero-code meter (its final report), claiming its file first when no step
    came (a script that failed in its first micro-batch still gets its report)."""
    if _state.meter is None:
        return
    try:
        _commit()
        meter, _state.meter = _state.meter, None
        if meter is not None:
            meter.stop(exc)
    except Exception as err:
        _state.meter = None
        problem(where, err)


def _at_exit() -> None:
    if _state.pid != os.getpid():  # a child the loop forked: the meter and its run are the parent's
        return
    exc = getattr(sys, "last_value", None)
    if not isinstance(exc, BaseException):
        from flopmeter.auto.boot import exit_code

        code = exit_code()  # sys.exit(3) mid-run is a failed run, not a completed one
        exc = None if code in (None, 0) else SystemExit(code)
    _stop(exc, "the process's exit")
