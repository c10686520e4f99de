"""``flopmeter estimate --recipe``: the forward arithmetic against PyTorch's own count of real
calls (a Hugging Face ``generate`` with its cache, a scoring forward), the phases of each
recipe, and the refusals. The plans against metered TRL runs are in
tests/integrations/test_trl_plans.py."""

from __future__ import annotations

import json

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

from flopmeter.cli import main
from flopmeter.errors import ConfigurationError
from flopmeter.planner import estimate
from flopmeter.planner.phase_costs import forward_cost, generation_flops, scoring_flops
from flopmeter.planner.recipe_shape import Recipe, recipe_sequences
from tests.support.planner import CONFIG

transformers = pytest.importorskip("transformers")


@pytest.fixture(scope="module")
def config_path(tmp_path_factory):
    path = tmp_path_factory.mktemp("recipe") / "config.json"
    path.write_text(json.dumps({**CONFIG, "architectures": ["LlamaForCausalLM"]}))
    return path


@pytest.fixture(scope="module")
def model():
    torch.manual_seed(0)
    config = transformers.LlamaConfig(**CONFIG, attn_implementation="eager")
    return transformers.LlamaForCausalLM(config).eval()


def _profile(config: dict):
    from flopmeter.flops.architecture import read_architecture
    from flopmeter.planner.build import MethodSetup, hf_config
    from flopmeter.planner.costing import method_cost
    from flopmeter.planner.families import detect_family

    family = detect_family(config, hf_config(config))
    layers = read_architecture(config)[0].num_layers
    return method_cost(config, MethodSetup("full", 16, "all-linear", 0.25, None), layers, family)


def test_generation_with_a_cache_costs_what_pytorch_counts(model):
    """One prefill of the prompt and ``C - 1`` cached decode steps, against FlopCounterMode
    over a real ``generate`` of full-length completions."""
    cost = forward_cost(_profile(CONFIG).profile)
    prompts = torch.randint(2, 60, (3, 7))
    with FlopCounterMode(display=False) as counter, torch.no_grad():
        out = model.generate(
            prompts, max_new_tokens=5, min_new_tokens=5, do_sample=False, pad_token_id=1
        )
    assert out.shape == (3, 12)
    assert generation_flops(cost, 3, 7, 5) == counter.get_total_flops()


def test_a_scoring_forward_costs_what_pytorch_counts(model):
    cost = forward_cost(_profile(CONFIG).profile)
    ids = torch.randint(2, 60, (4, 9))
    with FlopCounterMode(display=False) as counter, torch.no_grad():
        model(input_ids=ids)
    assert scoring_flops(cost, 4, 9) == counter.get_total_flops()


def test_each_recipe_has_its_phases_in_the_meters_names(config_path):
    grpo = dict(recipe="grpo", prompts=10, prompt_len=32, completion_len=64, methods=["full"])
    plain = estimate(model=str(config_path), **grpo).methods[0]
    assert [p.name for p in plain.phases] == ["training", "generation"]
    full = estimate(model=str(config_path), **grpo, reference=True, iterations=2).methods[0]
    assert [p.name for p in full.phases] == [
        "training", "generation", "scoring", "model reference"
    ]  # fmt: skip
    assert full.tokens == 10 * 8 * 96 * 2  # 8 generations (TRL's default), two passes each
    assert full.flops == pytest.approx(sum(p.flops for p in full.phases))
    lora = estimate(model=str(config_path), **{**grpo, "methods": ["lora"]}, reference=True)
    assert [p.name for p in lora.methods[0].phases] == ["training", "generation", "scoring"]
    dpo = estimate(
        model=str(config_path), recipe="dpo", prompts=5, prompt_len=10, completion_len=20,
        rejected_len=30, methods=["full"],
    ).methods[0]  # fmt: skip
    assert [p.name for p in dpo.phases] == ["training", "model reference"]
    assert (dpo.tokens, dpo.sequences, dpo.sum_sq_seq_len) == (
        5 * 30 + 5 * 40,
        10,
        5 * 900 + 5 * 1600,
    )
    distill = dict(recipe="distill", prompts=4, prompt_len=8, completion_len=8)
    off = estimate(model=str(config_path), **distill, teacher=str(config_path), on_policy=0)
    assert [p.name for p in off.methods[0].phases] == ["training", "model teacher"]


def test_the_teacher_costs_its_own_forward(config_path, tmp_path):
    wide = tmp_path / "teacher.json"
    wide.write_text(json.dumps({**CONFIG, "hidden_size": 64, "intermediate_size": 128}))
    plan = estimate(
        model=str(config_path), recipe="distill", prompts=4, prompt_len=8, completion_len=8,
        teacher=str(wide), on_policy=0, methods=["full"],
    )  # fmt: skip
    teacher = plan.methods[0].phases[1]
    own = forward_cost(_profile({**CONFIG, "hidden_size": 64, "intermediate_size": 128}).profile)
    assert teacher.flops == scoring_flops(own, 4, 16)


def test_the_plan_of_a_recipe_is_rendered_with_its_phases(config_path, capsys):
    args = ["estimate", str(config_path), "--recipe", "grpo", "--prompts", "100",
            "--prompt-len", "64", "--completion-len", "128", "--reference", "--method", "full"]  # fmt: skip
    assert main(args) == 0
    text = capsys.readouterr().out
    assert "phases (policy modification" in text and "model reference" in text
    assert main([*args, "--format", "json"]) == 0
    plan = json.loads(capsys.readouterr().out)
    phases = plan["methods"][0]["phases"]
    assert [p["name"] for p in phases] == ["training", "generation", "model reference"]
    assert plan["methods"][0]["flops"] == pytest.approx(sum(p["flops"] for p in phases))
    assert main([*args, "--phases", "updates", "--format", "json"]) == 0
    updates = json.loads(capsys.readouterr().out)["methods"][0]
    assert updates["flops"] == updates["phases"][0]["flops"]
    assert [p["counted"] for p in updates["phases"]] == [True, False, False]


@pytest.mark.parametrize(
    ("extra", "why"),
    [
        (["--tokens", "1e6"], "not --tokens"),
        (["--teacher", "x"], "--teacher does not apply to --recipe grpo"),
        (["--phases", "everything"], "--phases must be one of"),
        (["--prompt-len", "0"], "--prompt-len must be between 1"),
        (["--completion-len", "1e9"], "--completion-len must be between 1 and 1e+08"),
    ],
)
def test_a_recipe_that_cannot_be_planned_is_refused_in_one_line(config_path, capsys, extra, why):
    base = ["estimate", str(config_path), "--recipe", "grpo", "--prompts", "10",
            "--prompt-len", "8", "--completion-len", "8"]  # fmt: skip
    args = [*base, *extra]
    if extra[0] == "--prompt-len":
        args = [*base[:6], *extra, *base[8:]]
    try:
        code = main(args)
    except SystemExit as exit_:  # argparse's refusal of an option's value
        code = exit_.code
    assert code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and why in err[0]


def test_recipe_inputs_are_checked_before_any_model_is_built(config_path, tmp_path):
    with pytest.raises(ConfigurationError, match="needs --completion-len"):
        estimate(model=str(config_path), recipe="grpo", prompts=3, prompt_len=4)
    with pytest.raises(ConfigurationError, match="needs --teacher"):
        estimate(
            model=str(config_path), recipe="distill", prompts=3, prompt_len=4, completion_len=4
        )
    with pytest.raises(ConfigurationError, match="--prompts does not apply to --recipe sft"):
        estimate(model=str(config_path), tokens=100, prompts=3)
    with pytest.raises(ConfigurationError, match="--phases applies to a --recipe"):
        estimate(model=str(config_path), tokens=100, phases="updates")
    with pytest.raises(ConfigurationError, match="needs a MODEL"):
        estimate(params=1e9, recipe="dpo", prompts=3, prompt_len=4, completion_len=4)
    with pytest.raises(ConfigurationError, match=r"--on-policy must be a share in \[0, 1\]"):
        estimate(model=str(config_path), recipe="distill", prompts=3, prompt_len=4,
                 completion_len=4, teacher=str(config_path), on_policy=1.5)  # fmt: skip
    t5 = tmp_path / "t5.json"
    t5.write_text(json.dumps({"model_type": "t5", "d_model": 32, "d_ff": 64, "num_layers": 2,
                              "num_heads": 4, "d_kv": 8, "vocab_size": 64,
                              "architectures": ["T5ForConditionalGeneration"]}))  # fmt: skip
    with pytest.raises(ConfigurationError, match=r"the teacher .*decoder models"):
        estimate(model=str(config_path), recipe="distill", prompts=3, prompt_len=4,
                 completion_len=4, teacher=str(t5))  # fmt: skip
    with pytest.raises(ConfigurationError, match="--recipe dpo plans decoder models"):
        estimate(model=str(t5), recipe="dpo", prompts=3, prompt_len=4, completion_len=4)


def test_dpo_sequences_pair_each_chosen_with_its_rejected():
    recipe = Recipe("dpo", prompts=3, prompt_len=4, completion_len=5, rejected_len=7)
    assert recipe_sequences(recipe) == [(9, 3), (11, 3)]
    same = Recipe("dpo", prompts=3, prompt_len=4, completion_len=5)
    assert recipe_sequences(same) == [(9, 6)]
