"""The README's sample report is what the example prints today (scripts/readme_sample.py
writes it from a real run; this test runs the example and compares, so it cannot drift), and
its first lines give the answer: the verdict, the compute judged, the threshold, the share."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

from tests.support.shared_runs import plain_example_run

ROOT = Path(__file__).resolve().parents[1]


def _script():
    spec = importlib.util.spec_from_file_location(
        "readme_sample", ROOT / "scripts/readme_sample.py"
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.slow
def test_the_readme_sample_is_what_the_example_prints(shared_runs):
    sample = _script()
    folder = shared_runs.folder("examples/raw_loop.py", plain_example_run)
    printed = sample.printed_report((folder / "stdout.txt").read_text(encoding="utf-8"))
    readme = sample.readme_sample((ROOT / "README.md").read_text(encoding="utf-8"))
    assert sample.comparable(readme) == sample.comparable(printed), (
        "README.md's sample report is stale: run python scripts/readme_sample.py"
    )
    # the answer on the first lines, with the report's own figures
    report = json.loads((folder / "flops_meter.json").read_text(encoding="utf-8"))
    first = printed.splitlines()[:7]
    assert first[2] == "In short"
    assert first[3].split(None, 1)[1].strip() == "Below the threshold"
    assert report["verdict"]["outcome"] == "below_threshold"
    assert "Compute judged" in first[4] and "Threshold" in first[5] and "Share" in first[6]


def test_the_comparison_catches_a_changed_figure_and_ignores_a_run_id():
    sample = _script()
    text = "x\n  Run id                      abc\n  Training compute            2.7 FLOP\n"
    other = text.replace("abc", "def")
    assert sample.comparable(text) == sample.comparable(other)
    assert sample.comparable(text) != sample.comparable(other.replace("2.7", "2.8"))
    gpu = "Hardware and energy\n  GPU figures                 {}\n\nThreshold\n  T  1\n"
    assert sample.comparable(gpu.format("off")) == sample.comparable(gpu.format("H100"))
    assert sample.comparable(gpu.format("off")) != sample.comparable(gpu.format("off") + "x")


@pytest.mark.slow
@pytest.mark.parametrize("form", ["md", "html"])
def test_every_human_form_gives_the_verdict_before_the_details(shared_runs, form):
    from flopmeter.render import render
    from flopmeter.report.reading import read_report

    folder = shared_runs.folder("examples/raw_loop.py", plain_example_run)
    report = read_report(folder / "flops_meter.json")
    page = render(report, form)
    short, details = page.index("In short"), page.index("Model and parameters")
    verdict = page.index("Below the threshold")
    assert short < verdict < details
    assert page.index("Compute judged") < details and page.index("Share of the threshold") < details
