"""A call counted from its structure's plan counts exactly what it counts read in full.

Each case runs the same sequence of training calls through two sets of counters: one through
:class:`~flopmeter.counting.call_plan.CallPlans` (the hook's path: the first call of a structure read in
full, the later ones from the plan, unpacked CPU text staged), one through ``read_call`` and
``add_call`` on every call (the full path, the reference). Every count of the snapshot, the
returned shape, the reference tensor's shape and the shape units must be equal, and the token
counts are also checked against a count made here by hand.
"""

from __future__ import annotations

import pytest
import torch

from flopmeter.counting.call_plan import MAX_PLANS, CallPlans, call_key
from flopmeter.counting.counters import RunCounters
from flopmeter.counting.inputs import ModelInputFacts, read_call
from flopmeter.tokens import staging as staged_tokens
from flopmeter.tokens.batch import TokenInputError

PAD = 0


def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _ids(rows: int, cols: int, seed: int, *, pad_right: bool = True) -> torch.Tensor:
    g = _gen(seed)
    ids = torch.randint(1, 50, (rows, cols), generator=g)
    lengths = torch.randint(0, cols + 1, (rows,), generator=g)
    for r in range(rows):
        if pad_right:
            ids[r, lengths[r] :] = PAD
        else:
            ids[r, : cols - lengths[r]] = PAD
    return ids


def _mask(ids: torch.Tensor, dtype: torch.dtype = torch.long) -> torch.Tensor:
    return (ids != PAD).to(dtype)


def _both(calls, *, locator=None, facts=None, pad_id=PAD, read_between=False):
    """Counts ``calls`` (``(args, kwargs)`` pairs, or callables making one) both ways."""
    facts = facts or ModelInputFacts()
    planned, full = RunCounters(), RunCounters()
    plans = CallPlans(locator, pad_id)
    for i, make in enumerate(calls):
        args, kwargs = make() if callable(make) else make
        outcome = []
        for counters, use_plans in ((planned, True), (full, False)):
            counters.micro_batches += 1
            try:
                if use_plans:
                    shape, ref, units = plans.count(counters, args, kwargs, facts)
                else:
                    call = read_call(args, kwargs, locator, facts)
                    shape = counters.add_call(call, pad_id)
                    ref, units = call.ref, call.units
                outcome.append((shape, tuple(ref.shape), ref.device, units))
            except TokenInputError as exc:
                counters.add_uncounted(exc.kind, str(exc))
                outcome.append(("error", exc.kind, str(exc)))
        assert outcome[0] == outcome[1], f"call {i}"
        if read_between and i % 3 == 1:
            assert planned.snapshot(sync=False) == full.snapshot(sync=False)
    snap = planned.snapshot(sync=False)
    assert snap == full.snapshot(sync=False)
    return snap, plans


def _hand_counts(masks: list[torch.Tensor]) -> tuple[int, int, int, int]:
    """(tokens, tokens seen, sequences, sum of squared lengths) counted row by row."""
    tokens = seen = sequences = squares = 0
    for m in masks:
        for row in m.reshape(-1, m.shape[-1]).tolist():
            n = sum(1 for v in row if v != 0)
            tokens, seen, squares = tokens + n, seen + len(row), squares + n * n
            sequences += n > 0
    return tokens, seen, sequences, squares


def _totals(snap) -> tuple[int, int, int, int]:
    t = snap.totals
    return t.tokens_processed, t.tokens_seen, t.sequences, t.sum_sq_seq_len


@pytest.mark.parametrize("n_calls", [1, 5, 300])  # 300: staging areas fill and fold
@pytest.mark.parametrize("form", ["mask", "ids_pad", "bool_mask", "float_mask", "positional"])
def test_unpacked_text_counts_equal_the_full_path_and_the_hand_count(form, n_calls):
    batches = [_ids(4, 48, seed) for seed in range(n_calls)]
    masks = [_mask(ids) for ids in batches]
    calls = []
    for ids, mask in zip(batches, masks, strict=True):
        if form == "mask":
            calls.append(((), {"input_ids": ids, "attention_mask": mask, "labels": ids}))
        elif form == "ids_pad":
            calls.append(((), {"input_ids": ids}))
        elif form == "bool_mask":
            calls.append(((), {"input_ids": ids, "attention_mask": mask.bool()}))
        elif form == "float_mask":
            calls.append(((), {"input_ids": ids, "attention_mask": mask.float() * 2.0}))
        else:
            calls.append(((ids, mask), {}))
    snap, plans = _both(calls, read_between=True)
    assert _totals(snap) == _hand_counts(masks)
    assert len(plans) == 1
    assert snap.totals.micro_batches == n_calls


def test_a_mask_with_values_other_than_one_counts_its_non_zero_elements():
    ids = _ids(3, 10, 1)
    mask = _mask(ids) * torch.tensor([2, 1, 3]).unsqueeze(1)  # non-zero is real
    snap, _ = _both([((), {"input_ids": ids, "attention_mask": mask})] * 7)
    assert _totals(snap) == _hand_counts([mask] * 7)


def test_ids_without_a_pad_id_count_every_position():
    ids = _ids(2, 9, 3)
    snap, _ = _both([((), {"input_ids": ids})] * 4, pad_id=None)
    assert _totals(snap) == (72, 72, 8, 8 * 81)


def test_a_tensor_refilled_in_place_is_counted_by_its_values_at_each_call():
    ids = torch.zeros(4, 16, dtype=torch.long)
    mask = torch.zeros_like(ids)
    seen_masks = []

    def refill(seed: int):
        def make():
            new = _ids(4, 16, seed)
            ids.copy_(new)
            mask.copy_(_mask(new))
            seen_masks.append(mask.clone())
            return (), {"input_ids": ids, "attention_mask": mask}

        return make

    snap, _ = _both([refill(s) for s in range(40)])
    assert _totals(snap) == _hand_counts(seen_masks)


@pytest.mark.parametrize("shape", [(96,), (2, 3, 16)])
def test_one_and_three_dimensional_ids(shape):
    ids = _ids(1, 96, 5).reshape(shape)
    mask = _mask(ids)
    snap, _ = _both([((), {"input_ids": ids, "attention_mask": mask})] * 6)
    assert _totals(snap) == _hand_counts([mask] * 6)


def test_large_batches_and_more_shapes_than_staging_areas_all_count():
    # beyond the staging size, and more shapes than staging areas: every path counts
    calls, masks = [], []
    for seed in range(2 * staged_tokens.MAX_STAGES + 3):
        cols = 8 + seed
        ids = _ids(3, cols, seed)
        calls.append(((), {"input_ids": ids, "attention_mask": _mask(ids)}))
        masks.append(_mask(ids))
    big = _ids(16, staged_tokens.STAGE_BYTES_MAX // 8, 99)
    calls += [((), {"input_ids": big, "attention_mask": _mask(big)})] * 3
    masks += [_mask(big)] * 3
    snap, plans = _both(calls * 2)
    assert _totals(snap) == _hand_counts(masks * 2)
    assert len(plans) == 2 * staged_tokens.MAX_STAGES + 4


@pytest.mark.parametrize("form", ["ids and pad id", "bool mask", "int32 ids, pad id beyond"])
def test_a_batch_too_large_to_stage_is_reduced_at_once_by_its_values_then(form):
    """Over STAGE_BYTES_MAX the hook reduces the batch to its row lengths at the call (the CPU
    statistics' reduction); a buffer refilled in place is counted by each call's values, and a
    pad id outside the ids' dtype goes to the torch operations, as read in full."""
    cols = staged_tokens.STAGE_BYTES_MAX // 8 + 3  # rows of int64 over the staging size
    dtype = torch.int32 if form.startswith("int32") else torch.long
    pad_id = 2**40 if form.startswith("int32") else PAD
    ids = torch.zeros(3, cols, dtype=dtype)
    mask = torch.zeros(3, cols, dtype=torch.bool)
    seen = []

    def refill(seed: int):
        def make():
            new = _ids(3, cols, seed)
            ids.copy_(new)
            mask.copy_(new != PAD)
            # the truth: torch's own comparison (a pad id beyond int32 is compared as torch does)
            seen.append(mask.clone() if form == "bool mask" else ids != pad_id)
            kwargs = {"input_ids": ids}
            if form == "bool mask":
                kwargs["attention_mask"] = mask
            return (), kwargs

        return make

    snap, plans = _both([refill(s) for s in range(12)], pad_id=pad_id, read_between=True)
    assert _totals(snap) == _hand_counts(seen)
    assert len(plans) == 1


def test_packed_positions_and_offsets_count_as_read_in_full():
    ids = torch.randint(1, 50, (1, 12), generator=_gen(2))
    pos = torch.tensor([[0, 1, 2, 0, 1, 0, 1, 2, 3, 0, 1, 2]])
    cu = torch.tensor([0, 3, 5, 9, 12])
    calls = [((), {"input_ids": ids, "position_ids": pos})] * 5
    calls += [((), {"input_ids": ids, "cu_seq_lens_q": cu})] * 5
    snap, _ = _both(calls)
    assert snap.totals.sequences == 40
    assert snap.totals.sum_sq_seq_len == 10 * (9 + 4 + 16 + 9)


def test_other_families_count_as_read_in_full():
    g = _gen(7)
    ids = _ids(2, 6, 8)
    calls = [
        (
            (),
            {"pixel_values": torch.randn(2, 3, 8, 8, generator=g), "labels": torch.tensor([1, 0])},
        ),
        ((), {"inputs_embeds": torch.randn(2, 5, 4, generator=g)}),
    ]
    _both(calls * 4, facts=ModelInputFacts(patch_size=4))
    seq2seq = ((), {"input_ids": ids, "attention_mask": _mask(ids), "labels": _ids(2, 4, 9)})
    snap, _ = _both([seq2seq] * 5, facts=ModelInputFacts(is_encoder_decoder=True))
    assert snap.totals.decoder_tokens > 0
    audio = ((), {"input_features": torch.randn(2, 8, 30, generator=g)})
    _both([audio] * 3, facts=ModelInputFacts(is_encoder_decoder=False))
    sample = ((torch.randn(2, 4, 8, 8, generator=g), torch.tensor(3)), {})
    _both([sample] * 3)


def test_meta_tensors_and_a_modality_change_count_as_read_in_full():
    ids = torch.empty(2, 8, dtype=torch.long, device="meta")
    pixels = torch.randn(2, 3, 8, 8)
    text = torch.ones(2, 8, dtype=torch.long)
    snap, _ = _both([((), {"input_ids": ids})] * 3)
    assert snap.unread == 3
    calls = [((), {"input_ids": text})] * 2 + [((), {"pixel_values": pixels})] * 3
    calls += [((), {"input_ids": text})] * 2
    snap, _ = _both(calls, facts=ModelInputFacts(patch_size=4))
    assert snap.unread == 3 and snap.totals.micro_batches == 7


def test_inconsistent_inputs_raise_on_every_call_and_keep_no_plan():
    ids = torch.ones(2, 8, dtype=torch.long)
    calls = [((), {"input_ids": ids, "attention_mask": torch.ones(2, 7)})] * 4
    snap, plans = _both(calls)
    assert snap.inconsistent == 4
    assert len(plans) == 0


def test_one_tensor_under_two_names_takes_each_role_from_its_own_name():
    # labels=ids (the same object) first: the ids must still come from input_ids later
    def make(seed: int):
        ids = _ids(2, 10, seed)
        return lambda: (
            ((), {"labels": ids, "input_ids": ids})
            if seed == 0
            else ((), {"labels": _ids(2, 10, seed + 100), "input_ids": ids})
        )

    masks = [_mask(_ids(2, 10, s)) for s in range(6)]
    snap, plans = _both([make(s) for s in range(6)])
    assert _totals(snap) == _hand_counts(masks)
    assert None not in plans._plans.values()  # planned: each role by its own name


def test_an_unnamed_tensor_in_two_places_is_always_read_in_full():
    # model(ids, ids): which one is the ids is not known from a name; never planned
    def make(seed: int):
        ids = _ids(2, 10, seed)
        return lambda: ((ids, ids), {}) if seed == 0 else ((ids, _mask(ids)), {})

    _, plans = _both([make(s) for s in range(5)])
    assert list(plans._plans.values()) == [None]


def test_containers_and_a_token_inputs_function_are_never_planned():
    ids = _ids(2, 10, 4)
    batch = {"input_ids": ids, "attention_mask": _mask(ids)}
    assert call_key((batch,), {}) is None
    assert call_key(((ids, ids),), {}) is None
    _, plans = _both([((batch,), {})] * 3)
    assert len(plans) == 0
    _, plans = _both([((), {"x": ids})] * 3, locator=lambda args, kwargs: kwargs["x"])
    assert len(plans) == 0
    snap, plans = _both([((), {"x": ids, "attention_mask": _mask(ids)})] * 3, locator="x")
    assert len(plans) == 1 and _totals(snap) == _hand_counts([_mask(ids)] * 3)


def test_structures_differ_by_shape_dtype_device_and_scalar_type():
    ids = torch.ones(2, 4, dtype=torch.long)
    base = call_key((), {"input_ids": ids, "return_dict": True})
    assert base == call_key((), {"input_ids": ids.clone(), "return_dict": False})
    assert base != call_key((), {"input_ids": ids.int(), "return_dict": True})
    assert base != call_key((), {"input_ids": ids[:, :3], "return_dict": True})
    assert base != call_key((), {"input_ids": ids.to("meta"), "return_dict": True})
    assert base != call_key((), {"input_ids": ids, "return_dict": None})
    assert base != call_key((ids,), {"return_dict": True})


def test_plans_are_bounded(monkeypatch):
    monkeypatch.setattr("flopmeter.counting.call_plan.MAX_PLANS", 3)
    calls = []
    for cols in range(2, 9):
        ids = _ids(2, cols, cols)
        calls.append(((), {"input_ids": ids}))
    _, plans = _both(calls * 2)
    assert len(plans) == 3
    assert MAX_PLANS >= 256  # the real bound covers a run padded to each batch's longest
