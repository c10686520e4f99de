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
