"""Hostile input and secrets (issue 19): files beside the reports, escape sequences, formulas,
run ids that climb out of a prefix, credentials in messages, impossible dates and numbers,
withheld figures that would read as 0, and ``token_inputs`` at a float tensor.

Real components throughout: real tiny models trained a step, real SQLite ledgers, the real CLI,
a moto server over real HTTP for S3, real signals.
"""

from __future__ import annotations

import csv
import io
import json
import os
import signal
import subprocess
import sys
import threading
import time

import pytest
import torch

from flopmeter import FlopMeter
from flopmeter.cli import main
from flopmeter.errors import ConfigurationError, ReportFileError
from flopmeter.ledger.store import Ledger
from flopmeter.report.reading import read_report
from tests.support.batches import PAD_ID, padded_batch
from tests.support.models import tiny_llama

CONTROLS = ("\x1b", "\x07", "\x9b", "\u202e", "\u2066", "\r")


def _train(tmp_path, name="run.json", **kwargs):
    """One real step of a tiny model, metered; the report file."""
    model = tiny_llama()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    out = tmp_path / name
    with FlopMeter(model, PAD_ID, output=out, **kwargs) as meter:
        model(**padded_batch([3, 5], 6)).loss.backward()
        optimizer.step()
    return out, meter


def _edited(path, edit):
    data = json.loads(path.read_text())
    edit(data)
    path.write_text(json.dumps(data))
    return path


# ----------------------------------------------------------------- 1. files beside the reports
def test_a_deeply_nested_file_is_a_clear_error_naming_it(tmp_path, capsys):
    deep = tmp_path / "deep.json"
    deep.write_text("[" * 100_000 + "]" * 100_000)
    with pytest.raises(ReportFileError, match=r"deep\.json.*nested"):
        read_report(deep)
    assert main(["report", str(deep)]) == 2
    assert "nested" in capsys.readouterr().err


def test_a_huge_integer_is_a_clear_error_naming_it(tmp_path):
    huge = tmp_path / "huge.json"
    huge.write_text('{"schema_version": "2.0", "x": ' + "9" * 100_000 + "}")
    with pytest.raises(ReportFileError, match=r"huge\.json.*digits"):
        read_report(huge)


def test_a_file_over_the_size_cap_is_refused_without_reading_it(tmp_path, capsys):
    big = tmp_path / "big.json"
    with open(big, "wb") as f:
        f.truncate(300 * 1024 * 1024)  # sparse: 300 MB that take no disk
    started = time.monotonic()
    with pytest.raises(ReportFileError, match=r"big\.json.*larger than"):
        read_report(big)
    assert time.monotonic() - started < 2.0
    assert main(["report", str(big)]) == 2
    assert "larger than" in capsys.readouterr().err


def test_parent_lookup_by_run_id_skips_hostile_files_and_says_so(tmp_path, caplog):
    _, meter = _train(tmp_path, "parent.json")
    (tmp_path / "deep.json").write_text("[" * 100_000 + "]" * 100_000)
    (tmp_path / "huge.json").write_text('{"a": ' + "1" * 100_000 + "}")
    child = FlopMeter(tiny_llama(), PAD_ID, output=tmp_path / "child.json",
                      parent_runs=[meter.run_id])  # fmt: skip
    assert [p.run_id for p in child.parents] == [meter.run_id]
    skipped = caplog.text
    assert "deep.json" in skipped and "huge.json" in skipped
    with pytest.raises(ConfigurationError, match=r"not reports and were skipped: deep\.json"):
        FlopMeter(tiny_llama(), PAD_ID, output=tmp_path / "c2.json", parent_runs=["0" * 32])


# ----------------------------------------------------------------- 2. escapes and formulas
EVIL = "org/m\x1b[31mred\x07\x9b2J\u202etxt.exe\u2066x\rover"


def _evil_report(tmp_path):
    """A run named EVIL that fails with EVIL in its error (the banner and the notes)."""
    model = tiny_llama()
    out = tmp_path / "run.json"
    with pytest.raises(RuntimeError), FlopMeter(model, PAD_ID, output=out, model_name=EVIL):
        model(**padded_batch([3, 5], 6)).loss.backward()
        raise RuntimeError(f"boom {EVIL}")
    return out, None


@pytest.mark.parametrize("form", ["text", "md", "html"])
def test_reports_never_print_terminal_or_bidi_controls(tmp_path, capsys, form):
    out, _ = _evil_report(tmp_path)
    assert main(["report", str(out), "--format", form]) == 0
    printed = capsys.readouterr().out
    for ch in CONTROLS:
        assert ch not in printed, repr(ch)
    assert "x1b" in printed and "u202e" in printed  # shown as escapes, not swallowed


def test_to_text_shows_controls_as_escapes(tmp_path):
    text = read_report(_evil_report(tmp_path)[0]).to_text()
    for ch in CONTROLS:
        assert ch not in text
    assert "\\x07" in text


def _ledger_with(tmp_path, name):
    path = tmp_path / "ledger.sqlite"
    _train(tmp_path, model_name=name, ledger=path)
    return path


def test_ledger_list_never_prints_controls(tmp_path, capsys):
    path = _ledger_with(tmp_path, EVIL)
    assert main(["ledger", "--ledger", str(path), "list"]) == 0
    printed = capsys.readouterr().out
    for ch in CONTROLS:
        assert ch not in printed
    assert "\\x1b[31mred" in printed


@pytest.mark.parametrize("command", [["show", "RUN"], ["export"]])
def test_ledger_show_and_export_are_the_same_json_with_no_raw_controls(tmp_path, capsys, command):
    path = _ledger_with(tmp_path, EVIL)
    run_id = Ledger(path, create=False).records()[0].run_id
    args = [run_id if part == "RUN" else part for part in command]
    assert main(["ledger", "--ledger", str(path), *args]) == 0
    printed = capsys.readouterr().out
    for ch in CONTROLS:
        assert ch not in printed, repr(ch)
    assert json.loads(printed)["report"]["model"]["name"] == EVIL  # the same JSON


@pytest.mark.parametrize("start", ["=", "+", "-", "@", "\t", "\r"])
def test_csv_export_writes_no_live_formula(tmp_path, capsys, start):
    name = f'{start}HYPERLINK("http://x.test/?"&A1,"ok")'
    path = _ledger_with(tmp_path, name)
    assert main(["ledger", "--ledger", str(path), "export", "--format", "csv"]) == 0
    rows = list(csv.DictReader(io.StringIO(capsys.readouterr().out)))
    assert rows[0]["model.name"] == "'" + name
    for row in rows:
        for value in row.values():
            assert not value.startswith(("=", "+", "-", "@", "\t", "\r")), value


# ----------------------------------------------------------------- 3. run ids
def test_a_run_id_that_climbs_out_is_refused_by_the_reader(tmp_path):
    out, _ = _train(tmp_path)
    _edited(out, lambda d: d["run"].update(run_id="../tenant-b/victim"))
    with pytest.raises(ReportFileError, match=r"run\.run_id"):
        read_report(out)


def test_sinks_and_the_ledger_refuse_a_run_id_that_is_not_one(tmp_path):
    from flopmeter.ledger.sinks import S3Sink, SinkError, SinkPayload

    report = {"schema_version": "2.0", "run": {"run_id": "../tenant-b/victim"}}
    with pytest.raises(SinkError, match="not a run id"):
        SinkPayload.of(report)
    with pytest.raises(ValueError, match="not a run id"):
        S3Sink("bucket", "tenant-a").key("../tenant-b/victim")
    with pytest.raises(Exception, match="not a run id"):
        Ledger(tmp_path / "l.sqlite").append(report)


def test_upload_never_writes_outside_its_prefix(tmp_path, endpoint, aws, capsys):
    name, s3 = aws["name"], aws["s3"]
    out, _ = _train(tmp_path)
    _edited(out, lambda d: d["run"].update(run_id="../tenant-b/victim"))
    code = main(["upload", str(out), "--s3", f"s3://{name}/tenant-a", "--endpoint-url",
                 endpoint])  # fmt: skip
    assert code == 2
    assert "run_id" in capsys.readouterr().err
    assert s3.list_objects_v2(Bucket=name).get("KeyCount", 0) == 0


# ----------------------------------------------------------------- 4. credentials
SECRETS = {
    "hf": "hf_" + "a1B2" * 9,
    "aws": "AKIAIOSFODNN7EXAMPLE",
    "url": "pa55word",
    "github": "ghp_" + "Z9y8" * 9,
    "github_pat": "github_pat_11ABCDEFG0" + "x" * 40,
    "jwt": "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxMjM0NTY3ODkwIn0.SflKxwRJSMeKKF2QT4fwpMeJf36POk6yJV",
    "openai": "sk-proj-" + "Q" * 40,
    "slack": "xoxb-1234567890-abcdefghijkl",
    "pem": "MIIEvQIBADANBgkqhkiG9w0BAQEFAASC",
}
MESSAGE = (
    f"pull with {SECRETS['hf']} and {SECRETS['aws']} from https://me:{SECRETS['url']}@hub.test/x "
    f"{SECRETS['github']} {SECRETS['github_pat']} {SECRETS['jwt']} {SECRETS['openai']} "
    f"{SECRETS['slack']} -----BEGIN PRIVATE KEY-----\n{SECRETS['pem']}\n-----END PRIVATE KEY-----"
)


def test_redaction_covers_every_known_shape():
    from flopmeter.safe_text import redact

    text = redact(MESSAGE)
    for kind, secret in SECRETS.items():
        assert secret not in text, kind
    assert text.startswith("pull with hf_[REDACTED]")


def test_a_hook_exception_reaches_neither_report_nor_ledger_unredacted(tmp_path):
    def tokens(args, kwargs):
        raise RuntimeError(MESSAGE)

    ledger = tmp_path / "ledger.sqlite"
    out, meter = _train(tmp_path, ledger=ledger, token_inputs=tokens)
    stored = [out.read_text(), *(r.report_json for r in Ledger(ledger, create=False).records())]
    stored.append(json.dumps(dict(meter.problems)))
    for text in stored:
        for kind, secret in SECRETS.items():
            assert secret not in text, kind
    assert "hf_[REDACTED]" in out.read_text()  # the problem is still said


# ----------------------------------------------------------------- 5. dates, numbers, S3, Ctrl-C
@pytest.mark.parametrize(
    ("edit", "field"),
    [
        (lambda r: r.update(ended_at="2020-01-01T00:00:00+00:00"), "run.ended_at"),
        (lambda r: r.update(started_at="yesterday"), "run.started_at"),
        (lambda r: r.update(ended_at="01/02/2026"), "run.ended_at"),
        (lambda r: r.update(updated_at="soon"), "run.updated_at"),
    ],
)
def test_the_reader_refuses_impossible_dates(tmp_path, edit, field):
    out, _ = _train(tmp_path)
    _edited(out, lambda d: edit(d["run"]))
    with pytest.raises(ReportFileError, match=field.replace(".", r"\.")):
        read_report(out)


def test_a_budget_too_large_for_a_float_is_a_configuration_error():
    with pytest.raises(ConfigurationError, match="budget"):
        FlopMeter(tiny_llama(), PAD_ID, budget=10**400)


@pytest.mark.parametrize("bad", [float("nan"), -5.0, float("inf"), "1e20", True])
@pytest.mark.parametrize("key", ["budget_flops_saved", "budget_step_flops_saved"])
def test_impossible_saved_budget_figures_are_refused(tmp_path, bad, key):
    _, meter = _train(tmp_path, budget=1e20)
    state = json.loads(json.dumps(meter.state_dict()))
    assert key in state
    state[key] = bad
    for budget in (1e20, None):
        fresh = FlopMeter(tiny_llama(), PAD_ID, budget=budget)
        with pytest.raises(ConfigurationError, match=key):
            fresh.load_state_dict(state)


class _Failing500:
    """An HTTP proxy in front of moto that answers the first ``n`` requests with a bare 500."""

    def __init__(self, upstream: str, n: int) -> None:
        import http.client
        import http.server
        from urllib.parse import urlparse

        up = urlparse(upstream)
        state = {"left": n, "seen": 0}

        class Handler(http.server.BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def _any(self):
                state["seen"] += 1
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                if state["left"] > 0:
                    state["left"] -= 1
                    self.send_response(500)
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                con = http.client.HTTPConnection(up.hostname, up.port, timeout=10)
                con.request(self.command, self.path, body=body, headers=dict(self.headers))
                answer = con.getresponse()
                data = answer.read()
                self.send_response(answer.status)
                for key, value in answer.getheaders():
                    if key.lower() not in ("content-length", "transfer-encoding", "connection"):
                        self.send_header(key, value)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                if self.command != "HEAD":
                    self.wfile.write(data)

            do_GET = do_PUT = do_HEAD = do_POST = _any

        self.state = state
        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"


@pytest.mark.slow
def test_an_s3_500_answer_is_retried(endpoint, aws):
    from flopmeter.ledger.sinks import S3Sink, SinkPayload, deliver

    name, s3 = aws["name"], aws["s3"]
    proxy = _Failing500(endpoint, 2)
    try:
        sink = S3Sink(name, "p", endpoint_url=proxy.url)
        report = {"schema_version": "2.0", "run": {"run_id": "run-500"}}
        outcome = deliver(SinkPayload.of(report), [sink], 20)[0]
    finally:
        proxy.server.shutdown()
    assert outcome.ok, outcome.detail
    assert proxy.state["seen"] >= 3
    assert s3.get_object(Bucket=name, Key="p/run-500.json")["Body"].read()


HOLD_LOCK = """
import sqlite3, sys, time
con = sqlite3.connect(sys.argv[1], isolation_level=None)
con.execute("BEGIN IMMEDIATE")
print("held", flush=True)
time.sleep(float(sys.argv[2]))
con.execute("ROLLBACK")
"""


@pytest.mark.slow
def test_ctrl_c_during_the_ledger_append_leaves_a_final_report_with_a_note(tmp_path):
    ledger = tmp_path / "ledger.sqlite"
    Ledger(ledger)  # made, empty
    model = tiny_llama()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    out = tmp_path / "run.json"
    holder = subprocess.Popen([sys.executable, "-c", HOLD_LOCK, str(ledger), "1.5"],
                              stdout=subprocess.PIPE, text=True)  # fmt: skip
    try:
        meter = FlopMeter(model, PAD_ID, output=out, ledger=ledger)
        with pytest.raises(KeyboardInterrupt), meter:
            model(**padded_batch([3, 5], 6)).loss.backward()
            optimizer.step()
            assert holder.stdout.readline().strip() == "held"
            threading.Timer(0.3, os.kill, (os.getpid(), signal.SIGINT)).start()
    finally:
        holder.wait(10)
    report = read_report(out)
    assert report.run.status != "running"  # the final report is on disk
    assert any("interrupted" in n and "ledger" in n for n in report.notes), report.notes
    assert Ledger(ledger, create=False).records() == []  # rolled back, as the note says


# ----------------------------------------------------------------- 6. withheld is null, not 0
def _unread_run(tmp_path, shape=(8,), **kwargs):
    """A small model fed floats of ``shape``: by default one vector without a batch dimension
    (whether it is one item or a batch of eight is not known), so nothing is read and the
    compute is withheld."""
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    out = tmp_path / "run.json"
    with FlopMeter(model, output=out, **kwargs):
        model(torch.randn(*shape)).sum().backward()
        optimizer.step()
    return out


def test_a_withheld_figure_is_never_shown_as_zero(tmp_path, capsys):
    out = _unread_run(tmp_path)
    data = json.loads(out.read_text())
    assert data["compute"]["withheld_reason"] is not None
    assert data["compute"]["primary_flops"] is None
    for key, est in data["compute"]["estimates"].items():
        assert est["flops"] is None, key
    for form in ("text", "md", "html"):
        assert main(["report", str(out), "--format", form]) == 0
        printed = capsys.readouterr().out
        assert "0 FLOP" not in printed.replace("10 FLOP", ""), form
        assert "withheld" in printed.lower() or "not known" in printed.lower(), form


# ----------------------------------------------------------------- 7. token_inputs at floats
def test_token_inputs_at_a_float_tensor_is_refused_naming_option_and_dtype(tmp_path):
    out = _unread_run(tmp_path, (4, 8), token_inputs=lambda args, kwargs: args[0])
    report = read_report(out)
    assert report.tokens.micro_batches_unread == 1
    assert report.tokens.tokens_seen == 0  # not 32 "tokens" of pixels
    assert report.compute.primary_flops is None
    reason = report.compute.withheld_reason
    assert "token_inputs" in reason and "float32" in reason, reason
