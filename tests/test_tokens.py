"""The torch token-statistics reference against hand-checked cases and an independent count."""

from __future__ import annotations

import sys

import pytest
import torch
from hypothesis import given, settings

from flopmeter.errors import MissingExtraError
from flopmeter.tokens import stats as tokens
from flopmeter.tokens.batch import (
    N_STATS,
    SLOT_SEQUENCES,
    SLOT_SUM_SQ_LEN,
    SLOT_TOKENS,
    SLOT_TOKENS_SEEN,
    TokenInputs,
    new_buffer,
)
from flopmeter.tokens.stats import accumulate_token_stats, token_stats_torch
from tests.support.token_truth import split_token_kwargs, token_batches, true_stats


def _stats(**kwargs) -> tuple[int, int, int, int]:
    buffer = new_buffer("cpu")
    inputs, rest = split_token_kwargs(kwargs)
    accumulate_token_stats(buffer, inputs, **rest)
    values = buffer.tolist()
    return (
        values[SLOT_TOKENS],
        values[SLOT_TOKENS_SEEN],
        values[SLOT_SEQUENCES],
        values[SLOT_SUM_SQ_LEN],
    )


# ------------------------------------------------------------------ hand-checked cases
RIGHT = torch.tensor([[5, 6, 7, 0, 0], [8, 0, 0, 0, 0]])


def test_right_padding_by_pad_id():
    # lengths 3 and 1: tokens 4, seen 2 * 5 = 10, sequences 2, 3^2 + 1^2 = 10
    assert _stats(input_ids=RIGHT, pad_id=0) == (4, 10, 2, 10)


def test_left_padding_by_mask_with_int32_ids():
    ids = torch.tensor([[0, 0, 5, 6, 7], [0, 9, 9, 9, 9]], dtype=torch.int32)
    mask = (ids != 0).long()
    # lengths 3 and 4: tokens 7, seen 10, 9 + 16 = 25
    assert _stats(input_ids=ids, attention_mask=mask, pad_id=None) == (7, 10, 2, 25)


def test_mask_wins_over_pad_id():
    mask = torch.tensor([[1, 1, 1, 1, 0], [1, 1, 0, 0, 0]], dtype=torch.bool)
    # lengths 4 and 2 (the mask), although ids != 0 gives 3 and 1: 16 + 4 = 20
    assert _stats(input_ids=RIGHT, attention_mask=mask, pad_id=0) == (6, 10, 2, 20)


def test_no_pad_id_counts_every_token():
    # two rows of 5: tokens 10, 25 + 25 = 50
    assert _stats(input_ids=RIGHT) == (10, 10, 2, 50)


def test_one_dimensional_batch_is_one_sequence():
    assert _stats(input_ids=torch.tensor([3, 4, 0]), pad_id=0) == (2, 3, 1, 4)


def test_three_dimensional_ids_fold_into_rows():
    ids = torch.tensor([[[1, 0], [2, 2]], [[0, 0], [3, 0]]])
    # rows [1,0] [2,2] [0,0] [3,0]: lengths 1, 2, 0, 1; the empty row is no sequence
    assert _stats(input_ids=ids, pad_id=0) == (4, 8, 3, 6)


def test_all_padding_row_is_not_a_sequence():
    ids = torch.tensor([[0, 0, 0], [4, 4, 0]])
    assert _stats(input_ids=ids, pad_id=0) == (2, 6, 1, 4)


def test_packed_by_position_ids():
    ids = torch.tensor([[5, 6, 7, 8, 9, 1, 2]])
    pos = torch.tensor([[0, 1, 2, 0, 1, 0, 1]])
    # documents of 3, 2 and 2 tokens: 9 + 4 + 4 = 17 (one row would give 49)
    assert _stats(input_ids=ids, position_ids=pos) == (7, 7, 3, 17)


def test_packed_positions_starting_at_two():
    ids = torch.tensor([[5, 6, 7, 8, 9]])
    pos = torch.tensor([[2, 3, 4, 2, 3]])  # DataCollatorWithFlattening(position_ids_start=2)
    assert _stats(input_ids=ids, position_ids=pos) == (5, 5, 2, 13)


def test_packed_with_padding_and_hf_style_pad_positions():
    # left padding, positions as Hugging Face makes them (pads at 1): one document of 3
    ids = torch.tensor([[0, 0, 7, 8, 9], [5, 6, 0, 0, 0]])
    pos = torch.tensor([[1, 1, 0, 1, 2], [0, 1, 1, 1, 1]])
    assert _stats(input_ids=ids, pad_id=0, position_ids=pos) == (5, 10, 2, 13)


def test_position_ids_broadcast_over_rows():
    ids = torch.tensor([[1, 1, 1, 1], [1, 1, 0, 0]])
    pos = torch.tensor([[0, 1, 0, 1]])
    # row 0: documents 2 and 2; row 1: 2 and 0 (all padding): 4 + 4 + 4 = 12
    assert _stats(input_ids=ids, pad_id=0, position_ids=pos) == (6, 8, 3, 12)


EOS = 2  # the pad id is the end-of-sequence id, as in many Llama and Qwen setups


def test_packed_documents_keep_their_closing_eos_when_pad_is_eos():
    ids = torch.tensor([[5, 9, EOS, 7, 4, 8, EOS]])
    pos = torch.tensor([[0, 1, 2, 0, 1, 2, 3]])
    # documents of 3 and 4 tokens, each EOS included: 9 + 16 = 25
    assert _stats(input_ids=ids, pad_id=EOS, position_ids=pos) == (7, 7, 2, 25)
    assert true_stats(input_ids=ids, pad_id=EOS, position_ids=pos) == (7, 7, 2, 25)


def test_packed_pad_eos_tokens_inside_a_document_are_real():
    ids = torch.tensor([[5, EOS, EOS, 6, EOS, 7, EOS]])
    pos = torch.tensor([[0, 1, 2, 3, 4, 0, 1]])
    assert _stats(input_ids=ids, pad_id=EOS, position_ids=pos) == (7, 7, 2, 29)


def test_packed_document_starting_with_the_pad_id_drops_its_leading_pads():
    # documented: a document's tokens are real from its first non-pad token on
    ids = torch.tensor([[EOS, EOS, 5, EOS, 7, 8]])
    pos = torch.tensor([[0, 1, 2, 3, 0, 1]])
    assert _stats(input_ids=ids, pad_id=EOS, position_ids=pos) == (4, 6, 2, 8)


def test_padding_after_packed_documents_stays_padding():
    # right padding after two packed documents; pad positions repeat (1) or are 0
    ids = torch.tensor([[5, EOS, 6, 7, EOS, EOS, EOS, EOS], [5, 6, EOS, EOS, EOS, EOS, EOS, EOS]])
    pos = torch.tensor([[0, 1, 0, 1, 2, 1, 1, 1], [0, 1, 2, 0, 0, 0, 0, 0]])
    # row 0: documents 2 and 3; row 1: one document of 3 (its EOS), then padding
    assert _stats(input_ids=ids, pad_id=EOS, position_ids=pos) == (8, 16, 3, 4 + 9 + 9)


def test_single_token_row_with_hf_pad_position_one_counts_the_first_pad():
    # documented ambiguity: [x, pad] at positions [0, 1] is a packed two-token document
    # closed by EOS as far as ids and positions tell; the mask settles it
    ids = torch.tensor([[5, 0, 0], [5, 6, 0]])
    pos = torch.tensor([[0, 1, 1], [0, 1, 1]])
    assert _stats(input_ids=ids, pad_id=0, position_ids=pos) == (4, 6, 2, 8)
    mask = (ids != 0).long()
    assert _stats(input_ids=ids, attention_mask=mask, pad_id=0, position_ids=pos) == (3, 6, 2, 5)


def test_cu_seqlens_documents_count_every_token_whatever_its_id():
    ids = torch.tensor([[5, 9, EOS, 7, EOS, EOS, EOS]])
    cu = torch.tensor([0, 3, 5])
    # documents 3 and 2 (EOS included); the last two tokens are outside every document
    assert _stats(input_ids=ids, pad_id=EOS, cu_seqlens=cu) == (5, 7, 2, 13)
    # a mask still decides inside the documents
    mask = torch.tensor([[1, 1, 1, 1, 0, 1, 1]])
    assert _stats(input_ids=ids, attention_mask=mask, pad_id=EOS, cu_seqlens=cu) == (4, 7, 2, 10)


@pytest.mark.parametrize("packing", ["position_ids", "position_ids+cu", "cu_seq_lens_q"])
def test_hf_flattening_collator_with_pad_equal_to_eos(packing):
    transformers = pytest.importorskip("transformers")
    docs = [[5, 9, EOS], [7, 4, 8, EOS], [11, EOS, 12, EOS], [3], [3, 3, 3, 3, 3, EOS]]
    collator = transformers.DataCollatorWithFlattening(
        return_flash_attn_kwargs=packing != "position_ids"
    )
    batch = collator([{"input_ids": d} for d in docs])
    assert "attention_mask" not in batch  # the collator pads nothing and gives no mask
    kwargs = {"input_ids": batch["input_ids"], "pad_id": EOS}
    if packing.startswith("position_ids"):
        kwargs["position_ids"] = batch["position_ids"]
    if packing != "position_ids":
        kwargs["cu_seqlens"] = batch["cu_seq_lens_q"]
    lengths = [len(d) for d in docs]  # every document whole, its EOS included
    n = sum(lengths)
    expected = (n, n, len(docs), sum(k * k for k in lengths))
    assert _stats(**kwargs) == expected
    assert true_stats(**kwargs) == expected


def test_packed_by_cu_seqlens():
    ids = torch.tensor([[5, 6, 7, 8, 9, 1, 2, 0]])
    cu = torch.tensor([0, 3, 5, 7], dtype=torch.int32)
    # documents 3, 2, 2; the last token is outside every document: 9 + 4 + 4 = 17
    assert _stats(input_ids=ids, cu_seqlens=cu) == (7, 8, 3, 17)


def test_position_ids_take_precedence_over_cu_seqlens():
    ids = torch.tensor([[5, 6, 7, 8]])
    pos = torch.tensor([[0, 1, 2, 3]])
    cu = torch.tensor([0, 2, 4])
    assert _stats(input_ids=ids, position_ids=pos, cu_seqlens=cu) == (4, 4, 1, 16)


def test_floating_ids_count_every_token():
    embeds_column = torch.zeros(2, 3)  # inputs_embeds[..., 0]: a zero is no padding
    assert _stats(input_ids=embeds_column, pad_id=0) == (6, 6, 2, 18)


@pytest.mark.parametrize("shape", [(0,), (0, 5), (3, 0), (0, 0)])
def test_empty_batch_adds_nothing(shape):
    buffer = new_buffer("cpu")
    accumulate_token_stats(
        buffer, TokenInputs(input_ids=torch.zeros(shape, dtype=torch.long)), pad_id=0
    )
    accumulate_token_stats(buffer, TokenInputs(input_ids=torch.zeros(shape, dtype=torch.long)))
    assert buffer.tolist() == [0] * N_STATS


def test_nothing_to_count_adds_nothing():
    buffer = new_buffer("cpu")
    accumulate_token_stats(
        buffer, TokenInputs(attention_mask=torch.ones(1, 1, 4, 4))
    )  # a 4-D mask only
    assert buffer.tolist() == [0] * N_STATS
    assert token_stats_torch(TokenInputs()) is None


def test_accumulates_over_micro_batches():
    buffer = new_buffer("cpu")
    accumulate_token_stats(buffer, TokenInputs(input_ids=RIGHT), pad_id=0)
    accumulate_token_stats(buffer, TokenInputs(input_ids=RIGHT), pad_id=0)
    assert buffer.tolist() == [8, 20, 4, 20]


# ------------------------------------------------------------------ random batches
@pytest.mark.slow
@settings(max_examples=300, deadline=None)
@given(case=token_batches(max_rows=5, max_cols=48))
def test_torch_reference_matches_independent_count(case):
    assert _stats(**case.kwargs) == true_stats(**case.kwargs), case.note


# ------------------------------------------------------------------ bad input
@pytest.mark.parametrize(
    "buffer",
    [
        torch.zeros(N_STATS),
        torch.zeros(N_STATS + 1, dtype=torch.long),
        torch.zeros(2 * N_STATS, dtype=torch.long)[::2],
    ],
)
def test_bad_buffer_is_refused(buffer):
    with pytest.raises(ValueError, match="buffer must be"):
        accumulate_token_stats(buffer, TokenInputs(input_ids=RIGHT))


def test_unknown_backend_is_refused():
    with pytest.raises(ValueError, match="backend must be one of"):
        accumulate_token_stats(new_buffer("cpu"), TokenInputs(input_ids=RIGHT), backend="cuda")  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "pos", [torch.zeros(3, 5, dtype=torch.long), torch.zeros(2, 4, dtype=torch.long)]
)
def test_position_ids_that_do_not_fit_are_refused(pos):
    with pytest.raises(ValueError, match="position_ids of shape"):
        accumulate_token_stats(new_buffer("cpu"), TokenInputs(input_ids=RIGHT, position_ids=pos))


def test_float_position_ids_are_refused():
    with pytest.raises(ValueError, match="position_ids must be integers"):
        accumulate_token_stats(
            new_buffer("cpu"), TokenInputs(input_ids=RIGHT, position_ids=torch.zeros(2, 5))
        )


def test_two_dimensional_cu_seqlens_are_refused():
    with pytest.raises(ValueError, match="cu_seqlens must be a 1-D integer tensor"):
        accumulate_token_stats(
            new_buffer("cpu"),
            TokenInputs(input_ids=RIGHT, cu_seqlens=torch.zeros(2, 2, dtype=torch.long)),
        )


def test_zero_dimensional_ids_are_refused():
    with pytest.raises(ValueError, match="at least one dimension"):
        accumulate_token_stats(new_buffer("cpu"), TokenInputs(input_ids=torch.tensor(3)))


def test_triton_backend_without_triton_names_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "triton", None)  # `import triton` now fails
    monkeypatch.delitem(sys.modules, "flopmeter.tokens.triton_kernel", raising=False)
    monkeypatch.setattr(tokens, "_triton_kernels", None)
    with pytest.raises(
        MissingExtraError, match=r"pip install 'triton' \(it is in flopmeter's 'triton' extra"
    ):
        accumulate_token_stats(new_buffer("cpu"), TokenInputs(input_ids=RIGHT), backend="triton")
    # auto on CPU never needs Triton
    buffer = new_buffer("cpu")
    accumulate_token_stats(buffer, TokenInputs(input_ids=RIGHT), pad_id=0)
    assert buffer.tolist() == [4, 10, 2, 10]


def test_a_failing_triton_kernel_falls_back_to_torch_once(monkeypatch, caplog):
    class BrokenKernels:
        calls = 0

        @classmethod
        def launch(cls, *args, **kwargs):
            cls.calls += 1
            raise RuntimeError("no kernel image is available for execution on the device")

    # no CUDA here: let "auto" treat the CPU as a Triton device, with a kernel that fails
    monkeypatch.setattr(tokens, "_triton_device", lambda device: True)
    monkeypatch.setattr(tokens, "_triton_kernels", BrokenKernels)
    buffer = new_buffer("cpu")
    with caplog.at_level("WARNING", logger="flopmeter"):
        accumulate_token_stats(buffer, TokenInputs(input_ids=RIGHT), pad_id=0)
        accumulate_token_stats(buffer, TokenInputs(input_ids=RIGHT), pad_id=0)
    assert buffer.tolist() == [8, 20, 4, 20]  # both batches counted, by torch
    assert BrokenKernels.calls == 1  # not tried again
    assert tokens._triton_kernels is False
    assert sum("Triton token-statistics kernel failed" in r.message for r in caplog.records) == 1
