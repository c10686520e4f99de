"""DeepSpeed counted as it runs (issue 31), with the real engine from ``.venv-deepspeed``
(scripts/framework_venv deepspeed: DeepSpeed's CPU accelerator, gloo).

DeepSpeed's ZeRO optimizers hand the torch optimizer flat partitions, not the model's
parameters, and step it once per parameter group within one model step: before, the meter saw
no optimizer step under ZeRO (0 steps, the budget never fired); a step matched by parameters
alone would count one per group (8 for the Trainer's 4). Truth: the hand count of the data
(8 micro-batches of 2 x 16 tokens, accumulation 2: 256 tokens, 4 optimizer steps), the model's
own parameter count, and the plain torch loop of the same data, whose FLOP the meter checks
against the dispatch count (tests of the FLOP model).
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from tests.support.frameworks import framework_python
from tests.support.zero_code import clean_env

pytestmark = [pytest.mark.slow, pytest.mark.gloo]

SCRIPT = Path(__file__).parent / "scripts" / "deepspeed_runs.py"
ENGINE_CASES = ["zero0", "zero1", "zero2", "zero3", "zero3-offload", "explicit"]
HF_CASES = ["hf-zero1", "hf-zero2", "hf-zero3"]
BUDGET_CASES = ["budget-zero1", "budget-zero2", "budget-zero3"]
RESUME_CASES = ["hf-resume-zero2", "hf-resume-zero3"]
#: The data, counted by hand: micro-batches x batch x length, micro-batches / accumulation.
TOKENS, STEPS = 8 * 2 * 16, 8 // 2


def _env(extra: dict[str, str] | None = None) -> dict[str, str]:
    env = clean_env({"OMP_NUM_THREADS": "1", "DS_ACCELERATOR": "cpu", "CUDA_VISIBLE_DEVICES": ""})
    env.pop("PRETRAIN_FLOPS", None)
    env.update(extra or {})
    return env


def _run(out: Path, cases: list[str], *, ranks: int = 1) -> dict:
    python = str(framework_python("deepspeed"))
    result = out / "result.json"
    if ranks == 1:
        single = {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(29500 + os.getpid() % 400),
                  "RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0"}  # fmt: skip
        command, env = [python, str(SCRIPT), str(result), *cases], _env(single)
    else:
        command = [python, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node",
                   str(ranks), str(SCRIPT), str(result), *cases]  # fmt: skip
        env = _env()
    done = subprocess.run(command, cwd=out, env=env, capture_output=True, text=True,
                          timeout=900, check=False)  # fmt: skip
    assert done.returncode == 0, done.stderr[-4000:]
    return json.loads(result.read_text())


@pytest.fixture(scope="module")
def single(tmp_path_factory) -> dict:
    """Every case in one process, one after the other (one DeepSpeed import)."""
    out = tmp_path_factory.mktemp("deepspeed")
    cases = ["plain", *ENGINE_CASES, *BUDGET_CASES, *HF_CASES, "hf-budget-zero3", *RESUME_CASES]
    return _run(out, cases)


def _same_work(got: dict, plain: dict) -> None:
    for field in ("optimizer_steps", "micro_batches", "tokens", "n_total", "n_trainable",
                  "primary_flops"):  # fmt: skip
        assert got[field] == plain[field], field
    assert got["withheld"] is None and got["outcome"] is not None


def test_the_plain_loop_is_the_hand_count(single):
    plain = single["plain"]
    assert plain["tokens"] == TOKENS and plain["optimizer_steps"] == STEPS
    assert plain["n_total"] == plain["numel"] and plain["primary_flops"] > 0


@pytest.mark.parametrize("case", ENGINE_CASES + HF_CASES)
def test_every_zero_stage_counts_what_the_plain_loop_does(single, case):
    """ZeRO 0 to 3 (3 with parameters and optimizer states offloaded), the raw engine, an
    explicit ``optimizer=`` of DeepSpeed's own, and the Trainer's DeepSpeed: one step per
    engine step, the whole model's parameters under ZeRO-3's partitions."""
    got = single[case]
    _same_work(got, single["plain"])
    assert got["engine_steps"] == STEPS


@pytest.mark.parametrize("case", BUDGET_CASES)
def test_the_budget_stops_the_engine_at_the_last_step_within_it(single, case):
    """A budget of 2.5 steps' compute: the second step's update completes (every parameter
    group), the next forward raises, the report says stopped at step 2."""
    got, plain = single[case], single["plain"]
    per_step = plain["primary_flops"] / plain["optimizer_steps"]
    assert got["raised"] and "training stopped at step 2" in got["raised"]
    assert got["stopped_by_budget"] is True
    assert got["optimizer_steps"] == got["engine_steps"] == 2
    assert (
        got["primary_flops"] == pytest.approx(2 * per_step)
        and got["primary_flops"] <= single["budget"]
    )
    assert got["tokens"] == TOKENS // 2


def test_the_budget_stops_the_trainers_deepspeed(single):
    got, plain = single["hf-budget-zero3"], single["plain"]
    assert got["stopped_by_budget"] is True
    assert got["optimizer_steps"] == got["engine_steps"] == 2
    assert got["primary_flops"] == pytest.approx(2 * plain["primary_flops"] / STEPS)


@pytest.mark.parametrize("case", RESUME_CASES)
def test_a_trainer_resumed_from_a_deepspeed_checkpoint_keeps_the_counts(single, case):
    """Two steps, a checkpoint (the engine's and the Trainer's), a new Trainer resumed from it:
    the report is the whole run's (the first session's two steps in ``lineage.resumed``)."""
    got, plain = single[case], single["plain"]
    _same_work(got, plain)
    assert got["engine_steps"] == STEPS
    assert got["sessions_flops"] == [pytest.approx(plain["primary_flops"] / 2)]


def test_two_ranks_give_one_report_of_the_whole_job(tmp_path):
    """torchrun, 2 ranks, each its half of the micro-batches: tokens summed over ranks, the
    whole model's parameters (not a partition), the steps and FLOP of a plain 2-rank loop of
    the same data."""
    got = _run(tmp_path, ["plain", "zero2", "zero3", "hf-zero3"], ranks=2)
    plain = got["plain"]
    assert plain["tokens"] == TOKENS and plain["optimizer_steps"] == STEPS // 2
    for case in ("zero2", "zero3", "hf-zero3"):
        _same_work(got[case], plain)


@pytest.mark.parametrize(("stage", "launcher"), [(2, "flopmeter run"), (3, "environment")])
def test_zero_code_meters_a_raw_engine_loop(single, tmp_path, stage, launcher):
    """A loop that never mentions flopmeter: the engine is found as the module whose
    parameters the first optimizer steps (DeepSpeed builds it over the model's own parameters
    before partitioning them), and the report is the plain loop's."""
    python = str(framework_python("deepspeed"))
    env = _env({"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(29900 + os.getpid() % 90),
                "RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0", "FLOPMETER_PAD_ID": "0"})  # fmt: skip
    script = [python, str(SCRIPT.parent / "deepspeed_bare.py"), str(stage)]
    if launcher == "flopmeter run":
        command = [python, "-m", "flopmeter.cli", "run", "--", *script]
    else:
        command, env["FLOPMETER_AUTO"] = script, "1"
    done = subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=900, check=False)  # fmt: skip
    assert done.returncode == 0, done.stderr[-4000:]
    report = json.loads((tmp_path / "flops_meter.json").read_text())
    plain = single["plain"]
    assert report["attach"]["method"] == "optimizer"
    assert report["attach"]["model_class"] == "deepspeed.runtime.engine.DeepSpeedEngine"
    assert report["tokens"]["optimizer_steps"] == plain["optimizer_steps"] == STEPS
    assert report["tokens"]["tokens_processed"] == plain["tokens"] == TOKENS
    assert report["model"]["n_total"] == plain["n_total"]
    assert report["compute"]["primary_flops"] == plain["primary_flops"]
