"""The report file's life on disk: claimed and written ``running`` at start, never replacing a
file that is not a flopmeter report, locked against a second live run, and never lost when the
final write fails."""

from __future__ import annotations

import errno
import json
import logging
import os
import signal
import stat
import subprocess
import sys
import textwrap
import time

import pytest

from flopmeter.errors import ConfigurationError
from flopmeter.report import FlopReport
from flopmeter.report import writing as output_module
from flopmeter.report.output_path import DEFAULT_FILENAME, check_writable, lock_path, resolve_output
from flopmeter.report.writing import ReportFile, fallback_path, write_report


def running(run_id: str = "run-a") -> FlopReport:
    return FlopReport(run={"run_id": run_id, "status": "running"}, tokens={"tokens_processed": 10})


def final(run_id: str = "run-a") -> FlopReport:
    return FlopReport(
        run={"run_id": run_id, "status": "completed"},
        tokens={"tokens_processed": 1234},
        compute={"primary_flops": 5.5e18},
    )


def on_disk(path) -> dict:
    return json.loads(path.read_text())


def test_open_writes_the_running_report_at_once_and_write_replaces_it(tmp_path):
    out = tmp_path / "nested" / "run.json"
    with ReportFile.open(out, running()) as rf:
        assert rf.path == out
        assert on_disk(out)["run"]["status"] == "running"
        assert lock_path(out).exists()
        assert rf.write(final()) is True
        assert on_disk(out) == json.loads(final().to_json())
        assert rf.write(running()) is False  # a refresh after the final one would be stale
        assert on_disk(out)["run"]["status"] == "completed"
        assert stat.S_IMODE(out.stat().st_mode) == 0o666 & ~_umask()
    assert sorted(p.name for p in out.parent.iterdir()) == ["run.json"]  # lock removed
    rf.close()  # idempotent


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def test_a_symlinked_output_writes_the_target_and_stays_a_link(tmp_path):
    target = tmp_path / "real" / "report.json"
    target.parent.mkdir()
    link = tmp_path / "link.json"
    link.symlink_to(target)
    with ReportFile.open(link, running()) as rf:
        assert rf.path == target
        assert rf.write(final())
    assert link.is_symlink() and os.readlink(link) == str(target)
    assert on_disk(target)["run"]["status"] == "completed"
    assert write_report(final("run-b"), link)  # the meter's end-of-run writer too
    assert link.is_symlink() and on_disk(target)["run"]["run_id"] == "run-b"


def _fifo(tmp_path):
    path = tmp_path / "fifo"
    os.mkfifo(path)
    return path, "FIFO"


def _device(tmp_path):
    path = tmp_path / "null"  # a stand-in for /dev/null; the real one is never touched
    os.mknod(path, stat.S_IFCHR | 0o666, os.makedev(1, 3))
    return path, "character device"


def _link_to_device(tmp_path):
    device, _ = _device(tmp_path)
    link = tmp_path / "link-to-null"
    link.symlink_to(device)
    return link, "character device"


@pytest.mark.parametrize("make", [_fifo, _device, _link_to_device], ids=["fifo", "dev", "link"])
def test_special_files_are_refused_untouched(tmp_path, make):
    path, kind = make(tmp_path)
    before = {p.name: os.lstat(p) for p in tmp_path.iterdir()}
    for claim in (lambda: ReportFile.open(path, running()), lambda: check_writable(path)):
        with pytest.raises(ConfigurationError, match=kind) as caught:
            claim()
        assert str(path) in str(caught.value) and "output" in str(caught.value)
    after = {p.name: os.lstat(p) for p in tmp_path.iterdir()}
    assert before.keys() == after.keys()  # no lock file, no temporary, nothing replaced
    for name, st in before.items():
        assert (st.st_mode, st.st_ino, st.st_rdev) == (
            after[name].st_mode,
            after[name].st_ino,
            after[name].st_rdev,
        )


@pytest.mark.parametrize(
    "content",
    [
        b"step,loss\n1,2.5\n",
        b'[{"schema_version": "1.1", "status": "running"}]',
        b'{"name": "my config", "status": "ok"}',
        b'{"schema_version": "3"}',
    ],
    ids=["csv", "json-list", "json-object", "no-status"],
)
def test_a_file_that_is_not_a_report_is_refused_and_left_as_it_was(tmp_path, content):
    out = tmp_path / "flops_meter.json"
    out.write_bytes(content)
    for claim in (lambda: ReportFile.open(out, running()), lambda: check_writable(out)):
        with pytest.raises(ConfigurationError, match="not a flopmeter report") as caught:
            claim()
        assert str(out) in str(caught.value)
    assert out.read_bytes() == content
    assert [p.name for p in tmp_path.iterdir()] == ["flops_meter.json"]


def test_an_earlier_report_is_replaced_by_the_new_runs_running_report(tmp_path):
    out = tmp_path / DEFAULT_FILENAME
    final("old-run").write_json(out)
    rf = ReportFile.open(out, running("new-run"))
    assert on_disk(out)["run"]["run_id"] == "new-run" and on_disk(out)["run"]["status"] == "running"
    rf.close()
    out.write_text("")  # an empty file (mktemp) holds nothing to lose
    with ReportFile.open(out, running("third")):
        assert on_disk(out)["run"]["run_id"] == "third"


def test_a_folder_is_refused_where_a_file_is_needed(tmp_path):
    with pytest.raises(ConfigurationError, match="is a folder where a file is needed"):
        ReportFile.open(tmp_path, running())


CHILD = textwrap.dedent(
    """
    import sys, pathlib
    from flopmeter.report.writing import ReportFile
    from flopmeter.report import FlopReport
    rf = ReportFile.open(pathlib.Path(sys.argv[1]), FlopReport(run={"run_id": "child", "status": "running"}))
    pathlib.Path(sys.argv[2]).write_text("claimed")
    sys.stdin.read()  # holds the path until killed or stdin closes
    """
)


def _start_child(out, ready):
    child = subprocess.Popen(
        [sys.executable, "-c", CHILD, str(out), str(ready)],
        stdin=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    deadline = time.monotonic() + 60
    while not ready.exists():
        assert child.poll() is None, child.stderr.read().decode()
        assert time.monotonic() < deadline, "the child never claimed the path"
        time.sleep(0.02)
    return child


@pytest.mark.slow
def test_a_second_live_run_on_the_same_path_is_refused_until_the_first_dies(tmp_path):
    out = tmp_path / DEFAULT_FILENAME
    child = _start_child(out, tmp_path / "ready")
    try:
        assert on_disk(out)["run"]["run_id"] == "child"
        link = tmp_path / "other-name.json"
        link.symlink_to(out)  # another name for the same file shares the lock
        for path in (out, link):
            with pytest.raises(ConfigurationError, match="another run") as caught:
                ReportFile.open(path, running("parent"))
            assert f"process {child.pid}" in str(caught.value) and str(path) in str(caught.value)
        assert on_disk(out)["run"]["run_id"] == "child"  # the refused run wrote nothing
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait(timeout=30)
    assert child.returncode == -signal.SIGKILL
    assert lock_path(out).exists()  # left behind by the killed run, no longer locked
    with ReportFile.open(out, running("parent")):
        assert on_disk(out)["run"]["run_id"] == "parent"
    assert not lock_path(out).exists()


def test_a_lock_released_by_close_lets_the_next_run_in(tmp_path):
    out = tmp_path / DEFAULT_FILENAME
    first = ReportFile.open(out, running("one"))
    with pytest.raises(ConfigurationError, match="another run"):
        ReportFile.open(out, running("two"))
    first.close()
    with ReportFile.open(out, running("two")):
        assert on_disk(out)["run"]["run_id"] == "two"


def _failed_write_check(rf, out, caplog, tmp_path, monkeypatch):
    monkeypatch.setattr(output_module.tempfile, "tempdir", str(tmp_path / "fallback"))
    (tmp_path / "fallback").mkdir()
    report = final("run-a")
    with caplog.at_level(logging.ERROR, logger="flopmeter"):
        assert rf.write(report) is False
    record = next(r for r in caplog.records if r.name == "flopmeter")
    assert record.levelno == logging.ERROR
    assert str(out) in record.getMessage() and report.to_json() in record.getMessage()
    saved = fallback_path(out, "run-a")
    assert saved == tmp_path / "fallback" / "flopmeter-run-a-run.json"
    assert str(saved) in record.getMessage()
    assert FlopReport.model_validate_json(saved.read_text()) == report


def test_a_failed_write_is_logged_with_the_report_and_saved_elsewhere(
    tmp_path, caplog, monkeypatch
):
    out = tmp_path / "run.json"
    rf = ReportFile.open(out, running("run-a"))
    real_replace = os.replace

    def disk_full(src, dst):
        if os.fspath(dst) == str(out):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        real_replace(src, dst)

    monkeypatch.setattr(os, "replace", disk_full)
    _failed_write_check(rf, out, caplog, tmp_path, monkeypatch)
    assert "No space left on device" in caplog.records[-1].getMessage()
    assert on_disk(out) == json.loads(running("run-a").to_json())  # this run's own last report
    assert [p.name for p in tmp_path.iterdir() if p.name.endswith(".tmp")] == []
    rf.close()


def test_a_folder_replaced_by_a_file_mid_run_fails_the_write_without_raising(
    tmp_path, caplog, monkeypatch
):
    folder = tmp_path / "out"
    out = folder / "run.json"
    rf = ReportFile.open(out, running("run-a"))
    folder.rename(tmp_path / "moved")
    folder.write_text("not a folder any more")
    _failed_write_check(rf, out, caplog, tmp_path, monkeypatch)
    assert on_disk(tmp_path / "moved" / "run.json")["run"]["status"] == "running"
    rf.close()


def test_writing_after_close_goes_to_the_fallback_not_the_path(tmp_path, caplog, monkeypatch):
    out = tmp_path / "run.json"
    rf = ReportFile.open(out, running("run-a"))
    rf.close()
    _failed_write_check(rf, out, caplog, tmp_path, monkeypatch)
    assert on_disk(out)["run"]["status"] == "running"


@pytest.mark.parametrize("bad", [3, object(), 2.5, ["a"]], ids=["int", "object", "float", "list"])
def test_a_value_that_is_not_a_path_is_a_configuration_error(tmp_path, bad):
    for call in (
        lambda: resolve_output(bad),
        lambda: ReportFile.open(bad, running()),
        lambda: check_writable(bad),
    ):
        with pytest.raises(ConfigurationError, match="output must be a file or folder path"):
            call()


def _name_too_long(tmp_path):
    return tmp_path / ("x" * 300) / "run.json"


def _nul_byte(tmp_path):
    return str(tmp_path / "a\0b.json")


def _parent_is_a_file(tmp_path):
    (tmp_path / "a-file").write_text("")
    return tmp_path / "a-file" / "run.json"


def _parent_is_a_symlink_loop(tmp_path):
    (tmp_path / "loop").symlink_to(tmp_path / "loop")
    return tmp_path / "loop" / "run.json"


@pytest.mark.parametrize(
    "make", [_name_too_long, _nul_byte, _parent_is_a_file, _parent_is_a_symlink_loop]
)
def test_a_path_that_cannot_be_used_is_a_configuration_error_naming_output(tmp_path, make):
    bad = make(tmp_path)
    for call in (
        lambda: ReportFile.open(resolve_output(bad), running()),
        lambda: check_writable(bad),
    ):
        with pytest.raises(ConfigurationError, match="output") as caught:
            call()
        assert repr(str(bad))[1:-1] in str(caught.value)


def test_a_parent_this_process_cannot_read_is_a_configuration_error(tmp_path, monkeypatch):
    # As root, chmod stops nothing; the OS's answer for a folder without search permission is
    # given by os.stat, where pathlib and flopmeter first look at the path.
    out = tmp_path / "locked" / "run.json"
    real_stat = os.stat

    def no_permission(path, *args, **kwargs):
        if str(tmp_path / "locked") in os.fspath(path):
            raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), os.fspath(path))
        return real_stat(path, *args, **kwargs)

    monkeypatch.setattr(os, "stat", no_permission)
    for call in (lambda: resolve_output(out), lambda: ReportFile.open(out, running())):
        with pytest.raises(ConfigurationError, match="Permission denied") as caught:
            call()
        assert str(out) in str(caught.value)


# ------------------------------------------------------------------ reports built by the writer
def _saved_statuses(monkeypatch) -> list[str]:
    """The status of each report the writer saves, in order."""
    saved: list[str] = []
    real = output_module._save

    def save(report, real_path, closed=False):
        saved.append(report.run.status)
        return real(report, real_path, closed)

    monkeypatch.setattr(output_module, "_save", save)
    return saved


def test_write_later_builds_on_the_writer_thread_and_writes_what_it_built(tmp_path, monkeypatch):
    import threading

    out = tmp_path / "r.json"
    built_on: list[threading.Thread] = []
    done = threading.Event()

    def build() -> FlopReport:
        built_on.append(threading.current_thread())
        done.set()
        return FlopReport(
            run={"run_id": "run-a", "status": "running"}, tokens={"tokens_processed": 77}
        )

    with ReportFile.open(out, running()) as rf:
        assert rf.write_later(build)
        assert done.wait(30)
        deadline = time.monotonic() + 30
        while on_disk(out)["tokens"]["tokens_processed"] != 77:
            assert time.monotonic() < deadline, "the built report never reached the file"
            time.sleep(0.01)
        assert rf.write_later(lambda: None)  # a build that fails gives nothing to write
        assert rf.write(final())
        assert not rf.write_later(build)  # after the final report: stale, dropped
    assert built_on == [built_on[0]] and built_on[0] is not threading.main_thread()
    assert on_disk(out)["run"]["status"] == "completed"


def test_a_report_still_being_built_when_the_final_one_comes_is_never_written(
    tmp_path, monkeypatch
):
    import threading

    out = tmp_path / "r.json"
    building, finish = threading.Event(), threading.Event()

    def slow_build() -> FlopReport:
        building.set()
        finish.wait(30)
        return running()

    with ReportFile.open(out, running()) as rf:
        saved = _saved_statuses(monkeypatch)
        rf.write_later(slow_build)
        assert building.wait(30)
        threading.Timer(0.2, finish.set).start()  # the build ends while the final one waits
        assert rf.write(final())
    assert saved == ["completed"]  # the running report built meanwhile was dropped
    assert on_disk(out)["run"]["status"] == "completed"
