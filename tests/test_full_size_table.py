"""benchmarks/full_size_table.py on two small published models (meta device, no peers, no network)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

pytest.importorskip("transformers")
pytest.importorskip("peft")
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
import full_size_table


def _independent_truth(name: str, mode: str, tokens: int) -> int:
    """Built here, not by the script: eager attention, PyTorch's formulas only."""
    import peft
    import transformers

    config = transformers.AutoConfig.for_model(**full_size_table.MODELS[name])
    with torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(config, attn_implementation="eager")
    if mode == "lora":
        lora = peft.LoraConfig(r=16, target_modules="all-linear")
        model = peft.get_peft_model(model, lora)
    ids = torch.zeros((1, tokens), dtype=torch.long, device="meta")
    with FlopCounterMode(display=False) as counter:
        model.train()(input_ids=ids, labels=ids).loss.backward()
    return counter.get_total_flops()


@pytest.mark.slow
def test_table_rows_are_ratios_to_an_independent_dispatch_count():
    names = ["GPT-2", "Qwen2.5-0.5B"]
    rows = full_size_table.table(names, ["full", "lora"], [512], peers=())
    assert [(r.model, r.mode) for r in rows] == [(n, m) for n in names for m in ("full", "lora")]
    for r in rows:
        truth = _independent_truth(r.model, r.mode, r.tokens)
        assert r.truth == truth
        assert set(r.ratios) == set(full_size_table.ESTIMATES)
        assert r.ratios["transformer"] == pytest.approx(1.0, abs=1e-9)
        assert r.ratios["measured"] == pytest.approx(1.0, abs=1e-9)
        assert r.ratios["six_nd"] != pytest.approx(1.0, abs=1e-3)  # a real ratio, not a copy
        cells = full_size_table.cells(r, full_size_table.ESTIMATES)
        assert cells[3:5] == [f"{truth / 512:.3e}", "1.000"]
    # LoRA trains less: less work per token than full fine-tuning of the same model.
    assert rows[1].truth < rows[0].truth


def test_rows_beyond_a_learned_position_table_say_why():
    (r,) = full_size_table.table(["GPT-2"], ["full"], [4096], peers=())
    assert r.truth is None and r.ratios["transformer"] == "n/a (context 1024 tokens)"


def test_a_missing_peer_is_na_not_a_number(monkeypatch):
    def missing(model, ids):
        raise ModuleNotFoundError("No module named 'nothing'", name="nothing")

    monkeypatch.setitem(full_size_table.PEERS, "nothing", missing)
    model = torch.nn.Linear(2, 2)
    model.config = type("C", (), {"_attn_implementation": "sdpa"})()
    ratio = full_size_table.peer_ratio("nothing", model, torch.zeros(1, 2), 1.0)
    assert ratio == "n/a (not installed: nothing)"


@pytest.mark.slow
def test_mixture_of_experts_with_lora_on_the_experts_runs_on_meta():
    # bfloat16 for grouped_mm's meta kernel, meta_autocast for peft's ParamWrapper on 3-D experts.
    (r,) = full_size_table.table(["OLMoE-1B-7B"], ["lora"], [512], peers=())
    assert r.truth is not None, r.ratios
    assert r.ratios["transformer"] == pytest.approx(1.0, abs=1e-9)
    assert torch.autocast is full_size_table._MetaAutocast.real  # restored after the row


_T5_CONFIG = {"model_type": "t5", "vocab_size": 64, "d_model": 32, "d_ff": 64, "d_kv": 8,
              "num_heads": 4, "num_layers": 2, "decoder_start_token_id": 0,
              "pad_token_id": 0}  # fmt: skip
_DIT_CONFIG = {"_class_name": "DiTTransformer2DModel", "num_attention_heads": 2,
               "attention_head_dim": 8, "in_channels": 4, "out_channels": 8, "num_layers": 1,
               "patch_size": 2, "sample_size": 8, "num_embeds_ada_norm": 10,
               "norm_type": "ada_norm_zero"}  # fmt: skip
_TINY_T5 = full_size_table.Workload(
    "encoder-decoder", _T5_CONFIG, "encoder tokens, with a 128-token target", (16,)
)
_TINY_DIT = full_size_table.Workload("diffusion", _DIT_CONFIG, "one 8 x 8 x 4 latent", (0,))


def _t5_truth(mode: str) -> int:
    """Built here on the CPU with real tensors: T5 as its trainer runs it, PyTorch's formulas."""
    import peft
    import transformers

    config = transformers.AutoConfig.for_model(**_TINY_T5.config)
    model = transformers.AutoModelForSeq2SeqLM.from_config(config, attn_implementation="eager")
    if mode == "lora":
        model = peft.get_peft_model(model, peft.LoraConfig(r=16, target_modules="all-linear"))
    ids = torch.full((1, 16), 5, dtype=torch.long)
    labels = torch.full((1, 128), 5, dtype=torch.long)
    with FlopCounterMode(display=False) as counter:
        model.train()(input_ids=ids, labels=labels).loss.backward()
    return counter.get_total_flops()


@pytest.mark.slow
def test_a_family_row_is_ratios_to_an_independent_dispatch_count(monkeypatch):
    monkeypatch.setitem(full_size_table.FAMILY_MODELS, "tiny-T5", _TINY_T5)
    rows = full_size_table.table(["tiny-T5"], ["full", "lora"], [512], peers=("nothing",))
    assert [(r.mode, r.tokens, r.family) for r in rows] == [
        ("full", 16, "encoder-decoder"),
        ("lora", 16, "encoder-decoder"),
    ]  # the workload's own lengths, not the table's
    for r in rows:
        assert r.truth == _t5_truth(r.mode)
        assert set(r.ratios) == {*full_size_table.ESTIMATES, "nothing"}
        assert r.ratios["nothing"].startswith("n/a (KeyError")  # not a peer: said, no number
        # the dispatch-level sample of the same step: the measured estimate is the truth
        assert r.ratios["measured"] == pytest.approx(1.0, abs=1e-9)
        assert r.primary is not None
        cells = full_size_table.cells(r, full_size_table.ESTIMATES)
        assert cells[3] == f"{r.truth / 16:.3e}" and cells[-1] == r.primary


@pytest.mark.slow
def test_a_diffusion_row_runs_on_meta_with_its_lora_targets(monkeypatch):
    monkeypatch.setitem(full_size_table.FAMILY_MODELS, "tiny-DiT", _TINY_DIT)
    full, lora = full_size_table.table(["tiny-DiT"], ["full", "lora"], [512], peers=())
    assert full.truth is not None and lora.truth is not None, (full.ratios, lora.ratios)
    assert lora.truth < full.truth  # the frozen base needs no weight gradient
    assert full_size_table.cells(full, full_size_table.ESTIMATES)[3].endswith("(example)")


def test_the_section_writes_every_ratio_and_names_the_rows_not_known(tmp_path):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
    import write_table

    data = {
        "run": "2026-12-01T00:00:00Z",
        "machine": "a test CPU, 2 logical CPUs, no GPU",
        "versions": "Python 3.11",
        "methods": ["transformer", "measured", "calflops"],
        "rows": [
            {"model": "T5-x", "family": "encoder-decoder", "mode": "full", "tokens": 512,
             "unit": "encoder tokens", "truth": 1024.0, "primary": "measured",
             "ratios": {"transformer": 0.5, "measured": 1.0,
                        "calflops": "n/a (not installed: calflops)"}},
            {"model": "Llama-x", "family": "decoder", "mode": "lora", "tokens": 0,
             "unit": "tokens", "truth": None, "primary": None,
             "ratios": {"transformer": "n/a (cannot run on meta: x)"}},
        ],
    }  # fmt: skip
    lines = write_table.full_size_section(data)
    assert "- machine: a test CPU, 2 logical CPUs, no GPU" in lines
    row = next(line for line in lines if line.startswith("| T5-x"))
    assert row == (
        "| T5-x | encoder-decoder | full | 512 encoder tokens | 2.000e+00 | 0.500 | 1.000 "
        "| n/a (not installed: calflops) | measured |"
    )
    assert any("n/a (cannot run on meta: x)" in line for line in lines)
    assert "- encoder-decoder: T5-x full (0.500)" in lines  # the FLOP model is off: listed
    assert not any("more than 1%" in line for line in lines)  # its primary is the count
    data["asked"] = ["T5-x full", "Llama-x lora", "Mamba-x full"]
    section = write_table.full_size_section(data)
    assert sum(line.endswith("(stopped first): Mamba-x full.") for line in section) == 1
    page = tmp_path / "benchmarks.md"
    page.write_text("# Benchmarks\n\n## Step overhead\n\nx\n\n## Running it\n\n- y\n")
    assert write_table.main(["w", "--full-size", str(_json(tmp_path, data)), str(page)]) == 0
    text = page.read_text()
    assert text.index("## Step overhead") < text.index(write_table.FULL_SIZE_HEADING)
    assert text.index(write_table.FULL_SIZE_HEADING) < text.index("## Running it")
    data["rows"][0]["primary"] = "transformer"  # a primary 0.5x the count is listed
    assert "- T5-x full (transformer: 0.500)" in write_table.full_size_section(data)
    data["rows"][0]["ratios"]["transformer"] = 0.25  # a second run replaces the section
    write_table.main(["w", "--full-size", str(_json(tmp_path, data)), str(page)])
    again = page.read_text()
    assert again.count(write_table.FULL_SIZE_HEADING) == 1 and "| 0.250 |" in again
    assert "| 0.500 |" not in again and again.endswith("- y\n")


def _json(tmp_path, data):
    import json

    path = tmp_path / "full.json"
    path.write_text(json.dumps(data))
    return path


def test_an_update_replaces_the_rows_it_reruns_and_keeps_the_others():
    """``--update``: a re-run row replaces the earlier one in place, a new row comes after, and
    each run is listed with the rows it still holds (so the page says which run each row is)."""
    import write_table

    def data(run: str, rows: list[tuple[str, str, float]]) -> dict:
        rows_ = [
            {"model": m, "mode": mode, "tokens": 512, "truth": t, "ratios": {}, "unit": "tokens",
             "family": "decoder", "primary": "measured"}
            for m, mode, t in rows
        ]  # fmt: skip
        asked = [f"{m} {mode}" for m, mode, _ in rows]
        return {"asked": asked, "run": run, "machine": "m", "versions": "v", "methods": [],
                "rows": rows_}  # fmt: skip

    old = data("day 1", [("A", "full", 1.0), ("B", "full", 2.0)])
    new = data("day 2", [("B", "full", 3.0), ("C", "lora", 4.0)])
    out = full_size_table.merged(old, new)
    assert [(r["model"], r["truth"]) for r in out["rows"]] == [("A", 1.0), ("B", 3.0), ("C", 4.0)]
    assert out["asked"] == ["A full", "B full", "C lora"]
    assert [(r["run"], r["rows"]) for r in out["runs"]] == [
        ("day 1", ["A full 512"]),
        ("day 2", ["B full 512", "C lora 512"]),
    ]
    again = full_size_table.merged(out, data("day 3", [("A", "full", 5.0)]))
    assert [r["run"] for r in again["runs"]] == ["day 2", "day 3"]  # day 1 holds no row now
    lines = write_table.full_size_section(again)
    assert any(line.startswith("- run day 3 (m; v): A full 512") for line in lines)
    assert full_size_table.merged(None, new) is new
