"""A run SIGKILLed between its final report file and its ledger record: the file says
``completed`` and the ledger has no record. The next run at the same output finds the report,
appends it to the ledger (once) and says so in its report; a report already in the ledger is
left alone."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from flopmeter import FlopMeter
from flopmeter.ledger.store import Ledger
from tests.support.models import PAD_ID, tiny_llama

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[1]

#: Trains two micro-batches under a meter whose ledger append is replaced by a SIGKILL: the
#: final file is written first (the meter's order), then the process dies where the append was.
KILLED_AT_THE_APPEND = """
import os, signal, sys, torch
sys.path.insert(0, {root!r})
from flopmeter import FlopMeter
from flopmeter.ledger.archive import RunArchive
from tests.support.models import PAD_ID, tiny_llama

RunArchive.seal = lambda self, report: os.kill(os.getpid(), signal.SIGKILL)
model = tiny_llama()
opt = torch.optim.SGD(model.parameters(), lr=0.01)
with FlopMeter(model, PAD_ID, output={out!r}, ledger={ledger!r}):
    for _ in range(2):
        ids = torch.randint(1, 90, (2, 8))
        model(input_ids=ids, labels=ids).loss.backward()
        opt.step()
        opt.zero_grad()
"""


def _train(model, meter_kwargs):
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    with FlopMeter(model, PAD_ID, **meter_kwargs) as meter:
        ids = torch.randint(1, 90, (2, 8))
        model(input_ids=ids, labels=ids).loss.backward()
        opt.step()
    return meter


def test_the_next_run_appends_a_killed_runs_final_report_to_the_ledger(tmp_path):
    out, ledger = tmp_path / "flops_meter.json", tmp_path / "ledger.db"
    script = KILLED_AT_THE_APPEND.format(root=str(ROOT), out=str(out), ledger=str(ledger))
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    assert done.returncode == -signal.SIGKILL, done.stderr[-2000:]
    killed = json.loads(out.read_text())
    assert killed["run"]["status"] == "completed"
    assert Ledger(ledger, create=False).get(killed["run"]["run_id"]) == []  # the disagreement

    meter = _train(tiny_llama(), {"output": out, "ledger": ledger})
    records = Ledger(ledger, create=False).records()
    assert [r.run_id for r in records] == [killed["run"]["run_id"], meter.run_id]
    assert json.loads(records[0].report_json)["run"]["status"] == "completed"
    notes = meter.report().notes
    assert any(killed["run"]["run_id"] in n and "appended now" in n for n in notes), notes
    assert Ledger(ledger, create=False).verify().ok

    again = _train(tiny_llama(), {"output": out, "ledger": ledger})  # the last one is in it
    assert len(Ledger(ledger, create=False).records()) == 3
    assert not any("appended now" in n for n in again.report().notes)
