"""Compares two folders of example reports (from scripts/example_reports), ignoring the fields
that differ between any two runs: timestamps, durations and what is derived from them."""

from __future__ import annotations

import json
import sys
from pathlib import Path

VOLATILE = {"started_at", "ended_at", "training_duration_seconds", "flopmeter_version"}


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
        a = _clean(json.loads(old.read_text()))
        b = _clean(json.loads(new.read_text())) if new.exists() else None
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
