"""Regressions found in review: reentrant checkpointing, a FLOP formula that raises, a process
group gone before the meter stops, report file permissions."""

from __future__ import annotations

import json
import os
import stat

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from flopmeter import FlopMeter
from tests.support.batches import PAD_ID, padded_batch
from tests.support.dist import join_gloo
from tests.support.models import tiny_llama

# spawns gloo processes: one rerun for gloo's teardown abort alone (tests/conftest.py)
pytestmark = pytest.mark.gloo


def _run(model, batches):
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
    with FlopMeter(model, PAD_ID, nvml=False) as meter:
        for batch in batches:
            model(**batch).loss.backward()
            optimizer.step()
            optimizer.zero_grad()
    return meter.report()


@pytest.mark.slow
def test_reentrant_checkpointing_does_not_lower_the_primary_figure():
    batches = [padded_batch([12, 7], 16, seed=i) for i in range(3)]
    plain = _run(tiny_llama(), batches)
    model = tiny_llama()
    model.gradient_checkpointing_enable({"use_reentrant": True})
    checkpointed = _run(model, batches)
    # Recomputation is not counted; the training work is the same as without checkpointing.
    assert plain.compute.primary_estimate == "transformer"
    assert checkpointed.compute.primary_flops == pytest.approx(
        plain.compute.primary_flops, rel=1e-9
    )
    # the profile now charges the checkpointed layers as their recomputed backward computes
    # them (issue 11), so the transformer estimate stays primary and agrees with measured
    assert checkpointed.compute.primary_estimate == "transformer"
    assert checkpointed.compute.measured_to_transformer_ratio == pytest.approx(1.0, rel=1e-6)


@pytest.mark.slow
def test_a_failing_flop_formula_drops_the_sample_and_never_fails_training(monkeypatch):
    from flopmeter.flops import aten_ops

    real = aten_ops.measured_formulas

    def broken_formulas():
        formulas = dict(real())
        for op in list(formulas):
            formulas[op] = lambda *a, **k: (_ for _ in ()).throw(ValueError("bad shape"))
        return formulas

    monkeypatch.setattr("flopmeter.flops.counter.measured_formulas", broken_formulas)
    model = tiny_llama()
    report = _run(model, [padded_batch([9, 4], 16, seed=i) for i in range(2)])
    assert report.run.status == "completed"
    assert report.tokens.tokens_processed == 26
    assert report.compute.estimates["measured"].flops is None
    assert any("formula failed" in n for n in report.compute.estimates["measured"].notes)


def _destroy_inside(rank: int, store: str, out: str) -> None:
    join_gloo(rank, 2, store)
    model = tiny_llama()
    with FlopMeter(model, PAD_ID, nvml=False, output=os.path.join(out, "report.json")) as meter:
        model(**padded_batch([3 + rank, 5], 16, seed=rank)).loss.backward()
        dist.barrier()
        dist.destroy_process_group()  # the user's main() tears down inside the block
    with open(os.path.join(out, f"rank{rank}.json"), "w") as f:
        f.write(meter.report().to_json())


@pytest.mark.slow
def test_a_process_group_gone_before_stop_gives_no_verdict_on_partial_counts(tmp_path):
    mp.spawn(_destroy_inside, args=(str(tmp_path / "store"), str(tmp_path)), nprocs=2)
    written = json.loads((tmp_path / "report.json").read_text())
    assert written["tokens"]["tokens_processed"] == 3 + 5  # rank 0's own, not the run's
    assert written["run"]["counts_scope"] == "this_rank"
    assert written["verdict"]["outcome"] is None and written["verdict"]["exceeds_threshold"] is None
    assert any("this rank's only" in n for n in written["notes"])
    rank1 = json.loads((tmp_path / "rank1.json").read_text())
    assert rank1["tokens"]["tokens_processed"] == 4 + 5 and rank1["verdict"]["outcome"] is None


@pytest.mark.slow
def test_the_report_file_is_readable_by_others(tmp_path):
    old = os.umask(0o022)
    try:
        model = tiny_llama()
        with FlopMeter(model, PAD_ID, nvml=False, output=tmp_path):
            model(**padded_batch([4], 8)).loss.backward()
    finally:
        os.umask(old)
    mode = stat.S_IMODE((tmp_path / "flops_meter.json").stat().st_mode)
    assert mode == 0o644


def test_a_fault_in_the_final_report_does_not_break_the_users_script(monkeypatch, caplog):
    model = tiny_llama()

    def broken(*args, **kwargs):
        raise RuntimeError("report bug")

    monkeypatch.setattr("flopmeter.run.reporting.determine_threshold", broken)
    after_block = []
    with FlopMeter(model, PAD_ID, nvml=False):
        model(**padded_batch([4, 6], 8)).loss.backward()
    after_block.append("saved")  # the user's save after the block still runs
    assert after_block == ["saved"]
    assert any("could not make its final report" in r.getMessage() for r in caplog.records)
