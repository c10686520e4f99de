"""One name, one home: a module's ``__all__`` lists only what it defines (or its own
submodules). The two public faces are the exception: the package root (``from flopmeter
import FlopMeter``) and the planner (``from flopmeter.planner import estimate``), which import
their names on first use from the modules that define them."""

from __future__ import annotations

import ast
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src" / "flopmeter"
INTEGRATIONS = SRC.parents[1] / "integrations"
FACES = {SRC / "__init__.py", SRC / "planner" / "__init__.py"}


def _exported_but_not_defined(path: Path) -> list[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    defined: set[str] = set()
    exported: list[str] = []
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            defined.add(node.name)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for target in targets:
                defined |= {n.id for n in ast.walk(target) if isinstance(n, ast.Name)}
            if any(isinstance(t, ast.Name) and t.id == "__all__" for t in targets):
                exported = list(ast.literal_eval(node.value))
    submodules = {p.stem for p in path.parent.glob("*.py")} | {
        p.name for p in path.parent.iterdir() if p.is_dir()
    }
    own = defined | (submodules if path.name == "__init__.py" else set())
    return [name for name in exported if name not in own]


def test_no_module_exports_a_name_it_does_not_define():
    wrong = {}
    for path in sorted([*SRC.rglob("*.py"), *INTEGRATIONS.rglob("*.py")]):
        if path in FACES:
            continue
        names = _exported_but_not_defined(path)
        if names:
            wrong[str(path.relative_to(SRC.parents[1]))] = names
    assert wrong == {}


def test_the_faces_name_the_defining_module_of_each_name():
    """The root's and the planner's tables say where each name is defined, not another
    re-export."""
    import importlib

    for face in ("flopmeter", "flopmeter.planner"):
        exports = importlib.import_module(face)._EXPORTS
        for name, module in exports.items():
            path = SRC.parent / (module.replace(".", "/") + ".py")
            if not path.exists():
                path = SRC.parent / module.replace(".", "/") / "__init__.py"
            assert name not in _exported_but_not_defined(path), (face, name, module)
            tree = ast.parse(path.read_text(encoding="utf-8"))
            top = {getattr(n, "name", None) for n in tree.body} | {
                t.id
                for n in tree.body
                if isinstance(n, (ast.Assign, ast.AnnAssign))
                for t in ast.walk(n.targets[0] if isinstance(n, ast.Assign) else n.target)
                if isinstance(t, ast.Name)
            }
            assert name in top, f"{face}.{name} is not defined in {module}"
