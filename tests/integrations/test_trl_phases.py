"""TRL's post-training trainers, metered with the Hugging Face callback: the whole run's compute
by phase, held to PyTorch's own count of the whole ``trainer.train()`` split by the model whose
forward call runs each operator (tests/support/phase_truth.py).

The data are of one length (prompts, chosen and rejected texts; completions generated to their
full length), so that no batch is padded: the training figure counts non-padding tokens and the
truth counts what ran, and here the two are the same work. Activation checkpointing is off (its
recomputation is not training compute: Annex A.1, para. 122), and the in-place ``addmm_`` TRL's
fused head runs in backward is counted in the truth.
"""

from __future__ import annotations

import pytest
import torch

from tests.support.models import tiny_llama
from tests.support.phase_truth import count_by_model
from tests.support.text import word_tokenizer
from tests.support.trl_runs import (
    distillation,
    dpo,
    gkd,
    grpo,
    reward_model,
    run,
    texts,
)

pytestmark = pytest.mark.slow

trl = pytest.importorskip("trl")

REL = 1e-6


def _phase(report, name):
    return next(p for p in report.compute.phases if p.name == name)


@pytest.mark.parametrize("kind", ["grpo", "rloo"])
def test_grpo_with_a_reference_counts_generation_and_the_reference(saved, tmp_path, kind):
    truth, report = run(lambda m: grpo(saved, tmp_path / str(m), m, trainer=kind))
    # RLOO also recomputes the old log-probs without gradients (scoring); GRPO with one
    # iteration per generation does not
    scoring = ["scoring"] if kind == "rloo" else []
    names = ["training", "generation", *scoring, "model reference"]
    assert [p.name for p in report.compute.phases] == names
    no_grad = sum(_phase(report, n).flops for n in ["generation", *scoring])
    assert no_grad == pytest.approx(truth["policy/nograd"], rel=REL)
    assert _phase(report, "model reference").flops == pytest.approx(
        truth["reference/nograd"], rel=REL
    )
    training = truth["policy/grad"] + truth["backward"]
    assert report.compute.primary_flops == pytest.approx(training, rel=0.01)
    assert report.verdict.judged_flops == pytest.approx(truth["total"], rel=0.01)
    assert report.tokens.tokens_processed == report.tokens.tokens_seen  # no padding


def test_grpo_with_a_reward_model_and_no_reference(saved, tmp_path):
    def make(m):
        return grpo(saved, tmp_path / str(m), m, beta=0.0, reward_model=reward_model(tmp_path))

    truth, report = run(make)
    assert [p.name for p in report.compute.phases] == [
        "training",
        "generation",
        "model reward model 1",
    ]
    reward = _phase(report, "model reward model 1")
    assert reward.flops == pytest.approx(truth["reward0/nograd"], rel=REL) and reward.counted
    assert report.verdict.judged_flops == pytest.approx(truth["total"], rel=0.01)


def test_grpo_with_lora_counts_the_adapter_disabled_reference_as_scoring(saved, tmp_path):
    truth, report = run(lambda m: grpo(saved, tmp_path / str(m), m, lora=True))
    # TRL generates with the model inside the PEFT wrapper (outside the watched policy in the
    # truth) and scores the reference with the adapter disabled (the policy, without gradients)
    assert _phase(report, "generation").flops == pytest.approx(truth["outside"], rel=REL)
    assert _phase(report, "scoring").flops == pytest.approx(truth["policy/nograd"], rel=REL)
    assert report.verdict.judged_flops == pytest.approx(truth["total"], rel=0.01)


def test_the_updates_policy_judges_grpo_on_its_training_passes(saved, tmp_path):
    trainer, cbs = grpo(saved, tmp_path, True, phases="updates")
    trainer.train()
    report = cbs[0].meter.report()
    assert report.verdict.judged_flops == report.compute.primary_flops
    assert not _phase(report, "generation").counted and _phase(report, "generation").flops > 0


def test_dpo_counts_its_reference_model(saved, tmp_path):
    truth, report = run(lambda m: dpo(saved, tmp_path / str(m), m))
    reference = _phase(report, "model reference")
    assert reference.flops == pytest.approx(truth["reference/nograd"], rel=REL)
    assert report.verdict.judged_flops == pytest.approx(truth["total"], rel=0.01)


def test_dpo_with_precomputed_reference_log_probs_names_what_it_did_not_see(saved, tmp_path):
    trainer, cbs = dpo(saved, tmp_path, True, precompute=True)
    trainer.train()
    report = cbs[0].meter.report()
    unseen = _phase(report, "reference log-probs (precomputed)")
    assert unseen.flops is None and unseen.counted
    assert report.verdict.outcome is None and report.compute.primary_flops is not None
    assert "precompute_ref_log_probs" in report.compute.withheld_reason


def test_distillation_trainer_counts_the_teacher_and_generation(saved, teacher_saved, tmp_path):
    def make(meter):
        return distillation(saved, teacher_saved, tmp_path / str(meter), meter)

    trainer, _ = make(False)
    truth = count_by_model(
        trainer.train, {"policy": trainer.model, "teacher": trainer.teacher_model}
    )
    trainer, cbs = make(True)
    trainer.train()
    report = cbs[0].meter.report()
    assert _phase(report, "model teacher").flops == pytest.approx(truth["teacher/nograd"], rel=REL)
    assert _phase(report, "generation").flops == pytest.approx(truth["policy/nograd"], rel=REL)
    # its training calls are read through TRL's forward redirection (the prompt and the
    # completion joined): none is left unread, and every token of both is counted
    assert report.tokens.micro_batches_unread == 0
    tok = word_tokenizer()
    tok.chat_template = "{% for m in messages %}{{ m['content'] }} {% endfor %}"
    prompt_tokens = sum(
        len(tok.apply_chat_template([{"role": "user", "content": t}], return_dict=False))
        for t in texts(8, 5, 5)
    )
    assert report.tokens.tokens_processed == prompt_tokens + 8 * 6  # 2 steps of 4, 6 generated
    assert report.verdict.judged_flops == pytest.approx(truth["total"], rel=0.01)


def test_vllm_generation_is_named_as_not_seen(tmp_path):
    """A trainer whose args say ``use_vllm`` (vLLM itself needs a GPU: its attribute stands in,
    the rest is real): the HF callback's naming declares the generation as not seen."""
    from types import SimpleNamespace

    from flopmeter import FlopMeter
    from flopmeter.integrations.trl import name_trainer_models

    model, ref = tiny_llama(), tiny_llama()
    trainer = SimpleNamespace(
        model=model, ref_model=ref, args=SimpleNamespace(use_vllm=True), reward_funcs=[len]
    )
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    with FlopMeter(model, pad_id=0, output=tmp_path / "v.json", ledger=False) as meter:
        name_trainer_models(meter, trainer)
        ids = torch.randint(1, 97, (2, 8))
        with torch.no_grad():
            ref(input_ids=ids)
        model(input_ids=ids, labels=ids).loss.backward()
        opt.step()
    report = meter.report()
    unseen = _phase(report, "generation (vLLM)")
    assert unseen.flops is None and unseen.counted and "use_vllm" in unseen.reason
    assert _phase(report, "model reference").flops > 0
    assert report.verdict.outcome is None and "vLLM" in report.compute.withheld_reason


def test_gkd_counts_generation_made_in_evaluation_mode_and_the_teacher(
    saved, teacher_saved, tmp_path
):
    """TRL's GKD generates its on-policy data before the Trainer's training step puts the model
    back in training mode: the callback marks the Trainer's evaluation loops, so the mode alone
    does not make that generation evaluation."""

    def make(meter):
        return gkd(saved, teacher_saved, tmp_path, meter)

    trainer, _ = make(False)
    truth = count_by_model(
        trainer.train, {"policy": trainer.model, "teacher": trainer.teacher_model}
    )
    trainer, cbs = make(True)
    trainer.train()
    report = cbs[0].meter.report()
    assert [p.name for p in report.compute.phases] == ["training", "generation", "model teacher"]
    assert _phase(report, "generation").flops == pytest.approx(truth["policy/nograd"], rel=REL)
    assert _phase(report, "model teacher").flops == pytest.approx(truth["teacher/nograd"], rel=REL)
    others = truth["policy/nograd"] + truth["teacher/nograd"]
    assert report.verdict.judged_flops == pytest.approx(report.compute.primary_flops + others)
    assert report.verdict.judged_flops == pytest.approx(truth["total"], rel=0.01)
