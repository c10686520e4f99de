"""The core meter on raw PyTorch loops, checked against counts the test makes itself."""

from __future__ import annotations

import json
import logging

import pytest
import torch

from flopmeter import ConfigurationError, FlopMeter, FlopMeterError
from flopmeter.flops.formulas import seed_flops, six_nd_flops
from tests.support.batches import PAD_ID, Truth, padded_batch
from tests.support.models import tiny_llama

# Row lengths of the training micro-batches (width 16) and of the evaluation batches.
TRAIN_LENGTHS = [
    [16, 3, 9, 1],
    [5, 5, 12, 16],
    [7, 2, 16, 4],
    [11, 8, 1, 13],
    [6, 14, 3, 10],
    [16, 16, 2, 2],
]
EVAL_LENGTHS = [[4, 16, 8, 2], [9, 9, 9, 9]]
WIDTH = 16


def train(
    model,
    meter_kwargs=None,
    *,
    accumulation=2,
    lengths=TRAIN_LENGTHS,
    left=False,
    evaluate_at=3,
    drop_mask=False,
):
    """A raw loop with gradient accumulation and an evaluation pass midway; returns the meter
    and the test's own count of what was trained."""
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-2)
    truth = Truth()
    steps = 0
    with FlopMeter(model, PAD_ID, **(meter_kwargs or {})) as meter:
        model.train()
        for i, rows in enumerate(lengths):
            batch = padded_batch(rows, WIDTH, left=left, seed=i)
            if drop_mask:
                del batch["attention_mask"]
            (model(**batch).loss / accumulation).backward()
            truth.add(rows, WIDTH)
            if (i + 1) % accumulation == 0:
                optimizer.step()
                optimizer.zero_grad()
                steps += 1
            if i + 1 == evaluate_at:
                model.eval()
                with torch.no_grad():
                    for j, rows_eval in enumerate(EVAL_LENGTHS):
                        model(**padded_batch(rows_eval, WIDTH, seed=100 + j))
                model.train()
    return meter, truth, steps


def assert_counts(report, truth, steps):
    assert report.tokens.tokens_processed == truth.tokens
    assert report.tokens.tokens_seen == truth.seen
    assert report.tokens.sequences == truth.sequences
    assert report.tokens.sum_sq_seq_len == truth.sum_sq
    assert report.tokens.micro_batches == truth.micro_batches
    assert report.tokens.optimizer_steps == steps


@pytest.mark.slow
def test_counts_training_tokens_only_with_accumulation_and_evaluation(model):
    meter, truth, steps = train(model)
    report = meter.report()
    assert report.run.status == "completed"
    # 29 + 38 + 29 + 33 + 33 + 36 = 198 real tokens of 6 x 4 x 16 = 384: the data has padding
    assert (truth.tokens, truth.seen, steps) == (198, 384, 3)
    assert_counts(report, truth, steps)


@pytest.mark.slow
def test_counts_from_pad_id_when_the_batch_has_no_mask(model):
    meter, truth, steps = train(model, drop_mask=True, left=True)
    assert_counts(meter.report(), truth, steps)


@pytest.mark.slow
def test_without_pad_id_or_mask_every_token_counts():
    model = tiny_llama()
    ids = padded_batch([3, 16], WIDTH)["input_ids"]
    with FlopMeter(model) as meter:
        model(input_ids=ids, labels=ids).loss.backward()
    report = meter.report()
    assert report.tokens.tokens_processed == report.tokens.tokens_seen == 2 * WIDTH


@pytest.mark.slow
def test_positional_ids_and_mask_are_found():
    model = tiny_llama()
    batch = padded_batch([5, 16, 2], WIDTH)
    with FlopMeter(model, PAD_ID) as meter:
        model(batch["input_ids"], batch["attention_mask"]).logits.sum().backward()
    assert meter.report().tokens.tokens_processed == 5 + 16 + 2


@pytest.mark.slow
def test_generate_and_no_grad_forward_do_not_count(model):
    batch = padded_batch([4, 6], WIDTH)
    with FlopMeter(model, PAD_ID) as meter:
        model.train()
        model.generate(
            input_ids=batch["input_ids"][:, :4],
            max_new_tokens=3,
            do_sample=False,
            pad_token_id=PAD_ID,
        )
        with torch.no_grad():
            model(**batch)
    report = meter.report()
    assert report.tokens.micro_batches == 0 and report.tokens.tokens_processed == 0


@pytest.mark.slow
@pytest.mark.parametrize("reentrant", [True, False])
def test_activation_checkpoint_recomputation_is_not_counted_again(reentrant):
    model = tiny_llama()
    model.gradient_checkpointing_enable({"use_reentrant": reentrant})
    meter, truth, steps = train(model, evaluate_at=-1)
    assert_counts(meter.report(), truth, steps)


@pytest.mark.slow
def test_report_inside_the_block_is_running_and_final_after(model):
    batch = padded_batch([5, 7], WIDTH)
    with FlopMeter(model, PAD_ID) as meter:
        model(**batch).loss.backward()
        running = meter.report()
        assert running.run.status == "running" and running.run.ended_at is None
        assert running.tokens.tokens_processed == 12
    final = meter.report()
    assert final.run.status == "completed" and final.run.ended_at is not None
    assert final.run.training_duration_seconds >= running.run.training_duration_seconds


@pytest.mark.slow
def test_lora_wrapped_after_the_meter_is_counted_as_it_trains():
    from peft import LoraConfig, get_peft_model

    base = tiny_llama()
    meter = FlopMeter(base, PAD_ID)  # made before PEFT freezes the base model
    model = get_peft_model(base, LoraConfig(r=4, target_modules=["q_proj", "v_proj"]))
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad])
    with meter:
        model.train()
        model(**padded_batch([9, 4], WIDTH)).loss.backward()
        optimizer.step()
    report = meter.report()
    trainable, total = model.get_nb_trainable_parameters()
    assert (report.model.n_trainable, report.model.n_total) == (trainable, total)
    assert report.model.n_frozen == total - trainable
    assert report.tokens.tokens_processed == 13 and report.tokens.optimizer_steps == 1
    # The seed formula from the report's own fields (LoRA: far less than full fine-tuning).
    assert report.compute.estimates["seed"].flops == (4 * total + 2 * trainable) * 13


@pytest.mark.slow
def test_seed_and_six_nd_estimates_match_their_formulas(model):
    meter, truth, _ = train(model)
    report = meter.report()
    n = report.model.n_total
    assert report.compute.estimates["seed"].flops == (4 * n + 2 * n) * truth.tokens
    assert report.compute.estimates["six_nd"].flops == 6 * n * truth.tokens
    assert seed_flops(10, 4, 3) == (40 + 8) * 3
    assert six_nd_flops(10, 3) == 180
    assert (
        report.compute.primary_flops
        == report.compute.estimates[report.compute.primary_estimate].flops
    )
    assert report.verdict.ratio_to_threshold == pytest.approx(
        report.compute.primary_flops / report.threshold.threshold_flops
    )
    assert report.verdict.exceeds_threshold is False and report.verdict.outcome == "below_threshold"


@pytest.mark.slow
def test_recount_follows_a_change_in_what_trains(model):
    batch = padded_batch([5], WIDTH)
    with FlopMeter(model, PAD_ID) as meter:
        model(**batch).loss.backward()
        assert meter.report().model.n_frozen == 0
        model.lm_head.weight.requires_grad_(False)
        assert meter.report().model.n_frozen == 0  # the census is kept until recount()
        meter.recount()
    assert meter.report().model.n_frozen == 97 * 32


def test_only_the_given_optimizer_or_the_models_optimizers_count(model):
    other = torch.nn.Linear(2, 2)
    other_opt = torch.optim.SGD(other.parameters(), lr=0.1)
    own = torch.optim.SGD(model.parameters(), lr=0.1)
    with FlopMeter(model, PAD_ID) as meter:
        for _ in range(2):
            other_opt.step()
            own.step()
    assert meter.report().tokens.optimizer_steps == 2
    second = torch.optim.SGD(model.parameters(), lr=0.1)
    with FlopMeter(model, PAD_ID, optimizer=own) as meter:
        own.step()
        second.step()
    assert meter.report().tokens.optimizer_steps == 1


@pytest.mark.slow
def test_failure_is_reported_and_the_exception_propagates_unchanged(model, tmp_path):
    out = tmp_path / "report.json"
    boom = RuntimeError("CUDA out of memory (simulated)")
    with pytest.raises(RuntimeError) as caught, FlopMeter(model, PAD_ID, output=out) as meter:
        model(**padded_batch([4, 8], WIDTH)).loss.backward()
        raise boom
    assert caught.value is boom
    written = json.loads(out.read_text())
    assert written["run"]["status"] == "failed"
    assert written["run"]["error"] == "RuntimeError: CUDA out of memory (simulated)"
    assert written["tokens"]["tokens_processed"] == 12
    assert meter.report().run.status == "failed"


def test_keyboard_interrupt_is_reported_as_interrupted(model, tmp_path):
    with pytest.raises(KeyboardInterrupt), FlopMeter(model, PAD_ID, output=tmp_path) as meter:
        raise KeyboardInterrupt
    assert meter.report().run.status == "interrupted"
    assert json.loads((tmp_path / "flops_meter.json").read_text())["run"]["status"] == "interrupted"


@pytest.mark.slow
def test_resume_through_state_dict_continues_the_counts(tmp_path):
    whole, _, _ = train(tiny_llama(), evaluate_at=-1)

    model = tiny_llama()
    first, _, _ = train(model, lengths=TRAIN_LENGTHS[:4], evaluate_at=-1)
    state = json.loads(json.dumps(first.state_dict()))  # survives a JSON checkpoint
    resumed_meter = FlopMeter(model, PAD_ID)
    resumed_meter.load_state_dict(state)
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-2)
    with resumed_meter:
        for i, rows in enumerate(TRAIN_LENGTHS[4:], start=4):
            model(**padded_batch(rows, WIDTH, seed=i)).loss.backward()
            if (i + 1) % 2 == 0:
                optimizer.step()
    a, b = whole.report(), resumed_meter.report()
    for section, field in (
        ("tokens", "tokens_processed"),
        ("tokens", "tokens_seen"),
        ("tokens", "sequences"),
        ("tokens", "sum_sq_seq_len"),
        ("tokens", "micro_batches"),
        ("tokens", "optimizer_steps"),
        ("compute", "primary_flops"),
    ):
        assert getattr(getattr(a, section), field) == getattr(getattr(b, section), field), field
    assert b.run.started_at == first.report().run.started_at
    assert b.run.training_duration_seconds >= first.report().run.training_duration_seconds


@pytest.mark.slow
def test_output_is_written_atomically_as_json_numbers(model, tmp_path):
    out = tmp_path / "nested" / "run.json"
    meter, truth, _ = train(model, {"output": out, "pretrain_flops": 1.2e24})
    data = json.loads(out.read_text())
    assert data == json.loads(meter.report().to_json())
    assert isinstance(data["compute"]["primary_flops"], float)
    assert (
        isinstance(data["tokens"]["tokens_processed"], int)
        and data["tokens"]["tokens_processed"] == truth.tokens
    )
    assert data["threshold"]["kind"] == "one_third_of_original"
    assert data["threshold"]["threshold_flops"] == pytest.approx(4e23)
    assert [p.name for p in out.parent.iterdir()] == ["run.json"]  # no temporary left


@pytest.mark.slow
def test_sagemaker_dict_keeps_the_aws_keys(model):
    meter, truth, _ = train(model, {"pretrain_flops": 3e23})
    d = meter.report().to_sagemaker_dict()
    assert set(d) == {
        "N_total",
        "N_trainable",
        "tokens_processed",
        "Flops_architecture",
        "Flops_hardware",
        "Flops_original",
        "threshold_type",
        "threshold_value",
        "pct_of_pretrain",
        "exceeds_30pct",
        "model_name",
        "num_epochs",
        "training_duration_seconds",
        "gpu_name",
    }
    assert d["tokens_processed"] == truth.tokens
    assert d["Flops_original"] == 3e23
    assert d["pct_of_pretrain"] == pytest.approx(d["Flops_architecture"] / 3e23)
    assert d["threshold_value"] == pytest.approx(1e23)
    assert d["exceeds_30pct"] is False


def test_pretrain_flops_from_the_environment(model, monkeypatch):
    monkeypatch.setenv("PRETRAIN_FLOPS", "6e24")
    report = FlopMeter(model).report()
    assert report.threshold.original_flops == 6e24
    assert report.threshold.threshold_flops == pytest.approx(2e24)
    assert "PRETRAIN_FLOPS" in report.threshold.original_flops_source
    monkeypatch.setenv("PRETRAIN_FLOPS", "lots")
    with pytest.raises(ConfigurationError, match="PRETRAIN_FLOPS"):
        FlopMeter(model)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"pad_id": -1}, "pad_id"),
        ({"pad_id": 1.5}, "pad_id"),
        ({"pad_id": True}, "pad_id"),
        ({"pretrain_flops": -3.0}, "negative"),
        ({"pretrain_flops": float("nan")}, "finite"),
        ({"pretrain_flops": float("inf")}, "finite"),
        ({"optimizer": "adam"}, "optimizer"),
    ],
)
def test_bad_arguments_are_refused_before_training(model, kwargs, match):
    with pytest.raises(ConfigurationError, match=match):
        FlopMeter(model, **kwargs)


def test_a_model_that_is_not_a_module_is_refused():
    with pytest.raises(ConfigurationError, match=r"nn\.Module"):
        FlopMeter(lambda x: x)


def test_an_unwritable_output_fails_on_entry_not_at_the_end(model, tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    meter = FlopMeter(model, output=blocker / "report.json")
    with pytest.raises(ConfigurationError, match="cannot be written"):
        meter.__enter__()


def test_a_finished_meter_cannot_be_entered_again(model):
    meter = FlopMeter(model)
    with meter:
        pass
    with pytest.raises(FlopMeterError, match="finished"), meter:
        pass


@pytest.mark.slow
def test_an_error_inside_the_hook_never_stops_training(model, monkeypatch, caplog):
    def broken(*args, **kwargs):
        raise RuntimeError("kernel exploded")

    monkeypatch.setattr("flopmeter.counting.counters.accumulate_token_stats", broken)
    losses = []
    with caplog.at_level(logging.WARNING, logger="flopmeter"), FlopMeter(model, PAD_ID) as meter:
        for i in range(3):
            loss = model(**padded_batch([4, 8], WIDTH, seed=i)).loss
            loss.backward()
            losses.append(loss.item())
    assert len(losses) == 3 and all(torch.isfinite(torch.tensor(losses)))
    assert sum("kernel exploded" in r.getMessage() for r in caplog.records) == 1  # logged once
    report = meter.report()
    assert report.run.status == "completed"
    assert any("kernel exploded" in note for note in report.notes)


@pytest.mark.slow
def test_recomputing_the_metered_module_itself_is_not_counted_again():
    # Non-reentrant checkpointing around the metered module: its forward runs with grad and
    # counts; the recomputation during backward does not. (Reentrant checkpointing of the
    # metered module itself runs its forward without grad: see docs/architecture.md.)
    reentrant = False
    from torch.utils.checkpoint import checkpoint

    inner = tiny_llama()
    batch = padded_batch([7, 3], WIDTH)
    calls = []
    inner.register_forward_pre_hook(lambda *a: calls.append(1))
    with FlopMeter(inner, PAD_ID) as meter:
        scale = torch.ones(1, requires_grad=True)
        logits = checkpoint(
            lambda ids, mask, s: inner(input_ids=ids, attention_mask=mask).logits * s,
            batch["input_ids"],
            batch["attention_mask"],
            scale,
            use_reentrant=reentrant,
        )
        logits.float().pow(2).mean().backward()
    assert len(calls) == 2  # the module really ran twice: forward and recomputation
    report = meter.report()
    assert (report.tokens.micro_batches, report.tokens.tokens_processed) == (1, 10)


@pytest.mark.slow
def test_inputs_embeds_count_every_position_even_with_a_pad_id(model):
    batch = padded_batch([3, 9], WIDTH)
    embeds = model.get_input_embeddings()(batch["input_ids"]).detach()
    with FlopMeter(model, PAD_ID) as meter:
        model(inputs_embeds=embeds, labels=batch["labels"]).loss.backward()
    report = meter.report()
    assert report.tokens.tokens_processed == report.tokens.tokens_seen == 2 * WIDTH
    assert report.tokens.sum_sq_seq_len == 2 * WIDTH * WIDTH


def test_compute_said_to_be_in_no_count_withholds_the_figure_and_the_verdict():
    """FlopMeter.uncounted: a figure known to be a part of the run is never judged."""
    from tests.support.models import PAD_ID, tiny_llama

    model = tiny_llama()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    with FlopMeter(model, PAD_ID) as meter:
        ids = torch.randint(1, 90, (2, 8))
        model(input_ids=ids, labels=ids).loss.backward()
        opt.step()
        assert meter.report().verdict.outcome is not None  # judged before
        meter.uncounted("a discriminator's training")
    report = meter.report()
    assert report.compute.primary_flops is None and report.verdict.outcome is None
    assert "a discriminator's training" in report.compute.withheld_reason
