"""``flopmeter ledger``: list, show, verify (exit 1 on tampering), export and cumulative."""

from __future__ import annotations

import csv
import io
import json
import sqlite3

import pytest

from flopmeter.cli import main
from flopmeter.ledger.store import Ledger
from flopmeter.report import FlopReport, format_flops
from flopmeter.types import ParentRun

BASE = "meta-llama/Llama-3.2-1B"


@pytest.fixture
def ledger_path(tmp_path):
    """Five runs: two on BASE, a descendant of one of them, a grandchild, and another base."""
    path = tmp_path / "ledger.sqlite"
    ledger = Ledger(path)
    runs = [
        ("base-a", BASE, 1.0e21, []),
        ("base-b", "Meta-Llama/Llama-3.2-1B ", 2.0e21, []),  # same id, other case and a space
        ("child", "./merged-a", 5.0e20, ["base-a"]),
        ("grandchild", "./merged-a-2", 2.5e20, ["child"]),
        ("other", "Qwen/Qwen2.5-0.5B", 9.0e21, []),
    ]
    for run_id, model, flops, parents in runs:
        ledger.append(
            FlopReport(
                run={"run_id": run_id, "status": "completed"}, model={"name": model}, compute={"primary_flops": flops}, verdict={"outcome": "below_threshold"}, lineage={"parent_runs": [ParentRun(ref=p, run_id=p, flops=None) for p in parents]},
            )
        )  # fmt: skip
    return path


def _run(args, capsys):
    status = main(args)
    out, err = capsys.readouterr()
    return status, out, err


def test_list_shows_every_record(ledger_path, capsys):
    status, out, _ = _run(["ledger", "list", "--ledger", str(ledger_path)], capsys)
    assert status == 0
    for run_id in ("base-a", "base-b", "child", "grandchild", "other"):
        assert run_id in out
    assert "5 record(s)" in out


def test_the_ledger_option_before_the_subcommand_and_the_environment_variable(
    ledger_path, capsys, monkeypatch
):
    assert _run(["ledger", "--ledger", str(ledger_path), "list"], capsys)[0] == 0
    monkeypatch.setenv("FLOPMETER_LEDGER", str(ledger_path))
    status, out, _ = _run(["ledger", "list"], capsys)
    assert status == 0 and "5 record(s)" in out


def test_show_prints_the_record_with_its_report(ledger_path, capsys):
    status, out, _ = _run(["ledger", "show", "chi", "--ledger", str(ledger_path)], capsys)
    assert status == 0
    shown = json.loads(out)
    record = Ledger(ledger_path, create=False).get("child")[0]
    assert shown["run_id"] == "child" and shown["seq"] == 3
    assert shown["chain_hash"] == record.chain_hash
    assert shown["report"]["compute"]["primary_flops"] == 5.0e20
    status, _, err = _run(["ledger", "show", "nope", "--ledger", str(ledger_path)], capsys)
    assert status == 2 and "no run 'nope'" in err
    status, _, err = _run(["ledger", "show", "base", "--ledger", str(ledger_path)], capsys)
    assert status == 2 and "ambiguous" in err


def test_verify_passes_then_names_the_tampered_record(ledger_path, capsys):
    status, out, _ = _run(["ledger", "verify", "--ledger", str(ledger_path)], capsys)
    assert status == 0 and out.startswith("ok: 5 record(s), chain valid, head 5:")
    head = out.strip().rsplit(" ", 1)[1]
    con = sqlite3.connect(ledger_path, isolation_level=None)
    con.execute("DROP TRIGGER ledger_no_update")
    con.execute(
        "UPDATE ledger_records SET report_json = replace(report_json, '5e+20', '5e+10') "
        "WHERE seq = 3"
    )
    status, out, err = _run(["ledger", "verify", "--ledger", str(ledger_path)], capsys)
    assert status == 1
    assert "record seq 3 (run child)" in out and "report_edited" in out
    assert "FAILED: 1 problem(s)" in err
    status, _, _ = _run(["ledger", "verify", "--head", head, "--ledger", str(ledger_path)], capsys)
    assert status == 1
    with pytest.raises(SystemExit) as exited:  # argparse's own exit, one line
        main(["ledger", "verify", "--head", "5:abc", "--ledger", str(ledger_path)])
    assert exited.value.code == 2 and "SEQ:CHAIN_HASH" in capsys.readouterr().err


def test_export_jsonl_and_csv_hold_every_record(ledger_path, capsys, tmp_path):
    records = Ledger(ledger_path, create=False).records()
    status, out, _ = _run(["ledger", "export", "--ledger", str(ledger_path)], capsys)
    lines = [json.loads(line) for line in out.splitlines()]
    assert status == 0 and [r["run_id"] for r in lines] == [r.run_id for r in records]
    assert [r["chain_hash"] for r in lines] == [r.chain_hash for r in records]
    assert lines[0]["report"] == records[0].report()
    target = tmp_path / "ledger.csv"
    args = ["ledger", "export", "--format", "csv", "-o", str(target), "--ledger", str(ledger_path)]
    assert _run(args, capsys)[0] == 0
    rows = list(csv.DictReader(io.StringIO(target.read_text())))
    assert [r["run_id"] for r in rows] == [r.run_id for r in records]
    assert float(rows[2]["compute.primary_flops"]) == 5.0e20
    assert rows[4]["report_sha256"] == records[4].report_sha256


def test_cumulative_sums_the_base_and_its_descendants_against_the_threshold(ledger_path, capsys):
    args = ["ledger", "cumulative", "--base", BASE, "--pretrain-flops", "6e23", "--format",
            "json", "--ledger", str(ledger_path)]  # fmt: skip
    status, out, _ = _run(args, capsys)
    result = json.loads(out)
    assert status == 0
    assert {r["run_id"] for r in result["runs"]} == {"base-a", "base-b", "child", "grandchild"}
    total = 1.0e21 + 2.0e21 + 5.0e20 + 2.5e20  # by hand; "other" is another base
    assert result["total_flops"] == pytest.approx(total)
    assert result["threshold_value"] == pytest.approx(6e23 / 3)
    assert result["ratio_to_threshold"] == pytest.approx(total / 2e23)
    assert result["verdict"] == "below_threshold"
    text = ["ledger", "cumulative", "--base", BASE, "--ledger", str(ledger_path)]
    status, out, _ = _run(text, capsys)
    assert status == 0 and f"total compute: {format_flops(3.75e21)}" in out
    assert "default_gpai" in out  # no original compute given or recorded: the default


def test_cumulative_withholds_the_total_when_a_run_has_no_figure(tmp_path, capsys):
    path = tmp_path / "l.sqlite"
    ledger = Ledger(path)
    ledger.append(FlopReport(run={"run_id": "ok", "status": "completed"}, model={"name": "m"}, compute={"primary_flops": 1e20}))  # fmt: skip
    ledger.append(FlopReport(run={"run_id": "unread", "status": "completed"}, model={"name": "m"}))
    args = ["ledger", "cumulative", "--base", "m", "--format", "json", "--ledger", str(path)]
    result = json.loads(_run(args, capsys)[1])
    assert result["total_flops"] is None and result["verdict"] is None
    assert "unread" in result["withheld_reason"]


def test_files_that_are_not_ledgers_are_one_line_and_exit_2(tmp_path, capsys):
    notes = tmp_path / "notes.txt"
    notes.write_text("not a database")
    for path, message in ((notes, "not an SQLite database"), (tmp_path / "none", "does not")):
        status, _, err = _run(["ledger", "list", "--ledger", str(path)], capsys)
        assert status == 2 and err.count("\n") == 1 and message in err


# ----------------------------------------------------------------------------- review fixes
def _tamper(path, seq=3):
    """Edits record ``seq``'s report as someone with the file would (the trigger dropped)."""
    con = sqlite3.connect(path, isolation_level=None)
    con.execute("DROP TRIGGER ledger_no_update")
    con.execute(
        "UPDATE ledger_records SET report_json = replace(report_json, '5e+20', '5e+10') "
        "WHERE seq = ?",
        (seq,),
    )
    con.close()


def test_cumulative_takes_the_catalogue_figure_for_the_base(tmp_path, capsys, monkeypatch):
    from flopmeter.compliance.catalog import lookup
    from flopmeter.compliance.thresholds import determine_threshold

    monkeypatch.delenv("PRETRAIN_FLOPS", raising=False)
    base = "meta-llama/Llama-3.2-3B"
    entry = lookup(base)
    assert entry is not None and entry.flops is not None and entry.flops > 1e23
    path = tmp_path / "l.sqlite"
    Ledger(path).append(FlopReport(run={"run_id": "r", "status": "completed"}, model={"name": base}, compute={"primary_flops": 4e21}))  # fmt: skip
    args = ["ledger", "cumulative", "--base", base, "--pretrain-flops", "catalog", "--format",
            "json", "--ledger", str(path)]  # fmt: skip
    status, out, err = _run(args, capsys)
    assert status == 0, err
    result = json.loads(out)
    assert result["threshold_value"] == pytest.approx(entry.flops / 3)
    assert result["threshold_type"] == determine_threshold(entry.flops).kind
    assert "catalogue" in result["pretrain_flops_source"]
    assert result["ratio_to_threshold"] == pytest.approx(4e21 / (entry.flops / 3))
    # PRETRAIN_FLOPS=catalog is the same opt-in
    monkeypatch.setenv("PRETRAIN_FLOPS", "catalog")
    status, out, _ = _run(args[:4] + args[6:], capsys)
    assert status == 0 and json.loads(out)["threshold_value"] == pytest.approx(entry.flops / 3)
    # a base the catalogue does not know: the fallback, and a note saying why
    monkeypatch.delenv("PRETRAIN_FLOPS")
    status, out, _ = _run(["ledger", "cumulative", "--base", "acme/unknown", "--pretrain-flops",
                           "catalog", "--ledger", str(path)], capsys)  # fmt: skip
    assert status == 0 and "does not know the model 'acme/unknown'" in out


def test_cumulative_refuses_a_ledger_that_does_not_verify(ledger_path, capsys):
    _tamper(ledger_path)  # the child's 5e20 made 5e10
    args = ["ledger", "cumulative", "--base", BASE, "--format", "json", "--ledger",
            str(ledger_path)]  # fmt: skip
    status, out, err = _run(args, capsys)
    assert status == 1 and out == ""
    assert err.count("\n") == 1 and "record seq 3 (run child)" in err and "report_edited" in err
    status, out, err = _run([*args, "--no-verify"], capsys)
    assert status == 0 and "warning" in err and "record seq 3" in err
    result = json.loads(out)
    assert result["chain_verified"] is False
    assert result["total_flops"] == pytest.approx(1.0e21 + 2.0e21 + 5.0e10 + 2.5e20)


def test_list_show_and_export_warn_when_the_chain_does_not_verify(ledger_path, capsys):
    for sub in (["list"], ["show", "child"], ["export"]):
        status, _, err = _run(["ledger", *sub, "--ledger", str(ledger_path)], capsys)
        assert status == 0 and err == "", sub
    _tamper(ledger_path)
    for sub in (["list"], ["show", "child"], ["export"]):
        status, out, err = _run(["ledger", *sub, "--ledger", str(ledger_path)], capsys)
        assert status == 0 and "child" in out, sub
        assert err.count("\n") == 1 and "does not verify" in err and "seq 3" in err, sub


def test_verify_names_an_edited_head_a_deleted_head_and_an_emptied_ledger(ledger_path, capsys):
    con = sqlite3.connect(ledger_path, isolation_level=None)
    con.execute("UPDATE ledger_meta SET value = ? WHERE key = 'head_hash'", ("ab" * 32,))
    status, out, _ = _run(["ledger", "verify", "--ledger", str(ledger_path)], capsys)
    assert status == 1 and "[head_edited]" in out and "the stored head was edited" in out
    assert "cut" not in out
    con.execute("DELETE FROM ledger_meta WHERE key IN ('head_seq', 'head_hash')")
    status, out, _ = _run(["ledger", "verify", "--ledger", str(ledger_path)], capsys)
    assert status == 1 and "[head_missing]" in out and "0000" not in out
    con.execute("INSERT INTO ledger_meta VALUES ('head_seq', '5'), ('head_hash', ?)", ("ab" * 32,))
    con.execute("DROP TRIGGER ledger_no_delete")
    con.execute("DELETE FROM ledger_records")
    status, out, _ = _run(["ledger", "verify", "--ledger", str(ledger_path)], capsys)
    assert status == 1 and "holds no records" in out and "seq 0" not in out
