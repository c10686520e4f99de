"""Issue 19, "wrong totals or verdicts": every total honest, and no verdict on a figure the meter
does not know.

Real components only: the tiny Llama trained by a raw loop, real checkpoints through
``state_dict``, the real SQLite ledger and the ``flopmeter`` command. Expected figures come from
the tests' own arithmetic on the reports' fields (never from the meter's code paths).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch

from flopmeter import FlopMeter
from flopmeter.cli import main
from flopmeter.ledger import Ledger
from flopmeter.ledger.store import LedgerError
from flopmeter.report import FlopReport
from flopmeter.report_file import read_report
from tests.conftest import PAD_ID, padded_batch, tiny_llama

ROWS = [12, 9, 5]


def llama():
    return tiny_llama(attn_implementation="eager")


def train(meter: FlopMeter, model, steps: int, *, obey: bool = True) -> int:
    """A raw loop of ``steps`` optimizer steps over one fixed batch; returns the steps made."""
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
    batch = padded_batch(ROWS, 12, seed=1)
    made = 0
    with meter:
        for _ in range(steps):
            if obey and meter.should_stop:
                break
            model(**batch).loss.backward()
            optimizer.step()
            optimizer.zero_grad()
            made += 1
    return made


def _cumulative(path: Path, base: str, capsys) -> dict[str, Any]:
    args = ["ledger", "cumulative", "--base", base, "--pretrain-flops", "3e24", "--format",
            "json", "--ledger", str(path)]  # fmt: skip
    status = main(args)
    out, err = capsys.readouterr()
    assert status == 0, err
    return json.loads(out)


# ---------------------------------------------------------------- item 7: ledger append
@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"compute": {"primary_flops": -1e30}}, "compute.primary_flops"),
        ({"tokens": {"tokens_processed": "many"}}, "tokens.tokens_processed"),
        ({"verdict": {"outcome": "fine"}}, "verdict.outcome"),
        ({"surprise": 1}, "surprise"),
    ],
)
def test_the_ledger_refuses_a_mapping_that_is_not_a_valid_report(tmp_path, capsys, change, field):
    good = json.loads(
        FlopReport(run={"run_id": "x", "status": "completed"}, model={"name": "org/base"}).to_json()
    )
    bad = {**good}
    for key, value in change.items():
        bad[key] = {**good[key], **value} if isinstance(value, dict) else value
    ledger = Ledger(tmp_path / "l.sqlite")
    with pytest.raises(LedgerError, match=field.replace(".", r"\.")):
        ledger.append(bad)
    assert ledger.records() == []
    # the total of the line is not changed by it: no run on the base at all
    status = main(["ledger", "cumulative", "--base", "org/base", "--pretrain-flops", "3e24",
                   "--format", "json", "--ledger", str(tmp_path / "l.sqlite")])  # fmt: skip
    out = capsys.readouterr().out
    assert status == 0 and json.loads(out)["total_flops"] is None


# ---------------------------------------------------------------- item 6: should_stop ignored
def test_a_loop_that_ignores_should_stop_is_not_reported_as_stopped_within_the_budget():
    model = llama()
    probe = FlopMeter(model, PAD_ID)
    train(probe, model, 1)
    step = probe.report().compute.primary_flops  # one step's compute, as this meter counts it
    model = llama()
    meter = FlopMeter(model, PAD_ID, budget=2.5 * step)
    assert train(meter, model, 10, obey=False) == 10
    report = meter.report()
    total = report.compute.primary_flops
    assert total == pytest.approx(10 * step, rel=1e-6)  # 4x the budget: it was spent
    assert report.budget.stopped_by_budget is False  # the guard asked; the loop did not stop
    assert report.budget.flops_at_stop == pytest.approx(2 * step, rel=1e-6)  # when it asked
    said = " ".join(report.notes)
    assert "within the budget" not in said
    assert "went on" in said and "4.00 x the budget" in said
