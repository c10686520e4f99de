"""Two-process torchrun runs (gloo, CPU): one report, written once, summing what the ranks fed.

Each script counts what its rank fed from the batches themselves and writes it next to the
report; FlopReport.write_json is instrumented to log every write with the writing rank.
"""

from __future__ import annotations

import csv
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.exits import assert_exit_ok

pytest.importorskip("transformers")

SCRIPTS = Path(__file__).parent / "scripts"
pytestmark = [pytest.mark.slow, pytest.mark.gloo]


def torchrun(script: str, out: Path) -> dict:
    """Runs ``script`` on two processes and returns the report plus each rank's facts."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "FM_WRITES_LOG": str(out / "writes.log")}
    env.pop("PRETRAIN_FLOPS", None)
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nproc_per_node",
        "2",
        "--standalone",
        str(SCRIPTS / script),
        str(out),
    ]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=180)
    assert_exit_ok(proc)
    writes = (out / "writes.log").read_text().splitlines()
    # one report file, written by rank 0 only: running at the start (and at refreshes), final
    assert set(writes) == {f"0 {out / 'flops_meter.json'}"} and len(writes) >= 2
    ranks = [json.loads((out / f"rank{r}.json").read_text()) for r in (0, 1)]
    return {"report": json.loads((out / "flops_meter.json").read_text()), "ranks": ranks}


def test_raw_loop(tmp_path):
    run = torchrun("ddp_raw_loop.py", tmp_path)
    report, ranks = run["report"], run["ranks"]
    assert ranks[0]["non_padding"] != ranks[1]["non_padding"]
    assert report["tokens"]["tokens_processed"] == sum(r["non_padding"] for r in ranks)
    assert report["tokens"]["tokens_seen"] == sum(r["with_padding"] for r in ranks)
    assert report["tokens"]["micro_batches"] == sum(r["micro_batches"] for r in ranks)
    assert report["tokens"]["optimizer_steps"] == 2
    assert (report["run"]["world_size"], report["run"]["counts_scope"]) == (2, "all_ranks")
    # every rank's final report is the summed one
    assert [r["report_tokens"] for r in ranks] == [report["tokens"]["tokens_processed"]] * 2


def test_hf_trainer(tmp_path):
    run = torchrun("ddp_hf_trainer.py", tmp_path)
    report, ranks = run["report"], run["ranks"]
    fed = [sum(r["non_padding"]) for r in ranks]
    assert fed[0] != fed[1]
    assert report["tokens"]["tokens_processed"] == sum(fed) == 2 * ranks[0]["dataset_tokens"]
    assert report["tokens"]["tokens_processed"] == ranks[0]["num_input_tokens_seen"]
    assert report["tokens"]["tokens_seen"] == sum(sum(r["with_padding"]) for r in ranks)
    assert report["tokens"]["optimizer_steps"] == ranks[0]["global_step"] == 4
    assert (report["run"]["world_size"], report["run"]["counts_scope"]) == (2, "all_ranks")
    # the running compute in the logs is summed over ranks: after step s, 2s batches per rank
    logged = [h for h in ranks[0]["log_history"] if "loss" in h]
    for entry in logged:
        s = entry["step"]
        assert entry["flopmeter_tokens"] == sum(sum(r["non_padding"][: 2 * s]) for r in ranks)
    # the checkpoint at step 2 holds the counts of both ranks at step 2
    saved = json.loads((tmp_path / "checkpoint-2" / "trainer_state.json").read_text())
    state = saved["stateful_callbacks"]["FlopMeterCallback"]["attributes"]["saved_meter_state"]
    assert state["tokens_processed"] == sum(sum(r["non_padding"][:4]) for r in ranks)
    assert state["micro_batches"] == 8


def test_lightning_ddp(tmp_path):
    import torch

    run = torchrun("ddp_lightning.py", tmp_path)
    report, ranks = run["report"], run["ranks"]
    fed = [sum(r["non_padding"]) for r in ranks]
    assert fed[0] != fed[1]
    assert ranks[0]["world_size"] == 2
    assert report["tokens"]["tokens_processed"] == sum(fed) == 2 * ranks[0]["dataset_tokens"]
    assert report["tokens"]["tokens_seen"] == sum(sum(r["with_padding"]) for r in ranks)
    assert report["tokens"]["optimizer_steps"] == ranks[0]["global_step"] == 4
    assert (report["run"]["world_size"], report["run"]["counts_scope"]) == (2, "all_ranks")
    # the FLOP model saw each rank's training_step (through DDP) and summed over ranks
    assert report["compute"]["primary_estimate"] == "transformer"
    assert report["compute"]["estimates"]["transformer"]["flops"] == pytest.approx(
        ranks[0]["flops_truth"], rel=1e-9
    )
    assert report["compute"]["estimates"]["measured"]["flops"] is not None
    with open(Path(ranks[0]["log_dir"]) / "metrics.csv", newline="") as f:
        logged = {
            int(row["step"]): float(row["flopmeter/tokens"])
            for row in csv.DictReader(f)
            if row.get("flopmeter/tokens")
        }
    assert logged == {
        s: float(sum(sum(r["non_padding"][: 2 * s]) for r in ranks)) for s in (1, 2, 3, 4)
    }
    checkpoint = torch.load(tmp_path / "ckpt" / "epoch=0-step=2.ckpt", weights_only=False)
    state = checkpoint["callbacks"]["FlopMeterCallback"]["meter"]
    assert state["tokens_processed"] == sum(sum(r["non_padding"][:4]) for r in ranks)
