"""Shared pieces of the integration tests: a tiny model config, a deterministic dataset with
known lengths, a padding collator that records what it fed, and an in-memory tokenizer.

Nothing here counts tokens the way flopmeter does: the expected counts come from the dataset's
own lengths and from the batches the collator produced.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import torch

PAD_ID = 0
VOCAB = 96


def tiny_llama_config(**overrides: Any):
    """A two-layer Llama-style config small enough to train in well under a second per step."""
    from transformers import LlamaConfig

    values = dict(
        vocab_size=VOCAB,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
        pad_token_id=PAD_ID,
        tie_word_embeddings=False,
    )
    values.update(overrides)
    return LlamaConfig(**values)


def sequences(n: int, seed: int, min_len: int = 3, max_len: int = 16) -> list[list[int]]:
    """``n`` token-id lists of seeded random lengths, ids in ``1..VOCAB-1`` (never the pad id)."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(n):
        length = int(torch.randint(min_len, max_len + 1, (1,), generator=g))
        out.append(torch.randint(1, VOCAB, (length,), generator=g).tolist())
    return out


def sequence_truth(model: torch.nn.Module, rows: list[list[int]]) -> int:
    """PyTorch's own count (``FlopCounterMode``) of one forward+backward pass over each row on
    its own (no padding), summed: the training FLOP of those rows."""
    from torch.utils.flop_counter import FlopCounterMode

    total = 0
    for row in rows:
        ids = torch.tensor([row])
        with FlopCounterMode(display=False) as counter:
            model(input_ids=ids, labels=ids).loss.backward()
        total += counter.get_total_flops()
        model.zero_grad()
    return total


class TokenDataset(torch.utils.data.Dataset):
    """A map-style dataset of ``{"input_ids": [...], "split": split}`` rows."""

    def __init__(self, rows: list[list[int]], split: str = "train") -> None:
        self.rows = rows
        self.split = split

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, i: int) -> dict[str, Any]:
        return {"input_ids": self.rows[i], "split": self.split}

    def total_tokens(self) -> int:
        return sum(len(r) for r in self.rows)


class RecordingCollator:
    """Right-pads a list of rows to the longest and remembers what each training batch held
    (rows of another ``split`` are collated but not recorded).

    ``mask_in_batch=False`` leaves ``attention_mask`` out, so that padding is only visible
    through the pad id.
    """

    def __init__(self, mask_in_batch: bool = True) -> None:
        self.mask_in_batch = mask_in_batch
        self.non_padding: list[int] = []
        self.with_padding: list[int] = []

    def __call__(self, rows: list[dict[str, Any]]) -> dict[str, torch.Tensor]:
        width = max(len(r["input_ids"]) for r in rows)
        ids = torch.full((len(rows), width), PAD_ID, dtype=torch.long)
        mask = torch.zeros((len(rows), width), dtype=torch.long)
        for i, r in enumerate(rows):
            ids[i, : len(r["input_ids"])] = torch.tensor(r["input_ids"])
            mask[i, : len(r["input_ids"])] = 1
        if all(r.get("split", "train") == "train" for r in rows):
            self.non_padding.append(sum(len(r["input_ids"]) for r in rows))
            self.with_padding.append(len(rows) * width)
        batch = {"input_ids": ids, "labels": ids.masked_fill(mask == 0, -100)}
        if self.mask_in_batch:
            batch["attention_mask"] = mask
        return batch


def word_tokenizer():
    """A word-level tokenizer built in memory (no download): ``[PAD]``=0, ``[UNK]``=1,
    ``[EOS]``=2, then ``w3`` .. ``w{VOCAB-1}``."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {"[PAD]": 0, "[UNK]": 1, "[EOS]": 2}
    vocab.update({f"w{i}": i for i in range(3, VOCAB)})
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    return PreTrainedTokenizerFast(
        tokenizer_object=tok, pad_token="[PAD]", unk_token="[UNK]", eos_token="[EOS]"
    )


def texts(n: int, seed: int) -> list[str]:
    """``n`` sentences of words ``w3`` .. ``w{VOCAB-1}`` of seeded random lengths."""
    return [" ".join(f"w{max(t, 3)}" for t in row) for row in sequences(n, seed)]


def record_writes() -> None:
    """Makes every FlopReport.write_json call append ``rank path`` to $FM_WRITES_LOG."""
    from flopmeter import distributed
    from flopmeter.report import FlopReport

    log = os.environ["FM_WRITES_LOG"]
    original = FlopReport.write_json

    def write_json(self, path):
        with open(log, "a", encoding="utf-8") as f:
            f.write(f"{distributed.rank()} {path}\n")
        return original(self, path)

    FlopReport.write_json = write_json


def dump_rank_facts(folder: str | os.PathLike[str], rank: int, **facts: Any) -> None:
    """Writes what a rank fed (its own count) to ``folder/rank{rank}.json``."""
    Path(folder, f"rank{rank}.json").write_text(json.dumps(facts), encoding="utf-8")
