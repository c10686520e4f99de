"""Shared test helpers: tiny real transformers models and padded batches with known counts."""

from __future__ import annotations

from dataclasses import dataclass

import pytest
import torch

PAD_ID = 0


def tiny_llama_config(**overrides):
    """A Llama config small enough to train in milliseconds on a CPU."""
    from transformers import LlamaConfig

    kwargs = dict(
        vocab_size=97,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
        pad_token_id=PAD_ID,
        tie_word_embeddings=False,
    )
    kwargs.update(overrides)
    return LlamaConfig(**kwargs)


def tiny_llama(**overrides):
    from transformers import LlamaForCausalLM

    torch.manual_seed(0)
    return LlamaForCausalLM(tiny_llama_config(**overrides))


@dataclass
class Truth:
    """Counts made by the test itself, independently of flopmeter."""

    tokens: int = 0
    seen: int = 0
    sequences: int = 0
    sum_sq: int = 0
    micro_batches: int = 0

    def add(self, lengths: list[int], width: int) -> None:
        self.tokens += sum(lengths)
        self.seen += len(lengths) * width
        self.sequences += len(lengths)
        self.sum_sq += sum(n * n for n in lengths)
        self.micro_batches += 1


def padded_batch(lengths: list[int], width: int, vocab: int = 97, *, left: bool = False, seed=0):
    """A batch with rows of the given non-padding lengths, padded with PAD_ID to ``width``.

    Real tokens are drawn from 1..vocab-1, so ``input_ids != PAD_ID`` and the mask agree.
    """
    g = torch.Generator().manual_seed(seed)
    ids = torch.full((len(lengths), width), PAD_ID, dtype=torch.long)
    mask = torch.zeros((len(lengths), width), dtype=torch.long)
    for row, n in enumerate(lengths):
        cols = slice(width - n, width) if left else slice(0, n)
        ids[row, cols] = torch.randint(1, vocab, (n,), generator=g)
        mask[row, cols] = 1
    labels = ids.masked_fill(mask == 0, -100)
    return {"input_ids": ids, "attention_mask": mask, "labels": labels}


@pytest.fixture(autouse=True, scope="session")
def _no_pretrain_flops_from_the_shell():
    """A ``PRETRAIN_FLOPS`` set in the shell would change every threshold the tests work out by
    hand: the whole session runs without it, module fixtures included (a test that wants it sets
    it with ``monkeypatch``)."""
    with pytest.MonkeyPatch.context() as patch:
        patch.delenv("PRETRAIN_FLOPS", raising=False)
        yield


@pytest.fixture
def model():
    return tiny_llama()
