"""What a meter is made of besides its counters, made once from its options.

:func:`assemble` turns :class:`~flopmeter.options.MeterOptions` (which do no I/O) into the parts
that do: the parent runs' reports (read strictly, once per run), the original compute, the
resolved budget, the ledger archive (the ledger opened for writing, so a bad one fails now) and
the hardware tracker. The meter calls it when it is made, before any training.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

from flopmeter.budget.resolve import Budget, resolve_budget
from flopmeter.compliance.original import OriginalCompute
from flopmeter.compliance.parents import parent_flops
from flopmeter.compliance.thresholds import determine_threshold
from flopmeter.errors import ConfigurationError
from flopmeter.hardware.tracker import HardwareTracker
from flopmeter.internals import config_name_or_path
from flopmeter.ledger.archive import RunArchive
from flopmeter.ledger.store import Ledger
from flopmeter.options import MeterOptions
from flopmeter.report.parent_runs import read_parent_runs
from flopmeter.types import ParentRun

__all__ = [
    "RunParts",
    "assemble",
    "budget_of",
    "check_pad_id",
    "default_model_id",
    "default_model_name",
    "vocabulary_size",
]


def default_model_id(model: Any) -> str | None:
    """The ``name_or_path`` of the model's ``config`` (or of its ``model.config``, as in a
    LightningModule holding a Hugging Face model): the id the catalogue looks up; ``None``."""
    for holder in (model, getattr(model, "model", None)):
        config = getattr(holder, "config", None)
        name = config_name_or_path(config)
        if name:
            return str(name)
    return None


def default_model_name(model: Any) -> str:
    """:func:`default_model_id`, else the model's class name."""
    return default_model_id(model) or type(model).__name__


def vocabulary_size(model: Any) -> int | None:
    """The token ids ``model`` embeds: its input embedding's rows (``get_input_embeddings``),
    else its config's ``vocab_size`` (or its text config's); ``None`` when neither says."""
    try:
        embedding = model.get_input_embeddings() if hasattr(model, "get_input_embeddings") else None
        rows = getattr(embedding, "num_embeddings", None)
        if isinstance(rows, int) and rows > 0:
            return rows
        config = getattr(model, "config", None)
        text = getattr(config, "text_config", None) or config
        size = getattr(text, "vocab_size", None)
    except Exception:  # a wrapper whose lookups raise: not known
        return None
    return size if isinstance(size, int) and not isinstance(size, bool) and size > 0 else None


def check_pad_id(model: Any, pad_id: int | None) -> None:
    """Refuses a pad id the model cannot embed (``pad_id >= vocabulary_size``), when its
    vocabulary is known: no input token can be padding then, so every position would count.

    Raises:
        ConfigurationError: naming the pad id and the vocabulary size.
    """
    size = None if pad_id is None else vocabulary_size(model)
    if size is not None and pad_id is not None and pad_id >= size:
        raise ConfigurationError(
            f"pad_id={pad_id} is outside the model's vocabulary of {size} token ids (0 to "
            f"{size - 1}), so no input token could be padding. Give the tokenizer's pad token "
            "id (tokenizer.pad_token_id), after any resize of the embeddings."
        )


@dataclass(frozen=True)
class RunParts:
    """The parts of one metered run that its options name.

    Attributes:
        parents: The parent runs, as read.
        original: The original model's compute (and the catalogue's figure).
        budget: The resolved compute budget, ``None`` without one.
        archive: Where the final report goes besides its file (ledger, sinks).
        hardware: The hardware tracker (NVML monitor, hardware fields).
    """

    parents: tuple[ParentRun, ...]
    original: OriginalCompute
    budget: Budget | None
    archive: RunArchive
    hardware: HardwareTracker


def budget_of(
    options: MeterOptions, original: OriginalCompute, parents: tuple[ParentRun, ...]
) -> Budget | None:
    """The compute budget resolved (``None`` without one): for ``budget="threshold"``, the
    threshold and the parents' compute as the report takes them (``determine_threshold`` of the
    original compute, ``parent_flops`` of the parents; see ``reporting._judgement``).

    Raises:
        ConfigurationError: ``"threshold"`` when the parents' compute is unknown, or when they
            have used the budget up (see :func:`flopmeter.budget.resolve_budget`).
    """
    threshold = rule = None
    if options.budget == "threshold":
        chosen = determine_threshold(
            original.flops, original_systemic_risk=options.original_systemic_risk
        )
        threshold, rule = chosen.value, chosen.kind
    return resolve_budget(
        options.budget,
        options.budget_action,
        threshold_flops=threshold,
        parents_flops=parent_flops(parents),
        threshold_rule=rule,
    )


def _ledger_waits(options: MeterOptions) -> bool:
    """Whether a ledger that cannot be written is a note in the report, not a refusal: under
    zero-code metering (``FLOPMETER_AUTO``), for the ledger the environment names
    (``FLOPMETER_LEDGER``, not an argument), nothing the job's environment says may leave its
    training unmetered. ``flopmeter run`` refuses such a ledger before the command starts."""
    from flopmeter.auto import SWITCH_ENV, switched_on

    return "ledger" not in options.given and switched_on(os.environ.get(SWITCH_ENV))


def assemble(options: MeterOptions, model_id: str | None) -> RunParts:
    """The run's parts from its options (reads the parents, opens the ledger).

    Args:
        options: The meter's options.
        model_id: The id the catalogue looks up (the option, or the model config's).

    Raises:
        ConfigurationError: a parent run cannot be read, the ledger cannot be opened (under
            zero-code metering, the environment's ledger is a note instead), or the budget
            cannot be resolved.
        MissingExtraError: NVML is required and ``nvidia-ml-py`` is not installed.
    """
    parents = read_parent_runs(options.parent_runs, options.output)
    original = options.original_compute(model_id)
    budget = budget_of(options, original, parents)
    archive = RunArchive(options.ledger, options.sinks, options.sink_timeout_seconds)
    if options.ledger is not None:
        try:
            Ledger(options.ledger)  # makes it (and its folder), or raises naming the file
        except ConfigurationError as exc:
            if not _ledger_waits(options):
                raise
            archive.unwritable_at_start(exc)  # metered all the same, and the report says so
    hardware = HardwareTracker(
        nvml=options.nvml,
        peak_flops=options.peak_flops,
        dtype=options.dtype,
        interval_seconds=options.nvml_interval_seconds,
    )
    return RunParts(parents, original, budget, archive, hardware)
