"""axolotl, the real package, training a tiny Llama: its plugin line and zero-code metering
leave the same report; the tokens are what the trainer fed its model, counted apart
(tests/integrations/scripts/frameworks/fed_tokens.py).

It runs from its own virtual environment (``.venv-axolotl``), made by ``scripts/framework_venv``
the first time (minutes): it pins another transformers version (5.16.1) than the suite's.
LLaMA-Factory's tests are in test_frameworks_llamafactory.py: a module of its own, so the two
frameworks' module fixtures run on different workers (tests/support/scheduling.py).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from flopmeter.errors import MissingExtraError
from tests.support.exits import assert_exit_ok
from tests.support.frameworks import (
    FED_PLUGIN,
    PLUGIN,
    axolotl_config,
    counts,
    framework_and_tiny,
    framework_env,
    read_json,
    report_files,
    report_lines,
    run_plain,
)
from tests.support.zero_code import LAUNCHERS, launch

# spawns gloo processes: one rerun for gloo's teardown abort alone (tests/conftest.py)
pytestmark = pytest.mark.gloo

AXOLOTL_TRAINER = "axolotl.core.trainers.base.AxolotlTrainer"
#: The model name the plugin run's YAML gives through its ``flopmeter:`` mapping.
YAML_MODEL_NAME = "tiny-llama-from-axolotl-yaml"


# ----------------------------------------------------------------------------- fixtures
@pytest.fixture(scope="module")
def axolotl(tmp_path_factory):
    """(python, tiny model folder) of the axolotl venv."""
    return framework_and_tiny("axolotl", tmp_path_factory.mktemp("ax"))


def _axolotl_train(python: Path, cfg: Path, run: Path, launcher: str | None):
    """``axolotl train cfg`` in ``run``, plainly (``launcher=None``) or under zero-code."""
    env = framework_env(python, run / "hf", {"FED_TOKENS_OUT": str(run / "fed.json")})
    command = [str(python.parent / "axolotl"), "train", str(cfg)]
    if launcher is None:
        done = run_plain(command, cwd=run, env=env)
    else:
        done = launch(command, launcher=launcher, cwd=run, env=env, timeout=900)
    assert_exit_ok(done)
    return done


@pytest.fixture(scope="module")
def axolotl_plugin_run(axolotl, tmp_path_factory):
    """The plugin line's run (no zero-code): its folder, with ``out/`` and ``fed.json``."""
    python, tiny = axolotl
    run = tmp_path_factory.mktemp("ax-plugin")
    cfg = axolotl_config(tiny, run, [FED_PLUGIN, PLUGIN], flopmeter={"model_name": YAML_MODEL_NAME})
    done = _axolotl_train(python, cfg, run, launcher=None)
    (run / "log.txt").write_text(done.stdout + done.stderr)
    return run


# ----------------------------------------------------------------------------- axolotl
def test_the_plugin_module_without_axolotl_names_what_to_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "axolotl", None)  # importing it raises ImportError
    monkeypatch.setitem(sys.modules, "axolotl.integrations", None)
    monkeypatch.setitem(sys.modules, "axolotl.integrations.base", None)
    monkeypatch.delitem(sys.modules, "flopmeter.integrations.axolotl", raising=False)
    with pytest.raises(MissingExtraError) as caught:
        __import__("flopmeter.integrations.axolotl")
    assert caught.value.package == "axolotl"
    assert "pip install 'axolotl'" in str(caught.value)
    assert isinstance(caught.value, ImportError)  # what axolotl's plugin loader catches


PROBE = r"""
import json, sys
from pathlib import Path
from transformers import LlamaConfig, LlamaForCausalLM, Trainer, TrainingArguments
from axolotl.integrations.base import load_plugin
from flopmeter.errors import ConfigurationError
from flopmeter.integrations.axolotl import plugin_options
from flopmeter.integrations.hf import FlopMeterCallback

out = Path(sys.argv[1])
plugin = load_plugin("flopmeter.integrations.axolotl.FlopMeterPlugin")  # as axolotl does
env = {"FLOPMETER_OUTPUT": "from-env.json", "FLOPMETER_PAD_ID": "3"}
result = {
    "args_model": plugin.get_input_args(),
    "yaml_over_env": plugin_options({"flopmeter": {"output": "from-yaml.json"}}, env),
    "env_alone": plugin_options({"plugins": []}, env),
}
refused = {}
for name, cfg in {"bad_option": {"flopmeter": {"measure_every": -1}},
                  "unknown_option": {"flopmeter": {"no_such_option": 1}},
                  "not_a_mapping": {"flopmeter": 3}}.items():
    try:
        plugin.register(cfg)
        refused[name] = None
    except ConfigurationError as exc:
        refused[name] = str(exc)
result["refused"] = refused

def trainer(callbacks):
    model = LlamaForCausalLM(LlamaConfig(vocab_size=32, hidden_size=16, intermediate_size=32,
        num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=2))
    args = TrainingArguments(output_dir=str(out), report_to=[], use_cpu=True)
    return Trainer(model=model, args=args, callbacks=callbacks)

bare = trainer([])
added = plugin.add_callbacks_post_trainer({}, bare)
own = FlopMeterCallback()
result["bare"] = {"added": [type(c).__name__ for c in added],
                  "train_wrapped": getattr(bare.train, "_flopmeter_wrapped", False)}
result["with_own"] = {"added": len(plugin.add_callbacks_post_trainer({}, trainer([own])))}
print(json.dumps(result))
"""


@pytest.mark.slow
def test_the_plugin_reads_the_yaml_over_the_environment_and_never_adds_a_second(axolotl, tmp_path):
    python, _ = axolotl
    done = run_plain([str(python), "-c", PROBE, str(tmp_path)], cwd=tmp_path,
                     env=framework_env(python, tmp_path / "hf"), timeout=600)  # fmt: skip
    assert_exit_ok(done)
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["args_model"] == "flopmeter.integrations.axolotl.FlopMeterArgs"
    assert result["yaml_over_env"] == {"output": "from-yaml.json", "pad_id": 3}
    assert result["env_alone"] == {"output": "from-env.json", "pad_id": 3}
    # checked when axolotl registers the plugin, before the model loads
    refused = result["refused"]
    assert "measure_every must be a non-negative integer" in refused["bad_option"]
    assert "Unknown FlopMeter option(s): no_such_option" in refused["unknown_option"]
    assert (
        "'flopmeter:' must be a mapping of flopmeter options, not int" in (refused["not_a_mapping"])
    )
    assert result["bare"] == {"added": ["FlopMeterCallback"], "train_wrapped": True}
    assert result["with_own"] == {"added": 0}


@pytest.mark.slow
def test_the_plugin_line_meters_what_axolotls_trainer_fed(axolotl_plugin_run):
    report = read_json(axolotl_plugin_run / "out")
    fed = read_json(axolotl_plugin_run / "fed.json")
    assert fed["micro_batches"] == 4  # max_steps 4, one micro-batch a step
    assert {k: report["tokens"][k] for k in fed} == fed
    assert report["tokens"]["optimizer_steps"] == 4
    assert report["run"]["status"] == "completed"
    assert report["model"]["name"] == YAML_MODEL_NAME  # the YAML's flopmeter: mapping
    assert report["compute"]["primary_flops"] is not None, report["compute"]["withheld_reason"]
    assert report.get("attach") is None  # the plugin is the user's own meter, not zero-code
    assert report_files(axolotl_plugin_run / "out") == ["flops_meter.json"]


@pytest.mark.slow
@pytest.mark.parametrize("launcher", LAUNCHERS)
def test_axolotl_under_zero_code_reports_what_the_plugin_line_does(
    axolotl, axolotl_plugin_run, tmp_path, launcher
):
    python, tiny = axolotl
    cfg = axolotl_config(tiny, tmp_path, [FED_PLUGIN])  # unmodified: no flopmeter in it
    done = _axolotl_train(python, cfg, tmp_path, launcher=launcher)
    zero_code = read_json(tmp_path / "out")
    plugin = read_json(axolotl_plugin_run / "out")
    assert counts(zero_code) == counts(plugin)
    assert counts(zero_code)["primary_flops"] is not None
    assert read_json(tmp_path / "fed.json") == read_json(axolotl_plugin_run / "fed.json")
    attach = zero_code["attach"]
    assert attach["method"] == "hf_trainer"
    assert attach["trainer_class"] == AXOLOTL_TRAINER
    assert attach["launcher"] == launcher
    assert report_files(tmp_path / "out") == ["flops_meter.json"]
    (line,) = report_lines(done)  # the job's end names it
    assert line.startswith(f"flopmeter: report: {tmp_path / 'out' / 'flops_meter.json'} (")


@pytest.mark.slow
@pytest.mark.parametrize("launcher", ["environment"])  # one launcher: the attach is the same
def test_the_plugin_line_under_zero_code_is_one_meter(
    axolotl, axolotl_plugin_run, tmp_path, launcher
):
    python, tiny = axolotl
    cfg = axolotl_config(tiny, tmp_path, [FED_PLUGIN, PLUGIN])
    done = _axolotl_train(python, cfg, tmp_path, launcher=launcher)
    # axolotl's logging config sends warnings to stdout
    assert "already has a FlopMeterCallback; the axolotl plugin adds none" in done.stdout
    report = read_json(tmp_path / "out")
    assert report_files(tmp_path / "out") == ["flops_meter.json"]  # one meter, one report
    (line,) = report_lines(done)  # the job's one meter (a second would be a second line)
    assert line.startswith(f"flopmeter: report: {tmp_path / 'out' / 'flops_meter.json'} (")
    assert counts(report) == counts(read_json(axolotl_plugin_run / "out"))  # not doubled
    assert report["attach"]["trainer_class"] == AXOLOTL_TRAINER  # zero-code's, there first
