"""A run's saved state: its format, the checks a checkpoint's counts must pass, and what it says
of their compute.

:meth:`flopmeter.counting.counters.RunCounters.state_dict` writes the state (``FlopMeter.state_dict``
adds the run's start, the model's identity and the saved compute); :func:`check_state` refuses, naming the field,
what no run can have produced before :meth:`~flopmeter.counting.counters.RunCounters.load_state_dict`
adds the counts; :class:`RestoredCompute` is what the restored counts' checkpoint says of their
compute. Plain Python data only: no torch.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from flopmeter.counting.work_units import MAX_INPUT_SHAPES
from flopmeter.errors import ConfigurationError

__all__ = ["STATE_FORMAT", "RestoredCompute", "check_state"]

#: The ``format`` of :meth:`~flopmeter.counting.counters.RunCounters.state_dict` (and so of
#: ``FlopMeter.state_dict``).
STATE_FORMAT = "flopmeter.meter/1"
#: The estimates a saved state may name as the earlier session's primary one.
_ESTIMATE_NAMES = ("seed", "six_nd", "transformer", "measured")


@dataclass(frozen=True)
class RestoredCompute:
    """What a checkpoint says of the compute of the counts it holds (``FlopMeter.state_dict``
    since flopmeter 0.2; every field ``None`` or empty in an older state).

    Attributes:
        run_id: The run (session) that saved the state: the one a resumed run continues.
        flops: The primary figure of the saved counts, FLOP, as that session's report gave it
            (``None``: not saved, or withheld there).
        estimate: How it was measured (the primary estimate's name).
        sessions: Every session whose compute the saved counts hold, each once: run id -> the
            compute that session added, FLOP (its part of ``flops``).
        micro_batches: The saved counts' training micro-batches.
        tokens_processed: The saved counts' non-padding tokens.
    """

    run_id: str | None = None
    flops: float | None = None
    estimate: str | None = None
    sessions: Mapping[str, float] | None = None
    micro_batches: int = 0
    tokens_processed: int = 0


#: Counts every saved state holds.
_COUNT_FIELDS = (
    "tokens_processed",
    "tokens_seen",
    "sequences",
    "sum_sq_seq_len",
    "micro_batches",
    "optimizer_steps",
)
#: Counts a state saved before they were kept lacks (0 then): the decoder stream, items and
#: micro-batches not all text, shape keys beyond the kept ones (issue 20).
_OPTIONAL_COUNTS = (
    "micro_batches_unread",
    "micro_batches_inconsistent",
    "uncounted_steps",
    "decoder_tokens",
    "decoder_sum_sq_len",
    "cross_pairs",
    "items",
    "non_text_micro_batches",
    "input_shapes_dropped",
)
#: The modalities a saved state may count micro-batches of (flopmeter.counting.work_units.Modality).
_MODALITIES = ("text", "image", "audio", "items")


def _count(state: Mapping[str, Any], name: str, *, required: bool = True) -> int:
    value = state.get(name)
    if value is None and not required:
        return 0
    if value is None:
        raise ConfigurationError(f"FlopMeter state: {name!r} is missing.")
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise ConfigurationError(
            f"FlopMeter state: {name!r} must be a whole number, got {value!r}."
        )
    if value < 0:
        raise ConfigurationError(f"FlopMeter state: {name!r} must not be negative, got {value}.")
    return int(value)


def _seen_sq(state: Mapping[str, Any], tokens_seen: int) -> int | None:
    """The saved padded squared lengths, checked (between ``tokens_seen`` and its square);
    None (unknown) in a state saved before they were kept, when it has tokens."""
    if state.get("sum_sq_seq_len_seen") is None and tokens_seen > 0:
        return None
    value = _count(state, "sum_sq_seq_len_seen", required=False)
    if not tokens_seen <= value <= tokens_seen**2:
        raise ConfigurationError(
            f"FlopMeter state: 'sum_sq_seq_len_seen' ({value}) is impossible against "
            "tokens_seen and its square."
        )
    return value


def check_state(
    state: object, model: Mapping[str, Any] | None = None, *, allow_other_model: bool = False
) -> dict[str, Any]:
    """A saved meter state, checked: refuses what no run can have produced, and (given the
    meter's ``model`` identity: its name and parameter count) a state saved for another model
    unless ``allow_other_model``.

    Counts are whole, non-negative numbers (not bools or fractions); non-padding tokens do not
    exceed tokens; sequences do not exceed non-padding tokens; the sum of squared lengths lies
    between the tokens and their square; the duration is a finite, non-negative number of
    seconds; ``started_at`` is an ISO 8601 time or null.

    Returns:
        The checked values (``micro_batches_unread``/``_inconsistent`` 0 when absent).

    Raises:
        ConfigurationError: ``state`` is not a flopmeter state, or a field is impossible; the
            message names the field.
    """
    if not isinstance(state, Mapping) or state.get("format") != STATE_FORMAT:
        raise ConfigurationError(f"Not a FlopMeter state (expected format {STATE_FORMAT!r}).")
    out: dict[str, Any] = {name: _count(state, name) for name in _COUNT_FIELDS}
    out.update({name: _count(state, name, required=False) for name in _OPTIONAL_COUNTS})
    out["sum_sq_seq_len_seen"] = _seen_sq(state, out["tokens_seen"])
    rules = (
        ("tokens_processed", out["tokens_processed"] <= out["tokens_seen"], "tokens_seen"),
        ("sequences", out["sequences"] <= out["tokens_processed"], "tokens_processed"),
        (
            "sum_sq_seq_len",
            out["tokens_processed"] <= out["sum_sq_seq_len"] <= out["tokens_processed"] ** 2,
            "tokens_processed and its square",
        ),
    )
    rules += (
        (
            "decoder_sum_sq_len",
            out["decoder_tokens"] <= out["decoder_sum_sq_len"] <= out["decoder_tokens"] ** 2,
            "decoder_tokens and its square",
        ),
        (
            "non_text_micro_batches",
            out["non_text_micro_batches"] <= out["micro_batches"],
            "micro_batches",
        ),
    )
    for name, holds, bound in rules:
        if not holds:
            raise ConfigurationError(
                f"FlopMeter state: {name!r} ({out[name]}) is impossible against {bound}."
            )
    seconds = state.get("training_duration_seconds")
    if isinstance(seconds, bool) or not isinstance(seconds, numbers.Real):
        raise ConfigurationError(
            f"FlopMeter state: 'training_duration_seconds' must be a number, got {seconds!r}."
        )
    if not math.isfinite(seconds) or seconds < 0:
        raise ConfigurationError(
            f"FlopMeter state: 'training_duration_seconds' must be finite and non-negative, "
            f"got {seconds!r}."
        )
    out["training_duration_seconds"] = float(seconds)
    out["input_shapes"] = _input_shapes(state.get("input_shapes"), out)
    out["modality_micro_batches"] = _modalities(state.get("modality_micro_batches"), out)
    out["started_at"] = _iso_time(state.get("started_at"))
    out.update(_saved_compute(state))
    saved = state.get("model")
    if model is not None and saved is not None and saved != model and not allow_other_model:
        raise ConfigurationError(
            f"FlopMeter state: 'model' is {saved!r}, but this meter measures {dict(model)!r}. "
            "Pass allow_other_model=True to continue its counts on this model anyway."
        )
    return out


def _input_shapes(value: object, counts: Mapping[str, int]) -> tuple[dict[str, Any], ...]:
    """The saved shape keys' counts, checked: at most MAX_INPUT_SHAPES distinct keys of whole,
    non-negative counts, whose micro-batches (with the dropped ones) do not exceed the run's."""
    if value is None:
        return ()
    if isinstance(value, (str, bytes, Mapping)) or not isinstance(value, (list, tuple)):
        raise ConfigurationError(
            f"FlopMeter state: 'input_shapes' must be a list of shape counts, got {value!r}."
        )
    out = []
    for i, entry in enumerate(value):
        name = f"input_shapes[{i}]"
        if not isinstance(entry, Mapping) or not isinstance(entry.get("key"), str):
            raise ConfigurationError(
                f"FlopMeter state: {name!r} must have a key, micro_batches and items, "
                f"got {entry!r}."
            )
        out.append(
            {
                "key": entry["key"],
                "micro_batches": _count(entry, "micro_batches"),
                "items": _count(entry, "items"),
            }
        )
    keys = [e["key"] for e in out]
    if len(set(keys)) != len(keys) or len(keys) > MAX_INPUT_SHAPES:
        raise ConfigurationError(
            f"FlopMeter state: 'input_shapes' must hold at most {MAX_INPUT_SHAPES} distinct keys."
        )
    total = sum(e["micro_batches"] for e in out) + counts["input_shapes_dropped"]
    if total > counts["micro_batches"]:
        raise ConfigurationError(
            f"FlopMeter state: 'input_shapes' ({total} micro-batches with the dropped ones) is "
            f"impossible against micro_batches ({counts['micro_batches']})."
        )
    return tuple(out)


def _modalities(value: object, counts: Mapping[str, int]) -> dict[str, int]:
    """The saved micro-batches per modality, checked (empty in a state saved before them)."""
    if value is None:
        return {}
    if not isinstance(value, Mapping) or not set(value) <= set(_MODALITIES):
        raise ConfigurationError(
            f"FlopMeter state: 'modality_micro_batches' must map {_MODALITIES} to counts, "
            f"got {value!r}."
        )
    out = {m: _count(value, m) for m in value}
    if sum(out.values()) > counts["micro_batches"]:
        raise ConfigurationError(
            "FlopMeter state: 'modality_micro_batches' is impossible against micro_batches "
            f"({counts['micro_batches']})."
        )
    return out


def _flops(value: object, name: str) -> float | None:
    """A saved figure, FLOP: ``None``, or a finite, non-negative number."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise ConfigurationError(f"FlopMeter state: {name!r} must be a number, got {value!r}.")
    if not math.isfinite(value) or value < 0:
        raise ConfigurationError(
            f"FlopMeter state: {name!r} must be finite and non-negative, got {value!r}."
        )
    return float(value)


def _saved_compute(state: Mapping[str, Any]) -> dict[str, Any]:
    """The saved state's run id, primary figure, its estimate and the sessions' compute, checked
    (each ``None`` when absent: a state saved before flopmeter 0.2)."""
    run_id = state.get("run_id")
    if run_id is not None and (not isinstance(run_id, str) or not run_id.strip()):
        raise ConfigurationError(f"FlopMeter state: 'run_id' must be a run id, got {run_id!r}.")
    estimate = state.get("primary_estimate_saved")
    if estimate is not None and estimate not in _ESTIMATE_NAMES:
        raise ConfigurationError(
            f"FlopMeter state: 'primary_estimate_saved' must be one of {_ESTIMATE_NAMES}, "
            f"got {estimate!r}."
        )
    sessions = state.get("sessions_flops_saved")
    checked: dict[str, float] | None = None
    if sessions is not None:
        if not isinstance(sessions, Mapping) or not all(isinstance(k, str) for k in sessions):
            raise ConfigurationError(
                "FlopMeter state: 'sessions_flops_saved' must map run ids to FLOP, got "
                f"{sessions!r}."
            )
        checked = {}
        for key, value in sessions.items():
            figure = _flops(value, f"sessions_flops_saved.{key}")
            if figure is None:
                raise ConfigurationError(
                    f"FlopMeter state: 'sessions_flops_saved.{key}' must be a number of FLOP."
                )
            checked[key] = figure
    return {
        "run_id": run_id,
        "primary_flops_saved": _flops(state.get("primary_flops_saved"), "primary_flops_saved"),
        "primary_estimate_saved": estimate,
        "sessions_flops_saved": checked,
    }


def _iso_time(value: object) -> str | None:
    if value is None:
        return None
    if isinstance(value, str):
        try:
            datetime.fromisoformat(value)
        except ValueError:
            pass
        else:
            return value
    raise ConfigurationError(
        f"FlopMeter state: 'started_at' must be an ISO 8601 time or null, got {value!r}."
    )
