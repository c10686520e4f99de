"""The planner's dispatch count without per-module tracking equals ``FlopCounterMode``'s.

:func:`flopmeter.planner.dispatch.dispatch_flops` counts with a ``FlopCounterMode`` whose
module tracker tracks nothing (:func:`flopmeter.planner.dispatch.global_counter`). The truth
is PyTorch's own ``FlopCounterMode`` with its module tracker, run on the same model on meta
over the same training step: the per-operator ``Global`` counts must be equal, operator for
operator, for one bundled configuration of each family the planner builds (with fewer blocks,
so that the test is quick: the count is a sum over operations either way) and each method.
"""

from __future__ import annotations

import warnings

import pytest

from flopmeter.flops.architecture import bundled_config
from flopmeter.planner.build import MethodSetup, hf_config, meta_autocast, method_model
from flopmeter.planner.dispatch import (
    SequenceShape,
    _step,
    dispatch_flops,
    global_counter,
    meta_masks,
)
from flopmeter.planner.families import detect_family

pytest.importorskip("peft")

#: One bundled model per family the planner builds, its blocks cut to two, and a shape.
CASES = {
    "llama-3.2-1b": SequenceShape(16),
    "gemma-3-1b": SequenceShape(16),
    "mixtral-8x7b": SequenceShape(16),
    "bert-base-uncased": SequenceShape(16),
    "bart-large": SequenceShape(16, decoder_tokens=8),
    "llava-1.5-7b": SequenceShape(16, images=1),
    "whisper-large-v3": SequenceShape(0, decoder_tokens=8, clips=1),
}
#: Spectrum and freeze need one stack of blocks (refused for the other families).
ONE_STACK = ("llama-3.2-1b", "gemma-3-1b", "mixtral-8x7b", "bert-base-uncased")
METHODS = {
    "full": MethodSetup("full"),
    "lora": MethodSetup("lora", lora_r=4),
    "spectrum": MethodSetup("spectrum", spectrum_fraction=0.5),
    "freeze": MethodSetup("freeze", freeze_layers=1),
}


def _small(name: str) -> dict:
    config = bundled_config(name)
    text = config.get("text_config", config)
    for key in ("num_hidden_layers", "encoder_layers", "decoder_layers"):
        if key in text:
            text[key] = 2
    if "vision_config" in config:
        config["vision_config"]["num_hidden_layers"] = 2
    return config


def _by_torch(model, family, shape) -> dict:
    from torch.utils.flop_counter import FlopCounterMode

    from flopmeter.flops.aten_ops import measured_formulas

    counter = FlopCounterMode(display=False, custom_mapping=measured_formulas())
    with meta_autocast(), meta_masks(), warnings.catch_warnings(), counter:
        warnings.simplefilter("ignore")
        _step(model, family, shape)
    model.zero_grad(set_to_none=True)
    return counter.get_flop_counts()["Global"]


def _by_planner(model, family, shape) -> dict:
    from flopmeter.flops.aten_ops import measured_formulas

    counter = global_counter(display=False, custom_mapping=measured_formulas())
    with meta_autocast(), meta_masks(), warnings.catch_warnings(), counter:
        warnings.simplefilter("ignore")
        _step(model, family, shape)
    model.zero_grad(set_to_none=True)
    return counter.get_flop_counts()["Global"]


@pytest.mark.slow
@pytest.mark.parametrize(
    ("name", "method"),
    [(n, m) for n in CASES for m in METHODS if n in ONE_STACK or m in ("full", "lora")],
)
def test_the_count_without_module_tracking_is_torchs(name, method):
    config = _small(name)
    family = detect_family(config, hf_config(config))
    model, _ = method_model(config, METHODS[method], 2 if family.text_only else None, family)
    shape = CASES[name]
    truth = _by_torch(model, family, shape)
    assert truth and sum(truth.values()) > 0
    assert _by_planner(model, family, shape) == truth
    assert dispatch_flops(model, family, shape) == sum(truth.values())


def test_the_tracker_left_out_is_the_only_difference():
    """What the planner's counter leaves out is module tracking only: its tracker's parents
    are ``Global``, which torch's tracker always holds (so each count lands where torch's
    total reads it)."""
    from torch.utils.module_tracker import ModuleTracker

    counter = global_counter(display=False)
    assert set(counter.mod_tracker.parents) == {"Global"}
    assert "Global" in ModuleTracker().parents
