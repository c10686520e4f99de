"""A hand-made valid report and the files that are not a flopmeter report.

The valid report's figures are worked out by hand: 6ND with N = 1e12 and D = 5e9 is 3e22 FLOP;
the threshold with the original compute unknown is 1e23 / 3 FLOP; 3e22 is 0.9 of it, not above
it, but 3e22 x 1.3 = 3.9e22 is, so the verdict is near_threshold.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from flopmeter.report import FlopReport
from flopmeter.types import Estimate

#: Reports written by flopmeter's schema 1.2 (before 2.0), kept as they were written.
V1_REPORTS = Path(__file__).parents[1] / "data" / "v1"


def valid_report(**overrides: Any) -> FlopReport:
    """A completed report whose figures agree (see the module docstring)."""
    fields: dict[str, Any] = dict(
        model={
            "name": "hand-made",
            "n_total": 1_000_000_000_000,
            "n_trainable": 10_000_000_000,
            "n_frozen": 990_000_000_000,
            "n_embedding": 1_000_000,
            "n_active": 1_000_000_000_000,
        },
        run={
            "run_id": "run-1",
            "status": "completed",
            "started_at": "2026-01-01T00:00:00+00:00",
            "ended_at": "2026-01-01T01:00:00+00:00",
            "updated_at": "2026-01-01T01:00:00+00:00",
            "pid": 4242,
            "hostname": "trainer-7",
            "training_duration_seconds": 3600.0,
            "world_size": 8,
        },
        tokens={
            "tokens_processed": 5_000_000_000,
            "tokens_seen": 6_000_000_000,
            "sequences": 2_000_000,
            "sum_sq_seq_len": 15_000_000_000_000,
            "micro_batches": 250_000,
            "optimizer_steps": 31_250,
        },
        compute={
            "primary_flops": 3.0e22,
            "primary_estimate": "six_nd",
            "estimates": {
                "six_nd": Estimate(flops=3.0e22, method="six_nd", formula="6 * n_total * D"),
                "seed": Estimate(flops=2.01e22, method="seed", formula="(4N + 2N_trainable) * D"),
            },
        },
        threshold={
            "threshold_flops": 1e23 / 3,
            "kind": "default_gpai",
            "source": "Commission Guidelines C(2025) 5045, section 3.2",
        },
        verdict={
            "ratio_to_threshold": 0.9,
            "exceeds_threshold": False,
            "outcome": "near_threshold",
        },
    )
    fields = merged(fields, overrides)
    lineage = fields.get("lineage", {})
    if "judged_flops" not in fields["verdict"]:  # with parent runs the cumulative figure
        parents = lineage.get("parent_runs")
        judged = lineage.get("cumulative_flops") if parents else fields["compute"]["primary_flops"]
        fields["verdict"]["judged_flops"] = judged
    return FlopReport(**fields)


def merged(fields: dict[str, Any], overrides: dict[str, Any]) -> dict[str, Any]:
    """``fields`` with ``overrides``: a section given as a dict updates that section's fields."""
    out = {key: dict(value) if isinstance(value, dict) else value for key, value in fields.items()}
    for key, value in overrides.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = {**out[key], **value}
        else:
            out[key] = value
    return out


def valid_data(**overrides: Any) -> dict[str, Any]:
    """The valid report as the JSON object its file holds."""
    return json.loads(valid_report(**overrides).to_json())


def write_data(folder: Path, data: object) -> Path:
    """Writes ``data`` as JSON to ``folder``/flops_meter.json."""
    path = folder / "flops_meter.json"
    path.write_text(json.dumps(data, indent=2), encoding="utf-8")
    return path


@dataclass(frozen=True)
class Bad:
    """A file that is not a flopmeter report, and what the error must name."""

    id: str
    make: Callable[[Path], Path]  # writes the file under a folder, returns the path to read
    field: str | None  # the field the message names (None: the file as a whole)
    says: str  # a fragment of the message


def _edited(edit: Callable[[dict[str, Any]], None]) -> Callable[[Path], Path]:
    def make(folder: Path) -> Path:
        data = valid_data()
        edit(data)
        return write_data(folder, data)

    return make


def _set(**changes: Any) -> Callable[[Path], Path]:
    """Sets fields of the file: top-level ones by name, a section's as ``section={...}``."""
    return _edited(lambda data: data.update(merged(data, changes)))


def _drop(path: str) -> Callable[[Path], Path]:
    """Drops a field, named by its path (``"tokens.tokens_seen"``)."""
    *sections, key = path.split(".")

    def drop(data: dict[str, Any]) -> None:
        for section in sections:
            data = data[section]
        data.pop(key)

    return _edited(drop)


def _raw(content: bytes) -> Callable[[Path], Path]:
    def make(folder: Path) -> Path:
        path = folder / "flops_meter.json"
        path.write_bytes(content)
        return path

    return make


def _huge_duration(folder: Path) -> Path:
    """A number too large for a float (1e400 parses as infinity)."""
    text = json.dumps(valid_data(run={"training_duration_seconds": 1.0})).replace(
        '"training_duration_seconds": 1.0', '"training_duration_seconds": 1e400'
    )
    return _raw(text.encode())(folder)


def _aws_file(folder: Path) -> Path:
    return write_data(
        folder,
        {
            "N_total": 24800,
            "N_trainable": 24800,
            "tokens_processed": " 8",
            "Flops_architecture": " 1190400",
            "threshold_type": "default_3.3e22",
            "pct_of_pretrain": 3.6e-17,
            "exceeds_30pct": False,
        },
    )


def _estimate_edit(key: str, value: Any) -> Callable[[Path], Path]:
    return _edited(lambda data: data["compute"]["estimates"]["seed"].update({key: value}))


def _estimate_drop(key: str) -> Callable[[Path], Path]:
    return _edited(lambda data: data["compute"]["estimates"]["seed"].pop(key))


VALID_TEXT = valid_report().to_json().encode()

BAD = [
    # the file itself
    Bad("missing file", lambda d: d / "nothing.json", None, "no such file"),
    Bad("folder without a report", lambda d: d, None, "no such file"),
    Bad("truncated JSON", _raw(VALID_TEXT[: len(VALID_TEXT) // 2]), None, "not valid JSON"),
    Bad("empty file", _raw(b""), None, "not valid JSON"),
    Bad("not UTF-8", _raw(b'{"model_name": "\xff"}'), None, "not UTF-8"),
    Bad("JSON array", _raw(b"[1, 2]"), None, "JSON array, not a report"),
    Bad("JSON string", _raw(b'"flops"'), None, "JSON string, not a report"),
    Bad("NaN", _raw(b'{"schema_version": NaN}'), None, "NaN is not a JSON number"),
    Bad("key twice", _raw(b'{"a": 1, "a": 2}'), None, "'a' appears twice"),
    Bad("empty object", _raw(b"{}"), "schema_version", "missing"),
    Bad("AWS meter file", _aws_file, None, "AWS FlopsMeterCallback's file"),
    Bad("unknown schema", _set(schema_version="3.0"), "schema_version", 'unknown version "3.0"'),
    Bad("schema as number", _set(schema_version=1.1), "schema_version", "expected a string"),
    # fields
    Bad("missing field", _drop("tokens.tokens_seen"), "tokens.tokens_seen", "missing"),
    Bad("missing section", _drop("hardware"), "hardware", "missing"),
    Bad("unknown field", _set(flops_total=1.0), "flops_total", "unknown"),
    Bad("unknown field in a section", _set(compute={"flops_total": 1.0}), "compute.flops_total", "unknown"),
    Bad("1.x field in 2.0", _set(tokens_processed=1), "tokens_processed", "not a field of report schema 2.2"),
    Bad("2.0 file as 1.0", _set(schema_version="1.0"), "model_name", "missing"),
    Bad("estimate field missing", _estimate_drop("formula"), "compute.estimates.seed.formula", "missing"),
    Bad("estimate field unknown", _estimate_edit("unit", "FLOP"), "compute.estimates.seed.unit", "unknown"),
    # types
    Bad("int as string", _set(tokens={"tokens_processed": "12"}), "tokens.tokens_processed", 'an integer, got "12"'),
    Bad("int as float", _set(tokens={"micro_batches": 12.0}), "tokens.micro_batches", "an integer, got 12.0"),
    Bad("int as bool", _set(tokens={"optimizer_steps": True}), "tokens.optimizer_steps", "an integer, got true"),
    Bad("float as bool", _set(run={"training_duration_seconds": True}), "run.training_duration_seconds", "a number, got true"),
    Bad("float as string", _set(threshold={"threshold_flops": "3e22"}), "threshold.threshold_flops", "a number"),
    Bad("null not allowed", _set(tokens={"tokens_seen": None}), "tokens.tokens_seen", "null, but a meter attached to this run"),
    Bad("null time not allowed", _set(run={"training_duration_seconds": None}), "run.training_duration_seconds", "null, but a meter attached to this run"),
    Bad("string as number", _set(model={"name": 5}), "model.name", "a string, got 5"),
    Bad("bool as number", _set(verdict={"exceeds_threshold": 0}), "verdict.exceeds_threshold", "true or false, got 0"),
    Bad("unknown status", _set(run={"status": "done"}), "run.status", "one of 'running'"),
    Bad("list of numbers", _set(notes=[1]), "notes.0", "a string, got 1"),
    Bad("section not object", _set(tokens=3), "tokens", "an object, got 3"),
    Bad("estimate not object", _set(compute={"estimates": {"seed": 3}}), "compute.estimates.seed", "an object, got 3"),
    Bad("estimate flops string", _estimate_edit("flops", "2e22"), "compute.estimates.seed.flops", "a number"),
    # figures
    Bad("negative count", _set(tokens={"sequences": -1}), "tokens.sequences", "must not be negative"),
    Bad("negative figure", _set(hardware={"energy_joules": -5.0}), "hardware.energy_joules", "must not be negative"),
    Bad("infinite figure", _huge_duration, "run.training_duration_seconds", "must be finite"),
    Bad("no rank", _set(run={"world_size": 0}), "run.world_size", "at least 1"),
    Bad("more tokens than seen", _set(tokens={"tokens_processed": 7_000_000_000}), "tokens.tokens_processed", "more than tokens_seen"),
    Bad("final without end", _set(run={"ended_at": None}), "run.ended_at", "null while status is 'completed'"),
    Bad("interrupted without end", _set(run={"status": "interrupted", "ended_at": None}), "run.ended_at", "'interrupted'"),
    Bad("primary differs", _set(compute={"primary_flops": 2.9e22}), "compute.primary_flops", "is not estimates.six_nd.flops"),
    Bad("primary missing", _set(compute={"primary_estimate": "transformer"}), "compute.primary_estimate", "not in estimates"),
    Bad("flops without primary", _set(compute={"primary_estimate": None}), "compute.primary_flops", "primary_estimate is null"),
    Bad("estimate under another name", _estimate_edit("method", "six_nd"), "compute.estimates.seed.method", "not the estimate's key"),
    Bad("threshold not the rule's", _set(threshold={"threshold_flops": 1e22}), "threshold.threshold_flops", "rules give for original_flops null"),
    Bad("threshold kind not the rule's", _set(threshold={"original_flops": 6e24}), "threshold.threshold_flops", "one_third_of_original"),
    Bad("threshold half null", _set(threshold={"kind": None}), "threshold.kind", "null while"),
    Bad("judged not the primary", _set(verdict={"judged_flops": 2.9e22}), "verdict.judged_flops", "is not compute.primary_flops"),
    Bad("exceeds wrong", _set(verdict={"exceeds_threshold": True}), "verdict.exceeds_threshold", "not above"),
    Bad("verdict wrong", _set(verdict={"outcome": "below_threshold"}), "verdict.outcome", "the figures give 'near_threshold'"),
    Bad("ratio wrong", _set(verdict={"ratio_to_threshold": 0.8}), "verdict.ratio_to_threshold", "compute.primary_flops / threshold.threshold_flops"),
    Bad("verdict half null", _set(verdict={"outcome": None}), "verdict.outcome", "null while"),
    Bad("verdict without compute", _set(compute={"primary_flops": None, "primary_estimate": None}, verdict={"judged_flops": None}), "verdict.outcome", "compute.primary_flops is null"),
    Bad("budget without its figure", _set(budget={"source": "argument"}), "budget.budget_flops", "missing"),
]  # fmt: skip
