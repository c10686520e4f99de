"""Zero-code metering of a two-process torchrun raw loop (gloo, CPU): every rank attaches to
the DDP wrapper its optimizer steps, and rank 0 writes one report, summed over the ranks, equal
to examples/torchrun_raw_loop.py's (the same loop with its ``with FlopMeter`` line)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from flopmeter.auto.job import read_records
from tests.support.dist import two_nodes
from tests.support.exits import assert_exit_ok
from tests.support.zero_code import LAUNCHERS, clean_env, launch

pytest.importorskip("transformers")
pytestmark = [pytest.mark.slow, pytest.mark.gloo]

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "zero_code" / "torchrun_raw_loop.py"


def torchrun(script: Path, *args: str) -> list[str]:
    return [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2",
            "--standalone", str(script), *args]  # fmt: skip


def _edited_run(folder: Path) -> None:
    """examples/torchrun_raw_loop.py (the loop with its ``with FlopMeter`` line) in ``folder``."""
    cmd = torchrun(ROOT / "examples" / "torchrun_raw_loop.py", "--output", "flops_meter.json")
    proc = subprocess.run(cmd, cwd=folder, env=clean_env(), capture_output=True, text=True)
    assert_exit_ok(proc)


@pytest.mark.parametrize("launcher", LAUNCHERS)
def test_an_unmodified_torchrun_loop_reports_what_the_edited_one_does(
    tmp_path, shared_runs, launcher
):
    plain, auto, job = tmp_path / "plain", tmp_path / "auto", tmp_path / "job"
    for folder in (auto, job):
        folder.mkdir()
    # the edited loop's run is deterministic: made once in the session, copied here
    shared_runs.copy("examples/torchrun_raw_loop.py --output flops_meter.json", plain, _edited_run)
    proc = launch(
        torchrun(SCRIPT), launcher=launcher, cwd=auto, env={"FLOPMETER_JOB_DIR": str(job)}
    )
    assert_exit_ok(proc)

    mine, theirs = (json.loads((f / "flops_meter.json").read_text()) for f in (auto, plain))
    assert sorted(p.name for p in auto.iterdir()) == ["flops_meter.json"]
    assert mine["tokens"] == theirs["tokens"] and mine["tokens"]["optimizer_steps"] == 8
    assert mine["compute"]["primary_flops"] == theirs["compute"]["primary_flops"] is not None
    flops = {k: v["flops"] for k, v in mine["compute"]["estimates"].items()}
    assert flops == {k: v["flops"] for k, v in theirs["compute"]["estimates"].items()}
    assert (mine["run"]["world_size"], mine["run"]["counts_scope"]) == (2, "all_ranks")
    assert mine["run"]["status"] == "completed" and mine["verdict"]["outcome"] is not None
    assert mine["attach"]["model_class"].endswith("DistributedDataParallel")
    attached = [r for r in read_records(job) if r["event"] == "attached"]
    assert sorted(r["rank"] for r in attached) == [0, 1]  # every rank, once
    assert {r["report"] for r in attached} == {str(auto / "flops_meter.json")}


def test_two_nodes_each_say_where_the_jobs_report_is(tmp_path):
    """torchrun as 2 nodes x 1 rank on 127.0.0.1, each node its own ``flopmeter run`` (as on a
    cluster: one launch per node, each in its own folder): rank 0's node writes the one report,
    summed over both; the other node, which used to print nothing, says where it is."""
    done = two_nodes(tmp_path, 1, [str(SCRIPT)], clean_env())
    for status, err in done:
        assert status == 0, err[-3000:]
    report = json.loads((tmp_path / "node0" / "flops_meter.json").read_text())
    assert (report["run"]["world_size"], report["run"]["counts_scope"]) == (2, "all_ranks")
    assert not (tmp_path / "node1" / "flops_meter.json").exists()
    first, second = (err for _, err in done)
    assert f"flopmeter: report: {tmp_path / 'node0' / 'flops_meter.json'} (completed" in first
    assert (
        "flopmeter: no report on this node: its rank(s) 1 fed the job's one report, which rank "
        f"0 writes on its own node; this node's ranks named it {tmp_path / 'node1' / 'flops_meter.json'}"
    ) in second, second[-3000:]
