"""``flopmeter run -- CMD`` and the environment switch alone, run as a user runs them (new
processes): the command's exit status, options checked before it starts, the job's root, the
report of a job nothing attached to, and the boot's lightness."""

from __future__ import annotations

import functools
import json
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from flopmeter.auto.finish import NO_PYTHON_METERED, NOTHING_FOUND
from flopmeter.render import render
from flopmeter.report.reading import read_report
from tests.support import zero_code
from tests.support.zero_code import LAUNCHERS, clean_env

pytestmark = pytest.mark.slow

PY = sys.executable
#: zero_code.launch with ``flopmeter run`` in a process of its own: the process is what these
#: tests check (its exit status, signals, the job's root), so never the in-process shortcut.
launch = functools.partial(zero_code.launch, cli_process=True)


def _script(folder: Path, name: str, body: str) -> Path:
    path = folder / name
    path.write_text(textwrap.dedent(body))
    return path


def _report_lines(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if line.startswith("flopmeter: report: ")]


@pytest.mark.parametrize("status", [0, 3])
def test_the_command_s_exit_status_is_flopmeter_run_s(tmp_path, status):
    done = launch([PY, "-c", f"import sys; sys.exit({status})"], launcher="flopmeter run",
                  cwd=tmp_path)  # fmt: skip
    assert done.returncode == status, done.stderr


def test_a_command_killed_by_a_signal_exits_128_plus_it(tmp_path):
    done = launch(["sh", "-c", "kill -TERM $$"], launcher="flopmeter run", cwd=tmp_path)
    assert done.returncode == 128 + signal.SIGTERM, done.stderr


def test_a_command_not_found_exits_127_with_one_line(tmp_path):
    done = launch(["no-such-command-here"], launcher="flopmeter run", cwd=tmp_path)
    assert done.returncode == 127
    assert done.stderr.strip() == "flopmeter: run: command not found: no-such-command-here"


def test_a_bad_option_exits_2_before_the_command_runs(tmp_path):
    marker = tmp_path / "ran"
    done = launch([PY, "-c", f"open({str(marker)!r}, 'w')"], launcher="flopmeter run",
                  cwd=tmp_path, options=["--pad-id", "-3"])  # fmt: skip
    assert done.returncode == 2
    assert done.stderr.strip().startswith("flopmeter: error: --pad-id")  # the flag typed
    assert "FLOPMETER_PAD_ID" not in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1
    assert not marker.exists()  # the command never started
    bad_env = launch([PY, "-c", f"open({str(marker)!r}, 'w')"], launcher="flopmeter run",
                     cwd=tmp_path, env={"FLOPMETER_MEASURE_EVERY": "often"})  # fmt: skip
    assert bad_env.returncode == 2 and "FLOPMETER_MEASURE_EVERY must be" in bad_env.stderr
    assert not marker.exists()


@pytest.mark.parametrize("launcher", LAUNCHERS)
def test_a_script_that_trains_nothing_gets_a_report_saying_why(tmp_path, launcher):
    script = _script(
        tmp_path,
        "nothing.py",
        """
        import torch
        x = torch.ones(3) * 2  # torch, but no Trainer and no optimizer
        print("done", float(x.sum()))
    """,
    )
    done = launch([PY, str(script)], launcher=launcher, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert "done 6.0" in done.stdout
    path = tmp_path / "flops_meter.json"
    assert _report_lines(done.stderr) == [
        f"flopmeter: report: {path} (completed, no verdict: not measured: {NOTHING_FOUND})"
    ]
    report = read_report(path)
    assert report.attach.method is None and report.attach.launcher == launcher
    assert report.tokens.tokens_processed is None and report.verdict.outcome is None
    for fmt in ("text", "md", "html"):
        assert "NOT MEASURED" in render(report, fmt)


@pytest.mark.parametrize("launcher", LAUNCHERS)
def test_a_job_that_never_imports_torch_gets_no_report(tmp_path, launcher):
    done = launch([PY, "-c", "print('hello')"], launcher=launcher, cwd=tmp_path)
    assert done.returncode == 0
    said = "flopmeter: nothing trained: no Python process of the job imported torch"
    # flopmeter run was asked to meter this command: it says so; under the switch alone every
    # Python tool of a platform (pip, a shell helper) is a job of its own: it stays quiet
    assert (said in done.stderr) == (launcher == "flopmeter run"), done.stderr
    assert not (tmp_path / "flops_meter.json").exists()


def test_python_dash_s_inside_a_shell_script_gets_a_report_saying_why(tmp_path):
    """The check before the command sees only the command (``sh``), not the ``python -S`` it
    starts: that Python runs no sitecustomize, records nothing, and may train unseen. The job's
    end cannot tell that from a job that trained nothing: it writes a report saying so."""
    script = _script(tmp_path, "train.sh", f"{PY} -S -c 'import sys; print(sys.flags.no_site)'\n")
    done = zero_code.launch(["sh", str(script)], launcher="flopmeter run", cwd=tmp_path)
    assert done.returncode == 0 and done.stdout == "1\n", done.stderr
    path = tmp_path / "flops_meter.json"
    assert _report_lines(done.stderr) == [
        f"flopmeter: report: {path} (completed, no verdict: not measured: {NO_PYTHON_METERED})"
    ]
    report = read_report(path)
    assert report.attach.reason == NO_PYTHON_METERED and report.tokens.tokens_processed is None
    assert report.verdict.outcome is None and "nothing trained" not in done.stderr


def test_a_python_that_cannot_import_flopmeter_inside_a_script_is_named(tmp_path):
    """A Python of another environment (here: one whose ``flopmeter`` cannot be imported) started
    by a shell script: its sitecustomize records that it runs unmetered, the report names it."""
    broken = tmp_path / "broken"
    (broken / "flopmeter").mkdir(parents=True)
    (broken / "flopmeter" / "__init__.py").write_text("raise ImportError('not here')\n")
    # the job's sitecustomize folder stays first; the broken flopmeter shadows the real one
    body = f'PYTHONPATH="${{PYTHONPATH%%:*}}:{broken}" {PY} -c "import torch"\n'
    script = _script(tmp_path, "train.sh", body)
    done = zero_code.launch(["sh", str(script)], launcher="flopmeter run", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert f"zero-code metering is off in {PY}: flopmeter is not installed in it" in done.stderr
    report = read_report(tmp_path / "flops_meter.json")
    assert report.attach.reason == (
        f"a Python process of the job ({PY}) cannot import flopmeter, so it ran unmetered"
    )


def test_the_output_flag_and_a_failed_command(tmp_path):
    done = launch([PY, "-c", "import torch, sys; sys.exit(5)"], launcher="flopmeter run",
                  cwd=tmp_path, options=["--output", "out/"])  # fmt: skip
    assert done.returncode == 5
    report = read_report(tmp_path / "out" / "flops_meter.json")
    assert report.run.status == "failed"
    assert report.run.error == "the command exited with status 5"


def test_under_the_switch_the_first_process_is_the_root_of_the_job(tmp_path):
    child = _script(
        tmp_path,
        "child.py",
        """
        import json, os, torch
        print(json.dumps({k: os.environ.get(k) for k in
              ("FLOPMETER_JOB_ID", "FLOPMETER_JOB_ROOT", "FLOPMETER_JOB_DIR")}))
    """,
    )
    parent = _script(
        tmp_path,
        "parent.py",
        f"""
        import json, os, subprocess, sys
        mine = {{k: os.environ.get(k) for k in
                ("FLOPMETER_JOB_ID", "FLOPMETER_JOB_ROOT", "FLOPMETER_JOB_DIR")}}
        print(json.dumps(mine), os.getpid())
        subprocess.run([sys.executable, {str(child)!r}], check=True)
        sys.exit(4)
    """,
    )
    done = launch([PY, str(parent)], launcher="environment", cwd=tmp_path)
    assert done.returncode == 4, done.stderr
    first, second = done.stdout.splitlines()
    mine, pid = json.loads(first.rsplit(" ", 1)[0]), first.rsplit(" ", 1)[1]
    theirs = json.loads(second)
    assert mine["FLOPMETER_JOB_ROOT"] == pid  # the first process is the root
    assert theirs == mine  # its child joined its job
    assert not Path(mine["FLOPMETER_JOB_DIR"]).exists()  # removed at the end
    assert len(_report_lines(done.stderr)) == 1  # one end, in the root only
    report = read_report(tmp_path / "flops_meter.json")
    assert report.run.status == "failed" and report.attach.job_id == mine["FLOPMETER_JOB_ID"]


def test_under_the_switch_a_root_that_execs_another_program_still_ends_the_job(tmp_path):
    """axolotl's CLI replaces itself with ``accelerate launch`` (same process id): the program
    it becomes keeps the root's role, so the job still ends with its report line."""
    child = _script(tmp_path, "child.py", "import torch\nraise SystemExit(0)\n")
    parent = _script(
        tmp_path,
        "parent.py",
        f"""
        import os, sys
        os.execv(sys.executable, [sys.executable, {str(child)!r}])
    """,
    )
    done = launch([PY, str(parent)], launcher="environment", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert len(_report_lines(done.stderr)) == 1, done.stderr  # the job ended, once
    report = read_report(tmp_path / "flops_meter.json")
    assert report.attach is not None and report.attach.method is None  # nothing attached


@pytest.mark.parametrize("launcher", LAUNCHERS)
def test_a_child_killed_by_sigkill_leaves_its_running_report_and_the_root_says_so(
    tmp_path, launcher
):
    victim = _script(
        tmp_path,
        "victim.py",
        """
        import os, signal, torch
        from flopmeter import FlopMeter
        from flopmeter.auto.job import record
        model = torch.nn.Linear(4, 4)
        meter = FlopMeter(model, output="killed.json", nvml=False).start()
        # what an attach path records when its meter starts (rank 0: the job's report)
        record("attached", method="optimizer", report=os.path.abspath("killed.json"))
        os.kill(os.getpid(), signal.SIGKILL)
    """,
    )
    root = _script(
        tmp_path,
        "root.py",
        f"""
        import subprocess, sys
        sys.exit(subprocess.run([sys.executable, {str(victim)!r}]).returncode and 9)
    """,
    )
    done = launch([PY, str(root)], launcher=launcher, cwd=tmp_path)
    assert done.returncode == 9, done.stderr
    path = tmp_path / "killed.json"
    (line,) = _report_lines(done.stderr)
    assert line.startswith(f"flopmeter: report: {path} (running: its writer, pid ")
    assert "is gone, killed before it could finish" in line
    assert json.loads(path.read_text())["run"]["status"] == "running"
    assert not (tmp_path / "flops_meter.json").exists()  # a meter started: no report of its own


def test_the_boot_imports_neither_torch_nor_the_meter(tmp_path):
    probe = (
        "import sys; from flopmeter.auto import boot; boot.boot('environment'); "
        "print(sorted(m for m in ('torch', 'flopmeter.meter', 'flopmeter.options', "
        "'pydantic', 'flopmeter.auto.finish') if m in sys.modules))"
    )
    done = launch([PY, "-c", probe], launcher="environment", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"
    # and through flopmeter run's sitecustomize
    done = launch([PY, "-c", probe], launcher="flopmeter run", cwd=tmp_path)
    assert done.stdout.strip() == "[]", done.stderr


def test_the_user_s_own_sitecustomize_still_runs(tmp_path):
    theirs = tmp_path / "theirs"
    theirs.mkdir()
    (theirs / "sitecustomize.py").write_text("import builtins\nbuiltins.USER_SITE_RAN = True\n")
    probe = "import builtins, os; print(getattr(builtins, 'USER_SITE_RAN', False), " \
        "os.environ.get('FLOPMETER_JOB_DIR') is not None)"  # fmt: skip
    done = launch([PY, "-c", probe], launcher="flopmeter run", cwd=tmp_path,
                  env={"PYTHONPATH": str(theirs)})  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "True True"


def test_a_nested_flopmeter_run_joins_the_outer_job(tmp_path):
    inner = [PY, "-m", "flopmeter.cli", "run", "--", PY, "-c", "import torch"]
    done = launch(inner, launcher="flopmeter run", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert len(_report_lines(done.stderr)) == 1  # the outer root's end only
    assert "nothing trained" not in done.stderr


def test_flopmeter_run_under_the_switch_is_one_job(tmp_path):
    """With ``FLOPMETER_AUTO=1`` already set, the ``flopmeter`` process itself boots: it must
    not become a second root."""
    env = clean_env({"FLOPMETER_AUTO": "1"})
    full = [PY, "-m", "flopmeter.cli", "run", "--", PY, "-c", "import torch"]
    done = subprocess.run(full, cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=300, check=False)  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert len(_report_lines(done.stderr)) == 1
    assert "nothing trained" not in done.stderr
    assert read_report(tmp_path / "flops_meter.json").attach.launcher == "flopmeter run"


def test_sigterm_to_flopmeter_run_is_passed_on_to_the_command(tmp_path):
    script = _script(
        tmp_path,
        "waits.py",
        """
        import signal, sys, time
        def stop(signum, frame):
            print("got", signum, flush=True)
            sys.exit(7)
        signal.signal(signal.SIGTERM, stop)
        print("ready", flush=True)
        time.sleep(60)
    """,
    )
    full = [PY, "-m", "flopmeter.cli", "run", "--", PY, str(script)]
    proc = subprocess.Popen(full, cwd=tmp_path, env=clean_env(), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)  # fmt: skip
    assert proc.stdout is not None
    assert proc.stdout.readline().strip() == "ready"
    proc.send_signal(signal.SIGTERM)  # to flopmeter run only, not its child
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 7, err
    assert out.strip() == f"got {int(signal.SIGTERM)}"


def test_importing_the_sitecustomize_as_a_module_does_nothing():
    """The wheel check imports every module: ``flopmeter.auto.site.sitecustomize`` must not
    boot, nor run (or replace) the process's own ``sitecustomize``."""
    import importlib

    before = sys.modules.get("sitecustomize")
    importlib.import_module("flopmeter.auto.site.sitecustomize")
    assert sys.modules.get("sitecustomize") is before


def test_under_the_switch_an_exception_at_the_top_is_a_failed_job(tmp_path):
    done = launch([PY, "-c", "import torch; raise ValueError('no data')"],
                  launcher="environment", cwd=tmp_path)  # fmt: skip
    assert done.returncode == 1
    assert "ValueError: no data" in done.stderr  # the traceback, as without flopmeter
    report = read_report(tmp_path / "flops_meter.json")
    assert report.run.status == "failed"
    assert report.run.error == "the command exited with status 1"
