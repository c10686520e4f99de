"""One meta build shared by a plan's methods, and the costs kept per process, change no figure.

The truth is a fresh build per method (:func:`flopmeter.planner.build.cost_on_meta`, the
planner's path before the build was shared): the shared build's census, profile and trainable
blocks equal it for every method in every order, and a plan made with the costs kept equals
one made with none kept. A changed configuration is costed afresh, never served from the
kept costs.
"""

from __future__ import annotations

import itertools
import json

import pytest

from flopmeter.planner import estimate
from flopmeter.planner.build import MethodSetup, cost_on_meta
from flopmeter.planner.costing import clear_cache, method_cost
from flopmeter.planner.families import Family
from tests.support.planner import CONFIG

pytest.importorskip("peft")

DECODER = Family("decoder", "llama", "AutoModelForCausalLM", "causal LM head")
LAYERS = CONFIG["num_hidden_layers"]
SETUPS = {
    "full": MethodSetup("full"),
    "lora": MethodSetup("lora", lora_r=4, lora_targets=("q_proj", "v_proj")),
    "qlora": MethodSetup("qlora", lora_r=4, lora_targets=("q_proj", "v_proj")),
    "spectrum": MethodSetup("spectrum", spectrum_fraction=0.34),
    "freeze": MethodSetup("freeze", freeze_layers=1),
}


def _fresh(name: str):
    cost = cost_on_meta(CONFIG, SETUPS[name], LAYERS, DECODER)
    return cost.census, cost.profile, cost.trainable_blocks


@pytest.fixture(scope="module")
def fresh():
    return {name: _fresh(name) for name in SETUPS}


@pytest.mark.slow
@pytest.mark.parametrize(
    "order",
    [list(SETUPS), ["lora", "full", "freeze", "qlora", "spectrum"],
     ["freeze", "spectrum", "lora", "full"]],
    ids=lambda o: ",".join(o),
)  # fmt: skip
def test_the_shared_build_costs_each_method_as_a_fresh_build(fresh, order):
    clear_cache()
    for name in order:
        cost = method_cost(CONFIG, SETUPS[name], LAYERS, DECODER)
        assert (cost.census, cost.profile, cost.trainable_blocks) == fresh[name], name
    clear_cache()


@pytest.mark.slow
def test_the_methods_differ_so_the_comparison_can_fail(fresh):
    # the five fresh costs are not all alike: an equality above is not trivially true
    trainable = {name: census.n_trainable for name, (census, _, _) in fresh.items()}
    assert len({trainable[n] for n in ("full", "lora", "spectrum", "freeze")}) == 4
    assert fresh["lora"] == fresh["qlora"]  # QLoRA's model on meta is LoRA's (docs/planner.md)


@pytest.mark.slow
def test_a_plan_with_kept_costs_equals_one_without(tmp_path):
    path = tmp_path / "config.json"
    path.write_text(json.dumps(CONFIG))
    args = {"model": path, "tokens": 5000, "seq_len": 48, "lora_r": 4}
    clear_cache()
    first = estimate(**args).model_dump()
    again = estimate(**args).model_dump()  # every cost kept from the first
    clear_cache()
    for methods in itertools.permutations(["full", "lora", "freeze"]):
        clear_cache()
        one = {m["method"]: m for m in estimate(**args, methods=methods).model_dump()["methods"]}
        assert one == {m["method"]: m for m in first["methods"] if m["method"] in methods}
    assert again == first


@pytest.mark.slow
def test_a_changed_configuration_is_costed_afresh(tmp_path):
    path = tmp_path / "config.json"
    args = {"model": path, "tokens": 5000, "seq_len": 48, "methods": ["full"]}
    path.write_text(json.dumps(CONFIG))
    small = estimate(**args).methods[0]
    path.write_text(json.dumps({**CONFIG, "intermediate_size": 2 * CONFIG["intermediate_size"]}))
    large = estimate(**args).methods[0]
    clear_cache()
    truth = estimate(**args).methods[0]  # nothing kept
    assert large.model_dump() == truth.model_dump()
    assert large.n_total > small.n_total and large.flops > small.flops


@pytest.mark.parametrize("targets", ["all-linear", ("q_proj", "v_proj")])
def test_lora_adapters_made_on_meta_are_peft_s_own(targets):
    """The planner makes peft's adapters on meta; the truth is peft's own way (each adapter
    made and initialised on the CPU, then moved to the meta weights): the same census and the
    same profile."""
    import peft

    from flopmeter.counting.census import take_census
    from flopmeter.planner.build import _apply_lora, _base_model, profile_on_meta

    setup = MethodSetup("lora", lora_r=4, lora_targets=targets)
    ours = _apply_lora(_base_model(CONFIG, DECODER), setup, DECODER).train()
    lora = peft.LoraConfig(
        r=4,
        lora_alpha=8,
        target_modules=targets if isinstance(targets, str) else list(targets),
        lora_dropout=0.0,
        task_type="CAUSAL_LM",
    )
    theirs = peft.get_peft_model(_base_model(CONFIG, DECODER), lora).train()
    assert take_census(ours) == take_census(theirs)
    assert take_census(ours).n_trainable > 0
    assert profile_on_meta(ours, setup, DECODER) == profile_on_meta(theirs, setup, DECODER)
    shapes = lambda m: {n: (p.shape, p.dtype, p.requires_grad) for n, p in m.named_parameters()}  # noqa: E731
    assert shapes(ours) == shapes(theirs)
