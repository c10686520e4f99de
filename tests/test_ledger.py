"""The ledger: append-only, chained by SHA-256, verified against every kind of tampering,
safe for several processes appending at once, and strict about files that are not ledgers."""

from __future__ import annotations

import hashlib
import json
import os
import sqlite3
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from flopmeter.errors import ConfigurationError
from flopmeter.ledger.location import resolve_ledger
from flopmeter.ledger.store import Ledger, LedgerError
from flopmeter.report import FlopReport


def _report(run_id: str, **fields) -> FlopReport:
    return FlopReport(
        run={"run_id": run_id, "status": "completed"}, model={"name": "org/base"}, **fields
    )


def _ledger_with(path: Path, n: int) -> Ledger:
    ledger = Ledger(path)
    for i in range(1, n + 1):
        ledger.append(
            _report(
                f"run{i}", tokens={"tokens_processed": 100 * i}, compute={"primary_flops": 1e15 * i}
            )
        )
    return ledger


def _raw(path: Path) -> sqlite3.Connection:
    """A connection to the file as a tamperer has it: the append-only triggers dropped."""
    con = sqlite3.connect(path, isolation_level=None)
    con.execute("DROP TRIGGER ledger_no_update")
    con.execute("DROP TRIGGER ledger_no_delete")
    return con


def _problems(ledger: Ledger) -> list[tuple[int | None, str | None, str]]:
    return [(p.seq, p.run_id, p.kind) for p in ledger.verify().problems]


# ---------------------------------------------------------------------------- the chain itself
def test_records_hold_report_hash_and_chain_computed_independently(tmp_path):
    ledger = _ledger_with(tmp_path / "l.sqlite", 3)
    records = ledger.records()
    assert [r.seq for r in records] == [1, 2, 3]
    prev = "0" * 64
    for r in records:
        report = json.loads(r.report_json)
        # canonical: sorted keys, no spaces; the hash is of exactly that text
        assert r.report_json == json.dumps(report, sort_keys=True, separators=(",", ":"))
        assert r.report_sha256 == hashlib.sha256(r.report_json.encode()).hexdigest()
        assert r.prev_hash == prev
        text = "\n".join(
            ["flopmeter-ledger-v1", str(r.seq), r.run_id, str(r.version), r.recorded_at,
             r.report_sha256, r.prev_hash]
        )  # fmt: skip
        assert r.chain_hash == hashlib.sha256(text.encode()).hexdigest()
        prev = r.chain_hash
    assert ledger.head() == (3, prev)
    assert ledger.verify().ok


def test_the_same_report_again_is_not_appended_and_a_new_one_is_a_new_version(tmp_path):
    ledger = Ledger(tmp_path / "l.sqlite")
    first = ledger.append(_report("r"))
    again = ledger.append(_report("r"))
    assert first.appended and not again.appended
    assert again.record == first.record
    later = ledger.append(_report("r", tokens={"tokens_processed": 5}))
    assert later.appended and later.record.version == 2 and later.record.seq == 2
    assert [r.version for r in ledger.get("r")] == [1, 2]
    assert len(ledger.latest()) == 1 and ledger.latest()[0].version == 2
    assert ledger.verify().ok


def test_sqlite_refuses_update_and_delete_of_records(tmp_path):
    _ledger_with(tmp_path / "l.sqlite", 2)
    con = sqlite3.connect(tmp_path / "l.sqlite")
    with pytest.raises(sqlite3.DatabaseError, match="append-only"):
        con.execute("UPDATE ledger_records SET report_json = '{}' WHERE seq = 1")
    with pytest.raises(sqlite3.DatabaseError, match="append-only"):
        con.execute("DELETE FROM ledger_records WHERE seq = 2")


def test_a_report_without_run_id_is_refused(tmp_path):
    with pytest.raises(LedgerError, match="run_id"):
        Ledger(tmp_path / "l.sqlite").append(FlopReport())


# ---------------------------------------------------------------------------- tampering
def test_an_edited_report_is_named(tmp_path):
    ledger = _ledger_with(tmp_path / "l.sqlite", 4)
    con = _raw(ledger.path)
    text = con.execute("SELECT report_json FROM ledger_records WHERE seq = 2").fetchone()[0]
    edited = text.replace('"tokens_processed":200', '"tokens_processed":2')
    assert edited != text
    con.execute("UPDATE ledger_records SET report_json = ? WHERE seq = 2", (edited,))
    assert _problems(ledger) == [(2, "run2", "report_edited")]


def test_a_report_edited_with_its_hash_recomputed_breaks_the_chain_there(tmp_path):
    ledger = _ledger_with(tmp_path / "l.sqlite", 4)
    con = _raw(ledger.path)
    text = con.execute("SELECT report_json FROM ledger_records WHERE seq = 3").fetchone()[0]
    edited = text.replace('"primary_flops":3000000000000000.0', '"primary_flops":1.0')
    assert edited != text
    digest = hashlib.sha256(edited.encode()).hexdigest()
    con.execute(
        "UPDATE ledger_records SET report_json = ?, report_sha256 = ? WHERE seq = 3",
        (edited, digest),
    )
    assert _problems(ledger) == [(3, "run3", "hash_edited")]


def test_an_edited_chain_hash_is_named(tmp_path):
    ledger = _ledger_with(tmp_path / "l.sqlite", 4)
    con = _raw(ledger.path)
    con.execute("UPDATE ledger_records SET chain_hash = ? WHERE seq = 2", ("f" * 64,))
    problems = _problems(ledger)
    assert (2, "run2", "hash_edited") in problems
    assert (3, "run3", "link_broken") in problems  # the next record no longer links to it
    assert all(seq in (2, 3) for seq, _, _ in problems)


def test_a_deleted_middle_record_is_found_at_the_next_one(tmp_path):
    ledger = _ledger_with(tmp_path / "l.sqlite", 5)
    _raw(ledger.path).execute("DELETE FROM ledger_records WHERE seq = 3")
    problems = _problems(ledger)
    assert (4, "run4", "seq_gap") in problems and (4, "run4", "link_broken") in problems
    assert all(seq == 4 for seq, _, _ in problems)


def test_a_deleted_last_record_is_found_against_the_stored_head(tmp_path):
    ledger = _ledger_with(tmp_path / "l.sqlite", 3)
    _raw(ledger.path).execute("DELETE FROM ledger_records WHERE seq = 3")
    assert _problems(ledger) == [(2, "run2", "truncated")]


def test_a_tail_cut_with_the_stored_head_rewritten_is_found_only_against_an_exported_head(
    tmp_path,
):
    ledger = _ledger_with(tmp_path / "l.sqlite", 3)
    exported = ledger.head()
    con = _raw(ledger.path)
    second = con.execute("SELECT chain_hash FROM ledger_records WHERE seq = 2").fetchone()[0]
    con.execute("DELETE FROM ledger_records WHERE seq = 3")
    con.execute("UPDATE ledger_meta SET value = '2' WHERE key = 'head_seq'")
    con.execute("UPDATE ledger_meta SET value = ? WHERE key = 'head_hash'", (second,))
    assert ledger.verify().ok  # honest limit: the file alone cannot tell
    problems = ledger.verify(expected_head=exported).problems
    assert [(p.seq, p.kind) for p in problems] == [(2, "truncated")]


def test_an_exported_head_stays_valid_after_later_appends(tmp_path):
    ledger = _ledger_with(tmp_path / "l.sqlite", 2)
    exported = ledger.head()
    ledger.append(_report("run3"))
    assert ledger.verify(expected_head=exported).ok


def test_an_inserted_record_breaks_the_chain_at_the_record_after_it(tmp_path):
    ledger = _ledger_with(tmp_path / "l.sqlite", 4)
    records = ledger.records()
    con = _raw(ledger.path)
    for seq in (4, 3):  # make room at seq 3, from the top
        con.execute("UPDATE ledger_records SET seq = seq + 1 WHERE seq = ?", (seq,))
    forged = Ledger(tmp_path / "forge.sqlite")  # a well-formed record, linked to record 2
    text = json.dumps(_report("forged").model_dump(mode="json"), sort_keys=True,
                      separators=(",", ":"))  # fmt: skip
    digest = hashlib.sha256(text.encode()).hexdigest()
    from flopmeter.ledger.chain import chain_hash

    h = chain_hash(3, "forged", 1, "2026-01-01T00:00:00+00:00", digest, records[1].chain_hash)
    con.execute(
        "INSERT INTO ledger_records VALUES (3, 'forged', 1, '2026-01-01T00:00:00+00:00', ?, ?, ?, ?)",
        (text, digest, records[1].chain_hash, h),
    )
    con.execute("UPDATE ledger_meta SET value = '5' WHERE key = 'head_seq'")
    problems = _problems(ledger)
    # The break shows right after the insertion; the forged record itself is well formed (its
    # forger computed its hash), and the records moved down no longer match their seq.
    assert problems[0] == (4, "run3", "link_broken")
    assert 3 not in {seq for seq, _, _ in problems}
    assert (5, "run4", "hash_edited") in problems
    del forged


def test_a_record_added_after_the_head_is_found(tmp_path):
    ledger = _ledger_with(tmp_path / "l.sqlite", 2)
    last = ledger.records()[-1]
    con = _raw(ledger.path)
    con.execute(
        "INSERT INTO ledger_records VALUES (3, 'late', 1, ?, ?, ?, ?, ?)",
        (last.recorded_at, last.report_json, last.report_sha256, last.chain_hash,
         _chain(3, "late", last)),
    )  # fmt: skip
    assert _problems(ledger) == [(3, "late", "not_appended")]


def _chain(seq: int, run_id: str, prev) -> str:
    from flopmeter.ledger.chain import chain_hash

    return chain_hash(seq, run_id, 1, prev.recorded_at, prev.report_sha256, prev.chain_hash)


def test_reordered_records_are_named(tmp_path):
    ledger = _ledger_with(tmp_path / "l.sqlite", 4)
    con = _raw(ledger.path)
    con.execute("UPDATE ledger_records SET seq = 100 WHERE seq = 2")
    con.execute("UPDATE ledger_records SET seq = 2 WHERE seq = 3")
    con.execute("UPDATE ledger_records SET seq = 3 WHERE seq = 100")
    problems = _problems(ledger)
    named = {(seq, run_id) for seq, run_id, _ in problems}
    assert (2, "run3") in named and (3, "run2") in named
    assert all(seq in (2, 3, 4) for seq, _, _ in problems)


# ---------------------------------------------------------------------------- several processes
_APPENDER = textwrap.dedent(
    """
    import os, sys, time
    from flopmeter.ledger.store import Ledger
    from flopmeter.report import FlopReport
    path, who, n, go = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
    ledger = Ledger(path)
    open(go + "." + who, "w").close()  # ready
    while not os.path.exists(go):
        time.sleep(0.005)
    start = time.monotonic()
    for i in range(n):
        ledger.append(FlopReport(run={"run_id": f"{who}-{i}", "status": "completed"}, tokens={"tokens_processed": i}))
    print(start, time.monotonic())
    """
)


@pytest.mark.slow
def test_processes_appending_at_once_lose_nothing_and_keep_the_chain(tmp_path):
    path, go = tmp_path / "shared.sqlite", tmp_path / "go"
    Ledger(path)
    workers, per_worker = 4, 30
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", _APPENDER, str(path), f"p{w}", str(per_worker), str(go)],
            stdout=subprocess.PIPE,
            text=True,
        )
        for w in range(workers)
    ]
    while not all(Path(f"{go}.p{w}").exists() for w in range(workers)):
        assert all(p.poll() is None for p in procs), "a worker ended before it was ready"
        time.sleep(0.01)
    go.touch()  # every worker is ready: they all start appending at the same moment
    windows = [tuple(map(float, p.communicate(timeout=300)[0].split())) for p in procs]
    assert [p.returncode for p in procs] == [0] * workers
    # they did append at the same time: every worker started before any had finished
    assert max(start for start, _ in windows) < min(end for _, end in windows)
    ledger = Ledger(path, create=False)
    records = ledger.records()
    assert [r.seq for r in records] == list(range(1, workers * per_worker + 1))
    assert {r.run_id for r in records} == {
        f"p{w}-{i}" for w in range(workers) for i in range(per_worker)
    }
    assert ledger.verify().ok


# ---------------------------------------------------------------------------- bad files
def test_a_file_that_is_not_sqlite_is_not_a_ledger(tmp_path):
    path = tmp_path / "notes.txt"
    path.write_text("my notes, not a database\n")
    with pytest.raises(LedgerError, match=r"not a flopmeter ledger .*not an SQLite database"):
        Ledger(path)
    assert path.read_text() == "my notes, not a database\n"  # untouched


def test_an_sqlite_database_without_the_ledger_tables_is_not_a_ledger(tmp_path):
    path = tmp_path / "other.sqlite"
    con = sqlite3.connect(path)
    con.execute("CREATE TABLE users (name TEXT)")
    con.commit()
    con.close()
    for create in (True, False):
        with pytest.raises(LedgerError, match=r"not a flopmeter ledger .*without the ledger"):
            Ledger(path, create=create)
    tables = sqlite3.connect(path).execute("SELECT name FROM sqlite_master").fetchall()
    assert tables == [("users",)]  # nothing added


def test_a_folder_is_not_a_ledger(tmp_path):
    with pytest.raises(LedgerError, match="not a regular file"):
        Ledger(tmp_path)


def test_a_missing_ledger_is_an_error_when_reading(tmp_path):
    with pytest.raises(LedgerError, match="does not exist"):
        Ledger(tmp_path / "none.sqlite", create=False)


@pytest.fixture
def read_only(tmp_path):
    """A ledger with one record that this process cannot write (chattr +i as root)."""
    path = tmp_path / "ro.sqlite"
    _ledger_with(path, 1)
    if os.geteuid() != 0:
        path.chmod(0o444)
        tmp_path.chmod(0o555)
        yield path
        tmp_path.chmod(0o755)
        return
    made = subprocess.run(["chattr", "+i", str(path)], capture_output=True)
    if made.returncode != 0:
        pytest.skip(f"cannot make a file read-only for root here: {made.stderr!r}")
    yield path
    subprocess.run(["chattr", "-i", str(path)], check=True)


def test_a_read_only_ledger_is_refused_for_writing_and_read_fine(read_only):
    with pytest.raises(LedgerError, match="read-only"):
        Ledger(read_only)
    reader = Ledger(read_only, create=False)
    assert len(reader.records()) == 1 and reader.verify().ok


def test_a_folder_that_cannot_be_made_is_an_error(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    with pytest.raises(LedgerError, match=r"folder .* cannot be made"):
        Ledger(blocker / "sub" / "l.sqlite")


# ---------------------------------------------------------------------------- where it lives
def test_resolve_ledger_precedence(tmp_path):
    env = {"FLOPMETER_LEDGER": str(tmp_path / "env.sqlite"), "XDG_DATA_HOME": str(tmp_path)}
    assert resolve_ledger(None, env) == tmp_path / "env.sqlite"
    assert resolve_ledger(True, env) == tmp_path / "env.sqlite"
    assert resolve_ledger(False, env) is None
    assert resolve_ledger(tmp_path / "x.sqlite", env) == tmp_path / "x.sqlite"
    bare = {"XDG_DATA_HOME": str(tmp_path)}
    assert resolve_ledger(None, bare) is None
    assert resolve_ledger(True, bare) == tmp_path / "flopmeter" / "ledger.sqlite"
    home = resolve_ledger(True, {})
    assert home == Path.home() / ".local" / "share" / "flopmeter" / "ledger.sqlite"
    with pytest.raises(ConfigurationError, match="ledger must be"):
        resolve_ledger(3, {})


def test_a_meter_told_a_read_only_ledger_fails_before_training(read_only):
    import torch

    from flopmeter import FlopMeter

    model = torch.nn.Linear(3, 3)
    with pytest.raises(ConfigurationError, match="read-only"):
        FlopMeter(model, ledger=read_only)
    assert not model._forward_pre_hooks
