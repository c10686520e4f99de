"""The NVML monitor against a fake ``pynvml`` placed first on sys.path (tests/fake_nvml).

Nothing of flopmeter's is mocked: the monitor imports ``pynvml`` as it would on a GPU machine
and gets the fake, which answers like the real module (same names, types and error classes)
and records what it was asked.
"""

from __future__ import annotations

import sys
import threading

import pytest

from fake_nvml.install import use_fake_nvml
from flopmeter.errors import ConfigurationError, MissingExtraError
from flopmeter.hardware.devices import DeviceChoice, devices_in_use, parse_visible_devices
from flopmeter.hardware.figures import combine, summarise, to_vector, utilization_weighted_flops
from flopmeter.hardware.monitor import NvmlMonitor
from flopmeter.hardware.nvml import Nvml, NvmlFailure, import_pynvml
from flopmeter.hardware.options import NvmlSetting, nvml_from_env, nvml_setting
from flopmeter.hardware.readings import trapezoid_joules

FAST = 0.005  # sampling interval in these tests, seconds


@pytest.fixture
def nvml(monkeypatch: pytest.MonkeyPatch):
    """The fake pynvml module, imported as ``pynvml``; the real one is back afterwards."""
    return use_fake_nvml(monkeypatch)


def _energy_calls(gpu) -> int:
    return gpu.calls["nvmlDeviceGetTotalEnergyConsumption"]


def _util_calls(gpu) -> int:
    return gpu.calls["nvmlDeviceGetUtilizationRates"]


def _run(monitor: NvmlMonitor, state, gpu, samples: int = 3) -> None:
    """Starts ``monitor``, lets the thread sample ``gpu`` ``samples`` times, stops it."""
    assert monitor.start()
    assert state.wait_for(gpu, "nvmlDeviceGetUtilizationRates", samples)
    monitor.stop()


# ----------------------------------------------------------------------------- parsing
@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (None, None),
        ("", []),
        ("2,5", [2, 5]),
        (" 3 , 1 ", [3, 1]),
        ("1,-1,2", [1]),  # a negative entry ends the list, as in CUDA
        ("0,x,1", [0]),
        ("1gpu,2", [1, 2]),  # CUDA reads the leading number (strtoul)
        ("1,1", []),  # a repeated entry hides every device
        ("GPU-abc,GPU-def", ["GPU-abc", "GPU-def"]),
        ("GPU-abc,3", ["GPU-abc"]),
        ("MIG-0f3a,MIG-0f3b", ["MIG-0f3a", "MIG-0f3b"]),
        ("-1", []),
    ],
)
def test_parse_visible_devices_like_cuda(value, expected):
    assert parse_visible_devices(value) == expected


@pytest.mark.parametrize(
    ("value", "expected"), [(None, None), ("", None), ("0", False), ("off", False), ("1", True)]
)
def test_nvml_env(value, expected):
    env = {} if value is None else {"FLOPMETER_NVML": value}
    assert nvml_from_env(env) is expected


def test_nvml_env_rejects_nonsense():
    with pytest.raises(ConfigurationError, match="FLOPMETER_NVML"):
        nvml_from_env({"FLOPMETER_NVML": "maybe"})


# ----------------------------------------------------------------------------- devices
def test_one_gpu_energy_from_the_counter_and_mean_utilisation(nvml):
    state = nvml.state
    gpu = nvml.FakeGpu(name="NVIDIA H200", uuid="GPU-1", energy_mj=5_000_000, utilization=[30, 90])
    state.reset([gpu])
    monitor = NvmlMonitor(interval_seconds=FAST)
    assert monitor.start()
    assert state.wait_for(gpu, "nvmlDeviceGetUtilizationRates", 4)
    gpu.energy_mj += 123_456  # what the GPU used meanwhile, mJ
    monitor.stop()
    (reading,) = monitor.readings().devices
    assert reading.name == "NVIDIA H200" and reading.uuid == "GPU-1" and not reading.mig
    assert reading.energy_joules == pytest.approx(123.456)
    assert reading.energy_source == "energy counter"
    returned = gpu.utilization_returned  # every value the fake handed out, the last at stop
    assert returned[0] == 30 and set(returned[1:]) == {90}
    assert reading.utilization_samples == len(returned)
    assert reading.utilization == pytest.approx(sum(returned) / len(returned) / 100)
    assert _energy_calls(gpu) == 2  # start and end: exact, no sampling
    assert state.init_calls == state.shutdown_calls == 1
    assert not monitor.thread.is_alive()


def test_eight_gpus_visible_devices_choose_two_by_index(nvml, monkeypatch):
    gpus = nvml.state.eight_gpus()
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "2,5")
    monitor = NvmlMonitor(interval_seconds=FAST)
    _run(monitor, nvml.state, gpus[5])
    readings = monitor.readings()
    assert [d.uuid for d in readings.devices] == [gpus[2].uuid, gpus[5].uuid]
    for i, gpu in enumerate(gpus):
        touched = _energy_calls(gpu) + _util_calls(gpu)
        assert (touched > 0) == (i in (2, 5)), i
    assert any("all 2 visible GPU(s) are monitored" in n for n in readings.notes)


@pytest.mark.parametrize("prefix_len", [None, 12])
def test_eight_gpus_visible_devices_choose_two_by_uuid(nvml, monkeypatch, prefix_len):
    gpus = nvml.state.eight_gpus()
    chosen = [gpus[6].uuid, gpus[1].uuid]  # CUDA order: 6 first
    if prefix_len:  # CUDA accepts a unique prefix
        chosen = [u[:prefix_len] for u in chosen]
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", ",".join(chosen))
    monitor = NvmlMonitor(interval_seconds=FAST)
    _run(monitor, nvml.state, gpus[1])
    assert [d.uuid for d in monitor.readings().devices] == [gpus[6].uuid, gpus[1].uuid]
    assert [i for i, g in enumerate(gpus) if _energy_calls(g)] == [1, 6]


def test_local_rank_picks_one_of_the_visible_gpus(nvml, monkeypatch):
    gpus = nvml.state.eight_gpus()
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "2,5")
    monkeypatch.setenv("LOCAL_RANK", "1")
    choice = devices_in_use()
    assert choice.indices == (1,) and choice.source == "local_rank"
    monitor = NvmlMonitor(interval_seconds=FAST, choice=choice)
    _run(monitor, nvml.state, gpus[5])
    assert [d.uuid for d in monitor.readings().devices] == [gpus[5].uuid]
    assert [i for i, g in enumerate(gpus) if _energy_calls(g)] == [5]
    assert not any("visible GPU(s) are monitored" in n for n in monitor.notes)


def test_local_rank_with_one_gpu_per_process(nvml, monkeypatch):
    gpus = nvml.state.eight_gpus()
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3")  # the launcher gave this rank one GPU
    monkeypatch.setenv("LOCAL_RANK", "1")
    monitor = NvmlMonitor(interval_seconds=FAST, choice=devices_in_use())
    _run(monitor, nvml.state, gpus[3])
    assert [d.uuid for d in monitor.readings().devices] == [gpus[3].uuid]


def test_local_rank_outside_the_visible_gpus_monitors_nothing(nvml, monkeypatch):
    gpus = nvml.state.eight_gpus()
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "2,5")
    monkeypatch.setenv("LOCAL_RANK", "4")
    monitor = NvmlMonitor(interval_seconds=FAST, choice=devices_in_use())
    assert not monitor.start()
    monitor.stop()
    assert monitor.readings().available is False
    assert any("cuda:4 is not monitored" in n for n in monitor.notes)
    assert not any(_energy_calls(g) for g in gpus)
    assert nvml.state.init_calls == nvml.state.shutdown_calls == 1


def test_visible_index_beyond_the_node_stops_the_list(nvml, monkeypatch):
    gpus = nvml.state.eight_gpus()
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "7,9,0")
    monitor = NvmlMonitor(interval_seconds=FAST)
    _run(monitor, nvml.state, gpus[7])
    assert [d.uuid for d in monitor.readings().devices] == [gpus[7].uuid]
    assert any("names GPU 9" in n for n in monitor.notes)


def test_explicit_devices(nvml):
    gpus = nvml.state.eight_gpus()
    monitor = NvmlMonitor(interval_seconds=FAST, choice=devices_in_use(devices=[4]))
    _run(monitor, nvml.state, gpus[4])
    assert [d.uuid for d in monitor.readings().devices] == [gpus[4].uuid]


# ----------------------------------------------------------------------------- MIG
def test_mig_instance_by_uuid_has_no_whole_gpu_readings(nvml, monkeypatch):
    mig = nvml.FakeMig(uuid="MIG-0f3a1c2d-1111-2222-3333-444455556666", profile="1g.5gb")
    gpu = nvml.FakeGpu(
        name="NVIDIA A100-SXM4-40GB", uuid="GPU-a", mig_mode=nvml.NVML_DEVICE_MIG_ENABLE, migs=[mig]
    )
    nvml.state.reset([gpu])
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", mig.uuid)
    monitor = NvmlMonitor(interval_seconds=FAST)
    assert monitor.start()
    monitor.stop()
    (reading,) = monitor.readings().devices
    assert reading.mig and reading.name == "NVIDIA A100-SXM4-40GB MIG 1g.5gb"
    assert reading.uuid == mig.uuid
    assert reading.energy_joules is None and reading.utilization is None
    assert _energy_calls(gpu) == _util_calls(gpu) == 0  # whole-GPU readings never taken
    assert monitor.thread is None  # nothing to sample
    assert any("MIG instance" in n for n in monitor.notes)
    figures = summarise(monitor.readings(), 10.0)
    assert figures.gpu_count == 1 and figures.peak_flops_per_second is None
    assert figures.bound_flops is None and figures.energy_joules is None
    assert any("a MIG instance has a fraction of the GPU" in n for n in figures.notes)


def test_gpu_in_mig_mode_by_index_is_a_mig_device(nvml, monkeypatch):
    gpu = nvml.FakeGpu(name="NVIDIA H100 80GB HBM3", mig_mode=nvml.NVML_DEVICE_MIG_ENABLE)
    other = nvml.FakeGpu(name="NVIDIA H100 80GB HBM3", uuid="GPU-2", mig_mode=None)  # no MIG
    nvml.state.reset([gpu, other])
    monitor = NvmlMonitor(interval_seconds=FAST)
    _run(monitor, nvml.state, other)
    first, second = monitor.readings().devices
    assert first.mig and first.energy_joules is None and _energy_calls(gpu) == 0
    assert not second.mig and second.energy_joules == 0.0 and second.utilization == 0.5
    figures = summarise(monitor.readings(), 2.0)
    assert figures.bound_flops is None  # one of the two has no peak
    assert figures.energy_joules is None  # one of the two has no energy
    # The user knows the slice's peak: the bound is made, for both devices.
    figures = summarise(monitor.readings(), 2.0, peak_flops_override=100e12)
    assert figures.bound_flops == pytest.approx(2 * 2.0 * 100e12)


# ----------------------------------------------------------------------------- fallbacks
def test_no_energy_counter_integrates_sampled_power(nvml):
    gpu = nvml.FakeGpu(name="NVIDIA A10G", energy_mj=None, power_mw=150_000)
    nvml.state.reset([gpu])
    monitor = NvmlMonitor(interval_seconds=FAST)
    _run(monitor, nvml.state, gpu, samples=5)
    readings = monitor.readings()
    (reading,) = readings.devices
    assert reading.energy_source == "sampled power"
    # Constant 150 W over the window, integrated exactly (the samples span the window).
    assert reading.energy_joules == pytest.approx(150.0 * readings.window_seconds, rel=1e-9)
    assert gpu.calls["nvmlDeviceGetPowerUsage"] >= 5 + 2  # baseline, thread, final
    assert any("no energy counter" in n and "integrated from power" in n for n in readings.notes)
    figures = summarise(readings, readings.window_seconds)
    assert figures.average_power_watts == pytest.approx(150.0, rel=1e-9)
    assert any("sampled power" in n for n in figures.notes)


def test_neither_energy_nor_power(nvml):
    gpu = nvml.FakeGpu(name="NVIDIA H200", energy_mj=None, power_mw=None, utilization=70)
    nvml.state.reset([gpu])
    monitor = NvmlMonitor(interval_seconds=FAST)
    _run(monitor, nvml.state, gpu)
    (reading,) = monitor.readings().devices
    assert reading.energy_joules is None and reading.utilization == pytest.approx(0.7)
    figures = summarise(monitor.readings(), 3.0)
    assert figures.energy_joules is None and figures.average_power_watts is None
    assert figures.bound_flops == pytest.approx(3.0 * 989.4e12)
    assert figures.utilization_weighted_bound_flops == pytest.approx(0.7 * 3.0 * 989.4e12)
    assert any("energy_joules is null" in n for n in figures.notes)


def test_utilisation_not_supported_is_a_note_not_an_error(nvml):
    gpu = nvml.FakeGpu(name="NVIDIA H200", utilization=None)
    nvml.state.reset([gpu])
    monitor = NvmlMonitor(interval_seconds=FAST)
    assert monitor.start()
    gpu.energy_mj += 1000
    monitor.thread.join(5)  # nothing left to sample: the thread ends by itself
    assert not monitor.thread.is_alive()
    monitor.stop()
    (reading,) = monitor.readings().devices
    assert reading.utilization is None and reading.energy_joules == pytest.approx(1.0)
    assert any("does not report utilisation" in n for n in monitor.notes)


def test_nvml_init_failing(nvml):
    nvml.state.reset([nvml.FakeGpu()], init_error=nvml.NVML_ERROR_DRIVER_NOT_LOADED)
    monitor = NvmlMonitor(interval_seconds=FAST)
    assert monitor.start() is False
    monitor.stop()
    assert monitor.readings().available is False
    assert any("NVML could not initialise" in n and "Driver Not Loaded" in n for n in monitor.notes)
    figures = summarise(monitor.readings(), 5.0)
    assert figures.gpu_count is None and figures.bound_flops is None
    assert nvml.state.shutdown_calls == 0


def test_no_pynvml_package(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", None)  # import pynvml raises ImportError
    with pytest.raises(
        MissingExtraError, match=r"pip install 'nvidia-ml-py' \(it is in flopmeter's 'nvml' extra"
    ):
        import_pynvml()
    monitor = NvmlMonitor(interval_seconds=FAST)
    assert monitor.start() is False
    monitor.stop()
    assert any("nvidia-ml-py" in n for n in monitor.notes)


def test_error_in_the_middle_of_sampling(nvml):
    lost = nvml.FakeGpu(name="NVIDIA H200", uuid="GPU-lost", utilization=80)
    lost.fail_after = {"nvmlDeviceGetUtilizationRates": 3, "nvmlDeviceGetTotalEnergyConsumption": 1}
    fine = nvml.FakeGpu(name="NVIDIA H200", uuid="GPU-fine", utilization=60)
    nvml.state.reset([lost, fine])
    monitor = NvmlMonitor(interval_seconds=FAST)
    assert monitor.start()
    assert nvml.state.wait_for_error(1)
    seen = _util_calls(fine)
    assert nvml.state.wait_for(fine, "nvmlDeviceGetUtilizationRates", seen + 5)  # goes on
    fine.energy_mj += 2000
    monitor.stop()
    # The lost GPU was not asked again after its error: one utilisation error, then the energy
    # counter failing at the end.
    assert nvml.state.errors_raised == [
        ("nvmlDeviceGetUtilizationRates", nvml.NVML_ERROR_GPU_IS_LOST),
        ("nvmlDeviceGetTotalEnergyConsumption", nvml.NVML_ERROR_GPU_IS_LOST),
    ]
    assert _util_calls(lost) == 3
    bad, good = monitor.readings().devices
    assert bad.utilization is None and bad.energy_joules is None
    assert good.utilization == pytest.approx(0.6) and good.energy_joules == pytest.approx(2.0)
    assert any("GPU is lost" in n and "sampling of this GPU stopped" in n for n in monitor.notes)
    assert not monitor.thread.is_alive()
    assert nvml.state.init_calls == nvml.state.shutdown_calls == 1


def test_stop_always_joins_and_is_idempotent(nvml):
    gpu = nvml.FakeGpu()
    nvml.state.reset([gpu])
    monitor = NvmlMonitor(interval_seconds=3600)  # would sleep an hour without Event.wait
    assert monitor.start()
    thread = monitor.thread
    assert thread.daemon and thread.name == "flopmeter-nvml"
    monitor.stop()
    monitor.stop()
    assert not thread.is_alive()
    assert _util_calls(gpu) == 1  # only the final sample
    assert "flopmeter-nvml" not in {t.name for t in threading.enumerate()}


def test_readings_while_running_read_the_counter_now(nvml):
    gpu = nvml.FakeGpu(energy_mj=10_000)
    nvml.state.reset([gpu])
    monitor = NvmlMonitor(interval_seconds=FAST)
    assert monitor.start()
    gpu.energy_mj += 7_000
    assert monitor.readings().devices[0].energy_joules == pytest.approx(7.0)
    gpu.energy_mj += 1_000
    monitor.stop()
    assert monitor.readings().devices[0].energy_joules == pytest.approx(8.0)


def test_interval_must_be_positive():
    with pytest.raises(ConfigurationError):
        NvmlMonitor(interval_seconds=0)
    with pytest.raises(ConfigurationError):
        NvmlMonitor(interval_seconds=float("nan"))


def test_unchosen_devices_are_never_opened(nvml):
    gpus = nvml.state.eight_gpus()
    monitor = NvmlMonitor(interval_seconds=FAST, choice=DeviceChoice((0, 7), source="explicit"))
    _run(monitor, nvml.state, gpus[7])
    assert [i for i, g in enumerate(gpus) if g.calls] == [0, 7]


# ----------------------------------------------------------------------------- arithmetic
def test_trapezoid_by_hand():
    # 0-2 s at 100->200 W: 300 J; 2-3 s at 200->100 W: 150 J.
    assert trapezoid_joules([(0.0, 100.0), (2.0, 200.0), (3.0, 100.0)]) == 450.0
    assert trapezoid_joules([(0.0, 100.0)]) is None


def test_utilisation_weighted_by_hand():
    # 10 s x (1e14 x 0.5 + 2e14 x 0.25) = 1e15
    assert utilization_weighted_flops(10.0, [1e14, 2e14], [0.5, 0.25]) == pytest.approx(1e15)


def test_combining_ranks_counts_every_gpu_once():
    from flopmeter.hardware.figures import HardwareFigures

    r0 = HardwareFigures("NVIDIA H200", 2, 989.4e12, 4e15, 2e15, 1000.0, 500.0, ())
    r1 = HardwareFigures("NVIDIA H200", 2, 989.4e12, 5e15, 3e15, 1500.0, 600.0, ("x",))
    out = combine(r0, [to_vector(r0), to_vector(r1)], rank=0)
    assert out.gpu_count == 4 and out.gpu_name == "NVIDIA H200"
    assert out.bound_flops == 9e15 and out.utilization_weighted_bound_flops == 5e15
    assert out.energy_joules == 2500.0 and out.average_power_watts == 1100.0
    assert out.peak_flops_per_second == 989.4e12
    assert any("Rank(s) 1 noted other hardware problems" in n for n in out.notes)
    # Ranks whose notes are this rank's (NVML absent on a CPU run) are no problem of their own.
    off = HardwareFigures(notes=("GPU monitoring is off (NVML is not available).",))
    out = combine(off, [to_vector(off), to_vector(off)], rank=0)
    assert out.notes == off.notes
    # A rank without readings makes the total unknown, not smaller.
    r2 = HardwareFigures(notes=("NVML could not initialise",))
    out = combine(r0, [to_vector(r0), to_vector(r2)], rank=0)
    assert out.gpu_count is None and out.bound_flops is None and out.energy_joules is None
    assert any("missing on rank(s) 1 of 2" in n for n in out.notes)
    # Different GPU models: no single name or peak, the bound still sums.
    r3 = HardwareFigures("NVIDIA A100-SXM4-80GB", 1, 312e12, 1e15, None, 10.0, 1.0, ())
    out = combine(r0, [to_vector(r0), to_vector(r3)], rank=0)
    assert out.gpu_name is None and out.peak_flops_per_second is None
    assert out.bound_flops == 5e15 and out.utilization_weighted_bound_flops is None


# ----------------------------------------------------------------------------- options
@pytest.mark.parametrize(
    ("argument", "env", "mode", "source"),
    [
        (None, None, "auto", None),
        (None, "0", "off", "FLOPMETER_NVML=0"),
        (None, "yes", "required", "FLOPMETER_NVML=1"),
        (True, "0", "required", "nvml=True"),  # the argument beats the environment
        (False, "1", "off", "nvml=False"),
        (False, None, "off", "nvml=False"),
    ],
)
def test_nvml_setting_argument_then_environment_then_default(argument, env, mode, source):
    environ = {} if env is None else {"FLOPMETER_NVML": env}
    assert nvml_setting(argument, environ) == NvmlSetting(mode, source)


def test_nvml_setting_validates_the_environment_even_when_the_argument_decides():
    with pytest.raises(ConfigurationError, match="FLOPMETER_NVML"):
        nvml_setting(True, {"FLOPMETER_NVML": "maybe"})
    with pytest.raises(ConfigurationError, match="nvml must be"):
        nvml_setting("yes", {})  # type: ignore[arg-type]


# ----------------------------------------------------------------------------- wrapper
def test_wrapper_turns_nvml_errors_into_typed_failures(nvml):
    gpu = nvml.FakeGpu(energy_mj=None, power_mw=250_000)
    gpu.fail_after = {"nvmlDeviceGetUtilizationRates": 0}
    nvml.state.reset([gpu])
    wrapper = Nvml(nvml)
    assert wrapper.init() is None and wrapper.is_open
    handle = wrapper.handle_by_index(0)
    assert wrapper.power_watts(handle) == 250.0
    assert wrapper.energy_mj(handle) == NvmlFailure(
        "not_supported", "NVMLError_NotSupported", "Not Supported"
    )
    lost = wrapper.utilization(handle)
    assert lost.kind == "gpu_lost" and lost.reason == "NVMLError_GpuIsLost: GPU is lost"
    assert wrapper.handle_by_uuid("GPU-nope").kind == "not_found"
    assert wrapper.call("nvmlDeviceGetCount", convert=lambda n: 1 / (n - 1)).kind == "unexpected"
    wrapper.shutdown()
    wrapper.shutdown()
    assert not wrapper.is_open and nvml.state.shutdown_calls == 1
    assert isinstance(wrapper.device_count(), NvmlFailure)  # uninitialised: a failure, no raise
