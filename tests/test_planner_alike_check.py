"""The check of the FLOP model on a model cut to one block and to two answers as the check of
the whole model, and it answers only where the blocks are all alike.

The truth is the check of the whole model on meta (the planner's path before the cut): for one
bundled configuration of each family with alike blocks, and LoRA as well as full training, the
cut check finds both figures exactly equal where the whole model's check finds them equal. A
configuration whose blocks differ (Gemma's sliding and global layers) is never cut, and a cut
model whose figures differ sends the check to the whole model.
"""

from __future__ import annotations

import pytest

from flopmeter.flops.architecture import bundled_config, read_architecture
from flopmeter.flops.transformer import transformer_estimate
from flopmeter.planner.build import MethodSetup, cost_on_meta, hf_config, spectrum_layers
from flopmeter.planner.costing import _alike_check, _cuts, clear_cache, cut_config, method_check
from flopmeter.planner.dispatch import SequenceShape, dispatch_flops
from flopmeter.planner.families import detect_family
from flopmeter.planner.tokens import totals_for_tokens

pytest.importorskip("peft")

LENGTH = 16


def _counts(family):
    def counts(cost, length):
        modelled = transformer_estimate(cost.profile, totals_for_tokens(length, length)).flops
        return modelled, dispatch_flops(cost.model, family, SequenceShape(length))

    return counts


@pytest.mark.slow
@pytest.mark.parametrize(
    "name", ["llama-3.2-1b", "qwen2.5-0.5b", "mixtral-8x7b", "bert-base-uncased"]
)
@pytest.mark.parametrize("method", ["full", "lora"])
def test_the_cut_check_answers_as_the_whole_model(name, method):
    config = bundled_config(name)
    family = detect_family(config, hf_config(config))
    layers = read_architecture(config)[0].num_layers
    setup = MethodSetup(method)
    whole = cost_on_meta(config, setup, layers, family)
    modelled, counted = _counts(family)(whole, LENGTH)
    assert modelled == counted  # the whole model's figures agree exactly
    assert _alike_check(config, setup, layers, family, LENGTH, _counts(family))


@pytest.mark.parametrize("name", ["gemma-2-2b", "gemma-3-1b", "bart-large", "whisper-large-v3"])
def test_models_with_unlike_blocks_are_never_cut(name):
    assert cut_config(bundled_config(name), 1) is None


def test_a_cut_keeps_everything_but_the_blocks():
    config = bundled_config("llama-3.2-1b")
    cut = cut_config(config, 2)
    assert cut == {**config, "num_hidden_layers": 2}
    assert config["num_hidden_layers"] == 16  # the bundled one untouched


@pytest.mark.slow
@pytest.mark.parametrize("name", ["llama-3.2-1b", "mixtral-8x7b", "bert-base-uncased"])
@pytest.mark.parametrize(
    "setup",
    [MethodSetup("spectrum"), MethodSetup("spectrum", spectrum_fraction=0.1),
     MethodSetup("freeze"), MethodSetup("freeze", freeze_layers=0),
     MethodSetup("freeze", freeze_layers=3)],
    ids=["spectrum", "spectrum-0.1", "freeze", "freeze-0", "freeze-3"],
)  # fmt: skip
def test_the_cut_check_of_spectrum_and_freeze_answers_as_the_whole_model(name, setup):
    config = bundled_config(name)
    family = detect_family(config, hf_config(config))
    layers = read_architecture(config)[0].num_layers
    whole = cost_on_meta(config, setup, layers, family)
    modelled, counted = _counts(family)(whole, LENGTH)
    assert modelled == counted
    assert _alike_check(config, setup, layers, family, LENGTH, _counts(family))


def test_the_kinds_of_block_each_method_makes_are_cut_as_documented():
    assert [n for n, _ in _cuts(MethodSetup("lora"), 16)] == [1, 2]
    freeze = _cuts(MethodSetup("freeze"), 16)
    assert [(n, s.freeze_layers) for n, s in freeze] == [(2, 1), (3, 2), (3, 1)]
    spectrum = _cuts(MethodSetup("spectrum"), 16)
    assert [spectrum_layers(n, s.spectrum_fraction) for n, s in spectrum] == [(0,), (0, 1), (0,)]
    assert _cuts(MethodSetup("freeze", freeze_layers=16), 16) is None  # no block trains
    assert _cuts(MethodSetup("full"), 2) is None


def test_figures_that_differ_on_a_cut_model_send_the_check_to_the_whole_model():
    from tests.support.planner import CONFIG

    family = detect_family(CONFIG, hf_config(CONFIG))
    setup = MethodSetup("full")
    seen = []

    def whole(cost, length):
        seen.append(sum(1 for _ in cost.model.parameters()))
        return "differs"

    clear_cache()
    try:
        off_by_one = lambda cost, length: (1.0, 2)  # noqa: E731
        verdict = method_check(CONFIG, setup, 3, family, LENGTH, whole, off_by_one)
        assert verdict == "differs" and len(seen) == 1
        clear_cache()
        agree = lambda cost, length: (2.0, 2)  # noqa: E731
        assert method_check(CONFIG, setup, 3, family, LENGTH, whole, agree) is None
        assert len(seen) == 1  # not run again: the cut models settled it
    finally:
        clear_cache()
