"""The meter's options as environment variables and ``flopmeter run`` flags: one table, every
option round-trips flag -> variable -> options -> ``MeterOptions`` as if given as an argument,
and a bad value is an error naming its variable."""

from __future__ import annotations

import argparse
import os
from pathlib import Path

import pytest

from flopmeter.auto.env_options import (
    ENV_OPTIONS,
    add_option_flags,
    env_from_flags,
    meter_options_from_env,
    options_from_env,
)
from flopmeter.errors import ConfigurationError
from flopmeter.hardware.options import nvml_setting
from flopmeter.options import OPTION_NAMES, MeterOptions

#: Each option: the flag's values as a user types them, and the same option as an argument.
CASES = {
    "pad_id": (["7"], 7),
    "model_name": (["my model"], "my model"),
    "pretrain_flops": (["3e24"], 3e24),
    "model_id": (["org/name"], "org/name"),
    "parent_runs": (["runs/a.json", "run-b"], ["runs/a.json", "run-b"]),
    "original_systemic_risk": (["yes"], True),
    "output": (["reports/run.json"], "reports/run.json"),
    "nvml": (["0"], False),
    "peak_flops": (["9.9e14"], 9.9e14),
    "dtype": (["fp16"], "fp16"),
    "nvml_interval_seconds": (["0.25"], 0.25),
    "measure_every": (["0"], 0),
    "phases": (["updates"], "updates"),
    "token_inputs": (["tokens"], "tokens"),
    "refresh_seconds": (["30"], 30.0),
    "budget": (["4e22"], 4e22),
    "budget_action": (["raise"], "raise"),
    "ledger": (["audit/ledger.sqlite"], "audit/ledger.sqlite"),
    "sinks": (
        ["s3://bucket/prefix", "dynamodb://table"],
        ["s3://bucket/prefix", "dynamodb://table"],
    ),
    "sink_timeout_seconds": (["5"], 5.0),
}


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser()
    add_option_flags(parser)
    return parser


def test_the_table_holds_every_option_a_string_can_hold():
    assert [o.name for o in ENV_OPTIONS] == [n for n in OPTION_NAMES if n != "optimizer"]
    assert set(CASES) == {o.name for o in ENV_OPTIONS}
    envs = {o.name: o.env for o in ENV_OPTIONS}
    assert envs["pretrain_flops"] == "PRETRAIN_FLOPS"  # as before
    assert envs["pad_id"] == "FLOPMETER_PAD_ID"
    assert envs["sinks"] == "FLOPMETER_SINKS" and envs["ledger"] == "FLOPMETER_LEDGER"
    assert envs["nvml"] == "FLOPMETER_NVML"
    assert envs["phases"] == "FLOPMETER_PHASES"
    assert len(set(envs.values())) == len(envs)


@pytest.mark.parametrize("name", sorted(CASES))
def test_each_option_round_trips_from_its_flag(name, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    texts, argument = CASES[name]
    option = next(o for o in ENV_OPTIONS if o.name == name)
    argv = [part for text in texts for part in (option.flag, text)]
    if name == "budget_action":  # it needs a budget
        argv += ["--budget", "1e20"]
    env = env_from_flags(_parser().parse_args(argv))
    assert option.env in env
    from_env = meter_options_from_env(env)
    direct = MeterOptions(environ={}, **{name: argument, **_companion(name)})
    if name == "nvml":  # the field keeps what was given; the setting is what the meter does
        assert nvml_setting(from_env.nvml, env).mode == nvml_setting(direct.nvml, {}).mode
        assert nvml_setting(direct.nvml, {}).mode == "off"
    else:
        assert getattr(from_env, name) == getattr(direct, name)
    # nothing else changes: every other option is its default
    for other in OPTION_NAMES:
        if other not in (name, "budget") and other != "optimizer":
            assert getattr(from_env, other) == getattr(MeterOptions(environ={}), other), other


def _companion(name: str) -> dict[str, object]:
    return {"budget": 1e20} if name == "budget_action" else {}


def test_the_options_the_meter_reads_itself_are_not_read_twice():
    env = {"PRETRAIN_FLOPS": "1e24", "FLOPMETER_NVML": "0", "FLOPMETER_LEDGER": "l.sqlite",
           "FLOPMETER_SINKS": "s3://b/p", "FLOPMETER_PAD_ID": "3"}  # fmt: skip
    assert options_from_env(env) == {"pad_id": 3}
    # MeterOptions reads them, with their precedence: the argument beats the variable
    made = MeterOptions(environ=env, pretrain_flops=2e24)
    assert made.pretrain_flops == 2e24 and made.pretrain_flops_source == "argument"


def test_parent_runs_are_separated_by_os_pathsep():
    text = os.pathsep.join(["a.json", "run-2", ""])
    assert options_from_env({"FLOPMETER_PARENT_RUNS": text}) == {"parent_runs": ["a.json", "run-2"]}
    # a comma belongs to the path
    assert options_from_env({"FLOPMETER_PARENT_RUNS": "a,b.json"}) == {"parent_runs": ["a,b.json"]}


def test_empty_variables_count_as_unset():
    assert options_from_env({"FLOPMETER_PAD_ID": " ", "FLOPMETER_OUTPUT": ""}) == {}


def test_the_values_parse_to_the_options_types():
    got = options_from_env(
        {
            "FLOPMETER_PAD_ID": "0",
            "FLOPMETER_MEASURE_EVERY": "10",
            "FLOPMETER_BUDGET": "threshold",
            "FLOPMETER_ORIGINAL_SYSTEMIC_RISK": "off",
            "FLOPMETER_PEAK_FLOPS": "1e15",
        }
    )
    assert got == {
        "pad_id": 0,
        "measure_every": 10,
        "budget": "threshold",
        "original_systemic_risk": False,
        "peak_flops": 1e15,
    }
    assert type(got["pad_id"]) is int and type(got["peak_flops"]) is float


@pytest.mark.parametrize(
    ("variable", "text"),
    [
        ("FLOPMETER_PAD_ID", "x"),
        ("FLOPMETER_PAD_ID", "1.5"),
        ("FLOPMETER_MEASURE_EVERY", "often"),
        ("FLOPMETER_PEAK_FLOPS", "fast"),
        ("FLOPMETER_PEAK_FLOPS", "inf"),
        ("FLOPMETER_ORIGINAL_SYSTEMIC_RISK", "maybe"),
        ("FLOPMETER_BUDGET", "lots"),
        ("FLOPMETER_REFRESH_SECONDS", "soon"),
    ],
)
def test_a_value_of_the_wrong_type_names_its_variable(variable, text):
    with pytest.raises(ConfigurationError) as info:
        options_from_env({variable: text})
    assert str(info.value).startswith(f"{variable} must be "), info.value
    assert repr(text) in str(info.value)


@pytest.mark.parametrize(
    ("variable", "text"),
    [
        ("FLOPMETER_PAD_ID", "-1"),
        ("FLOPMETER_REFRESH_SECONDS", "0"),
        ("FLOPMETER_DTYPE", "fp7"),
        ("FLOPMETER_BUDGET", "-5"),
        ("FLOPMETER_NVML", "maybe"),
        ("PRETRAIN_FLOPS", "lots"),
    ],
)
def test_a_value_out_of_range_names_its_variable(variable, text):
    with pytest.raises(ConfigurationError) as info:
        meter_options_from_env({variable: text})
    assert str(info.value).startswith(f"{variable}: "), info.value


def test_the_flags_are_made_from_the_table():
    parser = _parser()
    flags = {a.option_strings[0] for a in parser._actions if a.option_strings}
    for flag in ("--output", "--pad-id", "--pretrain-flops", "--measure-every", "--budget"):
        assert flag in flags
    args = parser.parse_args(["--parent-runs", "a", "--parent-runs", "b", "--output", "x/"])
    assert env_from_flags(args) == {
        "FLOPMETER_PARENT_RUNS": f"a{os.pathsep}b",
        "FLOPMETER_OUTPUT": "x/",
    }
    assert env_from_flags(parser.parse_args([])) == {}


def test_output_from_the_environment_is_the_file_the_argument_gives(tmp_path):
    folder = tmp_path / "runs"
    folder.mkdir()
    made = meter_options_from_env({"FLOPMETER_OUTPUT": str(folder)})
    assert made.output == MeterOptions(environ={}, output=folder).output
    assert made.output == Path(folder) / "flops_meter.json"
