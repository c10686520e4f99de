"""The planner tests' model and tokenizer: a tiny Llama ``config.json`` and a word-level
tokenizer built here (never downloaded)."""

from __future__ import annotations

from pathlib import Path

CONFIG = {
    "model_type": "llama",
    "vocab_size": 64,
    "hidden_size": 32,
    "intermediate_size": 64,
    "num_hidden_layers": 3,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "max_position_embeddings": 128,
    "tie_word_embeddings": False,
}
WORDS = [f"w{i}" for i in range(40)]


def make_tokenizer(folder: Path) -> Path:
    """A word-level tokenizer over WORDS, saved as a transformers tokenizer folder."""
    import transformers
    from tokenizers import Tokenizer, models, pre_tokenizers

    vocab = {"[UNK]": 0, "[PAD]": 1, **{w: i + 2 for i, w in enumerate(WORDS)}}
    core = Tokenizer(models.WordLevel(vocab=vocab, unk_token="[UNK]"))
    core.pre_tokenizer = pre_tokenizers.Whitespace()
    fast = transformers.PreTrainedTokenizerFast(
        tokenizer_object=core, unk_token="[UNK]", pad_token="[PAD]"
    )
    fast.save_pretrained(folder)
    return folder
