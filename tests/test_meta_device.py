"""A run on the ``meta`` device: how a planner costs a full-size model without allocating it.

Meta tensors hold no values, so the meter counts their tokens from the shapes (every position
real, an upper bound) and withholds the verdict; the estimates are the cost of those shapes.
"""

from __future__ import annotations

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

from flopmeter import FlopMeter
from flopmeter.counting.counters import META_REASON, RunCounters
from flopmeter.flops.architecture import bundled_config
from flopmeter.flops.aten_ops import measured_formulas
from flopmeter.tokens.batch import TokenInputs, shape_stats

pytest.importorskip("transformers")


def _meta_llama_8b() -> torch.nn.Module:
    import transformers

    config = transformers.AutoConfig.for_model(**bundled_config("llama-3.1-8b"))
    with torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(config)
    return model.train()


def _train_step(model: torch.nn.Module, optimizer: torch.optim.Optimizer, ids) -> None:
    model(input_ids=ids, labels=ids).loss.backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)


@pytest.mark.slow
def test_full_size_model_on_meta_gets_a_report_whose_transformer_estimate_is_the_dispatch_count():
    model = _meta_llama_8b()
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-4)
    ids = torch.zeros((2, 256), dtype=torch.long, device="meta")
    # No attention_mask: transformers reads the mask's values (padding or not) to pick the
    # attention path, which meta tensors cannot answer. The pad id cannot be applied either.
    with FlopMeter(model, pad_id=0, optimizer=optimizer, nvml=False) as meter:
        _train_step(model, optimizer, ids)
    report = meter.report()
    assert not meter.problems
    with FlopCounterMode(display=False, custom_mapping=measured_formulas()) as counter:
        model(input_ids=ids, labels=ids).loss.backward()
    truth = counter.get_total_flops()

    transformer = report.compute.estimates["transformer"].flops
    assert transformer == pytest.approx(truth, rel=1e-6)
    assert report.compute.estimates["measured"].flops == pytest.approx(truth, rel=1e-6)
    assert report.tokens.tokens_processed == report.tokens.tokens_seen == 512
    assert report.tokens.sequences == 2 and report.tokens.sum_sq_seq_len == 2 * 256**2
    # No values were read: the shapes' cost is reported, the run gets no verdict.
    assert report.tokens.micro_batches_unread == 1
    assert report.compute.primary_flops is None and report.verdict.outcome is None
    assert any("meta device" in note for note in report.notes)


def test_meta_tokens_are_counted_from_shapes_as_an_upper_bound():
    ids = torch.zeros((3, 10), dtype=torch.long, device="meta")
    positions = torch.zeros((1, 10), dtype=torch.long, device="meta")
    inputs = TokenInputs(ids, attention_mask=torch.ones_like(ids), position_ids=positions)
    assert shape_stats(inputs, pad_id=0) == (30, 30, 3, 300)
    assert shape_stats(TokenInputs(ids[:, :0])) == (0, 0, 0, 0)

    counters = RunCounters()
    counters.add_micro_batch(inputs, pad_id=0)
    counters.add_micro_batch(TokenInputs(torch.ones(4, dtype=torch.long)), pad_id=0)  # real
    counters.micro_batches = 2
    snap = counters.snapshot(sync=False)
    assert (snap.totals.tokens_processed, snap.totals.sum_sq_seq_len) == (34, 316)
    assert (snap.unread, snap.unread_reason) == (1, META_REASON)
