"""Zero-code jobs beside one another and their ends (issue 30): several runs in one job, jobs
started at once in one folder, a ledger that cannot be written, and the job folders a root that
died leaves in the temporary folder.

In process: the job's end naming every run's report and its total, and the sweep of stale job
folders. In subprocesses (slow): unmodified scripts under ``FLOPMETER_AUTO=1`` and ``flopmeter
run``, as users run them."""

from __future__ import annotations

import io
import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from flopmeter.auto import JOB_DIR_ENV, JOB_ID_ENV, LAUNCHER_ENV
from flopmeter.auto.boot import ROOT_FILE
from flopmeter.auto.finish import finish_job
from flopmeter.auto.job import record
from flopmeter.ledger.store import Ledger
from flopmeter.report import FlopReport
from flopmeter.report.context import AttachSection, LineageSection, ResumedRun
from flopmeter.report.sections import ComputeSection, RunSection, TokenSection
from tests.support.zero_code import clean_env, cli_here

SCRIPT = Path(__file__).parent / "scripts" / "zero_code" / "side_by_side.py"
PY = sys.executable


@pytest.fixture
def job(tmp_path, monkeypatch):
    folder = tmp_path / "job"
    folder.mkdir()
    monkeypatch.setenv(JOB_DIR_ENV, str(folder))
    monkeypatch.setenv(JOB_ID_ENV, "job7")
    monkeypatch.setenv(LAUNCHER_ENV, "environment")
    for name in ("FLOPMETER_OUTPUT", "FLOPS_METER_OUT", "SM_TRAINING_ENV", "TRAINING_JOB_NAME"):
        monkeypatch.delenv(name, raising=False)
    return folder


def _report(path: Path, run_id: str, tokens: int | None, flops: float | None, **run) -> Path:
    lineage = {"lineage": run.pop("lineage")} if "lineage" in run else {}
    FlopReport(
        run=RunSection(run_id=run_id, status=run.pop("status", "completed"), **run),
        tokens=TokenSection(tokens_processed=tokens),
        compute=ComputeSection(primary_flops=flops),
        **lineage,
    ).write_json(path)
    return path


def _end(job: Path, cwd: Path) -> tuple[list[Path], list[str]]:
    out = io.StringIO()
    paths = finish_job(job, exit_status=0, cwd=cwd, stream=out)
    return paths, out.getvalue().splitlines()


# ------------------------------------------------------------------ several runs, one job
def test_two_runs_of_one_process_are_both_named_and_summed(job, tmp_path):
    """The second run claimed flops_meter.json and kept the first run's report aside under its
    run id: the end finds it there by the run id its record names."""
    default = tmp_path / "flops_meter.json"
    first = _report(tmp_path / "flops_meter.aaa1.json", "aaa1", 1000, 2.5e9)
    _report(default, "bbb2", 234, 1.0e9)
    record("torch")
    record("attached", method="hf_trainer", report=str(default), run_id="aaa1")
    record("attached", method="hf_trainer", report=str(default), run_id="bbb2")
    paths, lines = _end(job, tmp_path)
    assert paths == [first, default]
    assert lines[:2] == [f"flopmeter: report: {p} (completed, no verdict: the verdict is "
                         "withheld)" for p in (first, default)]  # fmt: skip
    assert lines[2] == (
        "flopmeter: job total: 2 runs: 1,234 non-padding tokens, 3.500e+09 FLOP (run aaa1: "
        "1,000 tokens, 2.500e+09 FLOP; run bbb2: 234 tokens, 1.000e+09 FLOP); each run's "
        "verdict is its own (above)"
    )
    assert len(lines) == 3


def test_a_record_without_a_run_id_finds_its_process_s_report_aside(job, tmp_path):
    """A raw loop's record names the default file and no run id: its report is the one of its
    process in this job (run.pid, attach.job_id), wherever a later run moved it."""
    default = tmp_path / "flops_meter.json"
    _report(default, "other9", 5, 1.0, pid=os.getpid())  # another job's run, same pid is no matter
    mine = tmp_path / "flops_meter.mine1.json"
    FlopReport(
        run=RunSection(run_id="mine1", status="completed", pid=4242),
        attach=AttachSection(method="optimizer", job_id="job7"),
    ).write_json(mine)
    attached = {"event": "attached", "pid": 4242, "rank": None, "time": 1.0, "report": str(default)}
    (job / "4242.jsonl").write_text(json.dumps(attached) + "\n")
    paths, lines = _end(job, tmp_path)
    assert paths == [mine]
    assert len(lines) == 1 and lines[0].startswith(f"flopmeter: report: {mine} (")


@pytest.mark.parametrize(
    ("second", "why"),
    [
        (dict(tokens=None, flops=None), "no token total (run b2 has no token count), no compute "
         "total (run b2's compute is withheld)"),
        (dict(tokens=7, flops=None), "7,007 non-padding tokens, no compute total (run b2's "
         "compute is withheld)"),
        (dict(tokens=7, flops=1.0, status="running"), "no token total (run b2's report is not "
         "final (running)), no compute total (run b2's report is not final (running))"),
        (dict(tokens=7, flops=1.0, lineage=LineageSection(resumed=ResumedRun(run_id="a1"))),
         "no token total (run b2 continues the counts of an earlier session from a "
         "checkpoint), no compute total (run b2 continues the counts of an earlier session "
         "from a checkpoint)"),
    ],
)  # fmt: skip
def test_no_total_is_made_of_a_figure_nobody_knows(job, tmp_path, second, why):
    a = _report(tmp_path / "a.json", "a1", 7000, 2.0e9)
    b = _report(tmp_path / "b.json", "b2", second.pop("tokens"), second.pop("flops"), **second)
    record("attached", method="hf_trainer", report=str(a), run_id="a1")
    record("attached", method="lightning_trainer", report=str(b), run_id="b2")
    _, lines = _end(job, tmp_path)
    assert lines[-1].startswith(f"flopmeter: job total: 2 runs: {why} (run a1: 7,000 tokens")


# ------------------------------------------------------------------ the sweep of stale folders
def _job_folder(temp: Path, name: str, saved: object, *extra: str) -> Path:
    folder = temp / f"flopmeter-job-{name}"
    folder.mkdir()
    if saved is not None:
        (folder / ROOT_FILE).write_text(json.dumps(saved))
    (folder / "123.jsonl").write_text('{"event": "torch"}\n')
    for item in extra:
        (folder / item).mkdir() if item.endswith("/") else (folder / item).write_text("x")
    return folder


def test_the_sweep_removes_only_folders_of_ours_whose_root_is_gone(tmp_path):
    from flopmeter.auto.boot import sweep_stale_jobs

    host = os.uname().nodename
    gone = int(Path("/proc/sys/kernel/pid_max").read_text()) + 1  # no process has this pid
    root = {"started": 0.0, "cwd": "/", "pid": gone, "host": host}
    stale = _job_folder(tmp_path, "stale", root)
    kept = [
        _job_folder(tmp_path, "alive", {**root, "pid": os.getpid()}),
        _job_folder(tmp_path, "elsewhere", {**root, "host": host + "-other"}),
        _job_folder(tmp_path, "unnamed", None),  # being made, or flopmeter run's
        _job_folder(tmp_path, "old", {"started": 0.0, "cwd": "/"}),  # before pids were kept
        _job_folder(tmp_path, "foreign", root, "notes.txt"),
        _job_folder(tmp_path, "nested", root, "sub/"),
        _job_folder(tmp_path, "garbled", "not a dict"),
    ]
    other = tmp_path / "unrelated"
    other.mkdir()
    assert sweep_stale_jobs(str(tmp_path)) == [str(stale)]
    assert not stale.exists()
    assert all(folder.is_dir() for folder in [*kept, other])
    assert sweep_stale_jobs(str(tmp_path / "missing")) == []  # never raises


# ------------------------------------------------------------------ subprocesses
def _started(tmp_path: Path, *args: str, env: dict[str, str]) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [PY, str(SCRIPT), *args],
        cwd=tmp_path,
        env=clean_env({"FLOPMETER_AUTO": "1", **env}),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _report_lines(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if line.startswith("flopmeter: report: ")]


@pytest.mark.slow
def test_three_jobs_at_once_in_one_folder_are_each_measured_in_a_file_of_their_own(tmp_path):
    """Before: two of the three were "not measured", their default file held by a sibling."""
    sync, temp = tmp_path / "sync", tmp_path / "tmp"
    sync.mkdir(), temp.mkdir()
    jobs = [_started(tmp_path, str(sync), "3", env={"TMPDIR": str(temp)}) for _ in range(3)]
    ended = [(job.pid, *job.communicate(timeout=300), job.returncode) for job in jobs]
    named = []
    for pid, _, stderr, status in ended:
        assert status == 0, stderr[-3000:]
        (line,) = _report_lines(stderr)  # each job's end names its own file
        path = Path(line.split()[2])
        data = json.loads(path.read_text())
        assert data["run"]["pid"] == pid and data["run"]["status"] == "completed"
        assert data["attach"]["method"] == "optimizer"
        assert data["tokens"]["tokens_processed"] == int((sync / f"{pid}.tokens").read_text())
        assert data["tokens"]["optimizer_steps"] == 4
        named.append((path, data))
    assert sorted(p.name for p in tmp_path.glob("*.json")) == sorted(p.name for p, _ in named)
    beside = [(p, d) for p, d in named if p.name != "flops_meter.json"]
    assert len(beside) == 2  # one job had the default file, the two others their own
    for path, data in beside:
        assert path.name == f"flops_meter.{data['run']['run_id']}.json"
        assert any(
            note.startswith("Another live run (process ") and str(path) in note
            for note in data["notes"]
        )
    figures = {d["compute"]["primary_flops"] for _, d in named}
    assert len(figures) == 1 and None not in figures  # the same training, the same compute
    assert list(temp.glob("flopmeter-job-*")) == []  # every job folder removed at its end


@pytest.mark.slow
def test_a_report_file_the_user_chose_is_refused_when_another_job_holds_it(tmp_path):
    sync, chosen = tmp_path / "sync", tmp_path / "mine.json"
    sync.mkdir()
    holder = _started(tmp_path, str(sync), "2", env={"FLOPMETER_OUTPUT": str(chosen)})
    try:
        while not list(sync.glob("*.ready")):  # the holder has claimed mine.json
            assert holder.poll() is None, holder.communicate()[1][-3000:]
            time.sleep(0.05)
        late = _started(tmp_path, str(sync), "2", env={"FLOPMETER_OUTPUT": str(chosen)})
        _, stderr = late.communicate(timeout=300)
    finally:
        _, held_err = holder.communicate(timeout=300)
    assert late.returncode == 0 and holder.returncode == 0, stderr[-3000:]
    (held,) = _report_lines(held_err)
    assert held.startswith(f"flopmeter: report: {chosen} (completed, ")
    (line,) = _report_lines(stderr)
    assert "not measured" in line and f"process {holder.pid}) is writing this report" in line
    assert json.loads(chosen.read_text())["run"]["pid"] == holder.pid


@pytest.fixture
def read_only_ledger(tmp_path):
    """A ledger of one record this process cannot write (as root: ``chattr +i``), and a
    folder nothing can be made in."""
    path = tmp_path / "ro" / "ledger.sqlite"
    path.parent.mkdir()
    Ledger(path).append(FlopReport(run=RunSection(run_id="first", status="completed")))
    made = [path, path.parent]
    if os.geteuid() != 0:
        path.chmod(0o444)
        path.parent.chmod(0o555)
    else:
        done = subprocess.run(["chattr", "+i", *map(str, made)], capture_output=True)
        if done.returncode != 0:
            pytest.skip(f"cannot make a file read-only for root here: {done.stderr!r}")
    yield path
    if os.geteuid() != 0:
        path.parent.chmod(0o755)
    else:
        subprocess.run(["chattr", "-i", *map(str, made)], check=True)


@pytest.mark.slow
@pytest.mark.parametrize("which", ["file", "folder"])
def test_a_read_only_ledger_under_the_switch_alone_is_a_note_not_unmetered(
    tmp_path, read_only_ledger, which
):
    ledger = read_only_ledger if which == "file" else read_only_ledger.parent / "new.sqlite"
    sync = tmp_path / "sync"
    sync.mkdir()
    job = _started(tmp_path, str(sync), "1", env={"FLOPMETER_LEDGER": str(ledger)})
    _, stderr = job.communicate(timeout=300)
    assert job.returncode == 0, stderr[-3000:]
    data = json.loads((tmp_path / "flops_meter.json").read_text())
    assert data["attach"]["method"] == "optimizer" and data["run"]["status"] == "completed"
    assert data["tokens"]["tokens_processed"] == int((sync / f"{job.pid}.tokens").read_text())
    notes = [n for n in data["notes"] if str(ledger) in n]
    assert len(notes) == 1 and "could not be appended" in notes[0] and "read-only" in notes[0]
    assert [r.run_id for r in Ledger(read_only_ledger, create=False).records()] == ["first"]
    assert not (read_only_ledger.parent / "new.sqlite").exists()


@pytest.mark.slow
@pytest.mark.parametrize("given", ["variable", "flag"])
def test_flopmeter_run_refuses_a_read_only_ledger_before_the_command(
    tmp_path, read_only_ledger, given
):
    marker = tmp_path / "ran"
    options = ["--ledger", str(read_only_ledger)] if given == "flag" else []
    env = clean_env({"FLOPMETER_LEDGER": str(read_only_ledger)} if given == "variable" else {})
    done = cli_here(["run", *options, "--", PY, "-c", f"open({str(marker)!r}, 'w')"],
                    cwd=tmp_path, env=env)  # fmt: skip
    assert done.returncode == 2
    (line,) = done.stderr.strip().splitlines()
    assert line.startswith("flopmeter: error: ") and str(read_only_ledger) in line
    assert "read-only" in line
    assert not marker.exists()  # the command never started


def _hanging(tmp_path: Path, temp: Path) -> subprocess.Popen[str]:
    sync = tmp_path / "sync"
    sync.mkdir(exist_ok=True)
    job = _started(tmp_path, str(sync), "1", "--hang", env={"TMPDIR": str(temp)})
    assert job.stdout is not None and job.stdout.readline().strip() == "HANGING"
    return job


@pytest.mark.slow
def test_sigterm_to_the_root_ends_its_job_and_removes_its_folder(tmp_path):
    temp = tmp_path / "tmp"
    temp.mkdir()
    job = _hanging(tmp_path, temp)
    assert len(list(temp.glob("flopmeter-job-*"))) == 1
    job.send_signal(signal.SIGTERM)
    _, stderr = job.communicate(timeout=120)
    assert job.returncode == -signal.SIGTERM  # ended as SIGTERM would have ended it
    assert list(temp.glob("flopmeter-job-*")) == []
    (line,) = _report_lines(stderr)
    assert line.startswith(f"flopmeter: report: {tmp_path / 'flops_meter.json'} (interrupted, ")
    assert json.loads((tmp_path / "flops_meter.json").read_text())["run"]["status"] == "interrupted"


@pytest.mark.slow
def test_the_next_root_sweeps_the_folders_of_roots_killed_or_gone_with_os_exit(tmp_path):
    temp = tmp_path / "tmp"
    temp.mkdir()
    env = clean_env({"FLOPMETER_AUTO": "1", "TMPDIR": str(temp)})
    alive = subprocess.Popen(
        [PY, "-c", "import time; print('up', flush=True); time.sleep(120)"],
        env=env, cwd=tmp_path, stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert alive.stdout is not None and alive.stdout.readline().strip() == "up"
        (live,) = temp.glob("flopmeter-job-*")
        killed = _hanging(tmp_path, temp)  # runs while the next one starts: no sweep between
        gone = subprocess.Popen([PY, "-c", "import os; os._exit(0)"], env=env, cwd=tmp_path)
        assert gone.wait(timeout=60) == 0
        killed.kill()
        killed.communicate(timeout=60)
        left = set(temp.glob("flopmeter-job-*")) - {live}
        assert len(left) == 2  # neither could end its job
        pids = {json.loads((f / ROOT_FILE).read_text())["pid"] for f in left}
        assert pids == {gone.pid, killed.pid}  # each root named itself
        done = subprocess.run([PY, "-c", "pass"], env=env, cwd=tmp_path)
        assert done.returncode == 0
        assert list(temp.glob("flopmeter-job-*")) == [
            live
        ]  # swept; the running root's folder stays
        assert json.loads((live / ROOT_FILE).read_text())["host"] == socket.gethostname()
    finally:
        alive.kill()
        alive.communicate()
