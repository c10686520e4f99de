"""Zero-code metering of a raw loop (issue 21, piece C): the model found by its optimizer.

In-process: the module choice (nested modules, a DDP-like wrapper, an EMA copy, a container,
LoRA with real peft, a bare tensor) and the meter's private lifecycle pieces zero-code metering
stands down with. In subprocesses (slow): unmodified scripts under the environment switch,
compared with examples/raw_loop.py's own report run plainly.
"""

from __future__ import annotations

import copy
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from torch import nn

from flopmeter import FlopMeter
from flopmeter.auto.attaching import attach_section
from flopmeter.auto.job import read_records
from flopmeter.auto.raw_model import find_model, pad_id_of_model, parameter_count
from tests.support.models import PAD_ID, tiny_llama
from tests.support.shared_runs import plain_example_run
from tests.support.zero_code import LAUNCHERS, clean_env, launch

ROOT = Path(__file__).resolve().parents[1]
SCRIPTS = Path(__file__).parent / "scripts" / "zero_code"
#: examples/raw_loop.py without its meter line (the example users run under zero-code).
UNMODIFIED = ROOT / "examples" / "zero_code_raw_loop.py"


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.inner = nn.Linear(4, 4)
        self.head = nn.Linear(4, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.inner(x))


class Wrapper(nn.Module):
    """Like DDP: holds the model as ``module``, no parameters of its own."""

    def __init__(self, module: nn.Module) -> None:
        super().__init__()
        self.module = module

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.module(x)


def params(module: nn.Module) -> list[nn.Parameter]:
    return list(module.parameters())


@pytest.mark.slow
def test_nested_modules_the_outermost_holding_all():
    model = Block()
    found = find_model(params(model))
    assert found.module is model
    # only the inner layer's parameters: the inner layer, not the block holding more
    assert find_model(params(model.inner)).module is model.inner


def test_a_ddp_like_wrapper_is_chosen_over_the_model_it_wraps():
    model = Block()
    wrapped = Wrapper(model)
    assert find_model(params(wrapped)).module is wrapped


def test_an_ema_copy_beside_the_model_is_not_chosen():
    model = Block()
    ema = copy.deepcopy(model).requires_grad_(False)
    assert find_model(params(model)).module is model
    assert find_model(params(ema)).module is ema  # and its own parameters find it


def test_a_container_with_a_trainable_copy_gives_the_model():
    model = Block()
    both = nn.ModuleDict({"model": model, "ema": copy.deepcopy(model)})
    found = find_model(params(model))
    assert found.module is model
    assert found.candidates == 2  # the container holds them too, with more trainable ones
    assert find_model(params(both)).module is both  # an optimizer over both: the container


def test_lora_finds_the_peft_model_not_a_lora_layer_nor_the_inner_model():
    peft = pytest.importorskip("peft")
    config = peft.LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"])
    model = peft.get_peft_model(tiny_llama(), config)
    adapters = [p for p in model.parameters() if p.requires_grad]
    found = find_model(adapters)
    assert type(found.module).__name__ == "PeftModel" and found.module is model
    # by all parameters the inner LlamaModel (no lm_head) would have been the fewest
    inner = model.base_model.model.model
    assert parameter_count(inner) < parameter_count(model)
    assert pad_id_of_model(model) == PAD_ID


def test_a_bare_tensor_finds_nothing_and_says_why():
    weight = torch.zeros(3, requires_grad=True)
    found = find_model([weight])
    assert found.module is None and "no torch.nn.Module" in (found.reason or "")
    model = Block()  # a module's parameters and a tensor outside it: no module holds both
    found = find_model([*params(model), weight])
    assert found.module is None and "every one of the 5 tensors" in (found.reason or "")


def test_pad_id_through_a_wrapper():
    assert pad_id_of_model(Wrapper(tiny_llama())) == PAD_ID
    assert pad_id_of_model(Block()) is None


def train_steps(model: nn.Module, steps: int) -> None:
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(steps):
        model(torch.ones(2, 4)).sum().backward()
        optimizer.step()
        optimizer.zero_grad()


def zero_code_meter(model: nn.Module, output: Path) -> FlopMeter:
    meter = FlopMeter(model, output=output)
    meter.note_attach(attach_section("optimizer", "a test", model=model))
    return meter.begin(claim_file=False)


def test_standing_down_before_the_claim_leaves_nothing(tmp_path):
    model = Block()
    out = tmp_path / "flops_meter.json"
    auto = zero_code_meter(model, out)
    train_steps(model, 1)
    assert not out.exists()  # counting, the file not yet claimed
    assert auto.stand_down("stood down: a test") is None
    assert not model._forward_pre_hooks and not out.exists()
    with FlopMeter(model, output=out) as mine:
        train_steps(model, 2)
    assert mine.report().tokens.optimizer_steps == 2
    assert sorted(p.name for p in tmp_path.iterdir()) == ["flops_meter.json"]
    assert json.loads(out.read_text())["attach"] is None  # the script's own report


def test_standing_down_after_the_claim_leaves_its_report_kept_aside(tmp_path):
    model = Block()
    out = tmp_path / "flops_meter.json"
    auto = zero_code_meter(model, out)
    train_steps(model, 1)
    auto.claim_file()
    assert json.loads(out.read_text())["run"]["status"] == "running"
    report = auto.stand_down("stood down: the script started its own FlopMeter")
    assert report is not None and report.run.status == "interrupted"
    assert report.attach.reason.startswith("stood down")
    assert report.tokens.optimizer_steps == 1
    with FlopMeter(model, output=out) as mine:
        train_steps(model, 2)
    assert mine.report().tokens.optimizer_steps == 2
    kept = [p for p in tmp_path.rglob("*.json") if p != out]  # the zero-code report, aside
    assert len(kept) == 1 and json.loads(kept[0].read_text())["attach"]["reason"]
    assert json.loads(out.read_text())["attach"] is None


# ----------------------------------------------------------------- unmodified scripts


def run_script(cwd: Path, *args: str, launcher: str = "environment", env=None):
    job = cwd / "job"
    job.mkdir(parents=True, exist_ok=True)
    extra = {"FLOPMETER_JOB_DIR": str(job), **(env or {})}
    proc = launch([sys.executable, *args], launcher=launcher, cwd=cwd, env=extra)
    return proc, read_records(job)


def report_at(folder: Path) -> dict:
    return json.loads((folder / "flops_meter.json").read_text())


def same_counts(a: dict, b: dict) -> None:
    assert a["tokens"] == b["tokens"]
    assert a["compute"]["primary_flops"] == b["compute"]["primary_flops"]
    assert a["compute"]["primary_flops"] is not None
    flops = {k: v["flops"] for k, v in a["compute"]["estimates"].items()}
    assert flops == {k: v["flops"] for k, v in b["compute"]["estimates"].items()}


@pytest.fixture
def plain(shared_runs) -> dict:
    """examples/raw_loop.py's own report, run plainly (no zero-code metering): made once in the
    session (tests/support/shared_runs.py), not by a module fixture, so the module's tests are
    work units of their own, spread over the workers (tests/support/scheduling.py)."""
    return report_at(shared_runs.folder("examples/raw_loop.py", plain_example_run))


@pytest.mark.slow
@pytest.mark.parametrize("launcher", LAUNCHERS)
def test_an_unmodified_raw_loop_reports_what_the_edited_one_does(tmp_path, plain, launcher):
    proc, records = run_script(tmp_path, str(UNMODIFIED), launcher=launcher)
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = report_at(tmp_path)
    same_counts(report, plain)
    assert report["run"]["status"] == "completed" and report["verdict"] is not None
    attach = report["attach"]
    assert attach["method"] == "optimizer" and attach["unseen_micro_batches"] is False
    assert attach["model_class"].endswith("LlamaForCausalLM")
    assert attach["found"].startswith("LlamaForCausalLM (988,288 parameters): the module")
    attached = [r for r in records if r["event"] == "attached"]
    assert [r["report"] for r in attached] == [str(tmp_path / "flops_meter.json")]


@pytest.mark.slow
@pytest.mark.parametrize("launcher", LAUNCHERS)
def test_the_edited_script_keeps_its_own_meter_alone(tmp_path, plain, launcher):
    proc, records = run_script(tmp_path, str(ROOT / "examples" / "raw_loop.py"), launcher=launcher)
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = report_at(tmp_path)
    same_counts(report, plain)
    assert report["attach"] is None and report["model"]["name"] == "example/tiny-llama"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["flops_meter.json", "job"]
    events = [r["event"] for r in records]
    assert "explicit" in events and "attached" not in events
    explicit = next(r for r in records if r["event"] == "explicit")
    assert explicit["report"] == str(tmp_path / "flops_meter.json")


@pytest.mark.slow
def test_micro_batches_before_the_optimizer_withhold_the_verdict(tmp_path):
    proc, _ = run_script(tmp_path, str(UNMODIFIED), "--early-backward")
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = report_at(tmp_path)
    assert report["attach"]["unseen_micro_batches"] is True
    assert "in no count" in report["attach"]["found"]
    assert report["compute"]["primary_flops"] is None
    assert "ran before the zero-code meter" in report["compute"]["withheld_reason"]
    assert report["verdict"]["outcome"] is None and report["verdict"]["judged_flops"] is None
    assert report["tokens"]["micro_batches"] == 16  # what it saw, from its start


@pytest.mark.slow
def test_an_optimizer_over_a_bare_tensor_runs_on_unmetered(tmp_path):
    proc, records = run_script(tmp_path, str(SCRIPTS / "bare_tensor.py"))
    assert proc.returncode == 0 and "trained" in proc.stdout, proc.stderr[-3000:]
    missed = [r for r in records if r["event"] == "not_attached"]
    assert len(missed) == 1 and missed[0]["method"] == "optimizer"
    assert "SGD" in missed[0]["reason"] and "no torch.nn.Module" in missed[0]["reason"]
    assert not any(r["event"] in ("attached", "problem") for r in records)


@pytest.mark.slow
def test_an_exception_in_the_script_is_a_failed_report_and_its_exit_status(tmp_path):
    proc, _ = run_script(tmp_path, str(UNMODIFIED), "--crash-after", "5")
    assert proc.returncode == 1 and "went to NaN" in proc.stderr
    report = report_at(tmp_path)
    assert report["run"]["status"] == "failed" and "went to NaN" in report["run"]["error"]
    assert (report["tokens"]["micro_batches"], report["tokens"]["optimizer_steps"]) == (5, 2)


@pytest.mark.slow
def test_sigterm_mid_run_leaves_an_interrupted_report(tmp_path):
    (tmp_path / "job").mkdir()
    env = clean_env({"FLOPMETER_AUTO": "1", "FLOPMETER_JOB_DIR": str(tmp_path / "job")})
    cmd = [sys.executable, str(UNMODIFIED), "--hang-after", "6"]
    proc = subprocess.Popen(cmd, cwd=tmp_path, env=env, stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "HANGING"
        os.kill(proc.pid, signal.SIGTERM)
        assert proc.wait(timeout=60) == -signal.SIGTERM
    finally:
        proc.kill()
        proc.wait()
    time.sleep(0.2)
    report = report_at(tmp_path)
    assert report["run"]["status"] == "interrupted" and "SIGTERM" in report["run"]["error"]
    assert report["tokens"]["optimizer_steps"] == 3


@pytest.mark.slow
def test_a_loop_that_skips_the_module_found_is_said(tmp_path):
    proc, _ = run_script(tmp_path, str(SCRIPTS / "unused_wrapper.py"))
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = report_at(tmp_path)
    assert report["attach"]["model_class"].endswith("Wrapper")
    assert report["tokens"]["micro_batches"] == 0 and report["tokens"]["optimizer_steps"] == 3
    assert any("through another module" in note for note in report["notes"])


@pytest.mark.slow
def test_an_optimizer_built_inside_a_hugging_face_trainer_is_left_to_its_path(tmp_path):
    pytest.importorskip("transformers")
    proc, records = run_script(tmp_path, str(SCRIPTS / "raw_guard_hf_trainer.py"))
    assert proc.returncode == 0 and "trained" in proc.stdout, proc.stderr[-3000:]
    assert "torch" in [r["event"] for r in records]
    assert not [r for r in records if r.get("method") == "optimizer"]
    report = tmp_path / "flops_meter.json"  # the Trainer's own zero-code path may write one
    assert not report.exists() or json.loads(report.read_text())["attach"]["method"] != "optimizer"


@pytest.mark.slow
def test_a_later_optimizer_over_other_parameters_withholds_the_verdict(tmp_path):
    """The second model's compute is in no count (a GAN's two optimizers): the figure would be
    a part of the run, so there is no figure and no verdict, with the reason."""
    proc, records = run_script(tmp_path, str(SCRIPTS / "two_optimizers.py"))
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = report_at(tmp_path)
    assert report["attach"]["model_class"] == "torch.nn.modules.linear.Linear"
    assert (report["tokens"]["micro_batches"], report["tokens"]["optimizer_steps"]) == (2, 2)
    later = "a later optimizer (SGD) steps 2 parameter tensors outside the metered Linear"
    assert later in report["compute"]["withheld_reason"]
    assert report["compute"]["primary_flops"] is None and report["verdict"]["outcome"] is None
    assert len([r for r in records if r["event"] == "attached"]) == 1


@pytest.mark.slow
def test_sys_exit_with_a_failure_code_mid_run_is_a_failed_run(tmp_path):
    proc, _ = run_script(tmp_path, str(SCRIPTS / "exit_mid_run.py"))
    assert proc.returncode == 3, proc.stderr[-3000:]
    report = report_at(tmp_path)
    assert report["run"]["status"] == "failed"
    assert report["run"]["error"] == "SystemExit: 3"
    assert report["tokens"]["optimizer_steps"] == 2


def _ledger_reports(path: Path) -> list[dict]:
    from flopmeter.ledger.store import Ledger

    return [record.report() for record in Ledger(path).records()] if path.exists() else []


@pytest.mark.slow
def test_a_child_the_loop_forks_writes_nothing_of_the_parents_run(tmp_path):
    """The child inherits the meter and its exit handler: it must not end the parent's run
    (a completed ledger record under the parent's run id with 2 of 4 steps, or the file)."""
    ledger = tmp_path / "ledger.db"
    env = {"FLOPMETER_LEDGER": str(ledger)}
    proc, _ = run_script(tmp_path, str(SCRIPTS / "fork_mid_run.py"), env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = report_at(tmp_path)
    assert report["run"]["status"] == "completed"
    assert (report["tokens"]["micro_batches"], report["tokens"]["optimizer_steps"]) == (4, 4)
    records = _ledger_reports(ledger)
    assert [r["tokens"]["optimizer_steps"] for r in records] == [4]
    assert records[0]["run"]["run_id"] == report["run"]["run_id"]


@pytest.mark.slow
def test_a_killed_parent_leaves_no_final_record_made_by_its_child(tmp_path):
    """Killed after the fork: the run's only record must not be the child's stale one; the
    file is the parent's last refresh, not a final report the child wrote."""
    ledger = tmp_path / "ledger.db"
    env = {"FLOPMETER_LEDGER": str(ledger), "FLOPMETER_REFRESH_SECONDS": "0.001"}
    proc, _ = run_script(tmp_path, str(SCRIPTS / "fork_mid_run.py"), "kill", env=env)
    assert proc.returncode == -signal.SIGKILL, proc.stderr[-3000:]
    parent = int(proc.stdout.split()[1])
    report = report_at(tmp_path)
    assert report["run"]["status"] == "running"
    assert report["run"]["pid"] == parent
    assert _ledger_reports(ledger) == []


@pytest.mark.slow
@pytest.mark.parametrize("stepped", [False, True])
def test_a_throwaway_first_optimizer_leaves_the_real_model_to_be_metered(tmp_path, stepped):
    """A first optimizer over a bare tensor attaches nothing, and the next one (over a real
    module) is metered; when the throwaway one stepped, its compute is in no count and the
    verdict is withheld with the reason."""
    args = ["step"] if stepped else []
    proc, records = run_script(tmp_path, str(SCRIPTS / "throwaway_first_optimizer.py"), *args)
    assert proc.returncode == 0 and "trained" in proc.stdout, proc.stderr[-3000:]
    report = report_at(tmp_path)
    assert report["attach"]["model_class"] == "torch.nn.modules.linear.Linear"
    assert (report["tokens"]["micro_batches"], report["tokens"]["optimizer_steps"]) == (3, 3)
    assert [r["event"] for r in records if r["event"] in ("attached", "not_attached")] == [
        "not_attached",
        "attached",
    ]
    withheld = report["compute"]["withheld_reason"] or ""
    if stepped:
        assert "an optimizer no module holds the tensors of (LBFGS) stepped" in withheld
        assert report["verdict"]["outcome"] is None
    else:
        assert "LBFGS" not in withheld
