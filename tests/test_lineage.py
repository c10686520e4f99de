"""One lineage definition and one verdict rule: the public ``flopmeter.verdict`` reproduces a
report's verdict from its own figures, and ``ledger cumulative`` counts and judges a line of runs
as a report counts and judges its parents.

The reports in tests/data/v1 were written by flopmeter 0.1.0's main (schema 1.2) for
the tiny Llama of the examples. Expected totals are written out by hand from the figures each
test gives; the 77% line is 1/1.3 of the threshold (Annex A.2's 30% margin).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

import flopmeter
from flopmeter.cli import main
from flopmeter.compliance.lineage import RunNode, counted_ancestors, line_of, node_from_report
from flopmeter.compliance.lineage_totals import sum_compute
from flopmeter.ledger.store import Ledger
from flopmeter.report import FlopReport
from flopmeter.report.reading import read_report
from flopmeter.report.upgrade import upgrade_report
from flopmeter.types import Estimate, ParentRun

V1 = Path(__file__).parent / "data" / "v1"
T = 1e24  # one third of an original trained with 3e24 FLOP


def _v1(name: str) -> dict[str, Any]:
    return json.loads((V1 / f"{name}.json").read_text())


def _own_figures(report: dict[str, Any]) -> tuple[float, float, float | None]:
    """The figure judged, the threshold and the measured cross-check, from the report's fields
    only, as the public function's docstring says to take them."""
    measured = report["estimates"].get("measured")
    cross = None
    if measured is not None and report["primary_estimate"] != "measured":
        cross = measured["flops"]
    if report["parent_runs"]:
        earlier = sum(report["ancestor_flops"].values())
        return report["cumulative_flops"], report["threshold_value"], cross and cross + earlier
    return report["flops_architecture"], report["threshold_value"], cross


@pytest.mark.parametrize("name", ["plain", "child", "budget", "failed"])
def test_the_public_verdict_reproduces_each_v1_reports_verdict(name):
    report = _v1(name)
    flops, threshold, measured = _own_figures(report)
    assert flopmeter.verdict(flops, threshold, measured_flops=measured) == report["verdict"]


def _near_by_measured(name: str) -> dict[str, Any]:
    """A v1 report edited so that its judged figure is 70% of the threshold (below the 77%
    line) and its measured cross-check 85% (above it), on an original of 3e24 FLOP."""
    data = _v1(name)
    earlier = sum(data["ancestor_flops"].values())
    own = 0.70 * T - earlier
    data["flops_architecture"] = own
    data["estimates"]["transformer"]["flops"] = own
    data["estimates"]["measured"]["flops"] = 0.85 * T - earlier
    data.update(pretrain_flops=3e24, pretrain_flops_source="argument",
                threshold_value=T, threshold_type="one_third_of_original",
                ratio_to_threshold=0.70, exceeds_threshold=False)  # fmt: skip
    if data["parent_runs"]:
        data["cumulative_flops"] = own + earlier
    return data


@pytest.mark.parametrize("name", ["plain", "child"])
def test_a_measured_figure_above_77_percent_is_near_in_the_report_and_the_public_function(
    name, tmp_path
):
    data = _near_by_measured(name)
    flops, threshold, measured = _own_figures(data)
    assert flops / threshold == pytest.approx(0.70) and flops * 1.3 < threshold
    assert measured / threshold == pytest.approx(0.85) and measured * 1.3 > threshold
    assert flopmeter.verdict(flops, threshold, measured_flops=measured) == "near_threshold"
    # the strict reader holds a report to the rule the report applies: near, not below
    path = tmp_path / "report.json"
    for verdict, ok in (("below_threshold", False), ("near_threshold", True)):
        path.write_text(json.dumps({**data, "verdict": verdict}))
        if ok:
            assert read_report(path).verdict.outcome == "near_threshold"
        else:
            with pytest.raises(flopmeter.FlopMeterError, match="'near_threshold'"):
                read_report(path)
    # the primary figure alone is below: the bare rule, kept for single figures
    from flopmeter.compliance.verdict import primary_verdict

    assert primary_verdict(flops, threshold) == "below_threshold"


def test_the_public_verdict_keeps_exceeds_on_the_primary_figure():
    assert flopmeter.verdict(1.01 * T, T) == "exceeds_threshold"
    assert flopmeter.verdict(0.5 * T, T, measured_flops=1.5 * T) == "near_threshold"
    assert flopmeter.verdict(0.5 * T, T, measured_flops=0.6 * T) == "below_threshold"
    with pytest.raises(TypeError):
        flopmeter.verdict(0.5 * T, T, 0.9 * T)  # the cross-check is named, never positional


# ------------------------------------------------------------------------ the lineage module
def test_a_v1_report_as_a_node_holds_its_recorded_lineage():
    child, parent = _v1("child"), _v1("plain")
    node = node_from_report(upgrade_report(child))
    assert node.run_id == child["run_id"]
    assert node.parent_ids == (parent["run_id"],)
    assert node.ancestors == {parent["run_id"]: parent["flops_architecture"]}
    assert node.own_flops == child["flops_architecture"]
    assert node.cumulative_flops == child["cumulative_flops"]  # the same sum, to the bit
    assert node.measured_flops is None or node.measured_flops == 121208832.0
    one_rank = node_from_report(upgrade_report({**child, "counts_scope": "this_rank"}))
    assert one_rank.own_flops is None and "one rank" in one_rank.own_reason


def test_the_walk_counts_each_run_once_and_finds_descendants_through_recorded_ancestors():
    a = RunNode("A", model_name="base", own_flops=1.0)
    b = RunNode("B", own_flops=10.0, parent_ids=("A",), ancestors={"A": 1.0})
    c = RunNode("C", own_flops=100.0, parent_ids=("B", "A"), ancestors={"A": 1.0, "B": 10.0})
    # D's parent P is outside the nodes; its report records P and, through P, A
    d = RunNode("D", own_flops=1000.0, parent_ids=("P",), ancestors={"A": 1.0, "P": 5.0})
    nodes = {n.run_id: n for n in (a, b, c, d)}
    how = line_of(nodes, lambda n: n.model_name == "base")
    assert how == {"A": "base", "B": "descendant of A", "C": "descendant of B",
                   "D": "descendant of A", "P": "ancestor of D"}  # fmt: skip
    parents = [
        RunNode("B", status="completed", own_flops=10.0, ancestors={"A": 1.0}),
        RunNode("A", status="completed", own_flops=1.0),
    ]
    assert counted_ancestors(parents) == {"A": 1.0, "B": 10.0}  # A named and inside B: once
    total = sum_compute({"A": 1.0, "B": 10.0}, head=100.0, head_measured=120.0)
    assert (total.flops, total.measured_flops) == (111.0, 131.0)  # parents' primary stands in
    assert total.stand_ins == ("A", "B")
    assert sum_compute({"A": 1.0}).measured_flops is None  # no run has a cross-check


# ------------------------------------------------------------------------ ledger cumulative
def _report(run_id, model, own, *, measured=None, parents=(), ancestors=None, **extra):
    estimates = {"transformer": Estimate(flops=own, method="transformer", formula="")}
    if measured is not None:
        estimates["measured"] = Estimate(flops=measured, method="measured", formula="")
    estimates = {k: v.model_dump() for k, v in estimates.items()}
    fields: dict[str, Any] = {
        "run_id": run_id, "model_name": model, "status": "completed", "flops_architecture": own,
        "primary_estimate": "transformer", "estimates": estimates,
        "parent_runs": [p.model_dump() for p in parents], "ancestor_flops": ancestors or {},
    }  # fmt: skip
    # written as a 1.x report (the names of the lineage module's cases) and upgraded to 2.0
    return FlopReport.model_validate(upgrade_report({"schema_version": "1.2", **fields, **extra}))


def _cumulative(path: Path, base: str, capsys, *more: str) -> dict[str, Any]:
    args = ["ledger", "cumulative", "--base", base, "--pretrain-flops", "3e24", "--format",
            "json", "--ledger", str(path), *more]  # fmt: skip
    status = main(args)
    out, err = capsys.readouterr()
    assert status == 0, err
    return json.loads(out)


def test_ledger_cumulative_judges_with_the_measured_cross_check(tmp_path, capsys):
    path = tmp_path / "l.sqlite"
    ledger = Ledger(path)
    # primary 0.35 T + 0.35 T = 0.70 T: below the 77% line; measured 0.45 T + 0.40 T = 0.85 T
    ledger.append(_report("a", "org/base", 0.35 * T, measured=0.45 * T))
    parent = ParentRun(ref="a.json", run_id="a", flops=0.35 * T, own_flops=0.35 * T,
                       status="completed")  # fmt: skip
    ledger.append(_report("b", "./merged", 0.35 * T, measured=0.40 * T, parents=[parent],
                          ancestors={"a": 0.35 * T}))  # fmt: skip
    result = _cumulative(path, "org/base", capsys)
    assert result["total_flops"] == pytest.approx(0.70 * T)
    assert result["measured_flops"] == pytest.approx(0.85 * T)
    assert result["ratio_to_threshold"] == pytest.approx(0.70)
    assert result["verdict"] == "near_threshold"  # below_threshold on the primary alone
    assert result["exceeds_threshold"] is False
    assert "measured cross-check" in result["verdict_basis"]
    # the text output says which figure decided it, as the report does
    main(["ledger", "cumulative", "--base", "org/base", "--pretrain-flops", "3e24",
          "--ledger", str(path)])  # fmt: skip
    out = capsys.readouterr().out
    assert "-> near_threshold" in out and "basis: " in out and "measured cross-check" in out
    # b's own report judges the same figures by the same rule, but a parent entry records no
    # measured figure, so a's primary stands in there: 0.40 T + 0.35 T = 0.75 T, below the line
    assert flopmeter.verdict(0.70 * T, T, measured_flops=0.40 * T + 0.35 * T) == "below_threshold"


def test_ledger_cumulative_says_when_a_run_has_no_cross_check(tmp_path, capsys):
    path = tmp_path / "l.sqlite"
    ledger = Ledger(path)
    ledger.append(_report("a", "org/base", 0.35 * T, measured=0.50 * T))
    ledger.append(_report("b", "org/base", 0.35 * T))  # no measured estimate
    result = _cumulative(path, "org/base", capsys)
    assert result["measured_flops"] == pytest.approx(0.85 * T)  # b's primary stands in
    assert result["verdict"] == "near_threshold"
    assert any("b have no measured estimate" in n for n in result["notes"])
    path2 = tmp_path / "l2.sqlite"
    Ledger(path2).append(_report("c", "org/base", 0.70 * T))
    result = _cumulative(path2, "org/base", capsys)
    assert result["measured_flops"] is None and result["verdict"] == "below_threshold"
    assert any("No run has a measured cross-check" in n for n in result["notes"])


def test_ledger_cumulative_counts_a_parent_outside_the_ledger_as_its_child_records_it(
    tmp_path, capsys
):
    path = tmp_path / "l.sqlite"
    # p ran elsewhere; c's report records it (3e20) and continues it on the base
    parent = ParentRun(ref="p.json", run_id="p", flops=3e20, own_flops=3e20, status="completed")
    Ledger(path).append(_report("c", "org/base", 1e20, parents=[parent], ancestors={"p": 3e20}))
    result = _cumulative(path, "org/base", capsys)
    assert result["total_flops"] == pytest.approx(4e20)  # by hand: 1e20 + 3e20, not 1e20
    assert {r["run_id"]: r["matched"] for r in result["runs"]} == {
        "c": "base", "p": "ancestor of c, recorded in its report"
    }  # fmt: skip


def test_ledger_cumulative_withholds_rather_than_drop_an_uncountable_run(tmp_path, capsys):
    path = tmp_path / "l.sqlite"
    ledger = Ledger(path)
    ledger.append(_report("a", "org/base", 1e20))
    # a descendant whose other parent is in no ledger and whose report records no compute
    ghost = ParentRun(ref="ghost.json", run_id="ghost", flops=None, status="failed")
    ledger.append(_report("b", "./m", 2e20, parents=[ParentRun(ref="a", run_id="a", flops=None),
                                                      ghost]))  # fmt: skip
    result = _cumulative(path, "org/base", capsys)
    assert result["total_flops"] is None and result["verdict"] is None
    assert "ghost" in result["withheld_reason"]
    # one rank's counts are not the run's compute either
    path2 = tmp_path / "l2.sqlite"
    Ledger(path2).append(_report("r", "org/base", 1e20, counts_scope="this_rank"))
    result = _cumulative(path2, "org/base", capsys)
    assert result["total_flops"] is None and "one rank" in result["withheld_reason"]


def test_ledger_cumulative_of_a_diamond_counts_each_run_once(tmp_path, capsys):
    path = tmp_path / "l.sqlite"
    ledger = Ledger(path)

    def entry(rid, own, anc=None):
        return ParentRun(ref=f"{rid}.json", run_id=rid, flops=own + sum((anc or {}).values()),
                         own_flops=own, ancestor_flops=anc or {}, status="completed")  # fmt: skip

    ledger.append(_report("A", "org/base", 1e20))
    ledger.append(_report("B", "./b", 2e20, parents=[entry("A", 1e20)], ancestors={"A": 1e20}))
    ledger.append(_report("C", "./c", 4e20, parents=[entry("A", 1e20)], ancestors={"A": 1e20}))
    ledger.append(_report("D", "./d", 8e20,
                          parents=[entry("B", 2e20, {"A": 1e20}), entry("C", 4e20, {"A": 1e20})],
                          ancestors={"A": 1e20, "B": 2e20, "C": 4e20}))  # fmt: skip
    result = _cumulative(path, "org/base", capsys)
    assert result["total_flops"] == pytest.approx(15e20)  # 1 + 2 + 4 + 8, each once
    assert sorted(r["run_id"] for r in result["runs"]) == ["A", "B", "C", "D"]
