"""A plan and a metered run of the same plan agree (issue 13: within 2%).

The plan is made from a tiny Llama ``config.json`` and a JSONL dataset tokenized by a
tokenizer built here (never downloaded). The same model is then really trained a few steps
under ``FlopMeter`` on the same texts, tokenized by the same tokenizer (one example per
micro-batch, no padding), with real peft LoRA for the LoRA plan. The plan must match the
meter's ``transformer`` estimate, and both an independent count: PyTorch's ``FlopCounterMode``
of the same steps with eager attention (which computes the full L x L square that the meter's
default convention counts).
"""

from __future__ import annotations

import json

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

from flopmeter import FlopMeter
from flopmeter.planner import estimate
from tests.support.planner import CONFIG, WORDS, make_tokenizer

transformers = pytest.importorskip("transformers")
peft = pytest.importorskip("peft")
tokenizers = pytest.importorskip("tokenizers")

#: Example texts of 5, 9, 17 and 30 words; seq_len 24 cuts the last one.
TEXTS = [" ".join(WORDS[(3 * i + j) % 40] for j in range(n)) for i, n in enumerate((5, 9, 17, 30))]
SEQ_LEN = 24
LORA = {"r": 4, "targets": ("q_proj", "v_proj")}


@pytest.fixture
def plan_files(tmp_path):
    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "config.json").write_text(json.dumps(CONFIG))
    data = tmp_path / "data.jsonl"
    data.write_text("".join(json.dumps({"text": t}) + "\n" for t in TEXTS))
    return tmp_path / "model", data, make_tokenizer(tmp_path / "tok")


def train_under_meter(method: str, tokenizer_path, epochs: int):
    """Trains the configured model on TEXTS; returns the meter's transformer estimate and
    FlopCounterMode's count of the same steps."""
    torch.manual_seed(0)
    config = transformers.AutoConfig.for_model(**CONFIG)
    model = transformers.AutoModelForCausalLM.from_config(config, attn_implementation="eager")
    if method == "lora":
        lora = peft.LoraConfig(
            r=LORA["r"], lora_alpha=8, target_modules=list(LORA["targets"]), lora_dropout=0.0
        )
        model = peft.get_peft_model(model, lora)
    model.train()
    tok = transformers.AutoTokenizer.from_pretrained(str(tokenizer_path), local_files_only=True)
    optimizer = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=1e-3)
    counted = 0
    with FlopMeter(model, optimizer=optimizer, nvml=False) as meter:
        for _ in range(epochs):
            for text in TEXTS:
                ids = tok(text, return_tensors="pt")["input_ids"][:, :SEQ_LEN]
                with FlopCounterMode(display=False) as counter:
                    model(input_ids=ids, labels=ids).loss.backward()
                counted += counter.get_total_flops()
                optimizer.step()
                optimizer.zero_grad(set_to_none=True)
    report = meter.report()
    return report, counted


@pytest.mark.slow
@pytest.mark.parametrize("method", ["full", "lora"])
def test_plan_agrees_with_the_metered_run(plan_files, method):
    model_dir, data, tok = plan_files
    plan = estimate(
        model=model_dir,
        dataset=data,
        tokenizer=tok,
        epochs=2,
        seq_len=SEQ_LEN,
        methods=[method],
        lora_r=LORA["r"],
        lora_targets=LORA["targets"],
    )
    planned = plan.methods[0]
    report, dispatch = train_under_meter(method, tok, epochs=2)
    # token statistics, counted here: 5 + 9 + 17 + min(30, 24) words, twice
    lengths = [5, 9, 17, 24]
    assert planned.tokens == 2 * sum(lengths) == report.tokens.tokens_processed
    assert planned.sum_sq_seq_len == 2 * sum(n * n for n in lengths)
    metered = report.compute.estimates["transformer"].flops
    assert planned.flops == pytest.approx(metered, rel=0.02)
    assert planned.flops == pytest.approx(dispatch, rel=0.02)
    assert (
        planned.n_total == report.model.n_total and planned.n_trainable == report.model.n_trainable
    )


def test_lora_plan_costs_less_than_full_and_counts_peft_trainables(plan_files):
    model_dir, _, _ = plan_files
    plan = estimate(model=model_dir, tokens=1000, seq_len=SEQ_LEN, methods=["full", "lora"],
                    lora_r=4, lora_targets=("q_proj", "v_proj"))  # fmt: skip
    full, lora = plan.methods
    assert lora.flops < full.flops
    config = transformers.AutoConfig.for_model(**CONFIG)
    base = transformers.AutoModelForCausalLM.from_config(config)
    assert full.n_trainable == full.n_total == sum(p.numel() for p in base.parameters())
    wrapped = peft.get_peft_model(base, peft.LoraConfig(r=4, target_modules=["q_proj", "v_proj"]))
    trainable, total = wrapped.get_nb_trainable_parameters()
    assert (lora.n_trainable, lora.n_total) == (trainable, total)
    # by hand: per layer A (32x4) + B (4x32) on q, A (32x4) + B (4x16) on v; 3 layers
    assert trainable == 3 * (128 + 128 + 128 + 64)
