"""Hypothesis strategies for packed token batches: documents marked by ``position_ids`` or
``cu_seqlens``, with the edge cases the statistics' rules name (see ``flopmeter.tokens.stats``).

Position rows are built from segments: documents whose positions start at 0 or elsewhere, runs
of padding whose positions repeat (Hugging Face fills them with 1), are 0, or go on from the
previous token, and random positions. Ids put the pad id at document starts, inside documents
and at their ends (a closing EOS that is the pad id). Offsets include empty documents, offsets
that go back (overlapping documents), negative ones and ones past the batch. Shapes are 1-D,
2-D or 3-D (the leading dimensions fold into rows), contiguous or not; masks are bool, int or
float, or none. The truth to check against is ``tests.support.token_truth.true_stats``.
"""

from __future__ import annotations

from typing import Any

import torch
from hypothesis import strategies as st

from tests.support.token_truth import Case


def _position_row(draw: Any, cols: int, g: torch.Generator) -> list[int]:
    out: list[int] = []
    while len(out) < cols:
        kind = draw(st.sampled_from(["doc", "doc", "doc_offset", "pad_ones", "pad_zeros", "go_on"]))
        n = draw(st.integers(1, max(1, cols)))
        if kind == "doc":
            out.extend(range(n))
        elif kind == "doc_offset":
            first = draw(st.integers(-3, 5))
            out.extend(range(first, first + n))
        elif kind == "pad_ones":
            out.extend([1] * n)
        elif kind == "pad_zeros":
            out.extend([0] * n)
        else:  # positions that go on from the previous token
            last = out[-1] if out else 0
            out.extend(range(last + 1, last + 1 + n))
        if draw(st.integers(0, 9)) == 0:
            out.extend(torch.randint(0, 3, (n,), generator=g).tolist())
    return out[:cols]


def _ids(draw: Any, rows: int, cols: int, pad: int, g: torch.Generator) -> torch.Tensor:
    density = draw(st.sampled_from([0.0, 0.1, 0.5, 0.9, 1.0]))
    ids = torch.randint(4, 50, (rows, cols), generator=g)
    pads = torch.rand((rows, cols), generator=g) < density
    if draw(st.booleans()):  # right padding after the packed documents
        tail = draw(st.integers(0, cols))
        pads[:, cols - tail :] = True
    return ids.masked_fill(pads, pad)


@st.composite
def packed_batches(draw: Any, max_rows: int = 4, max_cols: int = 40) -> Case:
    """Random packed micro-batches (keyword arguments for the token functions)."""
    n_dims = draw(st.sampled_from([1, 2, 2, 3]))
    if n_dims == 1:
        lead: tuple[int, ...] = ()
    elif n_dims == 2:
        lead = (draw(st.integers(1, max_rows)),)
    else:
        lead = (draw(st.integers(1, 2)), draw(st.integers(1, 2)))
    rows = 1
    for d in lead:
        rows *= d
    cols = draw(st.integers(1, max_cols))
    shape = (*lead, cols)
    pad = draw(st.sampled_from([0, 1, 2]))
    g = torch.Generator().manual_seed(draw(st.integers(0, 2**31 - 1)))
    ids = _ids(draw, rows, cols, pad, g).to(draw(st.sampled_from([torch.int32, torch.int64])))
    if draw(st.booleans()):  # not contiguous
        ids = ids.t().contiguous().t() if cols > 1 and rows > 1 else ids[:, ::1]
    kwargs: dict[str, Any] = {"input_ids": ids.reshape(shape)}
    mask_kind = draw(st.sampled_from([None, None, "bool", "int", "float", "strided_bool"]))
    if mask_kind is not None:
        mask = torch.rand((rows, cols), generator=g) < 0.7
        if mask_kind == "int":
            mask = mask.to(torch.int64) * torch.randint(1, 3, (rows, cols), generator=g)
        elif mask_kind == "float":
            mask = mask.to(torch.float32)
        elif mask_kind == "strided_bool":
            wide = torch.zeros((rows, 2 * cols), dtype=torch.bool)
            wide[:, ::2] = mask
            mask = wide[:, ::2]
        # a 3-D mask is not a mask (the ids decide): the statistics ignore it
        kwargs["attention_mask"] = mask.reshape(shape)
    kwargs["pad_id"] = draw(st.sampled_from([None, pad, pad]))
    packing = draw(st.sampled_from(["positions", "positions", "broadcast", "cu", "cu"]))
    if packing == "positions":
        pos = torch.tensor([_position_row(draw, cols, g) for _ in range(rows)])
        pos = pos.to(draw(st.sampled_from([torch.int32, torch.int64])))
        if n_dims == 2 and draw(st.booleans()):  # not contiguous: column-major, or strided
            if draw(st.booleans()):
                pos = pos.t().contiguous().t()
            else:
                wide = torch.zeros((rows, 2 * cols), dtype=pos.dtype)
                wide[:, ::2] = pos
                pos = wide[:, ::2]
        kwargs["position_ids"] = pos.reshape(shape)
    elif packing == "broadcast":
        row = torch.tensor(_position_row(draw, cols, g)).reshape(1, cols)
        kwargs["position_ids"] = row if n_dims > 1 else row[0]
    else:
        total = rows * cols
        offsets = sorted(draw(st.lists(st.integers(0, total), max_size=8)))
        cu = [0, *offsets, total]
        if draw(st.booleans()):  # empty documents: offsets repeated
            at = draw(st.integers(0, len(cu) - 1))
            cu.insert(at, cu[at])
        if draw(st.booleans()):  # an offset that goes back, or below 0, or past the batch
            cu.insert(draw(st.integers(0, len(cu))), draw(st.integers(-3, total + 3)))
        if draw(st.booleans()):
            cu.append(total + draw(st.integers(1, 5)))
        if draw(st.integers(0, 9)) == 0:
            cu = draw(st.sampled_from([[], [0], [total]]))
        kwargs["cu_seqlens"] = torch.tensor(
            cu, dtype=draw(st.sampled_from([torch.int32, torch.int64]))
        )
    return Case(kwargs, f"{n_dims}-D/{mask_kind}/{packing}/pad {kwargs['pad_id']}")
