"""The FLOP model inside the meter: the report's primary figure, its inputs, and honesty about
models it does not recognise."""

from __future__ import annotations

import json

import pytest
import torch
from torch import nn
from torch.utils.flop_counter import FlopCounterMode

from flopmeter import ConfigurationError, FlopMeter, FlopReport
from flopmeter.flops.aten_ops import measured_formulas
from tests.support.models import tiny_mixtral_config

transformers = pytest.importorskip("transformers")
peft = pytest.importorskip("peft")

VOCAB = 128
PAD = 0


def tiny_qwen2(**extra: object) -> nn.Module:
    torch.manual_seed(0)
    config = transformers.Qwen2Config(
        vocab_size=VOCAB,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        tie_word_embeddings=True,
        **extra,
    )
    return transformers.AutoModelForCausalLM.from_config(config, attn_implementation="eager")


def padded_batches(lengths: list[list[int]], width: int) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    batches = []
    for rows in lengths:
        ids = torch.full((len(rows), width), PAD)
        for r, n in enumerate(rows):
            ids[r, :n] = torch.randint(1, VOCAB, (n,), generator=g)
        batches.append(ids)
    return batches


def unpadded_truth(model: nn.Module, batches: list[torch.Tensor]) -> int:
    """PyTorch's count of forward+backward over every sequence on its own, without padding."""
    total = 0
    for ids in batches:
        for row in ids:
            seq = row[row != PAD].unsqueeze(0)
            with FlopCounterMode(display=False) as counter:
                model(input_ids=seq, labels=seq).loss.backward()
            total += counter.get_total_flops()
            model.zero_grad()
    return total


def run(model: nn.Module, batches: list[torch.Tensor], **kwargs: object) -> FlopReport:
    optimizer = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=1e-3)
    model.train()
    with FlopMeter(model, pad_id=PAD, **kwargs) as meter:
        for ids in batches:
            mask = (ids != PAD).long()
            model(input_ids=ids, attention_mask=mask, labels=ids).loss.backward()
            optimizer.step()
            optimizer.zero_grad()
    return meter.report()


def recompute_transformer(inputs: dict) -> float:
    """The transformer estimate from a report's own fields, independently of flopmeter's code."""
    linear = sum(
        g["macs_per_token"] * (2 + 2 * g["input_grad"] + 2 * g["weight_grad"])
        for g in inputs["linear_groups"]
    )
    attention = 0.0
    for a in inputs["attention_layers"]:
        qk = a["q_grad"] + a["k_grad"]
        v = (a["q_grad"] or a["k_grad"]) + a["v_grad"]
        per_pair = 2 * (a["query_width"] * (1 + qk) + a["value_width"] * (1 + v))
        attention += a["layers"] * per_pair * inputs["sum_sq_seq_len"]
    return inputs["tokens_processed"] * linear + attention


@pytest.mark.slow
def test_report_primary_is_the_transformer_estimate_and_matches_the_counter() -> None:
    model = tiny_qwen2()
    batches = padded_batches([[12, 7, 3], [9, 9, 1], [5, 12, 2]], width=12)
    report = run(model, batches)
    # token statistics counted by hand: 22 + 19 + 19 = 60 tokens; squares 144+49+9 +
    # 81+81+1 + 25+144+4 = 538
    assert (report.tokens.tokens_processed, report.tokens.sum_sq_seq_len) == (60, 538)
    assert report.compute.primary_estimate == "transformer"
    transformer = report.compute.estimates["transformer"]
    assert report.compute.primary_flops == transformer.flops
    assert transformer.flops == pytest.approx(unpadded_truth(model, batches), rel=1e-9)
    # the figure is recomputable from the report's JSON alone
    data = json.loads(report.to_json())
    assert recompute_transformer(
        data["compute"]["estimates"]["transformer"]["inputs"]
    ) == pytest.approx(report.compute.primary_flops, rel=1e-12)
    assert data["model"]["n_active"] == data["model"]["n_total"]
    assert data["compute"]["measured_to_transformer_ratio"] == pytest.approx(1.0, rel=1e-9)
    assert {"seed", "six_nd", "transformer", "measured"} <= set(report.compute.estimates)


@pytest.mark.slow
def test_lora_run_through_the_meter() -> None:
    model = peft.get_peft_model(
        tiny_qwen2(), peft.LoraConfig(r=4, target_modules=["q_proj", "v_proj"])
    )
    batches = padded_batches([[10, 10], [10, 10]], width=10)
    report = run(model, batches)
    assert report.compute.primary_estimate == "transformer"
    assert report.model.n_trainable < report.model.n_total
    assert report.compute.primary_flops == pytest.approx(unpadded_truth(model, batches), rel=1e-9)


@pytest.mark.slow
def test_mixture_of_experts_report_has_active_parameters() -> None:
    torch.manual_seed(0)
    config = tiny_mixtral_config(vocab_size=VOCAB)
    model = transformers.AutoModelForCausalLM.from_config(config)  # sdpa + grouped_mm defaults
    report = run(model, padded_batches([[8, 8]], width=8))
    # experts: 2 layers * 4 experts * (128*32 + 32*64) = 49152; a token uses 2 of 4
    assert report.model.n_total - report.model.n_active == 49152 // 2
    assert report.compute.primary_estimate == "transformer"
    assert report.compute.measured_to_transformer_ratio == pytest.approx(1.0, rel=1e-9)


class CustomAttentionModel(nn.Module):
    """No config; attention through nn.MultiheadAttention (its input projection is a bare
    parameter the profile cannot read)."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(VOCAB, 32)
        self.attn = nn.MultiheadAttention(32, 4, batch_first=True)
        self.head = nn.Linear(32, VOCAB)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        h = self.embed(input_ids)
        return self.head(self.attn(h, h, h, need_weights=False)[0])


@pytest.mark.slow
def test_unrecognised_model_reports_the_dispatch_count_and_says_why() -> None:
    """An architecture the profile cannot read: the seed formula is shown, never primary; the
    measured (dispatch-level) estimate is, and equals PyTorch's count of the same batch."""
    model = CustomAttentionModel().train()
    ids = torch.randint(1, VOCAB, (2, 8))
    with FlopMeter(model) as meter:
        model(ids).sum().backward()
    report = meter.report()
    assert report.compute.primary_estimate == "measured"
    assert report.compute.primary_reason.startswith("measured: architecture not recognised (")
    assert report.verdict.outcome is not None
    # seed: (4 * n_total + 2 * n_trainable) * 16 tokens, every parameter trainable
    assert report.compute.estimates["seed"].flops == 6 * report.model.n_total * 16
    with FlopCounterMode(display=False, custom_mapping=measured_formulas()) as counter:
        model(ids).sum().backward()
    assert report.compute.primary_flops == counter.get_total_flops()
    note = next(n for n in report.notes if "not recognised" in n)
    assert "attn" in note  # names what it could not read
    assert "attention-score FLOP" in note
    # the partial transformer estimate is still reported, with the same caveats
    assert report.compute.estimates["transformer"].flops is not None


@pytest.mark.slow
def test_plain_mlp_is_counted_from_its_modules() -> None:
    torch.manual_seed(0)
    model = nn.Sequential(
        nn.Embedding(VOCAB, 16), nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, VOCAB)
    ).train()
    ids = torch.randint(1, VOCAB, (3, 5))
    with FlopMeter(model) as meter:
        model(ids).sum().backward()
    report = meter.report()
    assert report.compute.primary_estimate == "transformer"
    # 15 tokens; first linear: input (embedding output) needs a gradient: 6 * 16*64 = 6144;
    # second: 6 * 64*128 = 49152 -> 15 * 55296 = 829440
    assert report.compute.primary_flops == 829440
    with FlopCounterMode(display=False) as counter:
        model(ids).sum().backward()
    assert report.compute.primary_flops == counter.get_total_flops()
    transformer_notes = report.compute.estimates["transformer"].notes
    assert any("read from the modules themselves" in n for n in transformer_notes)


def test_no_training_batch_means_no_transformer_figure() -> None:
    model = tiny_qwen2()
    with FlopMeter(model) as meter:
        pass
    report = meter.report()
    assert report.compute.primary_estimate is None  # no sample: nothing is checked
    # nothing was trained: no compute figure (not 0, which would read as "measured nothing")
    # and no verdict, with the reason
    assert report.compute.primary_flops is None and report.verdict.outcome is None
    assert "No training micro-batch has been counted" in report.compute.withheld_reason
    assert report.compute.estimates["transformer"].flops is None
    assert report.model.n_active is None
    assert any(
        "no training micro-batch" in n for n in report.compute.estimates["transformer"].notes
    )


@pytest.mark.slow
def test_recount_profiles_again() -> None:
    model = tiny_qwen2()
    ids = torch.randint(1, VOCAB, (1, 8))
    with FlopMeter(model) as meter:
        model(input_ids=ids, labels=ids).loss.backward()
        full = meter.report().compute.estimates["transformer"].inputs["linear_flops"]
        model.requires_grad_(False)
        model.lm_head.requires_grad_(True)  # tied: the embedding table trains, nothing else
        meter.recount()
        model(input_ids=ids, labels=ids).loss.backward()
    after = meter.report().compute.estimates["transformer"].inputs["linear_flops"]
    # per layer q 32x32 + k, v 32x16 + o 32x32 + MLP 3 * 32x64 = 9216 MACs, two layers 18432;
    # lm_head 32x128 = 4096. Full fine-tuning: 6 * (18432 + 4096) = 135168 per token, 8 tokens
    assert full == 8 * 135168
    # then only the tied table trains: its lookups still need gradients, so every layer gets
    # an input gradient (4 per MAC) and lm_head a weight gradient too (6):
    # 4 * 18432 + 6 * 4096 = 98304 per token, over all 16 tokens (the profile applies to all)
    assert after == 16 * 98304


@pytest.mark.parametrize("bad", [-1, 1.5, "10", True])
def test_measure_every_is_validated(bad: object) -> None:
    with pytest.raises(ConfigurationError, match="measure_every"):
        FlopMeter(nn.Linear(2, 2), measure_every=bad)  # type: ignore[arg-type]


@pytest.mark.slow
def test_sampling_can_be_turned_off() -> None:
    report = run(tiny_qwen2(), padded_batches([[6, 6]], width=6), measure_every=0)
    measured = report.compute.estimates["measured"]
    assert measured.flops is None
    assert measured.notes == ["Sampling was turned off (measure_every=0)."]
    assert report.compute.measured_to_transformer_ratio is None


class Wrapper(nn.Module):
    """A training wrapper without a config of its own (as a Lightning module or DDP is)."""

    def __init__(self, inner: nn.Module) -> None:
        super().__init__()
        self.inner = inner

    def forward(self, input_ids: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        return self.inner(input_ids=input_ids, labels=labels).loss


@pytest.mark.slow
def test_config_is_found_inside_a_wrapper() -> None:
    inner = tiny_qwen2()
    model = Wrapper(inner).train()
    ids = torch.randint(1, VOCAB, (2, 6))
    with FlopMeter(model) as meter:
        model(input_ids=ids, labels=ids).backward()
    report = meter.report()
    assert report.compute.primary_estimate == "transformer"
    assert report.compute.primary_flops == pytest.approx(unpadded_truth(inner, [ids]), rel=1e-9)
    lm_head = [g for g in report.compute.estimates["transformer"].inputs["linear_groups"]]
    assert any(g["kind"] == "lm_head" for g in lm_head)
