"""MeterOptions: one rule for numbers, one validated value made without I/O, and the
``FlopMeter(model, options=...)`` form giving what the keyword form gives."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from flopmeter import ConfigurationError, FlopMeter
from flopmeter.options import OPTION_NAMES, MeterOptions

#: Every option that takes a real number, with a valid value of it.
REAL_OPTIONS = {
    "pretrain_flops": 1e18,
    "peak_flops": 1e14,
    "nvml_interval_seconds": 2.0,
    "refresh_seconds": 30.0,
    "budget": 1e18,
    "sink_timeout_seconds": 5.0,
}
#: Every option that takes a whole number.
WHOLE_OPTIONS = {"pad_id": 3, "measure_every": 8}


def test_the_numeric_options_are_all_the_options_that_take_numbers():
    assert set(REAL_OPTIONS) | set(WHOLE_OPTIONS) <= set(OPTION_NAMES)
    assert len(OPTION_NAMES) == 21 and len(set(OPTION_NAMES)) == 21


@pytest.mark.parametrize("name", sorted(REAL_OPTIONS))
def test_numpy_scalars_are_numbers_for_every_real_option(name):
    value = REAL_OPTIONS[name]
    for given in (np.float32(value), np.int64(value), np.float64(value), int(value)):
        made = MeterOptions(environ={}, **{name: given})
        assert getattr(made, name) == float(given)
        assert type(getattr(made, name)) is float  # stored as a Python float


@pytest.mark.parametrize("name", sorted(REAL_OPTIONS))
@pytest.mark.parametrize(
    "bad", [True, False, np.bool_(True), float("nan"), float("inf"), -float("inf"), np.nan]
)
def test_bools_and_non_finite_values_are_refused_by_every_real_option(name, bad):
    with pytest.raises(ConfigurationError, match=name):
        MeterOptions(environ={}, **{name: bad})


@pytest.mark.parametrize("name", sorted(WHOLE_OPTIONS))
def test_whole_options_take_numpy_integers_and_refuse_everything_else(name):
    value = WHOLE_OPTIONS[name]
    assert getattr(MeterOptions(environ={}, **{name: np.int64(value)}), name) == value
    for bad in (True, np.bool_(True), float("nan"), float("inf"), np.float32(value), 3.5, -1):
        with pytest.raises(ConfigurationError, match=name):
            MeterOptions(environ={}, **{name: bad})


def test_np_float32_is_the_same_for_budget_and_refresh_seconds():
    """The disagreement the rule removes: budget took np.float32, refresh_seconds refused it."""
    made = MeterOptions(environ={}, budget=np.float32(4e20), refresh_seconds=np.float32(60))
    assert made.budget == float(np.float32(4e20)) and made.refresh_seconds == 60.0


def test_options_are_frozen():
    made = MeterOptions(environ={}, measure_every=4)
    with pytest.raises(Exception):  # noqa: B017 - pydantic's frozen-instance error
        made.measure_every = 8  # type: ignore[misc]


def test_making_options_touches_no_file(tmp_path):
    """A parent that does not exist yet and a ledger path: nothing is read or made until the
    meter is made from the options."""
    parent, ledger = tmp_path / "later" / "parent.json", tmp_path / "audit" / "ledger.sqlite"
    options = MeterOptions(environ={}, parent_runs=[parent], ledger=ledger, output=tmp_path)
    assert list(tmp_path.iterdir()) == []
    assert options.parent_runs == (str(parent),) and options.ledger == ledger
    with pytest.raises(ConfigurationError, match="parent"):
        FlopMeter(torch.nn.Embedding(10, 4), options=options)  # read now, and missing
    meter = FlopMeter(torch.nn.Embedding(10, 4), options=options.with_values(parent_runs=[]))
    assert ledger.exists() and meter.parents == ()  # the meter opened the ledger


def _run(meter: FlopMeter, model: torch.nn.Module) -> dict:
    with meter:
        for _ in range(3):
            model(torch.tensor([[1, 2, 3, 0], [4, 5, 0, 0]])).sum().backward()
    moving = {"run_id", "started_at", "ended_at", "updated_at", "training_duration_seconds"}
    return meter.report().model_dump(exclude={"run": moving})  # schema 2.0: run's fields


def test_the_options_value_gives_the_report_of_the_keyword_form():
    kwargs = {"model_name": "tiny/emb", "measure_every": 0, "nvml": False, "budget": 1e30}
    torch.manual_seed(0)
    model = torch.nn.Embedding(10, 4)
    by_keywords = _run(FlopMeter(model, 0, **kwargs), model)
    by_value = _run(FlopMeter(model, 0, options=MeterOptions(**kwargs)), model)
    assert by_keywords["tokens"]["tokens_processed"] == 3 * 5  # non-padding tokens, 3 steps
    assert by_value == by_keywords


def test_keywords_given_with_an_options_value_win():
    options = MeterOptions(environ={}, measure_every=4, model_name="from-value")
    meter = FlopMeter(torch.nn.Embedding(10, 4), 7, options=options, model_name="from-kw")
    assert (meter.options.measure_every, meter.model_name, meter.pad_id) == (4, "from-kw", 7)
    assert meter.options.given == {"measure_every", "model_name", "pad_id"}
    with pytest.raises(ConfigurationError, match="options must be MeterOptions"):
        FlopMeter(torch.nn.Embedding(10, 4), options={"measure_every": 4})  # type: ignore[arg-type]


def test_the_options_import_no_flop_model_hardware_tracker_or_ledger_store():
    """The options validate and hold defaults: importing them must not pull in the FLOP model's
    dispatch counter, the NVML tracker or the SQLite store (checked in a fresh interpreter)."""
    import subprocess
    import sys

    heavy = ("flopmeter.flops.sampler", "flopmeter.hardware.tracker", "flopmeter.ledger.store")
    code = f"import sys, flopmeter.options; print([m for m in {heavy!r} if m in sys.modules])"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
