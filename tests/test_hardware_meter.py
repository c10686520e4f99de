"""FlopMeter's hardware fields, end to end: a real (tiny) Llama trained under the meter, with the
fake ``pynvml`` of tests/fake_nvml first on sys.path standing in for the driver."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import pytest
import torch
from transformers import LlamaForCausalLM

from fake_nvml.install import FAKE_DIR, use_fake_nvml
from flopmeter import ConfigurationError, FlopMeter, MissingExtraError
from tests.support.models import tiny_llama_config

FAST = 0.005
H200_FLOPS = 989.4e12
VOCAB = 64


@pytest.fixture
def nvml(monkeypatch: pytest.MonkeyPatch):
    """The fake pynvml module, imported as ``pynvml``; the real one is back afterwards."""
    return use_fake_nvml(monkeypatch)


def tiny_llama() -> tuple[LlamaForCausalLM, torch.optim.Optimizer]:
    torch.manual_seed(0)
    # the shared tiny Llama with one layer of two heads, this file's vocabulary and no pad id
    config = tiny_llama_config(
        vocab_size=VOCAB,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=1,
        pad_token_id=None,
    )
    model = LlamaForCausalLM(config)
    return model, torch.optim.AdamW(model.parameters(), lr=1e-3)


def train_step(model: LlamaForCausalLM, optimizer: torch.optim.Optimizer) -> None:
    ids = torch.randint(1, VOCAB, (2, 16))
    model(input_ids=ids, labels=ids).loss.backward()
    optimizer.step()
    optimizer.zero_grad()


def train(model, optimizer, state, gpu, steps: int = 3) -> None:
    """A few steps, each long enough for the sampling thread to read ``gpu`` at least once."""
    for _ in range(steps):
        before = gpu.calls["nvmlDeviceGetUtilizationRates"]
        train_step(model, optimizer)
        assert state.wait_for(gpu, "nvmlDeviceGetUtilizationRates", before + 1)


def no_sampling_thread() -> bool:
    return "flopmeter-nvml" not in {t.name for t in threading.enumerate()}


# ----------------------------------------------------------------------------- one GPU
@pytest.mark.slow
def test_one_gpu_report_fields(nvml, tmp_path):
    gpu = nvml.FakeGpu(name="NVIDIA H200", utilization=[20, 70, 90])
    nvml.state.reset([gpu])
    model, opt = tiny_llama()
    with FlopMeter(model, output=tmp_path, nvml_interval_seconds=FAST) as meter:
        train(model, opt, nvml.state, gpu)
        gpu.energy_mj += 250_000  # the GPU used 250 J meanwhile
    r = meter.report()
    assert r.run.status == "completed"
    assert r.hardware.gpu_name == "NVIDIA H200" and r.hardware.gpu_count == 1
    assert r.hardware.peak_flops_per_second == H200_FLOPS  # the H200's, not the H20's 148e12
    assert r.hardware.bound_flops == pytest.approx(
        r.run.training_duration_seconds * H200_FLOPS, rel=1e-12
    )
    returned = gpu.utilization_returned
    mean_util = sum(returned) / len(returned) / 100
    assert r.hardware.utilization_weighted_bound_flops == pytest.approx(
        r.hardware.bound_flops * mean_util
    )
    assert r.compute.primary_flops is not None
    assert r.hardware.mfu == pytest.approx(r.compute.primary_flops / r.hardware.bound_flops)
    assert r.hardware.energy_joules == pytest.approx(250.0)
    assert r.hardware.energy_kwh == pytest.approx(250.0 / 3.6e6)
    # Average power: the energy over the monitored window, which is the training time give or
    # take what runs between the monitor's and the meter's clocks (3 ms of a 60 ms run on a
    # loaded machine: an absolute bound, not a relative one)
    window_seconds = 250.0 / r.hardware.average_power_watts
    assert window_seconds == pytest.approx(r.run.training_duration_seconds, abs=0.05)
    assert no_sampling_thread()
    assert nvml.state.init_calls == nvml.state.shutdown_calls == 1
    written = json.loads((tmp_path / "flops_meter.json").read_text())
    assert written["hardware"]["energy_joules"] == pytest.approx(250.0)
    assert written["hardware"]["bound_flops"] == pytest.approx(r.hardware.bound_flops)
    text = r.to_text()
    assert "1 x NVIDIA H200" in text and "energy" in text and "MFU" in text


def test_training_that_raises_stops_the_thread_and_keeps_the_energy(nvml, tmp_path):
    gpu = nvml.FakeGpu(name="NVIDIA H100 80GB HBM3")
    nvml.state.reset([gpu])
    model, opt = tiny_llama()
    meter = FlopMeter(model, output=tmp_path, nvml_interval_seconds=FAST)
    with pytest.raises(RuntimeError, match="out of memory"), meter:
        train(model, opt, nvml.state, gpu, steps=2)
        assert not no_sampling_thread()
        gpu.energy_mj += 42_000
        raise RuntimeError("CUDA out of memory (pretend)")
    assert no_sampling_thread()
    assert nvml.state.init_calls == nvml.state.shutdown_calls == 1
    r = json.loads((tmp_path / "flops_meter.json").read_text())
    assert r["run"]["status"] == "failed"
    assert r["hardware"]["energy_joules"] == pytest.approx(42.0)
    assert r["hardware"]["bound_flops"] == pytest.approx(
        r["run"]["training_duration_seconds"] * 989.4e12
    )


def test_running_report_reads_energy_so_far(nvml):
    gpu = nvml.FakeGpu(name="NVIDIA H200")
    nvml.state.reset([gpu])
    model, opt = tiny_llama()
    with FlopMeter(model, nvml_interval_seconds=FAST) as meter:
        train_step(model, opt)
        gpu.energy_mj += 5_000
        running = meter.report()
        gpu.energy_mj += 1_000
    assert running.run.status == "running" and running.hardware.energy_joules == pytest.approx(5.0)
    assert meter.report().hardware.energy_joules == pytest.approx(6.0)


def test_evaluation_inside_the_window_is_noted(nvml):
    gpu = nvml.FakeGpu(name="NVIDIA H200")
    nvml.state.reset([gpu])
    model, opt = tiny_llama()
    with FlopMeter(model, nvml_interval_seconds=FAST) as meter:
        train_step(model, opt)
        model.eval()
        with torch.no_grad():
            model(input_ids=torch.randint(1, VOCAB, (2, 16)))
            model(input_ids=torch.randint(1, VOCAB, (2, 16)))
        model.train()
    r = meter.report()
    assert r.tokens.micro_batches == 1  # evaluation is not counted as training ...
    assert any(n.startswith("2 forward passes in evaluation mode") for n in r.hardware.notes)


def test_resumed_run_bounds_this_session_only(nvml):
    gpu = nvml.FakeGpu(name="NVIDIA H200")
    nvml.state.reset([gpu])
    model, opt = tiny_llama()
    first = FlopMeter(model, nvml=False)
    with first:
        train_step(model, opt)
    state = first.state_dict()
    state["training_duration_seconds"] = 3600.0  # an hour before the checkpoint
    second = FlopMeter(model, nvml_interval_seconds=FAST)
    second.load_state_dict(state)
    with second:
        train_step(model, opt)
    r = second.report()
    session = r.run.training_duration_seconds - 3600.0
    assert 0 < session < 3600
    assert r.hardware.bound_flops == pytest.approx(session * H200_FLOPS, rel=1e-9)
    assert any("this session only" in n for n in r.hardware.notes)


# ----------------------------------------------------------------------------- devices
def test_eight_gpus_visible_devices_choose_two(nvml, monkeypatch):
    gpus = nvml.state.eight_gpus()
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", f"{gpus[3].uuid},{gpus[0].uuid[:10]}")
    model, opt = tiny_llama()
    with FlopMeter(model, nvml_interval_seconds=FAST) as meter:
        train(model, opt, nvml.state, gpus[0])
        for i, gpu in enumerate(gpus):
            gpu.energy_mj += 1000 * (i + 1)  # every GPU of the node used energy
    r = meter.report()
    assert r.hardware.gpu_count == 2
    assert r.hardware.energy_joules == pytest.approx(4.0 + 1.0)  # GPUs 3 and 0 only
    assert r.hardware.bound_flops == pytest.approx(2 * r.run.training_duration_seconds * 989.4e12)
    touched = [i for i, g in enumerate(gpus) if g.calls["nvmlDeviceGetTotalEnergyConsumption"]]
    assert touched == [0, 3]


def test_mig_device_has_no_hardware_figures(nvml, monkeypatch):
    mig = nvml.FakeMig(uuid="MIG-aa11bb22-0000-1111-2222-333344445555", profile="3g.20gb")
    gpu = nvml.FakeGpu(name="NVIDIA A100-SXM4-40GB", mig_mode=1, migs=[mig])
    nvml.state.reset([gpu])
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", mig.uuid)
    model, opt = tiny_llama()
    with FlopMeter(model, nvml_interval_seconds=FAST) as meter:
        train_step(model, opt)
    r = meter.report()
    assert r.hardware.gpu_name == "NVIDIA A100-SXM4-40GB MIG 3g.20gb" and r.hardware.gpu_count == 1
    for field in ("peak_flops_per_second", "bound_flops", "mfu", "energy_joules", "energy_kwh"):
        assert getattr(r.hardware, field) is None, field
    assert any("MIG instance" in n for n in r.hardware.notes)


# ----------------------------------------------------------------------------- peaks
def test_unknown_gpu_has_no_bound_until_the_user_gives_the_peak(nvml):
    gpu = nvml.FakeGpu(name="NVIDIA Future GPU 9000")
    nvml.state.reset([gpu])
    model, opt = tiny_llama()
    with FlopMeter(model, nvml_interval_seconds=FAST) as meter:
        train_step(model, opt)
    r = meter.report()
    assert (
        r.hardware.bound_flops is None
        and r.hardware.mfu is None
        and r.hardware.peak_flops_per_second is None
    )
    assert r.hardware.energy_joules == 0.0  # measured: the fake's counter did not move
    assert any("not in the peak table" in n and "peak_flops=" in n for n in r.hardware.notes)
    with FlopMeter(model, peak_flops=123e12, nvml_interval_seconds=FAST) as meter:
        train_step(model, opt)
    r = meter.report()
    assert r.hardware.peak_flops_per_second == 123e12
    assert r.hardware.bound_flops == pytest.approx(r.run.training_duration_seconds * 123e12)


def test_dtype_selects_the_peak(nvml):
    nvml.state.reset([nvml.FakeGpu(name="Tesla V100-SXM2-32GB")])
    model, opt = tiny_llama()
    with FlopMeter(model, nvml_interval_seconds=FAST) as meter:  # bf16: no V100 figure
        train_step(model, opt)
    r = meter.report()
    assert r.hardware.bound_flops is None
    assert any("no bf16 figure for V100 SXM2" in n for n in r.hardware.notes)
    with FlopMeter(model, dtype="fp16", nvml_interval_seconds=FAST) as meter:
        train_step(model, opt)
    r = meter.report()
    assert r.hardware.peak_flops_per_second == 125e12
    assert r.hardware.bound_flops == pytest.approx(r.run.training_duration_seconds * 125e12)


# ----------------------------------------------------------------------------- on / off
def test_nvml_false_and_env_off_never_touch_nvml(nvml, monkeypatch):
    nvml.state.reset([nvml.FakeGpu()])
    model, opt = tiny_llama()
    with FlopMeter(model, nvml=False) as meter:
        train_step(model, opt)
    assert meter.report().hardware.notes == ["GPU monitoring is off (nvml=False)."]
    monkeypatch.setenv("FLOPMETER_NVML", "0")
    with FlopMeter(model) as meter:  # nvml not given: the environment decides
        train_step(model, opt)
    r = meter.report()
    assert r.hardware.notes == ["GPU monitoring is off (FLOPMETER_NVML=0)."]
    assert r.hardware.gpu_count is None and r.hardware.energy_joules is None
    assert nvml.state.init_calls == 0


def test_explicit_nvml_argument_beats_the_environment(nvml, monkeypatch):
    """An explicit argument beats FLOPMETER_NVML, which beats the default."""
    nvml.state.reset([nvml.FakeGpu(name="NVIDIA H200")])
    model, opt = tiny_llama()
    monkeypatch.setenv("FLOPMETER_NVML", "0")
    with FlopMeter(model, nvml=True, nvml_interval_seconds=FAST) as meter:
        train_step(model, opt)
    r = meter.report()
    assert r.hardware.gpu_count == 1 and r.hardware.gpu_name == "NVIDIA H200"
    assert "GPU monitoring is off (FLOPMETER_NVML=0)." not in r.hardware.notes
    assert nvml.state.init_calls == nvml.state.shutdown_calls == 1
    monkeypatch.setenv("FLOPMETER_NVML", "1")
    with FlopMeter(model, nvml=False) as meter:
        train_step(model, opt)
    assert meter.report().hardware.notes == ["GPU monitoring is off (nvml=False)."]
    assert nvml.state.init_calls == 1  # not touched again


def test_explicit_nvml_false_beats_a_required_environment_without_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", None)  # nvidia-ml-py not installed
    monkeypatch.setenv("FLOPMETER_NVML", "1")
    model, opt = tiny_llama()
    with FlopMeter(model, nvml=False) as meter:  # no MissingExtraError: the argument decides
        train_step(model, opt)
    assert meter.report().hardware.notes == ["GPU monitoring is off (nvml=False)."]


@pytest.mark.parametrize("nvml_arg", [None, True])
def test_nvml_init_failing_never_fails_training(nvml, nvml_arg):
    nvml.state.reset([nvml.FakeGpu()], init_error=nvml.NVML_ERROR_LIBRARY_NOT_FOUND)
    model, opt = tiny_llama()
    with FlopMeter(model, nvml=nvml_arg, nvml_interval_seconds=FAST) as meter:
        train_step(model, opt)
    r = meter.report()
    assert r.run.status == "completed" and r.tokens.micro_batches == 1
    assert (
        r.hardware.gpu_count is None
        and r.hardware.bound_flops is None
        and r.hardware.energy_joules is None
    )
    assert any("NVML Shared Library Not Found" in n for n in r.hardware.notes)


def test_missing_package(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", None)  # nvidia-ml-py not installed
    monkeypatch.delenv("FLOPMETER_NVML", raising=False)
    model, opt = tiny_llama()
    with pytest.raises(
        MissingExtraError, match=r"pip install 'nvidia-ml-py' \(it is in flopmeter's 'nvml' extra"
    ):
        FlopMeter(model, nvml=True)
    monkeypatch.setenv("FLOPMETER_NVML", "1")
    with pytest.raises(MissingExtraError):
        FlopMeter(model)
    monkeypatch.delenv("FLOPMETER_NVML")
    with FlopMeter(model) as meter:  # default: on when available, so a note, no error
        train_step(model, opt)
    assert any("nvidia-ml-py" in n for n in meter.report().hardware.notes)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"peak_flops": -1.0}, "peak_flops"),
        ({"peak_flops": 0}, "peak_flops"),
        ({"peak_flops": float("nan")}, "peak_flops"),
        ({"peak_flops": float("inf")}, "peak_flops"),
        ({"peak_flops": "989e12"}, "peak_flops"),
        ({"peak_flops": True}, "peak_flops"),
        ({"peak_flops": 989.4}, "TFLOP/s"),  # TFLOP/s given where FLOP/s are asked
        ({"dtype": "bf32"}, "dtype"),
        ({"dtype": None}, "dtype"),
        ({"nvml": "yes"}, "nvml"),
        ({"nvml_interval_seconds": 0}, "nvml_interval_seconds"),
        ({"nvml_interval_seconds": float("inf")}, "nvml_interval_seconds"),
    ],
)
def test_bad_hardware_arguments_fail_before_training(kwargs, match):
    model, _ = tiny_llama()
    with pytest.raises(ConfigurationError, match=match):
        FlopMeter(model, **kwargs)


def test_bad_env_value_fails_before_training(monkeypatch):
    monkeypatch.setenv("FLOPMETER_NVML", "sometimes")
    model, _ = tiny_llama()
    with pytest.raises(ConfigurationError, match="FLOPMETER_NVML"):
        FlopMeter(model)


# ----------------------------------------------------------------------------- ranks
WORKER = """
import json, os, sys
sys.path.insert(0, {fake_dir!r})
sys.path.insert(0, {tests_dir!r})
sys.path.insert(0, {root_dir!r})
import torch
import torch.distributed as dist
sys.modules.pop("pynvml", None)
import pynvml
assert hasattr(pynvml, "state"), pynvml.__file__
from test_hardware_meter import tiny_llama, train_step
from flopmeter import FlopMeter

rank = int(os.environ["RANK"])
dist.init_process_group("gloo", init_method={init!r}, rank=rank, world_size=2)
gpu = pynvml.state.gpus[rank]  # LOCAL_RANK = rank chooses it
model, opt = tiny_llama()
with FlopMeter(model, nvml_interval_seconds=0.005) as meter:
    for _ in range(2):
        train_step(model, opt)
    gpu.energy_mj += 1000 * (rank + 1)
completed = meter.report()
completed_seconds = meter.elapsed_seconds()
try:
    with FlopMeter(model, nvml_interval_seconds=0.005) as failing:
        train_step(model, opt)
        gpu.energy_mj += 500
        raise RuntimeError("rank failure")
except RuntimeError:
    pass
calls = [g.calls["nvmlDeviceGetTotalEnergyConsumption"] for g in pynvml.state.gpus]
with open({out!r} + str(rank) + ".json", "w") as f:
    json.dump({{"completed": completed.model_dump(), "seconds": completed_seconds,
               "failed": failing.report().model_dump(), "energy_calls": calls}}, f)
dist.barrier()
dist.destroy_process_group()
"""


@pytest.mark.slow
def test_two_ranks_count_each_gpu_once(tmp_path):
    config = {
        "gpus": [
            {"name": "NVIDIA H200", "uuid": "GPU-rank0-0000"},
            {"name": "NVIDIA H200", "uuid": "GPU-rank1-1111"},
        ]
    }
    script = tmp_path / "worker.py"
    script.write_text(
        textwrap.dedent(
            WORKER.format(
                fake_dir=str(FAKE_DIR),
                tests_dir=str(Path(__file__).parent),
                root_dir=str(Path(__file__).parents[1]),
                init=f"file://{tmp_path / 'store'}",
                out=str(tmp_path / "rank"),
            )
        )
    )
    procs = []
    for rank in range(2):
        env = {
            **os.environ,
            "RANK": str(rank),
            "LOCAL_RANK": str(rank),
            "WORLD_SIZE": "2",
            "FAKE_NVML_CONFIG": json.dumps(config),
            "OMP_NUM_THREADS": "1",
        }
        env.pop("CUDA_VISIBLE_DEVICES", None)
        env.pop("FLOPMETER_NVML", None)
        procs.append(
            subprocess.Popen(
                [sys.executable, str(script)],
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
            )
        )
    for proc in procs:
        output, _ = proc.communicate(timeout=240)
        assert proc.returncode == 0, output
    results = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2)]
    # Each rank read only its own GPU.
    assert results[0]["energy_calls"][1] == 0 and results[0]["energy_calls"][0] > 0
    assert results[1]["energy_calls"][0] == 0 and results[1]["energy_calls"][1] > 0
    seconds = results[0]["seconds"] + results[1]["seconds"]
    for res in results:  # every rank gets the combined figures
        r = res["completed"]
        assert r["run"]["counts_scope"] == "all_ranks" and r["run"]["world_size"] == 2
        assert r["hardware"]["gpu_count"] == 2 and r["hardware"]["gpu_name"] == "NVIDIA H200"
        assert r["hardware"]["energy_joules"] == pytest.approx(1.0 + 2.0)
        assert r["hardware"]["bound_flops"] == pytest.approx(seconds * H200_FLOPS, rel=1e-9)
        assert r["hardware"]["mfu"] == pytest.approx(
            r["compute"]["primary_flops"] / r["hardware"]["bound_flops"]
        )
    # A failed rank makes no collective: each report holds its own GPU only.
    for res in results:
        r = res["failed"]
        assert r["run"]["status"] == "failed" and r["run"]["counts_scope"] == "this_rank"
        assert r["hardware"]["gpu_count"] == 1 and r["hardware"]["energy_joules"] == pytest.approx(
            0.5
        )
        assert r["hardware"]["bound_flops"] == pytest.approx(
            r["run"]["training_duration_seconds"] * H200_FLOPS
        )
