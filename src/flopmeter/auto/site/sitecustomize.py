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


if __name__ == "sitecustomize":  # imported as flopmeter.auto.site.sitecustomize: nothing to do
    _start()
