"""A hostile or broken ``config.json`` is refused by ``flopmeter estimate`` in one line (exit 2),
naming the field and its bound, before any model is built: never an "unexpected" error, a
traceback or an allocation."""

from __future__ import annotations

import json

import pytest

from flopmeter import ConfigurationError
from flopmeter.cli import main
from flopmeter.flops.architecture import BUNDLED_CONFIGS, bundled_config
from flopmeter.planner.config_checks import MAX_CONFIG_DEPTH, SIZE_BOUNDS, check_config_sizes
from tests.support.planner import CONFIG


def _estimate(tmp_path, capsys, text: str) -> tuple[int, str]:
    path = tmp_path / "config.json"
    path.write_text(text)
    status = main(["estimate", str(path), "--tokens", "1e6"])
    return status, capsys.readouterr().err.strip()


def _with(**changes) -> str:
    return json.dumps({**CONFIG, **changes}, allow_nan=True)


@pytest.mark.parametrize(
    ("text", "named"),
    [
        (_with(hidden_size=float("nan")), "hidden_size"),
        (_with(hidden_size="64"), "hidden_size"),
        (_with(hidden_size=-64), "hidden_size"),
        (_with(hidden_size=64.0), "hidden_size"),
        (_with(hidden_size=True), "hidden_size"),
        (_with(hidden_size=None), "hidden_size"),
        (_with(hidden_size=2**40), "hidden_size"),
        (_with(hidden_size=10**30), "hidden_size"),
        (_with(num_hidden_layers=1e12), "num_hidden_layers"),
        (_with(num_hidden_layers=2000), "num_hidden_layers"),
        (_with(num_attention_heads=0), "num_attention_heads"),
        (_with(vocab_size=float("inf")), "vocab_size"),
        (_with(text_config={**CONFIG, "intermediate_size": -1}), "text_config.intermediate_size"),
        (_with(num_heads=[3, 6, -12]), "num_heads"),
    ],
)
def test_a_bad_size_is_refused_naming_the_field_and_its_bound(tmp_path, capsys, text, named):
    status, err = _estimate(tmp_path, capsys, text)
    assert status == 2, err
    assert err.count("\n") == 0 and "unexpected" not in err
    assert f"{named} must be a whole number from" in err


def test_an_integer_too_long_to_read_and_a_deep_nesting_are_refused(tmp_path, capsys):
    huge = _with().replace('"hidden_size": 32', '"hidden_size": ' + "9" * 5000)
    status, err = _estimate(tmp_path, capsys, huge)
    assert status == 2 and "unexpected" not in err and "cannot be read" in err
    deep = json.dumps({**CONFIG, "extra": 0}).replace(
        '"extra": 0', '"extra": ' + "[" * 5000 + "]" * 5000
    )
    status, err = _estimate(tmp_path, capsys, deep)
    assert status == 2 and "unexpected" not in err and "nested too deeply" in err
    nested: dict = {}
    for _ in range(MAX_CONFIG_DEPTH + 1):
        nested = {"sub": nested}
    status, err = _estimate(tmp_path, capsys, json.dumps({**CONFIG, "x": nested}))
    assert status == 2 and f"deeper than {MAX_CONFIG_DEPTH} levels" in err


def test_every_bundled_configuration_is_within_the_bounds():
    for name in BUNDLED_CONFIGS:
        check_config_sizes(bundled_config(name), name)  # raises on a size out of bounds


def test_the_bounds_take_their_ends_and_nulls_where_transformers_derives_the_size():
    for key, (low, high) in SIZE_BOUNDS.items():
        check_config_sizes({key: low}, "c")
        check_config_sizes({key: high}, "c")
        with pytest.raises(ConfigurationError, match=key):
            check_config_sizes({key: high + 1}, "c")
    check_config_sizes({"head_dim": None, "num_key_value_heads": None}, "c")


def test_list_names_every_bundled_model_and_each_name_resolves(capsys):
    from flopmeter.planner.models import resolve_model

    assert main(["estimate", "--list"]) == 0
    ids = capsys.readouterr().out.split()
    assert len(ids) == len(BUNDLED_CONFIGS) == len(set(ids))
    for model_id in ids:
        assert resolve_model(model_id).source.startswith("bundled config")
    assert main(["estimate", "myorg/unknown", "--tokens", "1e6"]) == 2
    err = capsys.readouterr().err
    assert f"{len(ids)} in all: `flopmeter estimate --list` names them" in err


def _mamba2_json(**changes) -> str:
    """A tiny Mamba2 ``config.json`` as transformers itself writes one (``to_json_string``:
    its ``time_step_limit`` holds infinity, written as ``{"__float__": "Infinity"}``)."""
    from tests.support.models import tiny_mamba2_config

    data = json.loads(tiny_mamba2_config(vocab_size=64).to_json_string())
    return json.dumps({**data, **changes})


@pytest.mark.slow
def test_a_config_transformers_wrote_with_an_infinite_float_is_planned(tmp_path, capsys):
    text = _mamba2_json()
    assert '{"__float__": "Infinity"}' in text  # transformers' own tag, as a user's file has it
    from flopmeter.planner.models import _read_config

    path = tmp_path / "tagged.json"
    path.write_text(text)
    assert _read_config(path)["time_step_limit"] == [0.0, float("inf")]
    status, err = _estimate(tmp_path, capsys, text)
    assert status == 0, err
    assert "unexpected" not in err


@pytest.mark.slow
def test_a_field_of_the_wrong_type_is_refused_naming_it(tmp_path, capsys):
    status, err = _estimate(tmp_path, capsys, _mamba2_json(time_step_limit="x"))
    assert status == 2, err
    assert err.count("\n") == 0 and "unexpected" not in err
    assert "cannot be read by transformers" in err and "time_step_limit" in err
