"""The suite's own tooling: the longest work units are handed out first (by the committed
durations), a run shared by the session's tests is made once and copied to each, and
``flopmeter run`` in the test's process does what the command's own process does."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tests.support.durations import (
    DURATIONS_FILE,
    RECORDED_FROM,
    UNKNOWN,
    known_durations,
    merged,
    unit_seconds,
)
from tests.support.scheduling import longest_first, work_unit
from tests.support.shared_runs import SharedRuns, session_root
from tests.support.zero_code import clean_env, cli_here, launch


def test_the_longest_units_come_first_and_unknown_tests_are_short():
    known = {"a.py::slow": 60.0, "b.py::t1": 20.0, "b.py::t2": 30.0, "c.py::mid": 40.0}
    queue = {
        "new.py::x": {"new.py::x": False},
        "c.py::mid": {"c.py::mid": False},
        "b.py": {"b.py::t1": False, "b.py::t2": False, "b.py::fast": False},
        "a.py::slow": {"a.py::slow": False},
        "other.py::y": {"other.py::y": False},
    }
    assert longest_first(queue, known) == ["a.py::slow", "b.py", "c.py::mid", "new.py::x",
                                           "other.py::y"]  # fmt: skip
    assert unit_seconds(queue["b.py"], known) == pytest.approx(50 + UNKNOWN)


def test_a_module_groups_its_tests_by_their_first_parameters_when_it_says_so(tmp_path):
    (tmp_path / "test_grouped.py").write_text("WORK_UNITS_BY_PARAMETERS = 2\n")
    (tmp_path / "test_plain.py").write_text("CASES = 2\n")
    (tmp_path / "test_fixture.py").write_text(
        "import pytest\n\n@pytest.fixture(scope='module')\ndef made():\n    return 1\n"
    )
    units = {
        nodeid: work_unit(nodeid, tmp_path)
        for nodeid in [
            "test_grouped.py::test_a[t5-lora]",
            "test_grouped.py::test_b[t5-lora-long_targets]",
            "test_grouped.py::test_a[t5-full]",
            "test_grouped.py::test_by_hand",
            "test_plain.py::test_a[t5-lora]",
            "test_fixture.py::test_a[t5-lora]",
        ]
    }
    assert units == {
        "test_grouped.py::test_a[t5-lora]": "test_grouped.py::[t5-lora]",
        "test_grouped.py::test_b[t5-lora-long_targets]": "test_grouped.py::[t5-lora]",
        "test_grouped.py::test_a[t5-full]": "test_grouped.py::[t5-full]",
        "test_grouped.py::test_by_hand": "test_grouped.py::test_by_hand",
        "test_plain.py::test_a[t5-lora]": "test_plain.py::test_a[t5-lora]",
        "test_fixture.py::test_a[t5-lora]": "test_fixture.py",
    }


def test_a_recording_updates_the_tests_that_ran_and_keeps_the_others():
    old = {"a.py::kept": 3.0, "a.py::faster_now": 9.0, "a.py::slower": 1.0}
    measured = {"a.py::faster_now": RECORDED_FROM / 2, "a.py::slower": 4.04, "a.py::new": 7.96}
    assert merged(old, measured) == {"a.py::kept": 3.0, "a.py::new": 8.0, "a.py::slower": 4.0}


def test_the_committed_durations_name_tests_of_the_suite():
    data = json.loads(DURATIONS_FILE.read_text(encoding="utf-8"))
    assert data and all(v >= RECORDED_FROM for v in data.values())
    assert known_durations() == data
    assert all(k.startswith("tests/") and "::" in k for k in data)


def test_a_shared_run_is_made_once_and_each_test_gets_its_own_copy(tmp_path):
    runs, made = SharedRuns(tmp_path / "shared"), []

    def make(folder):
        made.append(folder)
        (folder / "report.json").write_text('{"n": 1}')

    first = runs.copy("script --edited", tmp_path / "a", make)
    second = runs.copy("script --edited", tmp_path / "b", make)
    assert len(made) == 1
    assert (first / "report.json").read_text() == (second / "report.json").read_text()
    (first / "report.json").write_text("changed by one test")  # the other's copy is its own
    assert (second / "report.json").read_text() == '{"n": 1}'
    runs.copy("script --with-meter", tmp_path / "c", make)  # another argument set: made
    assert len(made) == 2


def test_a_shared_run_that_failed_is_made_again_by_the_next_ask(tmp_path):
    runs, tries = SharedRuns(tmp_path / "shared"), []

    def make(folder):
        tries.append(1)
        (folder / "partial").write_text("left by a failed run")
        if len(tries) == 1:
            raise AssertionError("exit 1")

    with pytest.raises(AssertionError, match="exit 1"):
        runs.copy("k", tmp_path / "a", make)
    runs.copy("k", tmp_path / "b", make)
    assert len(tries) == 2


def test_the_session_keeps_its_shared_runs_beside_its_workers_folders(tmp_path, monkeypatch):
    monkeypatch.setenv("PYTEST_XDIST_WORKER", "gw1")
    assert session_root(tmp_path / "popen-gw1") == tmp_path / "shared-runs"
    monkeypatch.delenv("PYTEST_XDIST_WORKER")
    assert session_root(tmp_path) == tmp_path / "shared-runs"


@pytest.mark.slow
def test_flopmeter_run_in_this_process_gives_what_its_own_process_gives(tmp_path):
    script = "import sys; print('out'); print('err', file=sys.stderr); sys.exit(3)"
    env, here = dict(os.environ), os.getcwd()
    command = [sys.executable, "-c", script]
    done = {
        own: launch(command, launcher="flopmeter run", cwd=tmp_path, cli_process=own)
        for own in (True, False)
    }
    assert os.environ == env and os.getcwd() == here  # the call's own, given back
    assert done[False].returncode == done[True].returncode == 3
    assert done[False].stdout == done[True].stdout == "out\n"
    assert done[False].stderr == done[True].stderr  # the command's line, then the job's end
    assert done[False].stderr.startswith("err\nflopmeter: nothing trained")
    assert done[False].args == done[True].args


@pytest.mark.slow
def test_flopmeter_run_in_this_process_keeps_argument_errors_and_timeouts(tmp_path):
    bad = cli_here(["run", "--pad-id", "-3", "--", "true"], cwd=tmp_path, env=clean_env())
    assert bad.returncode == 2 and bad.stderr.startswith("flopmeter: error: --pad-id")
    usage = cli_here(["explode"], cwd=tmp_path, env=clean_env())
    assert usage.returncode == 2 and "invalid choice" in usage.stderr
    sleeper = [sys.executable, "-c", "import time; time.sleep(60)"]
    with pytest.raises(subprocess.TimeoutExpired):
        cli_here(["run", "--", *sleeper], cwd=tmp_path, env=clean_env(), timeout=3)
