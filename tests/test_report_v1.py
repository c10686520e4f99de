"""Schema 1.x reports (written by flopmeter before 2.0) read, upgrade and render.

The files under tests/data/v1/ were written by flopmeter's schema 1.2 writer (main before the
2.0 layout): a plain run, a run with a budget, a run continuing the plain one, a failed run, and
the AWS-keyed copy of the plain run (``to_sagemaker_dict()`` as it was). They are kept as they
were written: the truth these tests compare with.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from flopmeter.errors import ReportFileError
from flopmeter.ledger.cumulative import cumulative_compute
from flopmeter.ledger.store import Ledger
from flopmeter.render.html import render_html
from flopmeter.render.markdown import render_markdown
from flopmeter.render.text import render_text
from flopmeter.report.parent_runs import read_parent_runs
from flopmeter.report.reading import read_report
from flopmeter.report.upgrade import report_value, upgrade_report
from flopmeter.units import human_flops

V1 = Path(__file__).parent / "data" / "v1"
RUNS = ("plain", "budget", "child", "failed")


def _v1(name: str) -> dict[str, Any]:
    return json.loads((V1 / f"{name}.json").read_text())


def _leaves(data: dict[str, Any]) -> list[Any]:
    """Every value one level inside the 2.0 object's sections (and its top-level values)."""
    values: list[Any] = []
    for value in data.values():
        if isinstance(value, dict):
            values.extend(value.values())
        values.append(value)
    return values


@pytest.mark.parametrize("name", RUNS)
def test_a_1_2_report_reads_with_the_figures_it_was_written_with(name):
    flat = _v1(name)
    assert flat["schema_version"] == "1.2"
    report = read_report(V1 / f"{name}.json")
    assert report.schema_version == "2.0"
    assert report.compute.primary_flops == flat["flops_architecture"]
    assert (
        report.compute.estimates["transformer"].flops == flat["estimates"]["transformer"]["flops"]
    )
    assert report.threshold.threshold_flops == flat["threshold_value"]
    assert report.threshold.kind == flat["threshold_type"]
    assert report.threshold.original_flops == flat["pretrain_flops"]
    assert report.verdict.outcome == flat["verdict"]
    assert report.verdict.ratio_to_threshold == flat["ratio_to_threshold"]
    assert report.verdict.basis == flat["verdict_basis"]
    assert report.tokens.tokens_processed == flat["tokens_processed"]
    assert report.model.name == flat["model_name"] and report.model.n_total == flat["n_total"]
    assert (report.run.run_id, report.run.status) == (flat["run_id"], flat["status"])
    assert report.hardware.bound_flops == flat["flops_hardware"]
    assert report.hardware.notes == flat["hardware_notes"]
    assert report.lineage.cumulative_flops == flat["cumulative_flops"]
    assert report.notes[: len(flat["notes"])] == flat["notes"]
    assert "schema 1.2" in report.notes[-1]  # what it was read from


@pytest.mark.parametrize("name", RUNS)
def test_the_upgrade_drops_nothing(name):
    flat = _v1(name)
    upgraded = upgrade_report(flat)
    leaves = _leaves(upgraded)
    for key, value in flat.items():
        if key in ("schema_version", "budget_flops", "budget_source", "flops_at_stop"):
            continue  # the version is in the last note; a missing budget is budget: null
        if key == "stopped_by_budget" and upgraded["budget"] is None:
            assert value is False
            continue
        if key in ("catalog", "parent_runs"):  # inside them, threshold_value has its 2.0 name
            value = _threshold_flops_named(value)
        assert any(value == leaf for leaf in leaves), key
    assert (upgraded["budget"] is None) == (flat["budget_flops"] is None)


def _threshold_flops_named(value):
    """A 1.x catalogue figure or list of parent entries as 2.0 names them."""
    if isinstance(value, list):
        return [_threshold_flops_named(v) for v in value]
    if isinstance(value, dict):
        return {("threshold_flops" if k == "threshold_value" else k): v for k, v in value.items()}
    return value


def test_the_budget_and_the_parents_are_in_their_sections():
    budget = read_report(V1 / "budget.json").budget
    assert budget is not None and budget.budget_flops == _v1("budget")["budget_flops"] == 1e12
    assert budget.source == "argument" and budget.stopped_by_budget is False
    assert read_report(V1 / "plain.json").budget is None
    child, plain = read_report(V1 / "child.json"), _v1("plain")
    assert [p.run_id for p in child.lineage.parent_runs] == [plain["run_id"]]
    assert child.lineage.ancestor_flops == {plain["run_id"]: plain["flops_architecture"]}
    # the judged figure is the cumulative one: this run's plus its parent's
    assert child.verdict.judged_flops == 2 * plain["flops_architecture"] == 242417664.0


@pytest.mark.parametrize("name", RUNS)
def test_a_1_2_report_renders_in_every_format(name):
    report = read_report(V1 / f"{name}.json")
    figure = human_flops(_v1(name)["flops_architecture"])
    for text in (render_text(report), render_markdown(report), render_html(report)):
        assert figure in text
        assert "fixture/tiny-llama" in text
    if name == "failed":
        assert "THE RUN FAILED" in render_text(report)
    if name == "budget":
        assert "Compute budget" in render_text(report)


def test_the_aws_keyed_copy_is_what_to_sagemaker_dict_gives_exactly():
    written = json.loads((V1 / "aws_keys.json").read_text())
    assert read_report(V1 / "plain.json").to_sagemaker_dict() == written
    with pytest.raises(ReportFileError, match="AWS FlopsMeterCallback's file"):
        read_report(V1 / "aws_keys.json")


def test_a_1_x_error_names_the_field_of_the_file(tmp_path):
    data = _v1("plain")
    data["tokens_processed"] = "12"
    (tmp_path / "r.json").write_text(json.dumps(data))
    with pytest.raises(ReportFileError) as info:
        read_report(tmp_path / "r.json")
    assert info.value.field == "tokens_processed"  # the 1.x name, not tokens.tokens_processed
    data = _v1("plain")
    data["schema_version"] = "1.0"  # a 1.2 file calling itself 1.0 has fields 1.0 did not
    (tmp_path / "r.json").write_text(json.dumps(data))
    with pytest.raises(ReportFileError, match=r"not a field of report schema 1\.0") as info:
        read_report(tmp_path / "r.json")
    assert info.value.field == "run_id"


def test_a_1_x_parent_report_is_read_as_a_parent(tmp_path):
    (parent,) = read_parent_runs([str(V1 / "plain.json")], None)
    plain = _v1("plain")
    assert (parent.run_id, parent.flops) == (plain["run_id"], plain["flops_architecture"])
    assert parent.threshold_flops == plain["threshold_value"]  # its 2.0 name


def test_ledger_records_of_both_schemas_verify_and_sum(tmp_path):
    ledger = Ledger(tmp_path / "l.sqlite")
    ledger.append(_v1("plain"))  # a 1.x record, stored as it was written
    ledger.append(read_report(V1 / "child.json"))  # its child, as a 2.0 report
    assert ledger.verify().ok
    records = ledger.records()
    assert records[0].report() == _v1("plain")  # the chain hashes what was stored
    assert records[1].report()["schema_version"] == "2.0"
    plain = _v1("plain")
    assert [report_value(r.report(), "compute.primary_flops") for r in records] == [
        plain["flops_architecture"],
        _v1("child")["flops_architecture"],
    ]
    total = cumulative_compute(records, "fixture/tiny-llama")
    assert [run[0] for run in total.runs] == [plain["run_id"], _v1("child")["run_id"]]
    assert total.total_flops == plain["flops_architecture"] + _v1("child")["flops_architecture"]
    assert [run[4] for run in total.runs] == ["base", "base"]  # model.name of either schema
