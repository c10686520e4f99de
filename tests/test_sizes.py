"""The house's size limits hold (issue 29): no function in src/ or integrations/ over 60 lines of
code (docstrings, comments and blank lines not counted: ``scripts/long_functions.py``), no module
over 450 lines, and ``meter.py``, the public face, at most 300."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow  # tokenizes every module: seconds on two cores

ROOT = Path(__file__).resolve().parents[1]
ROOTS = (ROOT / "src" / "flopmeter", ROOT / "integrations")


def _modules() -> list[Path]:
    found = []
    for root in ROOTS:
        found += [p for p in sorted(root.rglob("*.py")) if not p.is_symlink()]
    return [p for p in found if "integrations" not in p.relative_to(ROOT).parts[2:3]]


def _long_functions():
    spec = importlib.util.spec_from_file_location(
        "long_functions", ROOT / "scripts" / "long_functions.py"
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.long_functions


def test_no_function_has_more_than_60_lines_of_code():
    long_functions = _long_functions()
    found = [
        f"{path.relative_to(ROOT)}:{line} {name} ({n})"
        for path in _modules()
        for line, name, n in long_functions(path, 60)
    ]
    assert found == []


def test_the_check_finds_a_long_function(tmp_path):
    """The measure counts code lines: 61 statements are too many, a long docstring is not."""
    long_functions = _long_functions()
    body = "".join(f"    x{i} = {i}\n" for i in range(61))
    doc = '    """' + "\n" * 80 + '    """\n'
    (tmp_path / "long.py").write_text(
        "def f():\n" + body + "\n\ndef g():\n" + doc + "    return 1\n"
    )
    assert [name for _, name, _ in long_functions(tmp_path / "long.py", 60)] == ["f"]


def test_no_module_passes_450_lines_and_the_meter_300():
    sizes = {p.relative_to(ROOT).as_posix(): len(p.read_text().splitlines()) for p in _modules()}
    assert {name: n for name, n in sizes.items() if n > 450} == {}
    assert sizes["src/flopmeter/meter.py"] <= 300
