"""Starts zero-code metering in each Python process ``flopmeter run`` launches (this folder is
first on their ``PYTHONPATH``), then runs the ``sitecustomize`` that was there before, if any."""

from __future__ import annotations


def _start() -> None:
    import importlib.machinery
    import importlib.util
    import os
    import sys

    try:
        from flopmeter.auto.boot import boot

        boot("flopmeter run")
    except ImportError:  # this Python has no flopmeter: it runs unmetered, and says so
        print(
            f"flopmeter: zero-code metering is off in {sys.executable}: flopmeter is not "
            "installed in it",
            file=sys.stderr,
        )
        _unmetered(sys.executable)
    except Exception as exc:  # never the job's problem
        print(f"flopmeter: zero-code metering is off: {exc}", file=sys.stderr)
    here = os.path.dirname(os.path.abspath(__file__))
    rest = [p for p in sys.path if os.path.abspath(p or ".") != here]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", rest)
    if spec is None or spec.loader is None:
        return
    module = importlib.util.module_from_spec(spec)
    sys.modules["sitecustomize"] = module
    spec.loader.exec_module(module)


def _unmetered(executable: str) -> None:
    """Records for the job's end, with the standard library alone (flopmeter cannot be
    imported here), that this Python runs unmetered (``flopmeter.auto.job``'s ``unmetered``)."""
    import json
    import os
    import time

    folder = os.environ.get("FLOPMETER_JOB_DIR")  # flopmeter.auto.JOB_DIR_ENV
    if not folder:
        return
    line = {"event": "unmetered", "pid": os.getpid(), "rank": None, "time": time.time(),
            "executable": executable}  # fmt: skip
    try:
        with open(os.path.join(folder, f"{os.getpid()}.jsonl"), "a", encoding="utf-8") as f:
            f.write(json.dumps(line) + "\n")
    except Exception:
        pass


if __name__ == "sitecustomize":  # imported as flopmeter.auto.site.sitecustomize: nothing to do
    _start()
