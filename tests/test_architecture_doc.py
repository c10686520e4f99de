"""docs/architecture.md stays true: its module table is the one generated from the docstrings,
and every module, package and dotted name it mentions exists."""

from __future__ import annotations

import importlib
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DOC = (ROOT / "docs" / "architecture.md").read_text(encoding="utf-8")
SRC = ROOT / "src" / "flopmeter"
sys.path.insert(0, str(ROOT / "scripts"))

import module_table  # noqa: E402


def test_the_module_table_is_generated_from_the_docstrings():
    assert module_table.current(DOC) == module_table.table(), "run python scripts/module_table.py"


def test_every_module_the_document_names_exists():
    paths = set(re.findall(r"`((?:[a-z_]+/)*[a-z_]+\.py)`", DOC))
    paths |= {p for p in re.findall(r"`((?:[a-z_]+/)+)`", DOC)}
    missing = []
    for path in sorted(paths):
        places = [
            SRC / path,
            ROOT / path,
            ROOT / "integrations" / path.removeprefix("integrations/"),
        ]
        if not any(p.exists() for p in places):
            missing.append(path)
    assert missing == []


def test_every_dotted_name_of_a_module_resolves():
    """``run.measure.measure``, ``counting.call_plan.CallPlans.count``: each a module of the
    package and attributes of it."""
    packages = {p.name for p in SRC.iterdir() if p.is_dir() or p.suffix == ".py"}
    names = set(re.findall(r"\b((?:[a-z_]+\.)+[A-Za-z_]+)\b", DOC))
    wrong = []
    for name in sorted(names):
        parts = name.split(".")
        if parts[0] not in packages and f"{parts[0]}.py" not in packages:
            continue
        if parts[-1] in {"py", "md", "json", "lock", "pth"}:
            continue
        for cut in range(len(parts), 0, -1):
            try:
                value = importlib.import_module("flopmeter." + ".".join(parts[:cut]))
            except ImportError:
                continue
            try:
                for attr in parts[cut:]:
                    value = getattr(value, attr)
            except AttributeError:
                wrong.append(name)
            break
        else:
            wrong.append(name)
    assert wrong == []
