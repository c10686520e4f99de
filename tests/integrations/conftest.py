"""Fixtures of the integration tests: the tiny causal LMs TRL's trainers load from a folder."""

from __future__ import annotations

import pytest

from tests.support.batches import WORD_VOCAB
from tests.support.models import tiny_llama
from tests.support.text import word_tokenizer


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """The tiny causal LM saved to a folder (TRL makes its reference model from the path)."""
    tok = word_tokenizer()
    path = tmp_path_factory.mktemp("tiny") / "model"
    tiny_llama(
        vocab_size=WORD_VOCAB, eos_token_id=tok.eos_token_id, attn_implementation="eager"
    ).save_pretrained(path)
    return path


@pytest.fixture(scope="module")
def teacher_saved(tmp_path_factory):
    """A larger tiny causal LM (hidden size 64) saved to a folder: the distillation teacher."""
    path = tmp_path_factory.mktemp("teacher") / "model"
    tiny_llama(
        vocab_size=WORD_VOCAB,
        eos_token_id=word_tokenizer().eos_token_id,
        attn_implementation="eager",
        hidden_size=64,
        intermediate_size=128,
    ).save_pretrained(path)
    return path
