"""How runs end, and what each ending leaves on disk (issue 19, "Endings and files"), with real
processes, real signals, a real Hugging Face Trainer, real SQLite and a moto S3 server."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytest.importorskip("transformers")

import torch

from flopmeter import FlopMeter
from flopmeter.cli import main
from flopmeter.report.reading import read_report
from tests.support.batches import PAD_ID, padded_batch
from tests.support.models import tiny_llama

SCRIPTS = Path(__file__).parent / "scripts"


def _env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}


def _wait_for_training(path: Path, child: subprocess.Popen, timeout: float = 180.0) -> dict:
    """The running report once it shows trained tokens."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            report = json.loads(path.read_text())
        except (OSError, ValueError):
            report = None
        if report and report["run"]["status"] == "running" and report["tokens"]["tokens_processed"]:
            return report
        if child.poll() is not None:
            raise AssertionError(f"the child ended early: {child.communicate()}")
        time.sleep(0.05)
    child.kill()
    raise AssertionError("no refreshed running report appeared")


@pytest.fixture(scope="module")
def sigtermed_trainer(tmp_path_factory) -> tuple[Path, int]:
    """The report of a real Trainer run stopped by a real SIGTERM mid-training, and the
    optimizer steps the child printed."""
    out = tmp_path_factory.mktemp("sigterm")
    child = subprocess.Popen(
        [sys.executable, str(SCRIPTS / "sigterm_trainer.py"), str(out)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=_env(),
    )
    report = out / "flops_meter.json"
    _wait_for_training(report, child)
    time.sleep(1.0)  # a few more steps
    child.send_signal(signal.SIGTERM)
    stdout, stderr = child.communicate(timeout=120)
    assert child.returncode == -signal.SIGTERM, stderr  # ended as SIGTERM ends it
    return report, stdout.count("step ")


@pytest.mark.slow
def test_a_sigtermed_trainer_run_has_a_final_report_the_strict_reader_accepts(sigtermed_trainer):
    path, steps = sigtermed_trainer
    report = read_report(path)  # before the fix: ReportFileError, run.ended_at null
    assert report.run.status == "interrupted" and "SIGTERM" in (report.run.error or "")
    assert report.run.ended_at is not None and report.run.ended_at >= report.run.started_at
    # the steps it made (the signal may land inside a step: at most one more)
    assert report.tokens.optimizer_steps in (steps, steps + 1)
    assert report.tokens.tokens_processed == 6 * 2 * report.tokens.micro_batches
    assert report.compute.primary_flops is not None and report.compute.primary_flops > 0


@pytest.mark.parametrize("fmt", ["text", "md", "html"])
@pytest.mark.slow
def test_a_sigtermed_trainer_runs_report_renders(sigtermed_trainer, fmt, tmp_path, capsys):
    path, _ = sigtermed_trainer
    out = tmp_path / f"report.{fmt}"
    assert main(["report", str(path), "--format", fmt, "-o", str(out)]) == 0
    text = out.read_text()
    assert "interrupted" in text.lower() and "tiny-llama" in text


@pytest.mark.slow
def test_a_sigtermed_trainer_runs_report_uploads(sigtermed_trainer, aws, capsys):
    path, _ = sigtermed_trainer
    run_id = json.loads(path.read_text())["run"]["run_id"]
    args = ["upload", str(path), "--s3", f"s3://{aws['name']}/runs", "--endpoint-url", aws["url"]]
    assert main(args) == 0, capsys.readouterr()
    body = aws["s3"].get_object(Bucket=aws["name"], Key=f"runs/{run_id}.json")["Body"].read()
    assert json.loads(body) == json.loads(path.read_text())


@pytest.mark.slow
def test_a_sigtermed_run_counts_as_a_parent_its_compute_was_spent(sigtermed_trainer, tmp_path):
    path, _ = sigtermed_trainer
    parent = read_report(path)
    model = tiny_llama()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    with FlopMeter(model, PAD_ID, parent_runs=[str(path)], nvml=False) as meter:
        model(**padded_batch([5, 3], 6)).loss.backward()
        optimizer.step()
    child = meter.report()
    (entry,) = child.lineage.parent_runs
    assert entry.status == "interrupted" and entry.flops == parent.compute.primary_flops
    own = child.compute.primary_flops
    assert child.lineage.cumulative_flops == pytest.approx(own + parent.compute.primary_flops)
    assert child.verdict.judged_flops == child.lineage.cumulative_flops
    assert child.verdict.outcome is not None


# ------------------------------------------------------------------ backwards document offsets
class _Packed(torch.nn.Module):
    """Takes a packed batch Hugging Face style (``cu_seq_lens_q``); trains one weight."""

    def __init__(self) -> None:
        super().__init__()
        self.w = torch.nn.Parameter(torch.ones(()))

    def forward(self, input_ids, cu_seq_lens_q=None, cu_seq_lens_k=None):
        return self.w * input_ids.float().sum()


def test_the_meters_report_of_backwards_cu_seqlens_is_read_back(tmp_path):
    model = _Packed()
    ids = torch.arange(1, 13).reshape(1, 12)
    cu = torch.tensor([0, 8, 4, 12], dtype=torch.int32)  # the third document starts before
    out = tmp_path / "packed.json"
    with FlopMeter(model, PAD_ID, output=out, nvml=False):
        model(ids, cu_seq_lens_q=cu, cu_seq_lens_k=cu).backward()
    report = read_report(out)  # before the fix: tokens_processed 16 > tokens_seen 12, refused
    assert report.tokens.micro_batches_inconsistent == 1
    assert report.tokens.tokens_seen == 12
    assert report.tokens.tokens_processed <= 12  # no token counted twice
    assert report.compute.primary_flops is None  # the meter does not know: withheld
    assert "cu_seqlens" in (report.compute.withheld_reason or "")
    assert report.verdict.outcome is None


# ------------------------------------------------------------------ the umask
@pytest.mark.slow
def test_writing_a_report_never_changes_the_process_umask(tmp_path, monkeypatch):
    """Another thread's file made while a report is written keeps the process's umask."""
    import stat
    import threading

    from flopmeter.report import FlopReport, write_text_atomic

    others: list[Path] = []
    real_umask = os.umask

    def umask_seen_by_another_thread(mask: int) -> int:
        previous = real_umask(mask)
        # what another thread creating a file at this very moment gets
        other = tmp_path / f"other-{len(others)}"
        os.close(os.open(other, os.O_WRONLY | os.O_CREAT, 0o666))
        others.append(other)
        return previous

    stop = threading.Event()

    def create_files() -> None:
        i = 0
        while not stop.is_set():
            path = tmp_path / f"thread-{i}"
            os.close(os.open(path, os.O_WRONLY | os.O_CREAT, 0o666))
            others.append(path)
            i += 1

    old = real_umask(0o022)
    try:
        monkeypatch.setattr(os, "umask", umask_seen_by_another_thread)
        thread = threading.Thread(target=create_files)
        thread.start()
        report = FlopReport(run={"run_id": "u", "status": "running"})
        for _ in range(200):
            write_text_atomic(tmp_path / "r.json", report.to_json())
        stop.set()
        thread.join()
        assert stat.S_IMODE((tmp_path / "r.json").stat().st_mode) == 0o644
        real_umask(0o077)
        write_text_atomic(tmp_path / "private.json", report.to_json())
        assert stat.S_IMODE((tmp_path / "private.json").stat().st_mode) == 0o600
    finally:
        real_umask(old)
    modes = {stat.S_IMODE(p.stat().st_mode) for p in others}
    assert modes == {0o644}  # before the fix: 0o666 for the files made while it was 0


# ------------------------------------------------------------------ output= and ledger= refused
def _linear() -> torch.nn.Module:
    return torch.nn.Linear(2, 2)


def test_an_output_without_a_suffix_that_does_not_exist_is_a_folder(tmp_path):
    from flopmeter.report.output_path import DEFAULT_FILENAME

    for given in (tmp_path / "runs", str(tmp_path / "more")):
        meter = FlopMeter(_linear(), 0, output=given, nvml=False)
        assert Path(meter.output) == Path(given) / DEFAULT_FILENAME
    (tmp_path / "existing").mkdir()
    assert Path(FlopMeter(_linear(), 0, output=tmp_path / "existing", nvml=False).output) == (
        tmp_path / "existing" / DEFAULT_FILENAME
    )
    # a name with a suffix is a file, and so is an existing file without one
    assert Path(FlopMeter(_linear(), 0, output=tmp_path / "r.json", nvml=False).output) == (
        tmp_path / "r.json"
    )
    (tmp_path / "plain").write_text("")
    assert Path(FlopMeter(_linear(), 0, output=tmp_path / "plain", nvml=False).output) == (
        tmp_path / "plain"
    )
    with FlopMeter(_linear(), 0, output=tmp_path / "runs", nvml=False):
        pass
    assert (tmp_path / "runs").is_dir()
    assert read_report(tmp_path / "runs").run.status == "completed"


@pytest.mark.parametrize("case", ["loop", "loop inside", "nul"])
def test_a_symlink_loop_or_a_nul_byte_in_output_is_a_configuration_error(tmp_path, case):
    from flopmeter.errors import ConfigurationError

    (tmp_path / "loop").symlink_to(tmp_path / "loop")
    given = {
        "loop": tmp_path / "loop",
        "loop inside": tmp_path / "loop" / "r.json",
        "nul": f"{tmp_path}/r\0.json",
    }[case]
    with pytest.raises(ConfigurationError, match="output") as err:
        FlopMeter(_linear(), 0, output=given, nvml=False)
    assert ("NUL" if case == "nul" else "symbolic link") in str(err.value)


def test_a_corrupt_ledger_is_a_configuration_error_naming_the_file(tmp_path):
    from flopmeter.errors import ConfigurationError
    from flopmeter.ledger.store import Ledger

    ledger = tmp_path / "ledger.sqlite"
    Ledger(ledger)
    data = bytearray(ledger.read_bytes())
    data[100:] = b"\xff" * (len(data) - 100)  # the SQLite header stays, the pages are garbage
    ledger.write_bytes(bytes(data))
    with pytest.raises(ConfigurationError, match="ledger") as err:
        FlopMeter(_linear(), 0, ledger=ledger, nvml=False)
    assert str(ledger) in str(err.value)
    assert main(["ledger", "list", "--ledger", str(ledger)]) == 2


# ------------------------------------------------------------------ a crash inside an append
_CRASHING_APPEND = """
import contextlib, os, sys
from flopmeter.ledger import store
from flopmeter.report import FlopReport

ledger = store.Ledger(sys.argv[1])
ledger.append(FlopReport(run={"run_id": "first", "status": "completed"}))
real = store.Ledger._transaction

@contextlib.contextmanager
def crash_before_commit(self):
    with real(self) as con:
        yield con
        os._exit(9)  # the process dies inside the append: the journal stays (hot)

store.Ledger._transaction = crash_before_commit
# a report large enough that SQLite spills changed pages into the file before the commit
ledger.append(FlopReport(run={"run_id": "second", "status": "completed"}, notes=["x" * 1000] * 5000))
"""


@pytest.mark.parametrize("command", ["list", "verify", "export", "show"])
def test_read_only_ledger_commands_after_a_crash_inside_an_append(tmp_path, command, capsys):
    ledger = tmp_path / "ledger.sqlite"
    crashed = subprocess.run(
        [sys.executable, "-c", _CRASHING_APPEND, str(ledger)], env=_env(), capture_output=True
    )
    assert crashed.returncode == 9, crashed.stderr
    assert Path(f"{ledger}-journal").stat().st_size > 0  # SQLite's hot journal
    args = ["ledger", "--ledger", str(ledger), command] + (["first"] if command == "show" else [])
    status = main(args)  # before the fix: 2, "not a flopmeter ledger"
    out = capsys.readouterr()
    assert status == 0, out.err
    if command == "list":
        assert "first" in out.out and "second" not in out.out  # the crashed append never was
    if command == "verify":
        assert "ok: 1 record(s), chain valid" in out.out


# ------------------------------------------------------------------ flopmeter report -o
def _cli_report(tmp_path: Path) -> Path:
    path = tmp_path / "flops_meter.json"
    model = _linear()
    with FlopMeter(model, 0, output=path, nvml=False):
        model(torch.randn(3, 2)).sum().backward()
    return path


def test_report_o_through_a_symlink_writes_the_target_and_the_link_stays(tmp_path, capsys):
    report = _cli_report(tmp_path)
    target = tmp_path / "site" / "report.html"
    target.parent.mkdir()
    target.write_text("old page")
    link = tmp_path / "latest.html"
    link.symlink_to(target)
    assert main(["report", str(report), "--format", "html", "-o", str(link)]) == 0
    assert link.is_symlink() and os.readlink(link) == str(target)  # before: a regular file
    assert "<html" in target.read_text().lower()


@pytest.mark.parametrize("kind", ["device", "fifo", "link to device"])
def test_report_o_refuses_special_files_and_leaves_them(tmp_path, kind, capsys):
    import stat

    report = _cli_report(tmp_path)
    node = tmp_path / "null"
    if kind == "fifo":
        os.mkfifo(node)
    else:  # a stand-in for /dev/null; the real one is never touched
        os.mknod(node, stat.S_IFCHR | 0o666, os.makedev(1, 3))
    given = node
    if kind == "link to device":
        given = tmp_path / "link"
        given.symlink_to(node)
    before = {p.name: os.lstat(p) for p in tmp_path.iterdir()}
    assert main(["report", str(report), "-o", str(given)]) == 2
    err = capsys.readouterr().err
    assert str(given) in err and ("FIFO" if kind == "fifo" else "character device") in err
    after = {p.name: os.lstat(p) for p in tmp_path.iterdir()}
    assert before.keys() == after.keys()
    assert all(
        (b.st_mode, b.st_ino, b.st_rdev) == (after[n].st_mode, after[n].st_ino, after[n].st_rdev)
        for n, b in before.items()
    )


# ------------------------------------------------------------------ a slow or hung file system
def _train_steps(model: torch.nn.Module, optimizer: torch.optim.Optimizer, n: int) -> None:
    for _ in range(n):
        model(**padded_batch([4, 2], 6)).loss.backward()
        optimizer.step()
        optimizer.zero_grad()


def _stuck_fsync(monkeypatch, folder: Path, *, once: bool):
    """``os.fsync`` that blocks (until ``release`` is set, 30 s at most) on files in ``folder``;
    ``in_write`` is set while it blocks. Returns (in_write, release, threads that blocked)."""
    import threading

    real = os.fsync
    in_write, release = threading.Event(), threading.Event()
    blocked: list[threading.Thread] = []

    def fsync(fd: int) -> None:
        where = os.readlink(f"/proc/self/fd/{fd}")
        if where.startswith(str(folder)) and not (once and blocked):
            blocked.append(threading.current_thread())
            in_write.set()
            release.wait(timeout=30)
            in_write.clear()
        real(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    return in_write, release, blocked


def test_a_stuck_refresh_write_never_holds_a_training_step(tmp_path, monkeypatch):
    import threading

    out = tmp_path / "out" / "r.json"
    model = tiny_llama()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    meter = FlopMeter(model, PAD_ID, output=out, refresh_seconds=1e-9, nvml=False).start()
    in_write, release, blocked = _stuck_fsync(monkeypatch, out.parent, once=True)
    _train_steps(model, optimizer, 1)  # its refresh's write gets stuck
    in_write.wait(timeout=30)  # before the fix: the step itself sat in the write, 30 s
    steps_while_stuck = 0
    for _ in range(10):
        _train_steps(model, optimizer, 1)
        steps_while_stuck += in_write.is_set()
    # before the fix the training thread itself sat in the fsync: no step while it was stuck
    assert steps_while_stuck == 10
    assert blocked[0] is not threading.main_thread()
    release.set()
    report = meter.stop()
    on_disk = read_report(out)
    assert on_disk.run.status == "completed" and on_disk.tokens.optimizer_steps == 11
    assert on_disk.run.run_id == report.run.run_id


def test_a_hung_final_write_waits_a_bounded_time_then_saves_a_copy(tmp_path, monkeypatch, caplog):
    import tempfile

    from flopmeter.report.writing import ReportFile

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "fallback"))
    (tmp_path / "fallback").mkdir()
    monkeypatch.setattr(ReportFile, "final_wait_seconds", 0.5)
    out = tmp_path / "out" / "r.json"
    model = tiny_llama()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    meter = FlopMeter(model, PAD_ID, output=out, refresh_seconds=3600, nvml=False).start()
    _train_steps(model, optimizer, 2)
    in_write, release, _ = _stuck_fsync(monkeypatch, out.parent, once=False)
    with caplog.at_level("ERROR", logger="flopmeter"):
        report = meter.stop()  # returns though the file system does not answer
    assert in_write.is_set()  # the write is still stuck: stop() did not wait for it
    (copy,) = (tmp_path / "fallback").iterdir()
    assert json.loads(copy.read_text()) == json.loads(report.to_json())
    assert str(out) in caplog.text and str(copy) in caplog.text
    release.set()  # the mount answers again: the final report reaches the file after all
    deadline = time.monotonic() + 10
    while json.loads(out.read_text())["run"]["status"] != "completed":
        assert time.monotonic() < deadline, "the final report never reached the file"
        time.sleep(0.02)
    assert read_report(out).tokens.optimizer_steps == 2


# ------------------------------------------------------------------ SIGTERM during the ledger wait
_WAITS_FOR_THE_LEDGER = """
import sys
import torch
from flopmeter import FlopMeter

torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Embedding(32, 8), torch.nn.Linear(8, 32))
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
ids = torch.randint(1, 32, (2, 5))
with FlopMeter(model, 0, output=sys.argv[1], ledger=sys.argv[2], refresh_seconds=3600,
               nvml=False):
    for _ in range(3):
        model(ids).sum().backward()
        optimizer.step()
        optimizer.zero_grad()
    print("trained", flush=True)
    sys.stdin.readline()  # the test takes the ledger's lock, then lets the run end
print("ended", flush=True)
"""


@pytest.mark.slow
def test_sigterm_while_the_finished_run_waits_for_the_ledger_leaves_its_final_report(tmp_path):
    import sqlite3

    out, ledger = tmp_path / "r.json", tmp_path / "ledger.sqlite"
    child = subprocess.Popen(
        [sys.executable, "-c", _WAITS_FOR_THE_LEDGER, str(out), str(ledger)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=_env(),
    )
    assert child.stdout.readline() == "trained\n", child.stderr.read()
    holder = sqlite3.connect(ledger, isolation_level=None)
    holder.execute("BEGIN IMMEDIATE")  # another process's append holds the lock
    try:
        child.stdin.write("\n")
        child.stdin.flush()
        time.sleep(1.0)  # the run has ended and waits for the ledger's lock
        child.send_signal(signal.SIGTERM)
        child.wait(timeout=60)
    finally:
        holder.execute("ROLLBACK")
        holder.close()
    assert child.returncode == -signal.SIGTERM
    report = read_report(out)  # before the fix: the running report of the start, 0 micro-batches
    assert report.run.status == "completed" and report.run.ended_at is not None
    assert report.tokens.micro_batches == 3 and report.tokens.tokens_processed == 3 * 10
