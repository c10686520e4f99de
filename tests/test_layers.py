"""The import layers of docs/architecture.md hold: no module imports from a layer above it.

Read from the source with ``ast`` (every ``import`` and ``from ... import`` of a flopmeter
module, also inside functions), so a lower layer reaching up fails here by name.
"""

from __future__ import annotations

import ast
from pathlib import Path

import flopmeter

SRC = Path(flopmeter.__file__).parent

#: Layer of each package (and of the few modules whose layer is not their package's), by dotted
#: name under ``flopmeter`` (longest prefix wins). ``integrations`` is the adapters' folder,
#: installed as ``flopmeter.integrations``.
LAYERS = {
    # 0: leaves (import nothing of flopmeter but other leaves)
    "_version": 0,  # the package's version
    "types": 0,
    "errors": 0,
    "internals": 0,
    "distributed": 0,
    "units": 0,
    "checks": 0,  # the one rule for numbers a user gives
    "safe_text": 0,  # redaction, visible controls, CSV cells, the run id's form
    "run.events": 0,  # the meters running in this process (standard library only)
    "run.signals": 0,  # the SIGTERM hook (standard library only)
    "run.engines": 0,  # whose optimizer steps the model: DeepSpeed's engine (internals only)
    "counting.work_units": 0,  # what a micro-batch's input shapes say (ShapeUnits)
    "auto": 0,  # zero-code switch, boot, watch, job: standard library only, in every process
    # 1: arithmetic, facts and the pieces that observe them
    "compliance": 1,
    "budget": 1,
    "flops": 1,
    "hardware": 1,
    "tokens": 1,
    "counting.census": 1,  # the parameter census the FLOP model reads
    "data": 1,
    # 2: the report's data model and its human forms (to_text imports render in the method)
    "report": 2,
    "render": 2,
    # 3: run state
    "counting": 3,
    "options": 3,
    "report.reading": 3,  # the strict reader: options reads the parent runs with it
    "report.checks": 3,
    "report.writing": 3,
    "report.output_path": 3,
    "report.sagemaker": 3,
    "report.parent_runs": 3,
    "run.facts": 3,  # what a report says of the run besides its counts
    "ledger": 3,
    "auto.env_options": 3,  # the meter's options as environment variables
    # 4: assembly
    "run": 4,
    "planner": 4,
    "auto.job_reports": 4,  # the reports of a job's runs: found, one line each, their total
    "auto.finish": 4,  # the job's end: its reports named, or the report of an unattached job
    # 5: the meter and the package's public face
    "meter": 5,
    "": 5,  # flopmeter/__init__.py
    "auto.attaching": 5,
    "auto.raw": 5,
    "auto.raw_model": 5,
    # 6: the adapters (the top-level integrations/ folder)
    "integrations": 6,
    # 7: what builds on the adapters: zero-code for the trainers, the command line
    "auto.hf": 7,
    "auto.lightning": 7,
    "cli": 7,
}
#: The adapters' folder (installed as flopmeter.integrations).
INTEGRATIONS = SRC.parents[1] / "integrations"


def _layer(dotted: str) -> int:
    parts = dotted.split(".")
    for n in range(len(parts), -1, -1):
        key = ".".join(parts[:n])
        if key in LAYERS:
            return LAYERS[key]
    raise AssertionError(f"flopmeter.{dotted} has no layer in LAYERS: add it")


def _module_name(path: Path) -> str:
    if path.is_relative_to(INTEGRATIONS):
        rel = Path("integrations") / path.relative_to(INTEGRATIONS).with_suffix("")
        return ".".join(p for p in rel.parts if p != "__init__")
    rel = path.relative_to(SRC).with_suffix("")
    parts = [p for p in rel.parts if p != "__init__"]
    return ".".join(parts)


def _imports(path: Path) -> set[str]:
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
        else:
            continue
        for name in names:
            if name == "flopmeter" or name.startswith("flopmeter."):
                found.add(name.removeprefix("flopmeter").removeprefix("."))
    return found


def _submodule(name: str) -> str:
    """``from flopmeter import distributed`` names the module; ``__version__`` is the root."""
    parts = name.split(".")

    def exists(parts: list[str]) -> bool:
        base = INTEGRATIONS.joinpath(*parts[1:]) if parts[:1] == ["integrations"] else None
        base = base if base is not None else SRC.joinpath(*parts)
        return base.with_suffix(".py").exists() or base.is_dir()

    while parts and not exists(parts):
        parts.pop()
    return ".".join(parts)


def test_no_module_imports_from_a_layer_above_it():
    wrong = []
    for path in sorted([*SRC.rglob("*.py"), *INTEGRATIONS.rglob("*.py")]):
        here = _module_name(path)
        for imported in _imports(path):
            target = _submodule(imported)
            if target == here or (here.startswith(target + ".") and path.name == "__init__.py"):
                continue
            if target == "" and here.startswith("integrations"):
                target = "meter"  # the adapters take the public names from the package root
            elif target == "" and here != "":
                continue  # `from flopmeter import X` resolves X above; root itself is never imported
            if _layer(target) > _layer(here):
                wrong.append(f"flopmeter.{here} (layer {_layer(here)}) imports flopmeter.{target}")
    assert wrong == []


def test_leaves_import_nothing_of_flopmeter():
    """The top-level leaves import nothing of flopmeter but each other (``distributed`` reads
    FSDP2's mesh through ``internals``); ``_version`` imports nothing at all."""
    leaves = {"_version", "types", "errors", "internals", "distributed", "units"}
    for leaf in sorted(leaves):
        assert {_submodule(n) for n in _imports(SRC / f"{leaf}.py")} <= leaves, leaf
    assert not _imports(SRC / "_version.py")
    assert {_submodule(n) for n in _imports(SRC / "checks.py")} <= {"checks", "errors"}
