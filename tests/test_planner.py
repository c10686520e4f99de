"""The planner (``flopmeter estimate``): counts, model ids, methods, datasets, exit codes.

Truths are computed here: parameter counts from transformers models built on meta and from the
models' published sizes, token counts by counting words, FLOP by hand where a formula is short.
The agreement of a plan with a metered run is in tests/test_planner_meter.py.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys

import pytest

from flopmeter.cli import main
from flopmeter.compliance.thresholds import determine_threshold
from flopmeter.compliance.verdict import UNCERTAINTY_MARGIN
from flopmeter.errors import ConfigurationError
from flopmeter.planner import METHODS, estimate, parse_count, resolve_model
from flopmeter.planner.build import spectrum_layers
from tests.support.planner import CONFIG, WORDS, make_tokenizer

transformers = pytest.importorskip("transformers")
peft = pytest.importorskip("peft")


# ----------------------------------------------------------------------------- numbers
@pytest.mark.parametrize(
    ("text", "value"),
    [("1e9", 10**9), ("3.2B", 3_200_000_000), ("24M", 24_000_000), ("1.5k", 1500),
     ("2T", 2 * 10**12), ("1_000", 1000), ("12345678901234567891", 12345678901234567891),
     ("7", 7), ("0", 0), ("2.5e3", 2500)],
)  # fmt: skip
def test_counts_parse_suffixes_and_scientific_notation(text, value):
    assert parse_count(text) == value


@pytest.mark.parametrize(
    ("text", "why"),
    [("-5", "negative"), ("0.5", "whole"), ("1.2345K", "whole"), ("abc", "not"), ("nan", "finite"),
     ("inf", "finite"), ("", "not"), ("3.2X", "not")],
)  # fmt: skip
def test_bad_counts_are_refused_with_a_reason(text, why):
    with pytest.raises(ValueError, match=why):
        parse_count(text)


@pytest.mark.parametrize("tokens", ["-1", "0.5", "1e-3", "lots"])
def test_a_bad_token_count_is_one_line_naming_the_flag(capsys, tokens):
    with pytest.raises(SystemExit) as info:
        main(["estimate", "--params", "1B", "--tokens", tokens])
    assert info.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--tokens" in err[0] and repr(tokens) in err[0]


def test_bare_numbers_use_the_seed_and_6nd_formulas(capsys):
    assert main(["estimate", "--params", "3.2B", "--trainable", "24M", "--tokens", "1e9",
                 "--format", "json"]) == 0  # fmt: skip
    (entry,) = json.loads(capsys.readouterr().out)["methods"]
    assert entry["seed_flops"] == (4 * 3.2e9 + 2 * 24e6) * 1e9
    assert entry["six_nd_flops"] == 6 * 3.2e9 * 1e9
    assert entry["flops"] == entry["six_nd_flops"] and entry["estimate"] == "six_nd"
    assert entry["threshold_value"] == pytest.approx(1e23 / 3)
    assert entry["tokens_to_threshold"] == pytest.approx(1e23 / 3 / (6 * 3.2e9))


# ----------------------------------------------------------------------------- bundled configs
#: Published parameter counts (model cards / the safetensors index), and the ids they answer to.
PUBLISHED = {
    "meta-llama/Llama-3.2-1B": 1.24e9,
    "meta-llama/Llama-3.2-3B-Instruct": 3.21e9,
    "meta-llama/Llama-3.1-8B": 8.03e9,
    "meta-llama/Llama-3.1-70B-Instruct": 70.6e9,
    "Qwen/Qwen2.5-0.5B-Instruct": 0.494e9,
    "Qwen/Qwen2.5-1.5B": 1.54e9,
    "Qwen/Qwen2.5-3B": 3.09e9,
    "Qwen/Qwen2.5-7B-Instruct": 7.61e9,
    "Qwen/Qwen3-4B": 4.02e9,
    "Qwen/Qwen3-8B": 8.19e9,
    "Qwen/Qwen3-14B": 14.8e9,
    "Qwen/Qwen3-32B": 32.8e9,
    "mistralai/Mistral-7B-v0.1": 7.24e9,
    "mistralai/Mistral-7B-Instruct-v0.3": 7.25e9,
    "mistralai/Mixtral-8x7B-Instruct-v0.1": 46.7e9,
    "google/gemma-2-2b-it": 2.61e9,
    "google/gemma-2-9b": 9.24e9,
    "google/gemma-2-27b": 27.2e9,
    "google/gemma-3-1b-it": 1.00e9,
    "microsoft/Phi-3-mini-4k-instruct": 3.82e9,
    "microsoft/phi-4": 14.7e9,
    "microsoft/Phi-4-mini-instruct": 3.84e9,
    "HuggingFaceTB/SmolLM2-135M-Instruct": 135e6,
    "HuggingFaceTB/SmolLM2-360M": 362e6,
    "HuggingFaceTB/SmolLM2-1.7B-Instruct": 1.71e9,
    # the model families, as their model cards give the size
    "google-bert/bert-base-uncased": 110e6,
    "facebook/bart-large": 406e6,
    "openai/whisper-large-v3": 1.55e9,
    "llava-hf/llava-1.5-7b-hf": 7.06e9,
}


def test_every_bundled_config_is_checked_here():
    from flopmeter.flops.architecture import BUNDLED_CONFIGS

    names = {resolve_model(i).source.rsplit(" ", 1)[-1] for i in PUBLISHED}
    assert names == set(BUNDLED_CONFIGS)


@pytest.mark.slow
@pytest.mark.parametrize(("model_id", "published"), PUBLISHED.items())
def test_bundled_configs_give_the_published_parameter_count(model_id, published):
    import torch

    from flopmeter.planner.families import detect_family

    values = resolve_model(model_id).config
    config = transformers.AutoConfig.for_model(**values)
    auto = getattr(transformers, detect_family(values, config).auto_class)  # BERT: masked LM
    with torch.device("meta"):
        model = auto.from_config(config)
    n = sum(p.numel() for p in model.parameters())  # tied weights are one parameter
    assert n == pytest.approx(published, rel=0.01), model_id


def test_instruct_ids_resolve_to_the_base_config():
    for base, instruct in [
        ("meta-llama/Llama-3.2-3B", "meta-llama/Llama-3.2-3B-Instruct"),
        ("Qwen/Qwen2.5-7B", "Qwen/Qwen2.5-7B-Instruct"),
        ("google/gemma-2-9b", "google/gemma-2-9b-it"),
        ("mistralai/Mistral-7B-v0.3", "mistralai/Mistral-7B-Instruct-v0.3"),
    ]:
        assert resolve_model(base).config == resolve_model(instruct).config


def test_an_unknown_model_id_lists_known_ones(capsys):
    assert main(["estimate", "acme/SuperModel-9B", "--tokens", "1e6"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1
    assert "acme/SuperModel-9B" in err
    listed = err.split("(bundled: ", 1)[1].split(", ...", 1)[0].split(", ")
    assert len(listed) >= 5 and all("/" in i for i in listed)  # ids as people write them
    for model_id in listed:  # each a known id, with its organisation
        assert resolve_model(model_id).source.startswith("bundled config")


# ----------------------------------------------------------------------------- methods
@pytest.fixture
def tiny(tmp_path):
    path = tmp_path / "config.json"
    path.write_text(json.dumps(CONFIG))
    return path


def _by_method(plan):
    return {m.method: m for m in plan.methods}


@pytest.mark.slow
def test_methods_side_by_side(tiny):
    plan = estimate(model=tiny, tokens=10_000, seq_len=16, lora_r=4)
    m = _by_method(plan)
    assert list(m) == ["full", "lora", "qlora", "spectrum", "freeze"]
    assert m["lora"].flops < m["full"].flops
    assert m["qlora"].flops == m["lora"].flops and m["qlora"].n_trainable == m["lora"].n_trainable
    assert m["spectrum"].flops < m["full"].flops and m["freeze"].flops < m["full"].flops
    # 3 blocks of 32x32 (q, o), 32x16 (k, v) and 3 x 32x64 (MLP): 9216 weights each
    per_block = 2 * 1024 + 2 * 512 + 3 * 2048
    # spectrum 0.25 of 3 blocks: round(0.75) = 1 block, block 0
    assert m["spectrum"].trainable_blocks == [0] and m["spectrum"].n_trainable == per_block
    # freeze: embeddings and block 0 (3 // 2 = 1) frozen; blocks 1-2 (with their two norms of
    # 32), the final norm (32) and the untied lm_head (32 x 64) train
    assert m["freeze"].n_trainable == 2 * (per_block + 64) + 32 + 32 * 64
    for entry in plan.methods:
        assert entry.tokens == 10_000
        assert entry.tokens_to_threshold == pytest.approx(
            entry.threshold_value / entry.flops * 10_000
        )


def test_full_plan_of_tiny_model_matches_a_hand_count(tiny):
    # one sequence of 16 tokens; every matmul trains: 6 FLOP per MAC per token
    plan = estimate(model=tiny, tokens=16, seq_len=16, methods=["full"])
    macs = 3 * (2 * 1024 + 2 * 512 + 3 * 2048) + 32 * 64  # blocks and lm_head
    # attention: QK^T and AV, forward and backward (dQ, dK, dP, dV): 2 * width * 3 per
    # product, width = 4 heads x 8 = 32; pairs 16^2 per layer
    attention = 3 * 16 * 16 * 2 * (32 * 3 + 32 * 3)
    assert plan.methods[0].flops == 16 * 6 * macs + attention


def test_spectrum_layers_spread_from_the_first_block():
    assert spectrum_layers(28, 0.25) == (0, 4, 8, 12, 16, 20, 24)
    assert spectrum_layers(10, 0.5) == (0, 2, 4, 6, 8)
    assert spectrum_layers(4, 0.01) == (0,) and spectrum_layers(4, 1.0) == (0, 1, 2, 3)


# ----------------------------------------------------------------------------- datasets
def _write(path, lines):
    path.write_text("".join(line + "\n" for line in lines))
    return path


def test_dataset_lengths_come_from_the_tokenizer(tiny, tmp_path):
    tok = make_tokenizer(tmp_path / "tok")
    texts = [" ".join(WORDS[:n]) for n in (3, 7, 12, 40)]
    data = _write(tmp_path / "d.jsonl", [
        json.dumps({"text": texts[0]}),
        "",  # blank lines are skipped
        json.dumps({"prompt": texts[1][:8], "completion": texts[1][8:]}),
        json.dumps({"messages": [{"role": "user", "content": texts[2]}]}),
        json.dumps({"text": texts[3]}),
    ])  # fmt: skip
    plan = estimate(model=tiny, dataset=data, tokenizer=tok, seq_len=20, methods=["full"],
                    epochs=3)  # fmt: skip
    # word counts, the last cut at 20 (prompt "w0 w1 w2" + completion " w3 ..." stays 7 words)
    lengths = [3, 7, 12, 20]
    entry = plan.methods[0]
    assert entry.tokens == 3 * sum(lengths) and entry.sequences == 12
    assert entry.sum_sq_seq_len == 3 * sum(n * n for n in lengths)
    assert not plan.approximate_tokens and "1 cut" in plan.tokens_from
    assert entry.epochs_to_threshold == pytest.approx(entry.threshold_value / entry.flops * 3)


@pytest.mark.slow
def test_without_a_tokenizer_lengths_are_approximate_and_say_so(tiny, tmp_path, capsys):
    data = _write(
        tmp_path / "d.jsonl", [json.dumps({"text": "x" * 10}), json.dumps({"text": "y" * 8})]
    )
    plan = estimate(model=tiny, dataset=data, methods=["full"])
    assert plan.approximate_tokens
    assert plan.methods[0].tokens == math.ceil(10 / 4) + 8 // 4
    assert main(["estimate", str(tiny), "--dataset", str(data), "--method", "full"]) == 0
    out = capsys.readouterr().out
    assert "(approximate)" in out and "characters / 4" in out


@pytest.mark.parametrize(
    ("line", "why"),
    [("{not json", "not valid JSON"), ('["a list"]', "JSON object"), ('{"title": "x"}', "no text"),
     ('{"messages": [{"role": "user"}]}', "messages")],
)  # fmt: skip
def test_a_malformed_line_is_named(tiny, tmp_path, capsys, line, why):
    data = _write(tmp_path / "d.jsonl", [json.dumps({"text": "fine"}), line])
    assert main(["estimate", str(tiny), "--dataset", str(data)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "line 2" in err and why in err


@pytest.mark.slow
def test_input_errors_are_one_line(tiny, tmp_path, capsys):
    bad_json = tmp_path / "bad" / "config.json"
    bad_json.parent.mkdir()
    bad_json.write_text("{oops")
    empty = tmp_path / "empty"
    empty.mkdir()
    data = _write(tmp_path / "d.jsonl", [json.dumps({"text": "fine"})])
    unknown_type = tmp_path / "unknown.json"
    unknown_type.write_text(json.dumps({**CONFIG, "model_type": "nonsense"}))
    no_type = tmp_path / "no_type.json"
    no_type.write_text(json.dumps({"hidden_size": 8}))
    cases = [
        ([str(tmp_path / "missing.json"), "--tokens", "1"], "no such file"),
        ([str(bad_json), "--tokens", "1"], "not valid JSON"),
        ([str(bad_json.parent), "--tokens", "1"], "not valid JSON"),
        ([str(empty), "--tokens", "1"], "no config.json"),
        ([str(tiny), "--dataset", str(tmp_path / "nope.jsonl")], "nope.jsonl"),
        ([str(tiny), "--dataset", str(data), "--tokenizer", str(empty)], "cannot be loaded"),
        ([str(tiny), "--dataset", str(data), "--tokenizer", str(tmp_path / "x")], "no such"),
        ([str(tiny)], "--tokens or --dataset"),
        ([str(tiny), "--tokens", "1", "--dataset", str(data)], "--tokens or --dataset"),
        (["--tokens", "1"], "MODEL"),
        ([str(tiny), "--tokens", "1", "--method", "freeze", "--freeze-layers", "4"], "3 blocks"),
        ([str(tiny), "--tokens", "1", "--lora-targets", "nothere"], "nothere"),
        ([str(unknown_type), "--tokens", "1"], "Unrecognized model identifier: nonsense"),
        ([str(no_type), "--tokens", "1"], "no model_type"),
    ]
    for argv, why in cases:
        assert main(["estimate", *argv]) == 2, argv
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and why in err, (argv, err)


# ----------------------------------------------------------------------------- output, gates
@pytest.mark.slow
def test_json_is_the_whole_plan_equal_to_the_function(tiny, capsys):
    argv = ["estimate", str(tiny), "--tokens", "5000", "--seq-len", "16", "--format", "json"]
    assert main(argv) == 0
    printed = json.loads(capsys.readouterr().out)
    plan = estimate(model=str(tiny), tokens=5000, seq_len=16)
    assert printed == plan.model_dump(mode="json")
    assert printed["approximate_tokens"] is False and printed["notes"]
    required = {"method", "n_total", "n_trainable", "tokens", "flops", "threshold_value", "verdict"}
    assert all(required <= set(e) for e in printed["methods"])
    assert [e["method"] for e in printed["methods"]] == list(METHODS)


@pytest.mark.slow
def test_json_says_when_the_token_count_is_approximate(tiny, tmp_path, capsys):
    # the review's case: --dataset without --tokenizer, --format json
    data = _write(tmp_path / "d.jsonl", [json.dumps({"text": "x" * 10})])
    argv = ["estimate", str(tiny), "--dataset", str(data), "--method", "full", "--format", "json"]
    assert main(argv) == 0
    printed = json.loads(capsys.readouterr().out)
    assert printed["approximate_tokens"] is True
    assert "characters / 4" in printed["tokens_from"]
    assert printed["methods"][0]["tokens"] == math.ceil(10 / 4)
    assert printed == estimate(model=str(tiny), dataset=data, methods=["full"]).model_dump(
        mode="json"
    )


@pytest.mark.slow
def test_table_and_markdown_show_every_method(tiny, capsys):
    for fmt in ("table", "md"):
        assert main(["estimate", str(tiny), "--tokens", "5000", "--format", fmt]) == 0
        out = capsys.readouterr().out
        for method in ("full", "lora", "qlora", "spectrum", "freeze"):
            assert f"{method} " in out or f"| {method} |" in out, (fmt, method)
        assert "below_threshold" in out


def _verdict_of(capsys):
    return [e["verdict"] for e in json.loads(capsys.readouterr().out)["methods"]]


@pytest.mark.slow
def test_fail_on_gates_a_pipeline(tiny, capsys):
    full = estimate(model=tiny, tokens=16_000, seq_len=16, methods=["full"]).methods[0]
    threshold = determine_threshold(None).value
    per_token = full.flops / 16_000  # whole sequences of 16: compute is proportional
    exceeds = str(math.ceil(threshold / per_token * 1.01 / 16) * 16)
    # inside the margin: flops < threshold < flops * (1 + margin)
    near = str(math.floor(threshold / per_token / (1 + UNCERTAINTY_MARGIN / 2) / 16) * 16)
    base = ["estimate", str(tiny), "--seq-len", "16", "--method", "full", "--format", "json"]
    assert main([*base, "--tokens", exceeds]) == 0  # no gate: the verdict is only reported
    assert _verdict_of(capsys) == ["exceeds_threshold"]
    assert main([*base, "--tokens", exceeds, "--fail-on", "exceeds"]) == 3
    capsys.readouterr()
    assert main([*base, "--tokens", near, "--fail-on", "exceeds"]) == 0
    assert _verdict_of(capsys) == ["near_threshold"]
    assert main([*base, "--tokens", near, "--fail-on", "near"]) == 3
    assert main([*base, "--tokens", "16", "--fail-on", "near"]) == 0
    capsys.readouterr()
    # full above, LoRA (r=2: 0.77 of full's compute on this tiny model) near: one method
    # reaching the verdict fails the gate
    both = [*base, "--method", "lora", "--lora-r", "2", "--tokens", exceeds, "--fail-on", "exceeds"]
    assert main(both) == 3
    assert _verdict_of(capsys) == ["exceeds_threshold", "near_threshold"]


@pytest.mark.slow
def test_the_command_line_starts_without_torch():
    code = (
        "import sys\n"
        "import flopmeter.cli.estimate\n"
        "from flopmeter.cli import main\n"
        "main(['threshold'])\n"
        "assert 'torch' not in sys.modules, 'torch imported'\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr


def test_a_ready_threshold_and_pretrain_flops_are_honoured(tiny):
    plan = estimate(model=tiny, tokens=100, methods=["full"], pretrain_flops=3e24)
    assert plan.methods[0].threshold_value == pytest.approx(1e24)
    assert plan.methods[0].threshold_kind == "one_third_of_original"
    with pytest.raises(ConfigurationError, match="positive"):
        estimate(model=tiny, tokens=100, seq_len=0)


def test_token_totals_of_a_token_count():
    from flopmeter.planner.tokens import totals_for_lengths, totals_for_tokens

    # 100 tokens in sequences of 32: 32, 32, 32, 4; three to a micro-batch: 2 micro-batches
    totals = totals_for_tokens(100, 32, batch_size=3)
    assert (totals.tokens_processed, totals.sequences, totals.micro_batches) == (100, 4, 2)
    assert totals.sum_sq_seq_len == 3 * 32 * 32 + 4 * 4
    twice = totals_for_lengths((5, 7, 9), epochs=2, batch_size=2)
    assert (twice.tokens_processed, twice.sequences, twice.micro_batches) == (42, 6, 4)
    assert twice.sum_sq_seq_len == 2 * (25 + 49 + 81)


@pytest.mark.slow
def test_pretrain_flops_catalog_is_looked_up_for_the_model_id(tiny, capsys, monkeypatch):
    from flopmeter.compliance.catalog import lookup

    monkeypatch.delenv("PRETRAIN_FLOPS", raising=False)
    model_id = "meta-llama/Llama-3.2-1B-Instruct"
    entry = lookup(model_id)
    assert entry is not None and entry.flops is not None
    argv = ["estimate", model_id, "--tokens", "1e6", "--method", "full", "--format", "json"]
    assert main([*argv, "--pretrain-flops", "catalog"]) == 0
    printed = json.loads(capsys.readouterr().out)
    (planned,) = printed["methods"]
    assert planned["threshold_value"] == pytest.approx(determine_threshold(entry.flops).value)
    assert planned["threshold_kind"] == determine_threshold(entry.flops).kind
    assert "from the catalogue" in printed["threshold_note"]
    # the Python API looks the catalogue up the same way
    plan = estimate(model=model_id, tokens="1e6", methods=["full"], pretrain_flops="catalog")
    assert printed == plan.model_dump(mode="json")


# ----------------------------------------------------------------------------- review fixes
def test_the_api_takes_counts_as_the_command_line_does(tiny):
    by_int = estimate(params=3_200_000_000, tokens=1_000_000_000).methods[0]
    for tokens in (1e9, "1e9", "1B"):
        assert estimate(params=3.2e9, tokens=tokens).methods[0] == by_int
    assert estimate(params="3.2B", trainable="24M", tokens=1e9).methods[0].n_trainable == 24 * 10**6
    # bare numbers say nothing of sequences: null, never a 0 that reads as "none"
    assert (by_int.sequences, by_int.sum_sq_seq_len, by_int.micro_batches) == (None, None, None)
    for bad, why in ((0, "tokens must be positive"), (0.0, "tokens must be positive"),
                     (1.5, "whole number"), ("lots", "not tokens"), (-3, "negative")):  # fmt: skip
        with pytest.raises(ConfigurationError, match=why):
            estimate(model=tiny, tokens=bad)
    with pytest.raises(ConfigurationError, match="params must be positive"):
        estimate(params=0, tokens=10)


def test_tokens_zero_is_refused_at_the_command_line(tiny, capsys):
    assert main(["estimate", str(tiny), "--tokens", "0"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "must be positive" in err


def test_epochs_with_tokens_is_refused_and_epochs_must_be_above_zero(tiny, tmp_path, capsys):
    with pytest.raises(ConfigurationError, match="--epochs applies to --dataset only"):
        estimate(model=tiny, tokens=10**9, epochs=2)
    assert main(["estimate", str(tiny), "--tokens", "1e9", "--epochs", "2"]) == 2
    assert "--epochs applies to --dataset only" in capsys.readouterr().err
    data = _write(tmp_path / "d.jsonl", [json.dumps({"text": "x" * 8})])
    for epochs in ("0", "-1", "nan"):
        with pytest.raises(SystemExit) as info:
            main(["estimate", str(tiny), "--dataset", str(data), "--epochs", epochs])
        assert info.value.code == 2 and "--epochs" in capsys.readouterr().err
    for epochs in (0, -0.5, float("inf")):
        with pytest.raises(ConfigurationError, match="epochs must be above 0"):
            estimate(model=tiny, dataset=data, epochs=epochs)


@pytest.mark.slow
def test_fractional_epochs_scale_tokens_and_the_length_mix(tiny, tmp_path, capsys):
    # 4 examples of 4, 8, 12 and 16 tokens (ceil(chars / 4)); sums 40 tokens, 480 squared
    data = _write(
        tmp_path / "d.jsonl", [json.dumps({"text": "x" * (16 * k)}) for k in (1, 2, 3, 4)]
    )
    one = estimate(model=tiny, dataset=data, methods=["full"]).methods[0]
    assert (one.tokens, one.sequences, one.sum_sq_seq_len) == (40, 4, 16 + 64 + 144 + 256)
    for epochs, tokens, sequences, squares in ((0.5, 20, 2, 240), (1.5, 60, 6, 720)):
        m = estimate(model=tiny, dataset=data, methods=["full"], epochs=epochs).methods[0]
        assert (m.tokens, m.sequences, m.sum_sq_seq_len) == (tokens, sequences, squares)
        assert m.flops == pytest.approx(epochs * one.flops)  # same mix: proportional
        assert m.epochs_to_threshold == pytest.approx(m.threshold_value / m.flops * epochs)
    argv = ["estimate", str(tiny), "--dataset", str(data), "--method", "full", "--format", "json"]
    assert main([*argv, "--epochs", "1.5"]) == 0
    assert json.loads(capsys.readouterr().out)["methods"][0]["tokens"] == 60


def test_model_and_params_together_are_called_exclusive(tiny):
    with pytest.raises(ConfigurationError, match="not both"):
        estimate(model=tiny, params=10, tokens=10)


@pytest.mark.slow
def test_the_header_counts_the_base_model_without_adapters(tiny, capsys):
    assert main(["estimate", str(tiny), "--tokens", "64", "--method", "lora"]) == 0
    head = capsys.readouterr().out.splitlines()[0]
    full = estimate(model=tiny, tokens=64, methods=["full"]).methods[0]
    # hand count: embeddings 64x32, 3 blocks of 9216 weights + 2 norms of 32, norm, lm_head
    assert full.n_total == 64 * 32 + 3 * (9216 + 64) + 32 + 32 * 64
    assert head.endswith(f", {full.n_total:,} parameters")


def test_a_sequence_longer_than_the_context_is_warned(tiny):
    plan = estimate(model=tiny, tokens=1000, seq_len=256, methods=["full"])  # context 128
    assert any("max_position_embeddings 128" in note for note in plan.notes)
    plan = estimate(model=tiny, tokens=1000, seq_len=128, methods=["full"])
    assert not any("max_position_embeddings" in note for note in plan.notes)


def test_markdown_notes_are_a_bulleted_list_under_a_heading(tiny, capsys):
    assert (
        main(["estimate", str(tiny), "--tokens", "64", "--method", "full", "--format", "md"]) == 0
    )
    lines = capsys.readouterr().out.splitlines()
    at = lines.index("**Notes**")
    notes = [line for line in lines[at + 1 :] if line]
    assert notes and all(line.startswith("- ") for line in notes)
    assert "- full: Every parameter trains." in notes


def test_a_tokenizer_with_broken_files_says_so(tiny, tmp_path, capsys):
    folder = tmp_path / "tok"
    folder.mkdir()
    (folder / "tokenizer.json").write_text('{"version": "1.0"}')
    (folder / "tokenizer_config.json").write_text('{"tokenizer_class": "PreTrainedTokenizerFast"}')
    data = _write(tmp_path / "d.jsonl", [json.dumps({"text": "fine"})])
    assert main(["estimate", str(tiny), "--dataset", str(data), "--tokenizer", str(folder)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1
    assert "tokenizer files there could not be read" in err and "missing" in err


# ----------------------------------------------------------------------------- families
# Each truth: the real model built here on the CPU (eager attention), run on real tensors the
# way its trainer feeds it, counted by PyTorch's own FlopCounterMode, per sequence shape.
_BERT = {"model_type": "bert", "hidden_size": 32, "intermediate_size": 64,
         "num_hidden_layers": 2, "num_attention_heads": 4, "vocab_size": 64}  # fmt: skip
_T5 = {"model_type": "t5", "d_model": 32, "d_ff": 64, "num_layers": 2, "num_heads": 4,
       "d_kv": 8, "vocab_size": 64, "decoder_start_token_id": 0}  # fmt: skip
_WHISPER = {"model_type": "whisper", "d_model": 32, "encoder_ffn_dim": 64,
            "decoder_ffn_dim": 64, "encoder_layers": 1, "decoder_layers": 1,
            "encoder_attention_heads": 4, "decoder_attention_heads": 4, "vocab_size": 64,
            "num_mel_bins": 16, "max_source_positions": 40, "max_target_positions": 32,
            "pad_token_id": 1, "bos_token_id": 1, "eos_token_id": 2,
            "decoder_start_token_id": 1}  # fmt: skip
_LLAVA = {"model_type": "llava", "image_token_index": 63, "image_seq_length": 16,
          "vision_config": {"model_type": "clip_vision_model", "hidden_size": 32,
                            "intermediate_size": 64, "num_hidden_layers": 2,
                            "num_attention_heads": 4, "image_size": 32, "patch_size": 8},
          "text_config": {"model_type": "llama", "hidden_size": 32, "intermediate_size": 64,
                          "num_hidden_layers": 2, "num_attention_heads": 4,
                          "vocab_size": 64}}  # fmt: skip


def _config_file(tmp_path, values):
    path = tmp_path / f"{values['model_type']}.json"
    path.write_text(json.dumps(values))
    return path


def _cpu_model(values, auto, mode="full"):
    import torch

    torch.manual_seed(0)
    config = transformers.AutoConfig.for_model(**values)
    model = getattr(transformers, auto).from_config(config, attn_implementation="eager")
    if mode == "lora":
        model = peft.get_peft_model(model, peft.LoraConfig(r=16, target_modules="all-linear"))
    return model.train()


def _counted(model, **inputs):
    from torch.utils.flop_counter import FlopCounterMode

    with FlopCounterMode(display=False) as counter:
        model(**inputs).loss.backward()
    model.zero_grad(set_to_none=True)
    return counter.get_total_flops()


def _ids(n, value=5):
    import torch

    return torch.full((1, n), value, dtype=torch.long)


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["full", "lora"])
def test_an_encoder_is_planned_as_its_masked_lm_not_a_causal_lm(tmp_path, mode):
    plan = estimate(model=_config_file(tmp_path, _BERT), tokens=300, seq_len=128,
                    methods=[mode])  # fmt: skip
    (m,) = plan.methods
    assert (plan.family, plan.head) == ("encoder", "masked-LM head")
    assert "masked-LM head" in plan.source
    model = _cpu_model(_BERT, "AutoModelForMaskedLM", mode)
    # 300 tokens: two full sequences of 128 and one of 44
    truth = 2 * _counted(model, input_ids=_ids(128), labels=_ids(128))
    truth += _counted(model, input_ids=_ids(44), labels=_ids(44))
    assert m.flops == pytest.approx(truth, rel=1e-9)
    assert m.n_total == sum(p.numel() for p in model.parameters())
    # a causal LM (BertLMHeadModel) would count the same blocks; the head is what differs
    assert m.n_trainable == sum(p.numel() for p in model.parameters() if p.requires_grad)


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["full", "lora"])
def test_an_encoder_decoder_takes_encoder_and_decoder_tokens(tmp_path, capsys, mode):
    path = _config_file(tmp_path, _T5)
    plan = estimate(model=path, tokens=300, seq_len=128, decoder_tokens=40, methods=[mode])
    (m,) = plan.methods
    assert (plan.family, m.estimate, m.decoder_tokens) == ("encoder-decoder", "dispatch", 40)
    model = _cpu_model(_T5, "AutoModelForSeq2SeqLM", mode)

    def pair(enc, dec):  # the trainer's form: labels, decoder inputs shifted right by T5
        return _counted(model, input_ids=_ids(enc), labels=_ids(dec))

    # 3 sequences (128, 128, 44); 40 decoder tokens: 14, 13, 13
    truth = pair(128, 14) + pair(128, 13) + pair(44, 13)
    assert m.flops == pytest.approx(truth, rel=1e-9)
    assert any("does not know encoder-decoders" in n for n in m.notes)
    # the decoder's tokens change the figure: a longer target costs more
    longer = estimate(model=path, tokens=300, seq_len=128, decoder_tokens=400, methods=[mode])
    assert longer.methods[0].flops > m.flops
    assert main(["estimate", str(path), "--tokens", "300", "--seq-len", "128",
                 "--decoder-tokens", "40", "--method", mode, "--format", "json"]) == 0  # fmt: skip
    assert json.loads(capsys.readouterr().out)["methods"][0]["flops"] == m.flops


@pytest.mark.slow
def test_a_vision_language_model_takes_an_image_budget(tmp_path):
    import torch

    plan = estimate(model=_config_file(tmp_path, _LLAVA), tokens=300, seq_len=128, images=2,
                    methods=["full"])  # fmt: skip
    (m,) = plan.methods
    assert (plan.family, m.images) == ("vision-language", 2)
    assert any("32 x 32 pixels" in n and "16 positions" in n for n in plan.notes)
    model = _cpu_model(_LLAVA, "AutoModelForImageTextToText")

    def sequence(text, images):  # the processor's form: 16 image tokens per image, then text
        ids = torch.cat([_ids(16 * images, 63), _ids(text)], dim=1)
        pixels = torch.zeros((images, 3, 32, 32)) if images else None
        return _counted(model, input_ids=ids, pixel_values=pixels, labels=ids)

    # 3 sequences (128, 128, 44); 2 images: one each in the first two
    truth = 2 * sequence(128, 1) + sequence(44, 0)
    assert m.flops == pytest.approx(truth, rel=1e-9)


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["full", "lora"])
def test_a_speech_model_takes_clips_of_its_configured_frames(tmp_path, mode):
    import torch

    plan = estimate(model=_config_file(tmp_path, _WHISPER), tokens=50, clips=4,
                    methods=[mode])  # fmt: skip
    (m,) = plan.methods
    assert (plan.family, m.clips, m.tokens) == ("speech", 4, 50)
    model = _cpu_model(_WHISPER, "AutoModelForSpeechSeq2Seq", mode)

    def clip(transcript):  # the feature extractor pads every clip to 2 x max_source_positions
        features = torch.zeros((1, 16, 80))
        return _counted(model, input_features=features, labels=_ids(transcript))

    truth = 2 * clip(13) + 2 * clip(12)  # 50 tokens over 4 clips
    assert m.flops == pytest.approx(truth, rel=1e-9)


@pytest.mark.parametrize(
    ("values", "words"),
    [({"_class_name": "UNet2DModel", "_diffusers_version": "0.42.0"}, "UNet2DModel: diffusion"),
     ({"model_type": "vit", "image_size": 224}, "vit: vision models are not planned"),
     ({"model_type": "qwen2_vl", "vision_config": {}}, "qwen2_vl: vision-language")],
)  # fmt: skip
def test_a_family_it_cannot_plan_is_refused_in_one_line(tmp_path, capsys, values, words):
    path = tmp_path / "config.json"
    path.write_text(json.dumps(values))
    assert main(["estimate", str(path), "--tokens", "1000"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and words in err[0], err


def test_a_budget_flag_of_another_family_is_refused(tmp_path, capsys):
    bert, t5 = _config_file(tmp_path, _BERT), _config_file(tmp_path, _T5)
    for argv, words in [([str(bert), "--images", "3"], "--images applies to vision-language"),
                        ([str(t5)], "needs --decoder-tokens"),
                        ([str(t5), "--decoder-tokens", "9", "--method", "spectrum"],
                         "spectrum needs the model's one list")]:  # fmt: skip
        assert main(["estimate", *argv, "--tokens", "1000"]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and words in err[0], err


@pytest.mark.slow
def test_the_default_methods_are_those_the_family_can_take(tmp_path, capsys):
    """No --method: a model without one stack of blocks is planned with every method it can
    take (full, lora, qlora), the plan saying spectrum and freeze were left out and why (it
    exited 2 before: the defaults held methods the family refuses)."""
    t5 = _config_file(tmp_path, _T5)
    plan = estimate(model=t5, tokens=300, seq_len=128, decoder_tokens=40)
    assert [m.method for m in plan.methods] == ["full", "lora", "qlora"]
    (left,) = [n for n in plan.notes if n.startswith("spectrum and freeze are not planned")]
    assert "t5 encoder-decoder model has no single stack" in left
    alone = estimate(model=t5, tokens=300, seq_len=128, decoder_tokens=40, methods=["lora"])
    assert plan.methods[1].flops == alone.methods[0].flops
    assert main(["estimate", str(t5), "--tokens", "300", "--seq-len", "128",
                 "--decoder-tokens", "40", "--format", "json"]) == 0  # fmt: skip
    printed = json.loads(capsys.readouterr().out)
    assert [m["method"] for m in printed["methods"]] == ["full", "lora", "qlora"]
    assert left in printed["notes"]


@pytest.mark.slow
def test_an_encoder_whose_architectures_name_a_classifier_gets_that_head(tmp_path):
    import torch

    values = {**_BERT, "architectures": ["BertForSequenceClassification"], "num_labels": 3}
    plan = estimate(model=_config_file(tmp_path, values), tokens=100, seq_len=128,
                    methods=["full"])  # fmt: skip
    assert plan.head.startswith("sequence-classification head (3 labels")
    model = _cpu_model(values, "AutoModelForSequenceClassification")
    truth = _counted(model, input_ids=_ids(100), labels=torch.zeros(1, dtype=torch.long))
    assert plan.methods[0].flops == pytest.approx(truth, rel=1e-9)
    assert plan.methods[0].n_total == sum(p.numel() for p in model.parameters())
