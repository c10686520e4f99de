"""docs/benchmarks.md's sections from benchmarks/_page.py: the end-to-end goal's verdict and
the instrument's validation follow the intervals, and a benchmark that did not run is said to
be not run (never a number)."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
import _page


def _v(added: float, lo: float, hi: float, step: float = 1000.0) -> dict:
    return {"added_us": added, "ci_low_us": lo, "ci_high_us": hi, "step_us": step}


def _clock(fm: dict, validation: list[dict]) -> dict:
    return {
        "bare_step_us": 1000.0,
        "variants": {
            "flopmeter": fm,
            "empty_hooks": _v(1.0, 0.0, 2.0),
            "aws_style": _v(40.0, 35.0, 45.0),
            "busy_5us": _v(6.0, 4.0, 8.0),
            "busy_20us": _v(21.0, 19.0, 23.0),
        },
        "validation": validation,
    }


def _check(us: int, known: float, lo: float, hi: float) -> dict:
    inside = lo <= known <= hi
    return {
        "busy_us": us,
        "known_us": known,
        "measured_us": (lo + hi) / 2,
        "ci_low_us": lo,
        "ci_high_us": hi,
        "inside": inside,
        "resolved": inside and hi - lo <= 5,
    }


def _data(fm: dict, validation: list[dict]) -> dict:
    e2e = {
        "kind": "e2e_overhead",
        "workload": "tiny",
        "rounds": 2,
        "pairs_per_round": 3,
        "pairs": 6,
        "seconds": 1.0,
        "descriptions": {"flopmeter": "the meter"},
        "spins": {"5": {"iterations": 100, "before_us": 4.0, "after_us": 6.0}},
        "cpu": _clock(fm, validation),
        "wall": _clock(fm, validation),
    }
    return {"benchmarks": [{"name": "test_e2e", "fullname": "x", "extra_info": e2e}]}


def test_goal_verdict_follows_the_interval():
    ok = [_check(5, 5.0, 3.0, 7.0), _check(20, 20.0, 18.0, 22.0)]
    for fm, verdict in (
        (_v(4.0, 2.0, 9.5), "**met**"),
        (_v(150.0, 120.0, 180.0), "**not met**"),
        (_v(9.0, 6.0, 12.0), "**not shown**"),
    ):
        text = "\n".join(_page.e2e_section(_data(fm, ok)))
        assert f"at most 10 us of host time per micro-batch: {verdict}" in text
    text = "\n".join(_page.e2e_section(_data(_v(4.0, 2.0, 9.5), ok)))
    assert "3.0 us above the empty hooks' 1.0 us" in text
    assert "in this run the instrument resolves a 10 us cost" in text
    assert "| about 5 us (100 iterations) | 5.0 (4.0, 6.0) |" in text


def test_the_least_a_counting_hook_pays_is_printed_beside_the_goal_when_measured():
    ok = [_check(5, 5.0, 3.0, 7.0), _check(20, 20.0, 18.0, 22.0)]
    data = _data(_v(50.0, 45.0, 55.0), ok)
    assert "the least a meter" not in "\n".join(_page.e2e_section(data))  # older runs: no row
    for clock in ("cpu", "wall"):
        data["benchmarks"][0]["extra_info"][clock]["variants"]["one_read"] = _v(12.0, 9.0, 15.0)
    text = "\n".join(_page.e2e_section(data))
    assert "| empty hooks + one copy of the mask (the least a counting hook does) | 12.0" in text
    assert "one copy of the mask) is 12.0 (9.0 to 15.0) us in the same run." in text


def test_validation_not_resolved_when_wide_or_off():
    for checks in (
        [_check(5, 5.0, -20.0, 30.0), _check(20, 20.0, 18.0, 22.0)],  # too wide
        [_check(5, 5.0, 8.0, 10.0), _check(20, 20.0, 18.0, 22.0)],  # the known cost outside
    ):
        text = "\n".join(_page.e2e_section(_data(_v(4.0, 2.0, 9.5), checks)))
        assert "**not resolved in this run**" in text
        assert "resolves a 10 us cost" not in text


def test_sections_of_benchmarks_not_run_say_so():
    empty = {"benchmarks": []}
    for section in (
        _page.e2e_section,
        _page.scaling_section,
        _page.memory_section,
        _page.planner_section,
    ):
        lines = section(empty)
        assert lines[-1].startswith("Not run in this run")
        assert not any(line.startswith("|") for line in lines)  # no table, no figure


def test_planner_section_reads_its_file_entries_by_name():
    data = {
        "benchmarks": [
            {
                "name": "test_params_estimate",
                "fullname": "benchmarks/test_planner_speed.py::test_params_estimate",
                "extra_info": {"command": ["flopmeter", "estimate", "--params", "7e9"]},
                "stats": {"median": 0.4321, "min": 0.4, "rounds": 5},
            },
            {
                "name": "test_other",
                "fullname": "benchmarks/test_scaling.py::test_other",
                "stats": {"median": 1.0, "min": 1.0, "rounds": 1},
            },
        ]
    }
    lines = _page.planner_section(data)
    rows = [line for line in lines if line.startswith("| test_")]
    assert rows == [
        "| test_params_estimate | flopmeter estimate --params 7e9 | 0.432 | 0.400 | 5 |"
    ]
