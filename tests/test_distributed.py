"""Two processes under torch.distributed (gloo): one report, summed once, written once."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import torch.multiprocessing as mp

from flopmeter import FlopMeter
from tests.support.batches import PAD_ID, Truth, padded_batch
from tests.support.dist import gloo_group
from tests.support.models import tiny_llama

# spawns gloo processes: one rerun for gloo's teardown abort alone (tests/conftest.py)
pytestmark = pytest.mark.gloo

# Each rank trains on different rows, so the sum is not twice one rank's count.
RANK_LENGTHS = {0: [[16, 2], [5, 9], [3, 3]], 1: [[1, 1], [16, 16], [8, 4]]}


def _worker(rank: int, world: int, store: str, out_dir: str) -> None:
    with gloo_group(rank, world, store):
        model = tiny_llama()
        optimizer = torch.optim.SGD(model.parameters(), lr=1e-2)
        # Every rank names the same output; only rank 0 may write it. Rank 1 also gets a
        # file of its own to prove it writes nothing.
        output = Path(out_dir) / ("report.json" if rank == 0 else "rank1.json")
        truth = Truth()
        with FlopMeter(model, PAD_ID, output=output) as meter:
            for i, rows in enumerate(RANK_LENGTHS[rank]):
                model(**padded_batch(rows, 16, seed=10 * rank + i)).loss.backward()
                optimizer.step()
                truth.add(rows, 16)
            state = meter.state_dict()  # a collective too: every rank calls it
        Path(out_dir, f"truth{rank}.json").write_text(json.dumps(truth.__dict__))
        Path(out_dir, f"state{rank}.json").write_text(json.dumps(state))


@pytest.mark.slow
def test_two_ranks_sum_their_counts_into_one_report_written_once(tmp_path):
    mp.spawn(_worker, args=(2, str(tmp_path / "store"), str(tmp_path)), nprocs=2, join=True)
    truths = [json.loads((tmp_path / f"truth{r}.json").read_text()) for r in (0, 1)]
    assert truths[0]["tokens"] != truths[1]["tokens"]
    report = json.loads((tmp_path / "report.json").read_text())
    assert not (tmp_path / "rank1.json").exists()
    assert report["run"]["world_size"] == 2
    assert report["run"]["counts_scope"] == "all_ranks"
    for field, key in [
        ("tokens_processed", "tokens"),
        ("tokens_seen", "seen"),
        ("sequences", "sequences"),
        ("sum_sq_seq_len", "sum_sq"),
        ("micro_batches", "micro_batches"),
    ]:
        assert report["tokens"][field] == truths[0][key] + truths[1][key], field
    assert report["tokens"]["optimizer_steps"] == 3  # steps are shared, not summed
    assert report["model"]["n_total"] == 24800  # parameters are not multiplied by the world size
    # The checkpoint state holds the global totals on every rank.
    states = [json.loads((tmp_path / f"state{r}.json").read_text()) for r in (0, 1)]
    # (started_at is each rank's own clock reading; everything counted is global.)
    assert {k: v for k, v in states[0].items() if k != "started_at"} == {
        k: v for k, v in states[1].items() if k != "started_at"
    }
    assert states[0]["tokens_processed"] == report["tokens"]["tokens_processed"]


def test_a_mesh_that_cannot_be_read_withholds_and_never_breaks_training(monkeypatch):
    """Reading how the model is split over ranks (its DTensors' meshes) failing at the census
    or at a recount: training goes on, the problem is named, and the figure is withheld with
    that reason (before, the first micro-batch was taken for unreadable tokens, the report
    asked for ``token_inputs``, and ``recount()`` raised into the user's code)."""
    import flopmeter.distributed

    def broken(model):
        raise RuntimeError("mesh read failed")

    monkeypatch.setattr(flopmeter.distributed, "model_parallel", broken)
    model = tiny_llama()
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-2)
    truth = Truth()
    with FlopMeter(model, PAD_ID) as meter:
        for i, rows in enumerate(RANK_LENGTHS[0]):
            model(**padded_batch(rows, 16, seed=i)).loss.backward()
            optimizer.step()
            truth.add(rows, 16)
        meter.recount()  # takes the census again: no exception reaches the loop
    report = meter.report()
    assert report.tokens.tokens_processed == truth.tokens  # every micro-batch counted
    assert report.tokens.micro_batches == len(RANK_LENGTHS[0])
    assert "split" in meter.problems
    assert report.compute.primary_flops is None and report.verdict.outcome is None
    assert "split over ranks is not known" in report.compute.withheld_reason
    assert "token_inputs" not in report.compute.withheld_reason
