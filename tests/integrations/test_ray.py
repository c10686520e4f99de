"""Ray Train (issue 31): a ``TorchTrainer`` with 2 CPU workers, metered explicitly and with
``FLOPMETER_AUTO=1`` alone, with the real Ray from ``.venv-ray`` (scripts/framework_venv ray).

Truth: the hand count of the data (8 micro-batches of 2 x 16 tokens over both workers, a step
at each: 256 tokens; each worker's 4 steps) and the single-process FLOP of the same batches
(the meter's own count of a plain loop, in this process). Zero-code used to leave its report in
Ray's session folder (the workers' folder, deleted with the session): it goes to the folder the
job started in.
"""

from __future__ import annotations

import json
import subprocess
import tempfile
from pathlib import Path

import pytest
import torch

from flopmeter import FlopMeter
from tests.support.frameworks import framework_python
from tests.support.zero_code import clean_env

pytestmark = [pytest.mark.slow, pytest.mark.gloo]
pytest.importorskip("transformers")

SCRIPT = Path(__file__).parent / "scripts" / "ray_loop.py"
TOKENS = 8 * 2 * 16


def _single_process(micro_batches: int = 8) -> tuple[float, int]:
    """The single-process FLOP of the first ``micro_batches`` of the same batches and the
    model's parameter count."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    net = LlamaForCausalLM(
        LlamaConfig(
            vocab_size=128, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
            num_attention_heads=4, num_key_value_heads=2, pad_token_id=0,
        )
    )  # fmt: skip
    opt = torch.optim.AdamW(net.parameters(), lr=1e-3)
    g = torch.Generator().manual_seed(1)
    with FlopMeter(net, 0) as meter:
        for ids in [torch.randint(1, 128, (2, 16), generator=g) for _ in range(8)][:micro_batches]:
            net(input_ids=ids, labels=ids).loss.backward()
            opt.step()
            opt.zero_grad()
    report = meter.report()
    assert report.tokens.tokens_processed == TOKENS * micro_batches // 8
    return report.compute.primary_flops, sum(p.numel() for p in net.parameters())


def _ray(
    cwd: Path, *args: str, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    python = str(framework_python("ray"))
    # Ray's own folders under a short temporary folder of the test's (socket paths are short)
    with tempfile.TemporaryDirectory(prefix="fr", dir="/tmp") as temp:
        environ = clean_env({"TMPDIR": temp, "FLOPMETER_NVML": "0", **(env or {})})
        done = subprocess.run([python, str(SCRIPT), *args], cwd=cwd, env=environ,
                              capture_output=True, text=True, timeout=600, check=False)  # fmt: skip
    assert done.returncode == 0, done.stderr[-4000:]
    return done


@pytest.mark.parametrize("mode", ["meter", "zero-code"])
def test_a_ray_trainer_gives_one_report_of_both_workers(tmp_path, mode):
    if mode == "meter":
        _ray(tmp_path, "meter", str(tmp_path / "flops_meter.json"))
    else:
        done = _ray(tmp_path, "bare", "-", env={"FLOPMETER_AUTO": "1", "FLOPMETER_PAD_ID": "0"})
        assert f"flopmeter: report: {tmp_path / 'flops_meter.json'} (completed" in done.stderr
    report = json.loads((tmp_path / "flops_meter.json").read_text())
    assert report["tokens"]["tokens_processed"] == TOKENS
    assert report["tokens"]["optimizer_steps"] == 4  # each worker's, in step
    assert (report["run"]["world_size"], report["run"]["counts_scope"]) == (2, "all_ranks")
    flops, parameters = _single_process()
    assert report["model"]["n_total"] == parameters
    assert report["compute"]["primary_flops"] == flops
    assert report["verdict"]["outcome"] is not None


def test_a_budget_stops_both_workers_after_the_same_step(tmp_path):
    """A budget of 2.5 of the job's steps (each a micro-batch on each worker): both workers
    stop after their second step, and the report is the single process's of the 4 micro-batches
    they trained (worker 0 the 1st and 3rd, worker 1 the 2nd and 4th), stopped by the budget."""
    flops, _ = _single_process()
    budget = 2.5 * flops / 4
    out = tmp_path / "flops_meter.json"
    _ray(tmp_path, "budget", str(out), repr(budget))
    stopped = [json.loads(Path(f"{out}.rank{r}.json").read_text())["stopped_at"] for r in (0, 1)]
    assert stopped == [2, 2]
    report = json.loads(out.read_text())
    trained, parameters = _single_process(4)
    assert report["tokens"]["tokens_processed"] == TOKENS // 2
    assert report["tokens"]["optimizer_steps"] == 2
    assert report["model"]["n_total"] == parameters
    assert report["compute"]["primary_flops"] == trained <= budget
    assert report["budget"]["stopped_by_budget"] is True
    assert report["budget"]["flops_at_stop"] == trained
    assert (report["run"]["world_size"], report["run"]["status"]) == (2, "completed")
