"""Compares two folders of example reports (from scripts/example_reports), ignoring the fields
that differ between any two runs: timestamps, durations, ids and what is derived from them.

Reports of schema 1.x are compared under their 2.0 names (``upgrade_report``), so a folder
written before schema 2.0 compares with one written after it.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from flopmeter.report.upgrade import upgrade_note, upgrade_report

VOLATILE = {
    "started_at",
    "ended_at",
    "updated_at",
    "training_duration_seconds",
    "flopmeter_version",
    "run_id",
    "pid",
}


def _report(path: Path) -> object:
    """The report of ``path`` as schema 2.0, without the upgrade's note."""
    data = json.loads(path.read_text())
    if not isinstance(data, dict):
        return data
    version = data.get("schema_version")
    data = upgrade_report(data)
    if isinstance(version, str) and isinstance(data.get("notes"), list):
        data["notes"] = [n for n in data["notes"] if n != upgrade_note(version)]
    return data


def _clean(value: object) -> object:
    if isinstance(value, dict):
        return {k: _clean(v) for k, v in value.items() if k not in VOLATILE}
    if isinstance(value, list):
        return [_clean(v) for v in value]
    return value


def main(before: str, after: str) -> int:
    failed = 0
    for old in sorted(Path(before).glob("*.json")):
        new = Path(after) / old.name
        a = _clean(_report(old))
        b = _clean(_report(new)) if new.exists() else None
        same = a == b
        failed += not same
        print(f"{'same' if same else 'DIFFERENT'}  {old.name}")
        if not same and isinstance(a, dict) and isinstance(b, dict):
            for key in sorted(set(a) | set(b)):
                if a.get(key) != b.get(key):
                    print(f"    {key}: {a.get(key)!r}\n      -> {b.get(key)!r}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:3]))
