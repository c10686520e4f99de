"""The meter counts packed batches as Hugging Face makes them (real collator, real model)."""

from __future__ import annotations

import pytest
import torch

from flopmeter import FlopMeter
from tests.support.models import tiny_llama_config

transformers = pytest.importorskip("transformers")

DOCS = [[5, 6, 7], [8, 9, 10, 11, 12], [13], [14, 15, 16, 17]]


def _model():
    torch.manual_seed(0)
    # the shared tiny Llama with one layer of two heads, a 64-word vocabulary and no pad id
    config = tiny_llama_config(
        vocab_size=64,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=1,
        pad_token_id=None,
    )
    return transformers.LlamaForCausalLM(config)


@pytest.mark.slow
@pytest.mark.parametrize("flash_kwargs", [False, True])
def test_flattened_batch_counts_each_document(flash_kwargs):
    collator = transformers.DataCollatorWithFlattening(return_flash_attn_kwargs=flash_kwargs)
    batch = collator([{"input_ids": d} for d in DOCS])
    assert batch["input_ids"].shape == (1, 13)
    assert ("cu_seq_lens_q" in batch) is flash_kwargs
    model = _model()
    with FlopMeter(model, pad_id=0) as meter:
        model.train()
        model(**batch).loss.backward()
    r = meter.report()
    # documents of 3, 5, 1 and 4 tokens: 9 + 25 + 1 + 16 = 51 (one 13-token row: 169)
    assert (
        r.tokens.tokens_processed,
        r.tokens.tokens_seen,
        r.tokens.sequences,
        r.tokens.sum_sq_seq_len,
    ) == (13, 13, 4, 51)
    assert meter.problems == {}


def test_cu_seqlens_alone_mark_documents():
    flat = torch.tensor([[t for doc in DOCS for t in doc]])
    cu = torch.tensor([0, 3, 8, 9, 13], dtype=torch.int32)
    model = _model()
    with FlopMeter(model) as meter:
        model.train()
        model(input_ids=flat, labels=flat, cu_seq_lens_q=cu, cu_seq_lens_k=cu).loss.backward()
    r = meter.report()
    assert (r.tokens.tokens_processed, r.tokens.sequences, r.tokens.sum_sq_seq_len) == (13, 4, 51)


class _Echo(torch.nn.Module):
    """Takes Hugging Face style keyword arguments; trains one weight."""

    def __init__(self) -> None:
        super().__init__()
        self.w = torch.nn.Parameter(torch.ones(()))

    def forward(self, input_ids, attention_mask=None, **kwargs):
        return self.w * input_ids.float().sum()


def test_three_dimensional_position_ids_are_not_documents():
    model = _Echo()
    ids = torch.tensor([[5, 6, 7, 0]])
    mask = torch.tensor([[1, 1, 1, 0]])
    mrope = torch.zeros(3, 1, 4, dtype=torch.long)  # multimodal rotary positions, [3, B, T]
    with FlopMeter(model) as meter:
        model(input_ids=ids, attention_mask=mask, position_ids=mrope).backward()
    r = meter.report()
    assert (r.tokens.tokens_processed, r.tokens.sequences, r.tokens.sum_sq_seq_len) == (3, 1, 9)
    assert meter.problems == {}


def test_position_ids_that_do_not_fit_are_noted_and_training_goes_on():
    model = _Echo()
    ids = torch.tensor([[5, 6, 7, 0], [1, 2, 0, 0]])
    with FlopMeter(model, pad_id=0) as meter:
        model(input_ids=ids, position_ids=torch.zeros(3, 4, dtype=torch.long)).backward()
        model(input_ids=ids).backward()
    r = meter.report()
    assert r.tokens.micro_batches == 2
    assert (r.tokens.tokens_processed, r.tokens.sequences) == (5, 2)  # the second batch only
    assert any("position_ids of shape (3, 4)" in note for note in r.notes)
