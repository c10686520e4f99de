"""torch's own engines under torchrun on CPU gloo ranks (issue 31), metered with ``FlopMeter``
(tests/integrations/scripts/torch_engines.py): DDP, FSDP2 and Accelerate's FSDP2 plugin on 2
ranks, DDP on 2 nodes x 2 ranks (each node its own ``flopmeter run``, as on a cluster), each
with a budget of 2.5 steps' compute; and a (dp 2, tp 2) mesh on 4 ranks.

Truth: the tokens counted by hand from the data (replica ``d`` feeds 2 rows of ``8 (d + 1)``
tokens a step, no padding), the model's own parameter count, and the FLOP of one process fed the
same micro-batches (every replica's of a step, then the optimizer step), metered in this
process: what the ranks did between them.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from flopmeter import FlopMeter
from tests.support.dist import two_nodes
from tests.support.exits import assert_exit_ok
from tests.support.models import tiny_llama
from tests.support.zero_code import clean_env

pytest.importorskip("transformers")
pytestmark = [pytest.mark.slow, pytest.mark.gloo]

SCRIPTS = Path(__file__).parent / "scripts"
SCRIPT = SCRIPTS / "torch_engines.py"
sys.path.insert(0, str(SCRIPTS))
from torch_engines import ROWS, micro_batch  # noqa: E402


def hand_tokens(replicas: int, steps: int) -> int:
    """The tokens of ``steps`` steps of ``replicas`` replicas, from the data's shape."""
    return steps * ROWS * sum(8 * (d + 1) for d in range(replicas))


def single_process(replicas: int, steps: int) -> dict:
    """One process fed every replica's micro-batch of each step, then the step: its FLOP and
    steps as the meter counts them, and the model's own parameter count."""
    model = tiny_llama()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    with FlopMeter(model, 0) as meter:
        for step in range(1, steps + 1):
            for replica in range(replicas):
                ids = micro_batch(replica, step)
                model(input_ids=ids, labels=ids).loss.backward()
            optimizer.step()
            optimizer.zero_grad()
    report = meter.report()
    assert report.tokens.tokens_processed == hand_tokens(replicas, steps)
    return {"flops": report.compute.primary_flops, "steps": report.tokens.optimizer_steps,
            "parameters": sum(p.numel() for p in model.parameters())}  # fmt: skip


def budget_of(replicas: int) -> float:
    """2.5 steps' compute of the whole job (every replica's micro-batch of a step)."""
    return 2.5 * single_process(replicas, 1)["flops"]


def torchrun(*args: str) -> list[str]:
    return [sys.executable, "-m", "torch.distributed.run", *args]


def ranks_of(*folders: Path) -> list[dict]:
    files = sorted(p for f in folders for p in f.glob("rank*.json"))
    return [json.loads(p.read_text()) for p in files]


def assert_stopped_at_step_2(report: dict, ranks: list[dict], replicas: int, budget: float):
    """Every rank stopped after step 2 (the last step within 2.5 steps' compute), and the one
    report is the single process's of those 2 steps, stopped by the budget."""
    truth = single_process(replicas, 2)
    assert [r["stopped_at"] for r in ranks] == [2] * len(ranks)
    assert report["tokens"]["tokens_processed"] == hand_tokens(replicas, 2)
    assert report["tokens"]["optimizer_steps"] == truth["steps"] == 2
    assert report["model"]["n_total"] == truth["parameters"]
    assert report["compute"]["primary_flops"] == truth["flops"]
    assert report["compute"]["primary_flops"] <= budget
    assert report["budget"]["stopped_by_budget"] is True
    assert report["budget"]["flops_at_stop"] == truth["flops"]
    assert report["run"]["status"] == "completed" and report["verdict"]["outcome"] is not None
    # every rank's final report is the summed one
    assert {(r["tokens"], r["steps"], r["flops"]) for r in ranks} == {
        (hand_tokens(replicas, 2), 2, truth["flops"])
    }


@pytest.mark.parametrize("engine", ["ddp", "fsdp2", "accelerate-fsdp2"])
def test_two_ranks_stop_at_the_last_step_within_the_budget(tmp_path, engine):
    """DDP, FSDP2 (``fully_shard``) and Accelerate's FSDP2 plugin on the CPU, which Accelerate
    1.16 prepares as DDP (the plugin is ignored under ``DistributedType.MULTI_CPU``):
    docs/distributed.md's trap."""
    budget = budget_of(2)
    cmd = torchrun("--standalone", "--nproc_per_node", "2", str(SCRIPT), str(tmp_path),
                   engine, repr(budget))  # fmt: skip
    env = clean_env({"OMP_NUM_THREADS": "1"})
    assert_exit_ok(subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300))
    report = json.loads((tmp_path / "flops_meter.json").read_text())
    assert (report["run"]["world_size"], report["run"]["counts_scope"]) == (2, "all_ranks")
    ranks = ranks_of(tmp_path)
    assert_stopped_at_step_2(report, ranks, 2, budget)
    ddp = "DistributedDataParallel"
    wrapper = {"ddp": ddp, "fsdp2": "FSDPLlamaForCausalLM", "accelerate-fsdp2": ddp}[engine]
    assert {r["model_class"] for r in ranks} == {wrapper}


def test_two_nodes_of_two_ranks_give_one_report_and_stop_in_step(tmp_path):
    """torchrun as 2 nodes x 2 ranks on 127.0.0.1, each node its own ``flopmeter run`` in its
    own folder: rank 0's node writes the one report of the 4 ranks; the other node says where
    it is; the budget stops all 4 after the same step."""
    budget = budget_of(4)
    args = [str(SCRIPT), ".", "ddp", repr(budget)]
    done = two_nodes(tmp_path, 2, args, clean_env({"OMP_NUM_THREADS": "1"}))
    for status, err in done:
        assert status == 0, err[-3000:]
    node0, node1 = tmp_path / "node0", tmp_path / "node1"
    report = json.loads((node0 / "flops_meter.json").read_text())
    assert (report["run"]["world_size"], report["run"]["counts_scope"]) == (4, "all_ranks")
    assert not (node1 / "flops_meter.json").exists()
    ranks = ranks_of(node0, node1)
    assert sorted(r["replica"] for r in ranks) == [0, 1, 2, 3]
    assert_stopped_at_step_2(report, ranks, 4, budget)
    first, second = (err for _, err in done)
    assert f"flopmeter: report: {node0 / 'flops_meter.json'} (completed" in first
    assert (
        "flopmeter: no report on this node: its rank(s) 2, 3 fed the job's one report, which "
        f"rank 0 writes on its own node; this node's ranks named it {node1 / 'flops_meter.json'}"
    ) in second, second[-3000:]
    assert os.path.exists(node1 / "rank2.json")


def test_a_tensor_parallel_mesh_counts_each_replica_once_and_withholds_the_compute(tmp_path):
    """A (dp 2, tp 2) mesh: the Llama's linears split over tp by ``parallelize_module``, FSDP2
    over dp. The two tp ranks of a replica feed the same micro-batches: the tokens are each
    replica's once (they were counted on both, twice the data) and the parameters the whole
    model's. The FLOP model's dispatch check cannot see a tp rank's work as a whole (DTensor
    operators at their full shapes, local ones at the shard's), so no figure and no verdict."""
    cmd = torchrun("--standalone", "--nproc_per_node", "4", str(SCRIPT), str(tmp_path), "tp")
    env = clean_env({"OMP_NUM_THREADS": "1"})
    assert_exit_ok(subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300))
    report = json.loads((tmp_path / "flops_meter.json").read_text())
    ranks = ranks_of(tmp_path)
    assert sorted(r["replica"] for r in ranks) == [0, 0, 1, 1]
    assert report["tokens"]["tokens_processed"] == hand_tokens(2, 4)
    assert report["tokens"]["micro_batches"] == 2 * 4
    assert report["tokens"]["optimizer_steps"] == 4
    assert report["model"]["n_total"] == single_process(1, 1)["parameters"]
    assert (report["run"]["world_size"], report["run"]["counts_scope"]) == (4, "all_ranks")
    assert report["compute"]["primary_flops"] is None and report["verdict"]["outcome"] is None
    assert "mesh dimension 'tp' of 2 ranks: tensor parallel" in report["compute"]["withheld_reason"]
    assert {r["tokens"] for r in ranks} == {hand_tokens(2, 4)}
