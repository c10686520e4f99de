"""No verdict on counts the meter does not trust (issue 10).

Each case is what a user can really do: call a model with its tokens under another name, pass a
tuple batch, give inconsistent inputs, resume from a hand-edited state. Expected counts are the
test's own (``Truth``); a withheld verdict is null with its reason, never 0 or "below".
"""

from __future__ import annotations

import json
from dataclasses import dataclass

import pytest
import torch
from torch import nn

from flopmeter import FlopMeter
from flopmeter.errors import ConfigurationError
from flopmeter.safe_text import MAX_ERROR_CHARS
from tests.support.batches import PAD_ID, Truth, padded_batch
from tests.support.models import tiny_llama


class Embedder(nn.Module):
    """A small model whose forward takes its token ids under a name of its own."""

    def __init__(self, vocab: int = 97, hidden: int = 16) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, hidden)
        self.head = nn.Linear(hidden, vocab)

    def forward(self, x=None, labels=None, features=None, batch=None):
        if batch is not None:
            x = batch.tokens
        if isinstance(x, (tuple, list)):
            x, _labels = x
        if x is None:
            return self.head(features).sum()
        return self.head(self.embed(x)).sum()


class Packed(Embedder):
    """Takes a packed batch's document offsets, as flash-attention varlen models do."""

    def forward(self, input_ids=None, cu_seqlens=None, attention_mask=None):
        return super().forward(x=input_ids)


@dataclass
class Batch:
    tokens: torch.Tensor


def _train(model, calls, **meter_kwargs):
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    with FlopMeter(model, **meter_kwargs) as meter:
        for args, kwargs in calls:
            model(*args, **kwargs).backward()
            optimizer.step()
            optimizer.zero_grad()
    return meter.report()


def _ids(lengths, width=8, seed=0):
    return padded_batch(lengths, width, seed=seed)["input_ids"]


def _assert_withheld(report, phrase):
    assert report.compute.primary_flops is None
    assert report.verdict.ratio_to_threshold is None
    assert report.verdict.exceeds_threshold is None
    assert report.verdict.outcome is None
    assert phrase in report.compute.withheld_reason
    assert any(phrase in note for note in report.notes)


# --------------------------------------------------------------------------- finding tokens
def test_ids_under_any_keyword_and_in_a_tuple_batch_are_counted():
    truth = Truth()
    calls = []
    for i, lengths in enumerate([[3, 8], [5, 1], [8, 8]]):
        ids = _ids(lengths, seed=i)
        truth.add(lengths, 8)
        # model(x=ids, labels=...): the integer [B, T] tensor under "x", not the labels
        calls.append(((), {"x": ids, "labels": ids.clone()}) if i % 2 else (((ids, ids),), {}))
    report = _train(Embedder(), calls, pad_id=PAD_ID)
    assert (report.tokens.tokens_processed, report.tokens.tokens_seen) == (truth.tokens, truth.seen)
    assert report.tokens.micro_batches_unread == 0
    assert report.verdict.outcome == "below_threshold"


@pytest.mark.slow
def test_unreadable_micro_batches_withhold_compute_and_verdict():
    features = torch.randn(16)  # floats without a batch dimension: one item, or sixteen?
    report = _train(Embedder(), [((), {"features": features})] * 100)
    assert report.tokens.micro_batches == 100 and report.tokens.micro_batches_unread == 100
    assert report.tokens.tokens_processed == 0
    _assert_withheld(report, "100 training micro-batch(es) could not be read")
    assert "token_inputs" in report.compute.withheld_reason  # how to fix it


def test_token_inputs_tells_the_meter_where_the_tokens_are():
    truth = Truth()
    calls = []
    for i, lengths in enumerate([[2, 7], [4, 4]]):
        calls.append(((), {"batch": Batch(_ids(lengths, seed=i))}))
        truth.add(lengths, 8)
    unread = _train(Embedder(), calls, pad_id=PAD_ID)
    assert unread.tokens.micro_batches_unread == 2 and unread.verdict.outcome is None
    located = _train(
        Embedder(), calls, pad_id=PAD_ID, token_inputs=lambda args, kwargs: kwargs["batch"].tokens
    )
    assert (
        located.tokens.tokens_processed == truth.tokens and located.tokens.micro_batches_unread == 0
    )
    assert located.verdict.outcome == "below_threshold"
    by_name = _train(Embedder(), [((), {"x": _ids([3, 3])})], pad_id=PAD_ID, token_inputs="x")
    assert by_name.tokens.tokens_processed == 6


def test_a_failing_or_wrong_token_inputs_function_is_an_unread_micro_batch():
    def broken(args, kwargs):
        raise KeyError("tokens")

    report = _train(Embedder(), [((), {"x": _ids([3])})], token_inputs=broken)
    _assert_withheld(report, "could not be read (KeyError")
    report = _train(Embedder(), [((), {"x": _ids([3])})], token_inputs=lambda a, k: "ids")
    _assert_withheld(report, "not an integer tensor")
    with pytest.raises(ConfigurationError, match="token_inputs"):
        FlopMeter(Embedder(), token_inputs=3)


def test_zero_dim_ids_and_unreadable_offsets_are_unread():
    report = _train(Packed(), [((), {"input_ids": torch.tensor(3)})])
    _assert_withheld(report, "0-d tensor")
    ids = torch.randint(1, 97, (2, 4))
    cu = torch.tensor([[0, 4], [4, 8]])  # 2-D: not offsets
    report = _train(Packed(), [((), {"input_ids": ids, "cu_seqlens": cu})])
    _assert_withheld(report, "cu_seqlens must be a 1-D integer tensor")


def test_inputs_with_nothing_to_count_are_unread_not_zero_tokens():
    from flopmeter.tokens.batch import TokenInputs

    four_d = torch.ones(2, 1, 8, 8, dtype=torch.long)  # an attention mask, but not [B, T]
    report = _train(
        Embedder(),
        [((), {"x": _ids([3, 8])})] * 2,
        token_inputs=lambda args, kwargs: TokenInputs(attention_mask=four_d),
    )
    assert report.tokens.micro_batches_unread == 2 and report.tokens.tokens_processed == 0
    _assert_withheld(report, "no [T] or [B, T] attention_mask")


# --------------------------------------------------------------------------- inconsistent
def test_a_mask_of_another_shape_than_the_ids_is_not_counted():
    ids = _ids([8, 8])  # (2, 8)
    mask = torch.ones(2, 5, dtype=torch.long)  # (2, 5): today counted as 10 tokens
    report = _train(Packed(), [((), {"input_ids": ids, "attention_mask": mask})] * 3)
    assert report.tokens.micro_batches_inconsistent == 3
    assert report.tokens.tokens_processed == 0  # not counted as if it were fine
    _assert_withheld(report, "attention_mask of shape (2, 5) does not match input_ids")


def test_backwards_document_offsets_are_found_on_the_device():
    ids = torch.randint(1, 97, (1, 8))
    cu = torch.tensor([0, 5, 3, 8])  # decreasing: documents overlap
    report = _train(Packed(), [((), {"input_ids": ids, "cu_seqlens": cu})] * 2)
    assert report.tokens.micro_batches_inconsistent == 2
    _assert_withheld(report, "document offsets (cu_seqlens) that decrease")
    past = _train(Packed(), [((), {"input_ids": ids, "cu_seqlens": torch.tensor([0, 4, 12])})])
    assert past.tokens.micro_batches_inconsistent == 1 and past.verdict.outcome is None
    fine = _train(Packed(), [((), {"input_ids": ids, "cu_seqlens": torch.tensor([0, 3, 8])})])
    assert fine.tokens.micro_batches_inconsistent == 0 and fine.verdict.outcome == "below_threshold"
    assert fine.tokens.tokens_processed == 8


def test_no_verdict_before_there_is_anything_to_judge():
    meter = FlopMeter(tiny_llama(), PAD_ID).start()
    report = meter.report()
    assert report.run.status == "running" and report.tokens.micro_batches == 0
    _assert_withheld(report, "No training micro-batch has been counted")
    meter.stop()


# --------------------------------------------------------------------------- booleans
@pytest.mark.parametrize("value", ["false", "False", 0, 1, "yes", 1.0])
def test_boolean_options_take_a_bool_only(value):
    with pytest.raises(ConfigurationError, match="original_systemic_risk"):
        FlopMeter(tiny_llama(), original_systemic_risk=value)


def test_adapters_refuse_non_bool_flags():
    pytest.importorskip("transformers")
    pytest.importorskip("lightning")
    from flopmeter.integrations import hf, lightning

    for callback in (hf.FlopMeterCallback, lightning.FlopMeterCallback):
        with pytest.raises(ConfigurationError, match="original_systemic_risk"):
            callback(original_systemic_risk="false")
        with pytest.raises(ConfigurationError, match="log_compute"):
            callback(log_compute="no")


# --------------------------------------------------------------------------- errors
class Unprintable(Exception):
    def __str__(self) -> str:
        raise RuntimeError("no message for you")


def test_an_exception_whose_str_raises_still_gives_a_failed_report(tmp_path):
    model = tiny_llama()
    with pytest.raises(Unprintable), FlopMeter(model, PAD_ID, output=tmp_path) as meter:
        model(**padded_batch([3, 4], 6)).loss.backward()
        raise Unprintable()
    report = json.loads((tmp_path / "flops_meter.json").read_text())
    assert report["run"]["status"] == "failed"
    assert report["run"]["error"].startswith("Unprintable: <the message could not be read")
    assert meter.report().run.status == "failed"  # not stuck in "running"


@pytest.mark.slow
@pytest.mark.parametrize(("code", "status"), [(0, "completed"), (None, "completed"), (3, "failed")])
def test_system_exit_zero_is_a_clean_exit(code, status):
    model = tiny_llama()
    with pytest.raises(SystemExit), FlopMeter(model, PAD_ID) as meter:
        model(**padded_batch([3], 4)).loss.backward()
        raise SystemExit(code)
    assert meter.report().run.status == status
    assert (meter.report().run.error is None) == (status == "completed")


def test_the_error_is_bounded_and_credentials_are_redacted():
    token = "hf_" + "a1B2" * 9
    secret = "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY"
    message = (
        f"download failed for {token} with AKIAIOSFODNN7EXAMPLE aws_secret_access_key={secret} "
        "Authorization: Bearer abcdef1234567890 https://user:pa55word@example.com/x "
    ) + "x" * 10_000
    model = tiny_llama()
    with pytest.raises(RuntimeError), FlopMeter(model, PAD_ID) as meter:
        raise RuntimeError(message)
    error = meter.report().run.error
    assert len(error) <= MAX_ERROR_CHARS
    for leaked in (token, "AKIAIOSFODNN7EXAMPLE", secret, "abcdef1234567890", "pa55word"):
        assert leaked not in error
    assert error.startswith("RuntimeError: download failed for hf_[REDACTED]")


# --------------------------------------------------------------------------- resume state
def _state(**changes):
    model = tiny_llama()
    meter = FlopMeter(model, PAD_ID, model_name="tiny")
    with meter:
        model(**padded_batch([3, 5], 6)).loss.backward()
    state = json.loads(json.dumps(meter.state_dict()))  # as a checkpoint holds it
    state.update(changes)
    return state


@pytest.mark.slow
@pytest.mark.parametrize(
    ("changes", "field"),
    [
        ({"tokens_processed": -1_000_000_000_000}, "tokens_processed"),
        ({"optimizer_steps": -1}, "optimizer_steps"),
        ({"tokens_processed": 10**6}, "tokens_processed"),  # more than tokens_seen
        ({"micro_batches": 1.9}, "micro_batches"),
        ({"sequences": True}, "sequences"),
        ({"sum_sq_seq_len": 1}, "sum_sq_seq_len"),
        ({"training_duration_seconds": float("nan")}, "training_duration_seconds"),
        ({"started_at": 12345}, "started_at"),
        ({"started_at": "yesterday"}, "started_at"),
        ({"tokens_seen": None}, "tokens_seen"),
    ],
)
def test_impossible_resume_states_are_refused_naming_the_field(changes, field):
    meter = FlopMeter(tiny_llama(), PAD_ID, model_name="tiny")
    with pytest.raises(ConfigurationError, match=field):
        meter.load_state_dict(_state(**changes))


def test_a_state_from_another_model_is_refused_unless_the_user_says_so():
    state = _state()
    other = FlopMeter(tiny_llama(num_hidden_layers=1), PAD_ID, model_name="tiny")
    with pytest.raises(ConfigurationError, match="allow_other_model"):
        other.load_state_dict(state)
    renamed = FlopMeter(tiny_llama(), PAD_ID, model_name="another")
    with pytest.raises(ConfigurationError, match="'model'"):
        renamed.load_state_dict(state)
    other.load_state_dict(state, allow_other_model=True)
    assert other.report().tokens.tokens_processed == state["tokens_processed"] == 8
    same = FlopMeter(tiny_llama(), PAD_ID, model_name="tiny")
    same.load_state_dict(state)
    assert same.report().tokens.tokens_processed == 8
