"""Batches whose counts the tests know: padded batches, token-id rows of seeded lengths, a
dataset of rows and a collator that records what it fed.

Nothing here counts tokens the way flopmeter does: the expected counts come from the lengths
the batches are made of and from the batches a collator produced.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

PAD_ID = 0
#: The vocabulary of ``sequences``, ``TokenDataset`` rows and ``tests.support.text``.
WORD_VOCAB = 96


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


def mixed_batches(device: str = "cpu") -> list[dict[str, torch.Tensor]]:
    """Right- and left-padded batches with masks, ids-only batches, and packed batches
    (vocabulary 64, pad id 0)."""
    g = torch.Generator().manual_seed(0)
    out = []
    for i in range(8):
        rows, cols = 3 + i % 2, 10 + i
        lengths = torch.randint(1, cols + 1, (rows,), generator=g)
        ids = torch.zeros((rows, cols), dtype=torch.int64 if i % 2 else torch.int32)
        for r, n in enumerate(lengths.tolist()):
            values = torch.randint(1, 64, (n,), generator=g)
            if i % 4 < 2:
                ids[r, :n] = values  # right padding
            else:
                ids[r, cols - n :] = values  # left padding
        batch = {"input_ids": ids, "labels": ids.long().masked_fill(ids == 0, -100)}
        if i % 3 != 2:
            batch["attention_mask"] = (ids != 0).long()
        out.append(batch)
    docs = [4, 7, 1, 5]
    packed = torch.randint(1, 64, (1, sum(docs)), generator=g)
    position_ids = torch.cat([torch.arange(n) for n in docs]).unsqueeze(0)
    cu = torch.tensor([0, *torch.tensor(docs).cumsum(0).tolist()], dtype=torch.int32)
    out.append({"input_ids": packed, "labels": packed, "position_ids": position_ids})
    out.append({"input_ids": packed, "labels": packed, "cu_seq_lens_q": cu})
    return [{k: v.to(device) for k, v in b.items()} for b in out]


def sequences(n: int, seed: int, min_len: int = 3, max_len: int = 16) -> list[list[int]]:
    """``n`` token-id lists of seeded random lengths, ids in ``1..WORD_VOCAB-1`` (never the pad
    id)."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(n):
        length = int(torch.randint(min_len, max_len + 1, (1,), generator=g))
        out.append(torch.randint(1, WORD_VOCAB, (length,), generator=g).tolist())
    return out


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
