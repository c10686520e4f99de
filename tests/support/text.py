"""An in-memory word tokenizer (no download) and texts over its words."""

from __future__ import annotations

from tests.support.batches import WORD_VOCAB, sequences


def word_tokenizer():
    """A word-level tokenizer built in memory (no download): ``[PAD]``=0, ``[UNK]``=1,
    ``[EOS]``=2, then ``w3`` .. ``w{WORD_VOCAB-1}``."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {"[PAD]": 0, "[UNK]": 1, "[EOS]": 2}
    vocab.update({f"w{i}": i for i in range(3, WORD_VOCAB)})
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    return PreTrainedTokenizerFast(
        tokenizer_object=tok, pad_token="[PAD]", unk_token="[UNK]", eos_token="[EOS]"
    )


def texts(n: int, seed: int) -> list[str]:
    """``n`` sentences of words ``w3`` .. ``w{WORD_VOCAB-1}`` of seeded random lengths."""
    return [" ".join(f"w{max(t, 3)}" for t in row) for row in sequences(n, seed)]
