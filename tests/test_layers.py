"""The import layers of docs/architecture.md hold: no module imports from a layer above it.

Read from the source with ``ast`` (every ``import`` and ``from ... import`` of a flopmeter
module, also inside functions), so a lower layer reaching up fails here by name.
"""

from __future__ import annotations

import ast
from pathlib import Path

import flopmeter

SRC = Path(flopmeter.__file__).parent

#: Layer of each module or package, by dotted name under ``flopmeter`` (longest prefix wins).
LAYERS = {
    # 0: leaves
    "types": 0,
    "errors": 0,
    "formulas": 0,  # seed and 6ND: the estimates' and the --params planner's one copy
    "internals": 0,
    "distributed": 0,
    "units": 0,
    "work_units": 0,  # what a micro-batch's input shapes say (ShapeUnits)
    "checks": 0,  # the one rule for numbers a user gives
    "safe_text": 0,  # redaction, visible controls, CSV cells, the run id's form
    "signals": 0,  # the SIGTERM hook (imports nothing of flopmeter)
    "meter_events": 0,  # the meters running in this process; who is told when one starts
    "auto": 0,  # zero-code switch: env names (standard library only, runs in every process)
    "auto.job": 0,  # the job folder's records (standard library only)
    "auto.watch": 0,  # the post-import hook (standard library only)
    "auto.boot": 0,  # each process's start: the import watch (standard library only)
    "auto.site": 0,  # flopmeter run's sitecustomize folder
    "auto.env_options": 3,  # the meter's options as environment variables
    "auto.attaching": 5,  # what the attach paths share (attach section, give-way, guard)
    "auto.raw": 5,  # zero-code: a raw loop's model, found by its optimizer
    "auto.raw_model": 5,  # which module a raw loop trains, from what its optimizer steps
    "auto.hf": 5,  # zero-code: the Hugging Face Trainer gets the callback when built
    "auto.lightning": 5,  # zero-code: the Lightning Trainer gets the callback when built
    "auto.finish": 4,  # the job's end: its reports named, the report of a job nothing attached to
    # 1: pure arithmetic, facts and data models
    "compliance": 1,
    "compliance.lineage_totals": 1,  # the lineage's sum and its verdict (out of lineage)
    "budget": 1,
    "flops": 1,
    "flops.streams": 1,  # each call's stream, the stream model's attention (out of build)
    "hardware": 1,
    "tokens": 1,
    "tokens_batch": 1,
    "tokens_torch": 1,
    "tokens_cpu": 1,  # the statistics of CPU tensors with numpy, per document
    "kernels": 1,
    "census": 1,
    "data": 1,
    # 2: the report's data model (built from the estimates, so above them) and its human forms
    # (report.to_text() imports render inside the method, so the two share a layer)
    "report": 2,
    "render": 2,
    # 3: run state
    "inputs": 3,
    "call_args": 3,  # a call's arguments: where its tokens are, its tensors by name
    "counters": 3,
    "call_plan": 3,  # the hook's reading of a call, once per call structure
    "staged_tokens": 1,  # unpacked CPU micro-batches' statistics, counted in batches
    "call_counts": 3,  # what calls add beside their text tokens: decoder stream, shapes
    "saved_state": 3,  # the saved meter state's format and checks; what it says of its compute
    "options": 3,
    "output": 3,
    "output_path": 3,
    "sagemaker": 3,  # the SageMaker copy's path and the AWS meter's keys (pure)
    "report_file": 3,  # the strict reader: options reads parent runs' reports with it
    "report_checks": 3,  # the strict reader's checks of the figures
    "parent_runs": 3,
    "run_facts": 3,  # what a report says of the run besides its counts (needs only types)
    "ledger": 3,
    "ledger.schema": 3,  # the ledger file's tables, triggers and file checks
    "ledger.location": 3,  # where the ledger is: ledger=, FLOPMETER_LEDGER, the per-user file
    # 4: assembly
    "reporting": 4,
    "measure": 4,  # the run's compute now, computed once; the notes composed
    "run_parts": 4,  # the parts a meter makes from its options (parents, ledger, hardware)
    "run_file": 4,  # the run's report on disk over its life (refresh, SIGTERM, final)
    "run_report": 4,  # the run's compute and report now, from the meter's parts
    "resume": 4,  # what a resumed run carries over (checkpoint state, an earlier session)
    "planner": 4,  # a plan: models on meta costed by flops/, judged by compliance/
    # 5: lifecycle and the package's public face
    "meter": 5,
    "hooks": 5,  # the bodies of the meter's hooks
    "": 5,  # flopmeter/__init__.py
    # 6: the command line
    "cli": 6,
}


def _layer(dotted: str) -> int:
    parts = dotted.split(".")
    for n in range(len(parts), -1, -1):
        key = ".".join(parts[:n])
        if key in LAYERS:
            return LAYERS[key]
    raise AssertionError(f"flopmeter.{dotted} has no layer in LAYERS: add it")


def _module_name(path: Path) -> str:
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
    while parts and not (
        (SRC.joinpath(*parts).with_suffix(".py")).exists() or SRC.joinpath(*parts).is_dir()
    ):
        parts.pop()
    return ".".join(parts)


def test_no_module_imports_from_a_layer_above_it():
    wrong = []
    for path in sorted(SRC.rglob("*.py")):
        if "integrations" in path.parts:
            continue
        here = _module_name(path)
        for imported in _imports(path):
            target = _submodule(imported)
            if target == here or (here.startswith(target + ".") and path.name == "__init__.py"):
                continue
            if target == "" and here != "":
                continue  # `from flopmeter import X` resolves X above; root itself is never imported
            if _layer(target) > _layer(here):
                wrong.append(f"flopmeter.{here} (layer {_layer(here)}) imports flopmeter.{target}")
    assert wrong == []


def test_leaves_import_nothing_of_flopmeter():
    for leaf in ("types", "errors", "internals", "distributed", "units"):
        assert {_submodule(n) for n in _imports(SRC / f"{leaf}.py")} <= {leaf}, leaf
    assert {_submodule(n) for n in _imports(SRC / "checks.py")} <= {"checks", "errors"}
