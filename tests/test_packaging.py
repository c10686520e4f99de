"""The installed package holds every module of the source tree.

A listed ``packages`` set in pyproject.toml once left out ``flopmeter.render``: the editable
install the suite runs hid it, and every wheel failed at ``report.to_text()``. This test reads
the list the build uses and the folders of ``src/flopmeter`` and fails when one is missing.
"""

from __future__ import annotations

from pathlib import Path

import tomllib

ROOT = Path(__file__).resolve().parents[1]


def _listed_packages() -> set[str]:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    return set(config["tool"]["setuptools"]["packages"])


def _source_packages() -> set[str]:
    src = ROOT / "src"
    found = set()
    for folder in [src / "flopmeter", *(src / "flopmeter").rglob("*")]:
        if not folder.is_dir() or folder.name == "__pycache__":
            continue
        if any(f.is_file() and f.suffix in {".py", ".json"} for f in folder.iterdir()):
            found.add(".".join(folder.relative_to(src).parts))
    return found


def test_every_source_folder_is_packaged() -> None:
    missing = _source_packages() - _listed_packages()
    assert not missing, f"pyproject.toml [tool.setuptools] packages lacks {sorted(missing)}"


def test_adapters_are_packaged() -> None:
    assert "flopmeter.integrations" in _listed_packages()
    config = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    assert config["tool"]["setuptools"]["package-dir"]["flopmeter.integrations"] == "integrations"
