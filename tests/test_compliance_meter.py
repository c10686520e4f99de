"""The compliance fields of real metered runs: the catalogue opt-in and parent runs.

Tiny real transformers models trained for one micro-batch on CPU; the parent reports are the
files a first FlopMeter wrote, read back by the second.
"""

from __future__ import annotations

import json

import pytest

from flopmeter import FlopMeter
from flopmeter.errors import ConfigurationError
from flopmeter.report.reading import read_report
from tests.support.batches import padded_batch
from tests.support.models import tiny_llama

LLAMA_32_3B = "meta-llama/Llama-3.2-3B-Instruct"
LLAMA_32_3B_FLOPS = 1.7e23  # ../shared/docs/pretrain-compute.md: Llama 3.2 3B, 6ND


def _train(output, lengths=(3, 5), **options):
    model = tiny_llama()
    with FlopMeter(model, 0, output=output, **options) as meter:
        model(**padded_batch(list(lengths), 8)).loss.backward()
    return meter.report()


@pytest.mark.slow
def test_catalog_opt_in_with_a_model_id_sets_the_threshold_and_says_so(tmp_path):
    report = _train(tmp_path / "r.json", pretrain_flops="catalog", model_id=LLAMA_32_3B)
    assert report.threshold.original_flops == LLAMA_32_3B_FLOPS
    assert report.threshold.original_flops_source == "catalog"
    assert report.threshold.kind == "one_third_of_original"
    assert report.threshold.threshold_flops == pytest.approx(LLAMA_32_3B_FLOPS / 3)
    assert (
        report.threshold.catalog is not None
        and report.threshold.catalog.base_model == "Llama 3.2 3B"
    )
    assert (
        report.threshold.catalog.basis == "6nd" and report.threshold.catalog.model_id == LLAMA_32_3B
    )
    assert any("catalogue's figure" in n and "Llama 3.2 3B" in n for n in report.notes)
    assert report.verdict.ratio_to_threshold == pytest.approx(
        report.compute.primary_flops / (LLAMA_32_3B_FLOPS / 3)
    )
    assert report.verdict.basis and report.verdict.uncertainty_margin == 0.30
    on_disk = read_report(tmp_path / "r.json")  # the strict reader accepts what was written
    assert on_disk.threshold.catalog == report.threshold.catalog


@pytest.mark.slow
def test_the_model_config_names_the_model_and_an_unchosen_figure_is_shown(tmp_path):
    model = tiny_llama()
    model.config._name_or_path = LLAMA_32_3B  # what from_pretrained records
    with FlopMeter(model, 0) as meter:
        model(**padded_batch([4], 8)).loss.backward()
    report = meter.report()
    assert (
        report.threshold.original_flops is None and report.threshold.original_flops_source is None
    )
    assert report.threshold.threshold_flops == pytest.approx(1e23 / 3)  # the fallback: not opted in
    assert report.threshold.catalog.threshold_flops == pytest.approx(LLAMA_32_3B_FLOPS / 3)
    assert any("It was not chosen" in n for n in report.notes)


@pytest.mark.slow
def test_catalog_opt_in_for_an_unknown_model_falls_back_with_a_note(tmp_path):
    report = _train(None, pretrain_flops="catalog", model_id="my-org/my-model")
    assert report.threshold.original_flops is None and report.threshold.catalog is None
    assert report.threshold.kind == "default_gpai"
    assert any("does not know the model 'my-org/my-model'" in n for n in report.notes)


@pytest.mark.slow
def test_parent_runs_read_a_real_parent_report_and_sum(tmp_path):
    parent = _train(tmp_path / "first.json", lengths=(3, 5))
    parent_flops = json.loads((tmp_path / "first.json").read_text())["compute"]["primary_flops"]
    child = _train(tmp_path / "second.json", lengths=(6, 2), parent_runs=[tmp_path / "first.json"])
    assert [p.run_id for p in child.lineage.parent_runs] == [parent.run.run_id]
    assert child.lineage.parent_runs[0].flops == parent_flops
    assert child.lineage.cumulative_flops == pytest.approx(
        child.compute.primary_flops + parent_flops
    )
    assert child.verdict.ratio_to_threshold == pytest.approx(
        child.lineage.cumulative_flops / (1e23 / 3)
    )
    assert "cumulative compute" in child.verdict.basis
    read_report(tmp_path / "second.json")  # the reader checks the sum too
    # a grandchild counts the whole chain, through the child's cumulative figure
    grandchild = _train(tmp_path / "third.json", parent_runs=[child.run.run_id])  # by run id
    assert grandchild.lineage.parent_runs[0].flops == pytest.approx(child.lineage.cumulative_flops)


def test_a_failed_parent_withholds_the_verdict(tmp_path):
    model = tiny_llama()
    with pytest.raises(RuntimeError), FlopMeter(model, 0, output=tmp_path / "p.json"):
        model(**padded_batch([3], 8)).loss.backward()
        raise RuntimeError("out of memory")
    child = _train(tmp_path / "c.json", parent_runs=[str(tmp_path / "p.json")])
    assert child.lineage.parent_runs[0].status == "failed"
    assert child.compute.primary_flops is not None  # its own figure stays
    assert child.verdict.outcome is None and child.verdict.exceeds_threshold is None
    assert child.lineage.cumulative_flops is None  # never a sum counting the parent as 0
    assert "status 'failed'" in child.compute.withheld_reason
    read_report(tmp_path / "c.json")


def test_a_parent_that_is_this_runs_output_is_refused_before_training(tmp_path):
    _train(tmp_path / "a.json")
    before = (tmp_path / "a.json").read_text()
    with pytest.raises(ConfigurationError, match="own output file"):
        FlopMeter(tiny_llama(), 0, output=tmp_path / "a.json", parent_runs=[tmp_path / "a.json"])
    assert (tmp_path / "a.json").read_text() == before  # the parent report is intact


def test_an_unresolvable_or_invalid_parent_is_refused_at_construction(tmp_path):
    (tmp_path / "junk.json").write_text("{}")
    with pytest.raises(ConfigurationError, match="schema_version"):
        FlopMeter(tiny_llama(), 0, parent_runs=[tmp_path / "junk.json"])
    with pytest.raises(ConfigurationError, match="output="):
        FlopMeter(tiny_llama(), 0, parent_runs=["0123abcd"])  # a run id, nowhere to look
    first = _train(tmp_path / "one.json")
    with pytest.raises(ConfigurationError, match="counts once"):
        FlopMeter(
            tiny_llama(),
            0,
            output=tmp_path / "two.json",
            parent_runs=[tmp_path / "one.json", first.run.run_id],  # the same run twice
        )


def _own(path) -> float:
    """A run's own compute as its report file says (its compute.primary_flops)."""
    return json.loads(path.read_text())["compute"]["primary_flops"]


@pytest.mark.slow
def test_a_parent_named_directly_and_through_another_parent_counts_once(tmp_path):
    a = _train(tmp_path / "a.json", lengths=(3, 5))
    b = _train(tmp_path / "b.json", lengths=(6, 2), parent_runs=[tmp_path / "a.json"])
    c = _train(tmp_path / "c.json", lengths=(7,), parent_runs=[tmp_path / "b.json", a.run.run_id])
    truth = _own(tmp_path / "a.json") + _own(tmp_path / "b.json") + _own(tmp_path / "c.json")
    assert c.lineage.cumulative_flops == pytest.approx(truth, rel=1e-12)  # A once, not twice
    assert c.lineage.ancestor_flops == {
        a.run.run_id: _own(tmp_path / "a.json"),
        b.run.run_id: _own(tmp_path / "b.json"),
    }
    assert c.verdict.ratio_to_threshold == pytest.approx(truth / (1e23 / 3), rel=1e-12)
    assert any(f"(run {a.run.run_id})" in n and "counted once" in n for n in c.notes)
    assert c.lineage.parent_runs[1].path == str((tmp_path / "a.json").resolve())  # named by run id
    read_report(tmp_path / "c.json")  # the reader's sum counts A once too


@pytest.mark.slow
def test_an_ancestor_shared_by_two_parents_counts_once(tmp_path):
    a = _train(tmp_path / "a.json", lengths=(3, 5))
    _train(tmp_path / "b.json", lengths=(6, 2), parent_runs=[tmp_path / "a.json"])
    _train(tmp_path / "c.json", lengths=(4,), parent_runs=[tmp_path / "a.json"])
    d = _train(
        tmp_path / "d.json", lengths=(2, 2), parent_runs=[tmp_path / "b.json", tmp_path / "c.json"]
    )
    truth = sum(_own(tmp_path / f"{x}.json") for x in "abcd")
    assert d.lineage.cumulative_flops == pytest.approx(truth, rel=1e-12)
    assert len(d.lineage.ancestor_flops) == 3
    assert any(f"Run {a.run.run_id} is an ancestor of more than one" in n for n in d.notes)
    # a grandchild of the diamond: its parent's cumulative, every run still once
    e = _train(tmp_path / "e.json", lengths=(5,), parent_runs=[tmp_path / "d.json", a.run.run_id])
    assert e.lineage.cumulative_flops == pytest.approx(truth + _own(tmp_path / "e.json"), rel=1e-12)
