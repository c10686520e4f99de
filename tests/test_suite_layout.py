"""The suite's own layout: test modules share code through tests/support only.

A test module that imports another test module (or conftest.py) runs that module's top level
twice, once as each of the two names pytest and the import give it, and ties two files' fixtures
together. Read from the source with ``ast`` (every ``import`` and ``from ... import``, also
inside functions), so such an import fails here by file and line.
"""

from __future__ import annotations

import ast
from pathlib import Path

TESTS = Path(__file__).parent
#: The folders whose modules are test modules (collected by pytest, or conftest.py).
TEST_FOLDERS = (TESTS, TESTS / "integrations")


def _test_modules() -> set[str]:
    """Every name a test module can be imported by: bare (``test_budget``, as pytest's
    rootdir-relative import gives it) and dotted (``tests.test_budget``)."""
    names: set[str] = set()
    for folder in TEST_FOLDERS:
        package = ".".join(folder.relative_to(TESTS.parent).parts)
        for path in folder.glob("*.py"):
            names.update({path.stem, f"{package}.{path.stem}"})
    return names


def imported_test_modules(source: str, test_modules: set[str]) -> list[tuple[int, str]]:
    """(line, module) of each import in ``source`` of a module named in ``test_modules``."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found += [(node.lineno, a.name) for a in node.names if a.name in test_modules]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            if node.module in test_modules:
                found.append((node.lineno, node.module))
            # ``from tests import conftest``: the names imported are modules of the package
            found += [
                (node.lineno, f"{node.module}.{a.name}")
                for a in node.names
                if f"{node.module}.{a.name}" in test_modules
            ]
    return sorted(found)


def python_files() -> list[Path]:
    return sorted(p for p in TESTS.rglob("*.py") if "data" not in p.relative_to(TESTS).parts)


def test_no_test_module_imports_another_test_module():
    test_modules = _test_modules()
    assert {"test_budget", "tests.test_budget", "tests.conftest"} <= test_modules
    assert "tests.integrations.test_hf_callback" in test_modules
    offences = [
        f"{path.relative_to(TESTS.parent)}:{line} imports {module}"
        for path in python_files()
        for line, module in imported_test_modules(path.read_text(encoding="utf-8"), test_modules)
    ]
    assert offences == [], "share it through tests/support instead:\n" + "\n".join(offences)


def test_the_check_finds_each_form_of_such_an_import():
    test_modules = _test_modules()
    source = "\n".join(
        [
            "from tests.test_budget import rows_truth",
            "from tests import conftest",
            "import tests.integrations.test_hf_callback",
            "def later():",
            "    from test_profile_retry import Flaky",
            "from tests.support.models import tiny_llama",  # the shared home: allowed
            "from tests import support",
        ]
    )
    assert imported_test_modules(source, test_modules) == [
        (1, "tests.test_budget"),
        (2, "tests.conftest"),
        (3, "tests.integrations.test_hf_callback"),
        (5, "test_profile_retry"),
    ]


def test_the_suite_imports_its_shared_pieces_from_support():
    users = [p for p in python_files() if "from tests.support." in p.read_text(encoding="utf-8")]
    assert len(users) > 30  # most test modules use the shared models, batches or reports
    assert not (TESTS / "integrations" / "fm_integration_support.py").exists()
