#!/usr/bin/env python3
"""Rewrites the README's sample report ("What the report says") from a real run of the example.

    python scripts/readme_sample.py            # runs examples/raw_loop.py, rewrites the block
    python scripts/readme_sample.py --from R   # the block from report R (flops_meter.json)

tests/test_readme_sample.py runs the example and checks that the README's block is what it
prints, apart from the lines every run has its own of (:data:`VARYING`: the run id, times, the
pid and host) and the hardware section (the machine's): the sample cannot drift from the code.
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
#: The rows whose values are a run's own (compared as "<varies>").
VARYING = (
    "Run id",
    "Report updated",
    "Written by",
    "Started",
    "Ended",
    "Wall-clock training time",
    "flopmeter version",
    "torch version",
)
_BLOCK = re.compile(r"(```text\n)(flopmeter report — .*?\n)(```)", re.S)
_LABELS = "|".join(re.escape(v) for v in VARYING)
_ROW = re.compile(r"^(  (" + _LABELS + r")\s{2,})(\S.*)$", re.M)


def printed_report(stdout: str) -> str:
    """The report the example prints (its stdout before the ``wrote ...`` line)."""
    return stdout.split("\nwrote ", 1)[0].rstrip("\n") + "\n"


def readme_sample(readme: str) -> str:
    """The README's sample report block (without its fences)."""
    found = _BLOCK.search(readme)
    if found is None:
        raise SystemExit("README.md has no ```text block starting 'flopmeter report — '")
    return found.group(2)


_HARDWARE = re.compile(r"^Hardware and energy\n.*?\n\n", re.M | re.S)


def comparable(text: str) -> str:
    """``text`` with the values of the :data:`VARYING` rows replaced by ``<varies>``, and the
    hardware section (the machine's own: its GPU, its driver, ``FLOPMETER_NVML``) left out."""
    text = _HARDWARE.sub("Hardware and energy\n  <the machine's own>\n\n", text)
    return _ROW.sub(lambda m: m.group(1) + "<varies>", text)


def run_example(folder: Path) -> str:
    """Runs examples/raw_loop.py in ``folder`` as ``scripts/example`` does; its stdout."""
    cmd = [sys.executable, str(ROOT / "examples" / "raw_loop.py")]
    proc = subprocess.run(cmd, cwd=folder, capture_output=True, text=True, check=True)
    return proc.stdout


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--from", dest="report", type=Path, help="a report to render instead")
    args = parser.parse_args(argv)
    if args.report is not None:
        sys.path.insert(0, str(ROOT / "src"))
        from flopmeter.report.reading import read_report

        text = read_report(args.report).to_text().rstrip("\n") + "\n"
    else:
        with tempfile.TemporaryDirectory() as folder:
            text = printed_report(run_example(Path(folder)))
    readme = README.read_text(encoding="utf-8")
    README.write_text(_BLOCK.sub(lambda m: m.group(1) + text + m.group(3), readme, 1), "utf-8")
    print(f"rewrote the sample report in {README}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
