"""The planner's figure for state-space and hybrid models equals PyTorch's count of the run.

Tiny Mamba2 and Jamba configurations (Mamba2's chunked scan; Jamba's Mamba mixers beside
attention and experts), written to a ``config.json`` and planned with ``estimate`` (what
``flopmeter estimate CONFIG`` runs), full fine-tuning and LoRA. The planner costs Jamba with
the FLOP model (its selective-scan mixers are modelled) and Mamba2 by its dispatch count on meta
(the chunked scan is not); the truth here is independent of both: the same configuration built on the CPU with real weights (eager attention
and experts), each planned sequence run as its own training step under PyTorch's
``FlopCounterMode`` with flopmeter's registry, the counts summed. On Mamba2, peft refuses LoRA on
the mixer's ``out_proj``, so the planner takes ``all-linear`` as ``in_proj`` and says so; the
truth is built with those targets.
"""

from __future__ import annotations

import json

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

from flopmeter.flops.aten_ops import measured_formulas
from flopmeter.planner import estimate
from tests.support.models import tiny_jamba_config, tiny_mamba2_config

transformers = pytest.importorskip("transformers")
peft = pytest.importorskip("peft")

pytestmark = pytest.mark.slow

#: How the planner costs each: Jamba's selective-scan mixers by the FLOP model (the
#: ``transformer`` estimate, checked against the dispatch count of one sequence on meta);
#: Mamba2's chunked scan, which the FLOP model has no formula for, by the dispatch count.
COSTED_BY = {"jamba": "transformer", "mamba2": "dispatch"}
SEQ_LEN = 16
SEQUENCES = 3
VOCAB = 64


def _config(family: str):
    if family == "mamba2":
        return tiny_mamba2_config(vocab_size=VOCAB, chunk_size=8)
    return tiny_jamba_config(vocab_size=VOCAB)


def _truth(family: str, mode: str) -> float:
    """PyTorch's count of the planned run: ``SEQUENCES`` training steps of one sequence each."""
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(
        _config(family), attn_implementation="eager", experts_implementation="eager"
    )
    if mode == "lora":
        targets = ["in_proj"] if family == "mamba2" else "all-linear"
        config = peft.LoraConfig(r=4, lora_alpha=8, target_modules=targets, lora_dropout=0.0)
        model = peft.get_peft_model(model, config)
    model.train()
    total = 0
    for seed in range(SEQUENCES):
        ids = torch.randint(0, VOCAB, (1, SEQ_LEN), generator=torch.Generator().manual_seed(seed))
        with FlopCounterMode(display=False, custom_mapping=measured_formulas()) as counter:
            model(input_ids=ids, labels=ids).loss.backward()
        model.zero_grad(set_to_none=True)
        total += counter.get_total_flops()
    return float(total)


@pytest.mark.parametrize("family", ["mamba2", "jamba"])
def test_the_plan_of_a_mixer_model_is_the_count_of_its_run(family, tmp_path):
    values = _config(family).to_dict()
    values.pop("time_step_limit", None)  # (0, inf): JSON has no infinity; it is the default
    path = tmp_path / "config.json"
    path.write_text(json.dumps(values))
    plan = estimate(
        model=str(path),
        tokens=SEQ_LEN * SEQUENCES,
        seq_len=SEQ_LEN,
        methods=["full", "lora"],
        lora_r=4,
    )
    by_method = {m.method: m for m in plan.methods}
    for mode in ("full", "lora"):
        planned = by_method[mode]
        assert planned.estimate == COSTED_BY[family]
        assert planned.flops == pytest.approx(_truth(family, mode), rel=1e-9)
    narrowed = [n for n in plan.notes if "peft refuses LoRA on a Mamba mixer" in n]
    assert bool(narrowed) == (family == "mamba2")
