"""Independent truth for token statistics, and hypothesis strategies for token batches.

The truth is plain Python over nested lists, written from the specification in
``flopmeter.tokens.stats`` (not from its code): it walks every token.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, field
from typing import Any

import torch
from hypothesis import strategies as st

from flopmeter.tokens.batch import TokenInputs


def _rows(t: torch.Tensor) -> list[list[Any]]:
    if t.dim() == 1:
        return [t.tolist()]
    return t.reshape(math.prod(t.shape[:-1]), t.shape[-1]).tolist()


def true_stats(
    *,
    input_ids: torch.Tensor | None = None,
    attention_mask: torch.Tensor | None = None,
    pad_id: int | None = None,
    position_ids: torch.Tensor | None = None,
    cu_seqlens: torch.Tensor | None = None,
) -> tuple[int, int, int, int]:
    """(tokens, tokens_seen, sequences, sum of squared lengths), by walking the tokens."""
    by_ids = False  # real tokens are ids != pad_id (refined by positions, ignored by cu_seqlens)
    if attention_mask is not None and attention_mask.dim() <= 2:
        grid = _rows(attention_mask)
        real = [[v != 0 for v in row] for row in grid]
    else:
        assert input_ids is not None
        grid = _rows(input_ids)
        if pad_id is None or input_ids.is_floating_point():
            real = [[True for _ in row] for row in grid]
        else:
            by_ids = True
            real = [[v != pad_id for v in row] for row in grid]
    n_rows = len(real)
    n_cols = len(real[0]) if real else 0
    seen = n_rows * n_cols
    lengths: list[int] = []
    if position_ids is not None:
        pos = _rows(position_ids)
        if len(pos) == 1 and n_rows != 1:
            pos = pos * n_rows
        tokens = 0
        for r in range(n_rows):
            current = 0
            for t in range(n_cols):
                starts = t == 0 or pos[r][t] != pos[r][t - 1] + 1
                if starts:
                    if t > 0:
                        lengths.append(current)
                    current = 0
                elif by_ids and real[r][t - 1]:
                    # a pad-id token that continues a document after a real token is real
                    real[r][t] = True
                current += real[r][t]
                tokens += real[r][t]
            if n_cols:
                lengths.append(current)
    elif cu_seqlens is not None:
        if by_ids:  # the documents are explicit: every token inside one is real
            real = [[True for _ in row] for row in real]
        flat = [v for row in real for v in row]
        # offsets that go back never reopen a document: each starts at the largest offset yet
        offsets = list(itertools.accumulate(cu_seqlens.tolist(), max))
        for a, b in itertools.pairwise(offsets):
            a = min(max(a, 0), seen)
            b = min(max(b, a), seen)
            lengths.append(sum(flat[a:b]))
        tokens = sum(lengths)
    else:
        lengths = [sum(row) for row in real]
        tokens = sum(lengths)
    sequences = sum(1 for n in lengths if n > 0)
    return tokens, seen, sequences, sum(n * n for n in lengths)


@dataclass
class Case:
    """A generated micro-batch: keyword arguments for the token functions."""

    kwargs: dict[str, Any] = field(default_factory=dict)
    note: str = ""


def _doc_positions(draw: Any, n_cols: int, first: int) -> list[int]:
    out: list[int] = []
    while len(out) < n_cols:
        n = draw(st.integers(1, max(1, n_cols)))
        out.extend(range(first, first + n))
    return out[:n_cols]


@st.composite
def token_batches(draw: Any, max_rows: int = 4, max_cols: int = 40) -> Case:
    """Random micro-batches: 1-D/2-D, int32/int64, left/right/random padding, masks, empty
    batches, non-contiguous views, and packing by position_ids or cu_seqlens."""
    one_d = draw(st.booleans())
    n_rows = 1 if one_d else draw(st.integers(0, max_rows))
    n_cols = draw(st.integers(0, max_cols))
    dtype = draw(st.sampled_from([torch.int32, torch.int64]))
    style = draw(st.sampled_from(["right", "left", "random"]))
    pad = draw(st.sampled_from([0, 1, 3]))
    seed = draw(st.integers(0, 2**31 - 1))
    g = torch.Generator().manual_seed(seed)
    if style == "random":
        ids = torch.randint(0, 4, (n_rows, n_cols), generator=g)
    else:
        ids = torch.full((n_rows, n_cols), pad)
        for r in range(n_rows):
            n = draw(st.integers(0, n_cols))
            values = torch.randint(4, 50, (n,), generator=g)
            if style == "right":
                ids[r, :n] = values
            else:
                ids[r, n_cols - n :] = values
    ids = ids.to(dtype)
    layout = draw(st.sampled_from(["contiguous", "transposed", "strided"]))
    if layout == "transposed":
        ids = ids.t().contiguous().t()
    elif layout == "strided":
        wide = torch.zeros((n_rows, 2 * n_cols), dtype=dtype)
        wide[:, ::2] = ids
        ids = wide[:, ::2]
    kwargs: dict[str, Any] = {"input_ids": ids[0] if one_d else ids}
    mask_kind = draw(st.sampled_from([None, "from_ids", "bool", "random"]))
    if mask_kind == "from_ids":
        kwargs["attention_mask"] = (kwargs["input_ids"] != pad).to(torch.int64)
    elif mask_kind == "bool":
        kwargs["attention_mask"] = kwargs["input_ids"] != pad
    elif mask_kind == "random":
        kwargs["attention_mask"] = torch.randint(
            0, 3, tuple(kwargs["input_ids"].shape), generator=g
        )
    kwargs["pad_id"] = draw(st.sampled_from([None, pad]))
    packing = draw(st.sampled_from([None, "docs", "docs_broadcast", "random_pos", "cu"]))
    if packing in ("docs", "random_pos"):
        first = draw(st.sampled_from([0, 2]))
        rows = []
        for _ in range(n_rows):
            if packing == "docs":
                rows.append(_doc_positions(draw, n_cols, first))
            else:
                rows.append(torch.randint(0, 4, (n_cols,), generator=g).tolist())
        pos = torch.tensor(rows, dtype=torch.int64).reshape(n_rows, n_cols)
        pos = pos.to(draw(st.sampled_from([torch.int32, torch.int64])))
        kwargs["position_ids"] = pos[0] if one_d else pos
    elif packing == "docs_broadcast":
        kwargs["position_ids"] = torch.tensor(
            _doc_positions(draw, n_cols, 0), dtype=torch.int64
        ).reshape(1, n_cols)
    elif packing == "cu":
        total = n_rows * n_cols
        cuts = sorted(draw(st.lists(st.integers(0, total), max_size=6)))
        cu = [0, *cuts, total]
        if draw(st.booleans()):  # out-of-range and decreasing offsets are clamped
            cu = [*cu, total + 3, draw(st.integers(-2, total))]
        if draw(st.booleans()):  # an offset that goes back in the middle (overlapping documents)
            cu.insert(draw(st.integers(1, len(cu) - 1)), draw(st.integers(-2, total)))
        kwargs["cu_seqlens"] = torch.tensor(
            cu, dtype=draw(st.sampled_from([torch.int32, torch.int64]))
        )
    return Case(kwargs, f"{style}/{layout}/{mask_kind}/{packing}")


def split_token_kwargs(kwargs: dict) -> tuple[TokenInputs, dict]:
    """``(TokenInputs, the other keywords)`` from keyword arguments naming the input tensors
    (``input_ids``, ``attention_mask``, ``position_ids``, ``cu_seqlens``) and ``pad_id`` etc."""
    fields = {"input_ids", "attention_mask", "position_ids", "cu_seqlens"}
    inputs = TokenInputs(**{k: v for k, v in kwargs.items() if k in fields})
    return inputs, {k: v for k, v in kwargs.items() if k not in fields}
