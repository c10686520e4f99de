"""A function compiled by ``torch.compile`` inside the model (issue 11): cut-cross-entropy's
``impl="torch_compile"`` fused loss computes the output projection from ``lm_head.weight`` in a
``torch.compile(fullgraph=True)`` function.

Before, a measured sample (a dispatch mode) made torch.compile raise inside the user's training
step, and with sampling off the projection was missing from the compute without a note. Now the
sample lets the compiled function run and counts its matrix products at run time; the profile
sees that something was compiled inside the forward pass, says so, and forces the measured
cross-check even when sampling is off. The truth is PyTorch's dispatch-level count of the same
model with the loss written out eagerly.
"""

from __future__ import annotations

import re

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.flop_counter import FlopCounterMode

from flopmeter import FlopMeter
from tests.support.models import tiny_llama_config

transformers = pytest.importorskip("transformers")
cce = pytest.importorskip("cut_cross_entropy")

pytestmark = pytest.mark.slow

VOCAB, HIDDEN = 96, 32
COMPILED_NOTE = "a function compiled by torch.compile inside the forward pass"


def _compiled_projection_loss(h: torch.Tensor, w: torch.Tensor, labels: torch.Tensor):
    logits = (h[:, :-1] @ w.T).float()
    return F.cross_entropy(logits.flatten(0, 1), labels[:, 1:].flatten())


_stand_in = torch.compile(_compiled_projection_loss, fullgraph=True)


class FusedLossLM(nn.Module):
    """A tiny Llama whose loss is a fused linear-cross-entropy on ``lm_head.weight``.

    ``loss``: ``"cce"`` (cut-cross-entropy, ``impl="torch_compile"``), ``"stand_in"`` (a
    ``torch.compile(fullgraph=True)`` function of our own) or ``"eager"`` (the same loss,
    uncompiled: the truth's model).
    """

    def __init__(self, loss: str) -> None:
        super().__init__()
        torch.manual_seed(0)
        # the shared tiny Llama (hidden size 32 = HIDDEN, pad id 0, untied head) with this
        # file's vocabulary and LlamaConfig's default context length
        config = tiny_llama_config(vocab_size=VOCAB, max_position_embeddings=2048)
        self.config = config
        self.model = transformers.LlamaModel(config)
        self.model.config._attn_implementation = "eager"
        self.lm_head = nn.Linear(HIDDEN, VOCAB, bias=False)
        self.loss = loss

    def get_output_embeddings(self) -> nn.Module:
        return self.lm_head

    def forward(self, input_ids, attention_mask=None, labels=None):
        h = self.model(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state
        w = self.lm_head.weight
        if self.loss == "cce":
            return cce.linear_cross_entropy(h, w, labels, impl="torch_compile", shift=1)
        if self.loss == "stand_in":
            return _stand_in(h, w, labels)
        return _compiled_projection_loss(h, w, labels)


def _batches(n: int = 4) -> list[dict[str, torch.Tensor]]:
    g = torch.Generator().manual_seed(3)
    out = []
    for _ in range(n):
        ids = torch.randint(1, VOCAB, (2, 12), generator=g)
        out.append({"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": ids})
    return out


def _truth_flops(batches: list[dict[str, torch.Tensor]]) -> int:
    """The dispatch-level count of the eager twin, forward and backward, every micro-batch."""
    model = FusedLossLM("eager")
    total = 0
    for batch in batches:
        with FlopCounterMode(display=False) as counter:
            model(**batch).backward()
        total += counter.get_total_flops()
        model.zero_grad()
    return total


def _train(loss: str, **options) -> tuple:
    model = FusedLossLM(loss)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    batches = _batches()
    with FlopMeter(model, pad_id=0, output=None, **options) as meter:
        for batch in batches:
            model(**batch).backward()
            optimizer.step()
            optimizer.zero_grad()
    return meter.report(), _truth_flops(batches)


@pytest.mark.parametrize("loss", ["cce", "stand_in"])
@pytest.mark.parametrize("measure_every", [None, 0])
def test_compiled_fused_loss_trains_and_is_counted(loss: str, measure_every: int | None) -> None:
    options = {} if measure_every is None else {"measure_every": measure_every}
    report, truth = _train(loss, **options)
    assert report.run.status == "completed"
    measured = report.compute.estimates["measured"].flops
    assert measured == pytest.approx(truth, rel=1e-9)
    # the profile cannot see the compiled projection: the transformer figure is low, so the
    # dispatch count is primary, and the report says why
    assert report.compute.estimates["transformer"].flops < 0.9 * truth
    assert report.compute.primary_estimate == "measured"
    assert report.compute.primary_flops == pytest.approx(truth, rel=1e-9)
    assert report.compute.primary_reason.startswith("measured:")
    # a note names what the profile could not model: the compiled function when it was compiled
    # during the profile, else the weight whose memory the compiled code read (lm_head)
    notes = " ".join(report.compute.estimates["transformer"].notes + report.notes)
    assert f"cannot fully model {COMPILED_NOTE}" in notes or "cannot fully model lm_head" in notes


def test_compiled_model_whose_head_runs_outside_its_module_is_named() -> None:
    """A model compiled as a whole whose loss uses ``lm_head.weight`` directly: the compiled code
    hides that use (the weight watch does not run in compiled models), so the transformer figure
    misses the projection; the report must say so, naming lm_head. The cross-check this forces
    even with sampling off runs through the eager module (issue 30), counts the projection and
    is the primary figure."""
    model = FusedLossLM("eager")
    compiled = torch.compile(model)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    batches = _batches(2)
    with FlopMeter(compiled, pad_id=0, output=None, measure_every=0) as meter:
        for batch in batches:
            compiled(**batch).backward()
            optimizer.step()
            optimizer.zero_grad()
    report = meter.report()
    assert report.run.status == "completed"
    truth = _truth_flops(batches)
    assert report.compute.estimates["transformer"].flops < 0.9 * truth
    notes = " ".join(report.compute.estimates["transformer"].notes + report.notes)
    assert re.search(
        r"cannot fully model (_orig_mod\.)?lm_head: .*a measured sample, run eagerly, is taken",
        notes,
    )
    assert report.compute.primary_estimate == "measured"
    assert report.compute.primary_flops == pytest.approx(truth, rel=1e-9)
