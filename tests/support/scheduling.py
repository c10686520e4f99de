"""How scripts/test spreads the suite over pytest-xdist's workers (``--dist loadscope``).

Every test is its own work unit, handed to whichever worker is free, except the tests of a
module that makes a fixture once for the module (or a class, or a package: a plain run of a
script in a new process, a framework's tiny model): that module is one unit, run by one worker,
so the fixture is made once, not once per worker. A module whose tests share a cache in the
process by parameter instead (test_families.py's one run of each family and mode) says so with
``WORK_UNITS_BY_PARAMETERS = N``: its tests whose parameter ids begin with the same N values
(``gemma3-lora`` of ``[gemma3-lora-default]``) are one unit, so each run is made by one worker
(not by each worker that gets one of its tests). The units are handed out longest first, by
the seconds tests/support/durations.json gives their tests (a unit it does not know, as many
tenths of a second as it has tests), so the minutes-long units start early and the short ones
fill the end. (xdist's own ``loadgroup`` does not group under pytest 9, whose node ids it can no
longer suffix.)
"""

from __future__ import annotations

import ast
import functools
from pathlib import Path

from tests.support.durations import known_durations, unit_seconds

#: The fixture scopes whose one value several tests share.
SHARED_SCOPES = frozenset({"module", "class", "package"})


def _scope_of(decorator: ast.expr) -> str | None:
    """The ``scope=`` a ``@pytest.fixture(...)`` decorator gives, or None."""
    if not isinstance(decorator, ast.Call):
        return None
    func = decorator.func
    name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", None)
    if name != "fixture":
        return None
    for keyword in decorator.keywords:
        if keyword.arg == "scope" and isinstance(keyword.value, ast.Constant):
            return str(keyword.value.value)
    return None


#: The module-level name by which a test module groups its tests by their first parameters.
BY_PARAMETERS = "WORK_UNITS_BY_PARAMETERS"


@functools.cache
def _module_tree(path: Path) -> ast.Module | None:
    try:
        return ast.parse(path.read_text(encoding="utf-8"))
    except (OSError, SyntaxError, UnicodeDecodeError):
        return None


def makes_a_shared_fixture(path: Path) -> bool:
    """Whether the test module at ``path`` defines a fixture of a scope in SHARED_SCOPES."""
    tree = _module_tree(path)
    if tree is None:
        return True  # unreadable: keep it together, as loadfile would
    return any(
        _scope_of(decorator) in SHARED_SCOPES
        for node in ast.walk(tree)
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
        for decorator in node.decorator_list
    )


def units_by_parameters(path: Path) -> int | None:
    """The ``WORK_UNITS_BY_PARAMETERS = N`` the test module at ``path`` sets, or None."""
    tree = _module_tree(path)
    for node in tree.body if tree is not None else ():
        if isinstance(node, ast.Assign):
            targets = node.targets
        elif isinstance(node, ast.AnnAssign):
            targets = [node.target]
        else:
            continue
        named = any(getattr(target, "id", None) == BY_PARAMETERS for target in targets)
        if named and isinstance(node.value, ast.Constant) and type(node.value.value) is int:
            return node.value.value
    return None


def work_unit(nodeid: str, rootdir: Path) -> str:
    """The work unit of the test ``nodeid``: its module's path when the module makes a shared
    fixture; ``MODULE::[first N parameter values]`` in a module that groups its tests by
    them; else the node id itself."""
    module = nodeid.split("::", 1)[0]
    path = rootdir / module
    if makes_a_shared_fixture(path):
        return module
    n = units_by_parameters(path)
    if n and nodeid.endswith("]") and "[" in nodeid:
        ids = nodeid[nodeid.index("[") + 1 : -1]
        return f"{module}::[{'-'.join(ids.split('-')[:n])}]"
    return nodeid


def longest_first(workqueue: dict[str, dict[str, bool]], known) -> list[str]:
    """The units of ``workqueue`` (unit to its tests), longest first by ``known`` seconds;
    units of equal length in their order there."""
    return sorted(workqueue, key=lambda unit: -unit_seconds(workqueue[unit], known))


def make_scheduler(config, log):
    """xdist's loadscope scheduling with the units of ``work_unit``, longest first."""
    from xdist.scheduler import LoadScopeScheduling

    rootdir = Path(config.rootpath)

    class SharedFixtureScheduling(LoadScopeScheduling):
        _ordered = False

        def _split_scope(self, nodeid: str) -> str:
            return work_unit(nodeid, rootdir)

        def _assign_work_unit(self, node) -> None:
            # the queue is whole at the first hand-out (xdist's schedule() fills it first)
            if not self._ordered:
                self._ordered = True
                order = longest_first(self.workqueue, known_durations())
                units = {unit: self.workqueue[unit] for unit in order}
                self.workqueue.clear()
                self.workqueue.update(units)
            super()._assign_work_unit(node)

    return SharedFixtureScheduling(config, log)
