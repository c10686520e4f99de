"""Schema 1.x reports as schema 2.0: one pure function, every field mapped, nothing dropped.

Schema 1.0 to 1.2 reports were flat JSON objects (one level of 66 fields); schema 2.0 groups
the same fields in sections and names them for what they hold. :data:`V1_FIELDS` maps each 1.x
field to its 2.0 place; :func:`upgrade_report` applies it. The strict reader
(:func:`flopmeter.report.reading.read_report`) and the ledger's cumulative view read 1.x reports
through it, so a 1.x report on a user's disk or in a ledger reads as 2.0. Schema 2.1 (the
``attach`` section, null token counts for a run no meter saw) only added to 2.0: a 2.0 object
reads as 2.1 unchanged (:func:`upgrade_report` copies it; the strict reader takes its missing
``attach`` as null).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from flopmeter.compliance.verdict import UNCERTAINTY_MARGIN

__all__ = [
    "SECTIONS",
    "V1_DEFAULTS",
    "V1_FIELDS",
    "UpgradeError",
    "is_v1",
    "report_value",
    "upgrade_note",
    "upgrade_report",
    "v1_name",
]

#: The sections of a 2.0 report, in order (``budget`` is null without a budget).
SECTIONS = (
    "run",
    "model",
    "tokens",
    "compute",
    "threshold",
    "verdict",
    "hardware",
    "budget",
    "lineage",
)

#: Each schema 1.x field -> (its 2.0 section, its 2.0 name); section ``""``: top level.
V1_FIELDS: dict[str, tuple[str, str]] = {
    "schema_version": ("", "schema_version"),
    "model_name": ("model", "name"),
    **{
        name: ("run", name)
        for name in (
            "run_id",
            "status",
            "error",
            "started_at",
            "ended_at",
            "updated_at",
            "pid",
            "hostname",
            "training_duration_seconds",
            "epochs",
            "world_size",
            "counts_scope",
            "torch_version",
            "flopmeter_version",
        )
    },
    **{
        name: ("model", name)
        for name in ("n_total", "n_trainable", "n_frozen", "n_embedding", "n_active")
    },
    **{
        name: ("tokens", name)
        for name in (
            "tokens_processed",
            "tokens_seen",
            "sequences",
            "sum_sq_seq_len",
            "micro_batches",
            "micro_batches_unread",
            "micro_batches_inconsistent",
            "optimizer_steps",
        )
    },
    "flops_architecture": ("compute", "primary_flops"),
    "primary_estimate": ("compute", "primary_estimate"),
    "primary_reason": ("compute", "primary_reason"),
    "estimates": ("compute", "estimates"),
    "measured_to_transformer_ratio": ("compute", "measured_to_transformer_ratio"),
    "withheld_reason": ("compute", "withheld_reason"),
    "pretrain_flops": ("threshold", "original_flops"),
    "pretrain_flops_source": ("threshold", "original_flops_source"),
    "catalog": ("threshold", "catalog"),
    "threshold_value": ("threshold", "threshold_flops"),
    "threshold_type": ("threshold", "kind"),
    "threshold_source": ("threshold", "source"),
    "verdict": ("verdict", "outcome"),
    "exceeds_threshold": ("verdict", "exceeds_threshold"),
    "ratio_to_threshold": ("verdict", "ratio_to_threshold"),
    "verdict_basis": ("verdict", "basis"),
    "uncertainty_margin": ("verdict", "uncertainty_margin"),
    "obligations": ("verdict", "obligations"),
    "gpu_name": ("hardware", "gpu_name"),
    "gpu_count": ("hardware", "gpu_count"),
    "peak_flops_per_second": ("hardware", "peak_flops_per_second"),
    "flops_hardware": ("hardware", "bound_flops"),
    "flops_hardware_utilization_weighted": ("hardware", "utilization_weighted_bound_flops"),
    "mfu": ("hardware", "mfu"),
    "energy_joules": ("hardware", "energy_joules"),
    "energy_kwh": ("hardware", "energy_kwh"),
    "average_power_watts": ("hardware", "average_power_watts"),
    "hardware_notes": ("hardware", "notes"),
    "budget_flops": ("budget", "budget_flops"),
    "budget_source": ("budget", "source"),
    "flops_at_stop": ("budget", "flops_at_stop"),
    "stopped_by_budget": ("budget", "stopped_by_budget"),
    "parent_runs": ("lineage", "parent_runs"),
    "cumulative_flops": ("lineage", "cumulative_flops"),
    "ancestor_flops": ("lineage", "ancestor_flops"),
    "notes": ("", "notes"),
    "disclaimer": ("", "disclaimer"),
}

#: What a 1.0 or 1.1 report lacks, as the writer of 1.2 would have written it (schema 1.1
#: added the run's identity, the writer, the uncounted micro-batches, ``primary_reason`` and
#: ``withheld_reason``; 1.2 the catalogue figure, the lineage, the margin, the verdict's basis
#: and the obligations).
V1_DEFAULTS: dict[str, Any] = {
    "run_id": None,
    "updated_at": None,
    "pid": None,
    "hostname": None,
    "micro_batches_unread": 0,
    "micro_batches_inconsistent": 0,
    "withheld_reason": None,
    "primary_reason": None,
    "catalog": None,
    "parent_runs": [],
    "cumulative_flops": None,
    "ancestor_flops": {},
    "uncertainty_margin": UNCERTAINTY_MARGIN,
    "verdict_basis": None,
    "obligations": [],
}

#: A budget section's fields besides ``budget_flops``, with the values a run without one has.
_NO_BUDGET = {"budget_source": None, "flops_at_stop": None, "stopped_by_budget": False}

#: The 2.0 place of each 1.x field, reversed: (section, name) -> the 1.x name.
_V2_TO_V1 = {place: old for old, place in V1_FIELDS.items()}


class UpgradeError(ValueError):
    """A 1.x report that cannot be upgraded: it names a field 1.x never had, or sets budget
    fields without a budget.

    Attributes:
        field: The 1.x field at fault.
    """

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field
        self.message = message


def is_v1(data: Mapping[str, Any]) -> bool:
    """Whether a report's JSON object is schema 1.x (a string ``schema_version`` ``"1.…"``)."""
    version = data.get("schema_version")
    return isinstance(version, str) and version.startswith("1.")


def v1_name(path: str) -> str:
    """The 1.x name of a 2.0 field path (``"compute.primary_flops"`` -> ``"flops_architecture"``);
    a path with no 1.x name (``"verdict.judged_flops"``, ``"compute.estimates.seed.flops"``) is
    given with its first 1.x field renamed where it has one, else as it is."""
    parts = path.split(".")
    if len(parts) >= 2 and (parts[0], parts[1]) in _V2_TO_V1:
        return ".".join([_V2_TO_V1[(parts[0], parts[1])], *parts[2:]])
    if len(parts) == 1 and ("", parts[0]) in _V2_TO_V1:
        return parts[0]
    return path


def upgrade_report(data: Mapping[str, Any]) -> dict[str, Any]:
    """A report's JSON object as schema 2.0 (a pure function; a 2.0 object comes back copied).

    Every 1.x field goes to its place in :data:`V1_FIELDS`; those a 1.0 or 1.1 report lacks
    get :data:`V1_DEFAULTS`, the values the 1.2 writer gave a run without them. Two 2.0 fields
    have no 1.x field: ``verdict.judged_flops`` is derived as 1.x readers derived it
    (``cumulative_flops`` when there are parent runs, else ``flops_architecture``), and
    ``budget`` is null when ``budget_flops`` is. ``schema_version`` becomes ``"2.0"``. The values
    are not checked here (the strict reader checks the result as it checks any 2.0 report).
    The version read is kept as a last note (:func:`upgrade_note`).

    Args:
        data: A report's JSON object, of schema 1.0, 1.1, 1.2 or 2.0.

    Returns:
        The 2.0 JSON object (new dicts; the values' lists and objects are shared with ``data``).

    Raises:
        UpgradeError: A 1.x object with a key no 1.x report has, or with budget fields set
            while ``budget_flops`` is null.
    """
    if not is_v1(data):
        return {k: (dict(v) if isinstance(v, Mapping) else v) for k, v in data.items()}
    flat = {**{k: v for k, v in V1_DEFAULTS.items() if k not in data}, **data}
    for key in flat:
        if key not in V1_FIELDS:
            raise UpgradeError(key, "not a field of report schema 1.x")
    out: dict[str, Any] = {"schema_version": "2.0"}
    out.update({section: {} for section in SECTIONS})
    for key, value in flat.items():
        section, name = V1_FIELDS[key]
        if section and key != "schema_version":
            out[section][name] = value
        elif key != "schema_version":
            out[name] = value
    notes = out.get("notes")
    if isinstance(notes, list):  # the one thing the 2.0 fields cannot hold: the version read
        out["notes"] = [*notes, upgrade_note(str(data["schema_version"]))]
    _nested_names(out)
    parents = flat.get("parent_runs")
    out["verdict"]["judged_flops"] = (
        flat.get("cumulative_flops") if parents else flat.get("flops_architecture")
    )
    budget = out["budget"]
    if budget.get("budget_flops") is None:
        for key, none in _NO_BUDGET.items():
            if key in flat and flat[key] != none:
                raise UpgradeError(key, f"{flat[key]!r} while budget_flops is null")
        out["budget"] = None
    return {key: out[key] for key in ("schema_version", *SECTIONS, "notes", "disclaimer")
            if key in out}  # fmt: skip


def upgrade_note(version: str) -> str:
    """The note an upgraded report carries: the schema version its file was written in."""
    return (
        f"Read from a report of schema {version} (flat field names), upgraded to schema 2.0 "
        "when read: the same fields under their 2.0 names."
    )


def report_value(data: Mapping[str, Any], path: str) -> Any:
    """A field of a report's JSON object of either schema, by its 2.0 path (``"model.name"``);
    ``None`` where the report has no such value (a section that is null, a missing key). Never
    raises: a 1.x object is read under the field's 1.x name, not upgraded as a whole."""
    if is_v1(data):
        if path == "verdict.judged_flops":
            key = "cumulative_flops" if data.get("parent_runs") else "flops_architecture"
            return data.get(key)
        parts = path.split(".")
        if len(parts) == 1:
            return data.get(path) if ("", path) in _V2_TO_V1 else None
        if (parts[0], parts[1]) not in _V2_TO_V1:
            return None
        value: Any = data.get(_V2_TO_V1[(parts[0], parts[1])])
        parts = parts[2:]
    else:
        value, parts = data, path.split(".")
    for part in parts:
        if not isinstance(value, Mapping):
            return None
        value = value.get(part)
    return value


def _renamed(entry: object) -> object:
    """A catalogue figure or parent entry of 1.x with its ``threshold_value`` as
    ``threshold_flops`` (the 2.0 name); anything else as it is."""
    if not isinstance(entry, Mapping) or "threshold_value" not in entry:
        return entry
    return {("threshold_flops" if k == "threshold_value" else k): v for k, v in entry.items()}


def _nested_names(out: dict[str, Any]) -> None:
    """The 2.0 names inside the nested objects of a 1.x report (in ``out``'s new dicts)."""
    out["threshold"]["catalog"] = _renamed(out["threshold"].get("catalog"))
    parents = out["lineage"].get("parent_runs")
    if isinstance(parents, list):
        out["lineage"]["parent_runs"] = [_renamed(p) for p in parents]
