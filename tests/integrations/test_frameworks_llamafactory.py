"""LLaMA-Factory, the real package, training a tiny Llama: its CLI under zero-code and its
Python API with the callback passed leave the same report, also relaunched under torchrun; the
tokens are what the trainer fed its model, counted apart
(tests/integrations/scripts/frameworks/fed_tokens.py).

It runs from its own virtual environment (``.venv-llamafactory``), made by
``scripts/framework_venv`` the first time (minutes): it pins another transformers version (5.6)
than the suite's. axolotl's tests are in test_frameworks_axolotl.py.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.exits import assert_exit_ok, tries_past_teardown_abort
from tests.support.frameworks import (
    SCRIPTS,
    counts,
    framework_and_tiny,
    framework_env,
    llamafactory_config,
    read_json,
    report_files,
    report_lines,
    run_plain,
)
from tests.support.zero_code import LAUNCHERS, launch

# spawns gloo processes: one rerun for gloo's teardown abort alone (tests/conftest.py)
pytestmark = pytest.mark.gloo

LLAMAFACTORY_TRAINER = "llamafactory.train.sft.trainer.CustomSeq2SeqTrainer"


# ----------------------------------------------------------------------------- fixtures
@pytest.fixture(scope="module")
def llamafactory(tmp_path_factory):
    """(python, tiny model folder) of the LLaMA-Factory venv."""
    return framework_and_tiny("llamafactory", tmp_path_factory.mktemp("lf"))


@pytest.fixture(scope="module")
def llamafactory_api_run(llamafactory, tmp_path_factory):
    """LLaMA-Factory through ``run_exp(args=cfg, callbacks=[FlopMeterCallback()])``."""
    python, tiny = llamafactory
    run = tmp_path_factory.mktemp("lf-api")
    cfg = llamafactory_config(tiny, run)
    script = SCRIPTS / "lf_api.py"
    command = [str(python), str(script), str(cfg), str(run / "fed.json")]
    assert_exit_ok(run_plain(command, cwd=run, env=framework_env(python, run / "hf")))
    return run


# ----------------------------------------------------------------------------- LLaMA-Factory
@pytest.mark.slow
def test_llamafactorys_api_with_the_callback_meters_what_its_trainer_fed(llamafactory_api_run):
    report = read_json(llamafactory_api_run / "out")
    fed = read_json(llamafactory_api_run / "fed.json")
    assert fed["micro_batches"] == 4
    assert {k: report["tokens"][k] for k in fed} == fed
    assert report["run"]["status"] == "completed"
    assert report["compute"]["primary_flops"] is not None, report["compute"]["withheld_reason"]
    assert report.get("attach") is None


@pytest.mark.slow
@pytest.mark.parametrize("launcher", LAUNCHERS)
def test_llamafactory_cli_under_zero_code_reports_what_the_api_with_the_callback_does(
    llamafactory, llamafactory_api_run, tmp_path, launcher
):
    python, tiny = llamafactory
    cfg = llamafactory_config(tiny, tmp_path)
    env = framework_env(python, tmp_path / "hf")
    command = [str(python.parent / "llamafactory-cli"), "train", str(cfg)]
    done = launch(command, launcher=launcher, cwd=tmp_path, env=env, timeout=900)
    assert_exit_ok(done)
    zero_code = read_json(tmp_path / "out")
    assert counts(zero_code) == counts(read_json(llamafactory_api_run / "out"))
    assert counts(zero_code)["primary_flops"] is not None
    attach = zero_code["attach"]
    assert attach["method"] == "hf_trainer"
    assert attach["trainer_class"] == LLAMAFACTORY_TRAINER
    assert attach["launcher"] == launcher
    assert report_files(tmp_path / "out") == ["flops_meter.json"]
    (line,) = report_lines(done)
    assert line.startswith(f"flopmeter: report: {tmp_path / 'out' / 'flops_meter.json'} (")


@pytest.mark.slow
@pytest.mark.parametrize("launcher", ["flopmeter run"])  # one launcher: the attach is the same
def test_llamafactorys_torchrun_relaunch_under_zero_code_is_one_report_of_both_ranks(
    llamafactory, tmp_path, launcher
):
    """``FORCE_TORCHRUN=1``: the CLI relaunches itself under torchrun (two gloo processes
    here), where no callback given to ``run_exp`` could reach; zero-code metering reaches both
    ranks. The edited form: the API script with the callback, under torchrun itself."""
    python, tiny = llamafactory
    torchrun = [str(python), "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2"]

    def edited_try(i: int):  # rank 0 saves its checkpoint after rank 1 left: gloo's abort
        folder = tmp_path / f"api{i}"
        cfg = llamafactory_config(tiny, folder)
        command = [*torchrun, str(SCRIPTS / "lf_api.py"), str(cfg), str(folder / "fed.json")]
        return run_plain(command, cwd=folder, env=framework_env(python, folder / "hf"))

    def zero_code_try(i: int):
        folder = tmp_path / f"cli{i}"
        cfg = llamafactory_config(tiny, folder)
        env = framework_env(python, folder / "hf", {"FORCE_TORCHRUN": "1", "NPROC_PER_NODE": "2"})
        command = [str(python.parent / "llamafactory-cli"), "train", str(cfg)]
        return launch(command, launcher=launcher, cwd=folder, env=env, timeout=900)

    i, done = tries_past_teardown_abort(edited_try)
    assert_exit_ok(done)
    edited_run, fed = tmp_path / f"api{i}", tmp_path / f"api{i}" / "fed.json"
    i, done = tries_past_teardown_abort(zero_code_try)
    assert_exit_ok(done)
    run = tmp_path / f"cli{i}"
    zero_code, edited = read_json(run / "out"), read_json(edited_run / "out")
    assert zero_code["run"]["world_size"] == edited["run"]["world_size"] == 2
    assert counts(zero_code) == counts(edited)
    assert counts(zero_code)["primary_flops"] is not None
    ranks = [read_json(Path(f"{fed}.{rank}")) for rank in (0, 1)]
    assert ranks[0]["micro_batches"] == ranks[1]["micro_batches"] == 4
    assert {k: zero_code["tokens"][k] for k in ranks[0]} == {
        k: ranks[0][k] + ranks[1][k] for k in ranks[0]
    }
    assert zero_code["attach"]["trainer_class"] == LLAMAFACTORY_TRAINER
    assert report_files(run / "out") == ["flops_meter.json"]  # rank 0's, the two ranks summed
    (line,) = report_lines(done)
    assert line.startswith(f"flopmeter: report: {run / 'out' / 'flops_meter.json'} (")
