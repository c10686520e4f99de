"""The run's phases: every model and every forward pass that feeds the updates, counted by phase
and held to PyTorch's own count (``FlopCounterMode``) of the whole run.

The loops here are what users write for distillation and RL-style post-training: a frozen
teacher or reference model beside the trained one, completions generated with a key-value
cache, log-probabilities recomputed without gradients. The truth is one ``FlopCounterMode``
over the whole loop, run without the meter on identical models and data (eager attention, so
that PyTorch's formulas and the meter's count the same work).
"""

from __future__ import annotations

import json

import pytest
import torch
import torch.nn.functional as F
from torch.utils.flop_counter import FlopCounterMode

from flopmeter import FlopMeter
from flopmeter.errors import ConfigurationError
from flopmeter.flops.call_units import call_units
from flopmeter.flops.phases import FormTally, PhaseTally, form_flops, phase_figures
from flopmeter.render import render
from flopmeter.report.reading import read_report
from tests.support.models import tiny_llama

REL = 1e-9


def _teacher():
    return tiny_llama(attn_implementation="eager", hidden_size=64, intermediate_size=128).eval()


def _batches(n: int = 4, rows: int = 2, cols: int = 16) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    return [torch.randint(1, 97, (rows, cols), generator=g) for _ in range(n)]


def _distill(order: str, meter: FlopMeter | None = None):
    """A distillation loop: the frozen teacher's forward before or after the student's."""
    student, teacher = tiny_llama(attn_implementation="eager"), _teacher()
    opt = torch.optim.AdamW(student.parameters(), lr=1e-3)

    def loop() -> None:
        for ids in _batches():
            if order == "before":
                with torch.no_grad():
                    target = teacher(input_ids=ids).logits
            logits = student(input_ids=ids).logits
            if order == "after":
                with torch.no_grad():
                    target = teacher(input_ids=ids).logits
            loss = F.kl_div(
                F.log_softmax(logits, -1),
                F.log_softmax(target, -1),
                log_target=True,
                reduction="batchmean",
            )
            loss.backward()
            opt.step()
            opt.zero_grad()

    return student, teacher, loop


def _truth(loop) -> int:
    with FlopCounterMode(display=False) as counter:
        loop()
    return counter.get_total_flops()


def _metered(model, loop, tmp_path, name: str, **options):
    with FlopMeter(model, pad_id=0, output=tmp_path / f"{name}.json", ledger=False, **options) as m:
        loop()
    return m.report()


def _phase(report, name):
    return next(p for p in report.compute.phases if p.name.startswith(name))


def test_the_two_distillation_orders_give_the_same_figure_and_split_and_the_whole_run(tmp_path):
    truth = _truth(_distill("before")[2])
    reports = {}
    for order in ("before", "after"):
        student, _, loop = _distill(order)
        reports[order] = _metered(student, loop, tmp_path, order)
    before, after = reports["before"], reports["after"]
    assert before.compute.primary_flops == after.compute.primary_flops
    assert _phase(before, "model").flops == _phase(after, "model").flops
    for report in (before, after):
        assert report.verdict.judged_flops == pytest.approx(truth, rel=REL)
        assert [p.name for p in report.compute.phases] == ["training", "model LlamaForCausalLM #1"]
        teacher = _phase(report, "model")
        assert teacher.counted and teacher.calls == 4
        assert "LlamaForCausalLM (86,464 parameters)" in teacher.modules
        # the teacher's share is its own forward work: counted alone, on the same data
    t = _teacher()
    alone = _truth(lambda: [t(input_ids=ids) for ids in _batches()])
    assert _phase(before, "model").flops == pytest.approx(alone, rel=REL)


def _rl_loop(policy, ref, prompts, *, evaluate: bool = False):
    """An RL-style step: completions generated with a cache, old log-probs and the reference's
    without gradients, then the policy's training forward and backward."""
    opt = torch.optim.AdamW(policy.parameters(), lr=1e-3)

    def loop() -> None:
        for p in prompts:
            with torch.no_grad():
                seqs = policy.generate(
                    p,
                    attention_mask=torch.ones_like(p),
                    max_new_tokens=5,
                    do_sample=False,
                    pad_token_id=0,
                )
                old = policy(input_ids=seqs).logits
                ref_logits = ref(input_ids=seqs).logits
            logits = policy(input_ids=seqs).logits
            loss = (F.log_softmax(logits, -1) - F.log_softmax(ref_logits, -1) + 0 * old).mean()
            loss.backward()
            opt.step()
            opt.zero_grad()
            if evaluate:
                policy.eval()
                with torch.no_grad():
                    policy(input_ids=seqs)
                    ref(input_ids=seqs)
                policy.train()

    return loop


def _rl(evaluate: bool = False):
    policy = tiny_llama(attn_implementation="eager")
    ref = tiny_llama(attn_implementation="eager").eval()
    prompts = _batches(3, 2, 6)
    return policy, ref, _rl_loop(policy, ref, prompts, evaluate=evaluate)


def test_generation_scoring_and_the_reference_are_counted_exactly(tmp_path):
    truth = _truth(_rl()[2])
    policy, _, loop = _rl()
    report = _metered(policy, loop, tmp_path, "rl")
    names = [p.name for p in report.compute.phases]
    assert names == ["training", "generation", "scoring", "model LlamaForCausalLM #1"]
    assert report.verdict.judged_flops == pytest.approx(truth, rel=REL)
    generation = _phase(report, "generation")
    assert generation.calls == 15 and generation.counted  # 3 prompts x (prefill + 4 decodes)
    assert _phase(report, "scoring").calls == 3
    assert "the 'modification' phase policy" in report.verdict.basis
    assert "generation, scoring, model LlamaForCausalLM #1" in report.verdict.basis


def test_evaluation_is_named_and_never_counted(tmp_path):
    truth_all = _truth(_rl(evaluate=True)[2])
    truth_train = _truth(_rl()[2])
    policy, _, loop = _rl(evaluate=True)
    report = _metered(policy, loop, tmp_path, "eval")
    evaluation = _phase(report, "evaluation")
    assert not evaluation.counted and evaluation.calls == 6
    assert report.verdict.judged_flops == pytest.approx(truth_train, rel=REL)
    assert evaluation.flops == pytest.approx(truth_all - truth_train, rel=REL)


def test_the_updates_policy_judges_the_training_passes_and_shows_the_rest(tmp_path):
    policy, _, loop = _rl()
    report = _metered(policy, loop, tmp_path, "updates", phases="updates")
    assert report.compute.phase_policy == "updates"
    assert report.verdict.judged_flops == report.compute.primary_flops
    others = [p for p in report.compute.phases if p.name != "training"]
    assert others and all(not p.counted and p.flops > 0 for p in others)


def test_the_policy_comes_from_the_environment_and_bad_ones_are_refused(monkeypatch):
    from flopmeter.options import MeterOptions

    monkeypatch.setenv("FLOPMETER_PHASES", "updates")
    assert MeterOptions().phases == "updates"
    assert MeterOptions(phases="modification").phases == "modification"  # the argument wins
    monkeypatch.setenv("FLOPMETER_PHASES", "all of it")
    with pytest.raises(ConfigurationError, match="FLOPMETER_PHASES"):
        MeterOptions()
    with pytest.raises(ConfigurationError, match="phases"):
        MeterOptions(phases="everything")


def test_a_declared_phase_is_added_and_an_unseen_one_withholds_the_verdict(tmp_path):
    student, _, loop = _distill("before")
    with FlopMeter(student, pad_id=0, output=tmp_path / "d.json", ledger=False) as m:
        loop()
        m.declare_phase("generation (vLLM)", None, "completions generated in a vLLM server")
    report = m.report()
    assert report.verdict.outcome is None and report.compute.primary_flops is not None
    assert "generation (vLLM)" in report.compute.withheld_reason
    unseen = _phase(report, "generation (vLLM)")
    assert unseen.flops is None and unseen.counted and "vLLM server" in unseen.reason

    student, _, loop = _distill("before")
    with FlopMeter(student, pad_id=0, output=tmp_path / "e.json", ledger=False) as m:
        loop()
        m.declare_phase("teacher logits", 1e9, "precomputed offline, see run 42")
    report = m.report()
    plain = _truth(_distill("before")[2])
    assert report.verdict.judged_flops == pytest.approx(plain + 1e9, rel=REL)
    with pytest.raises(ConfigurationError):
        m.declare_phase("training", 1.0, "x")
    with pytest.raises(ConfigurationError):
        m.declare_phase("x", -1.0, "x")
    with pytest.raises(ConfigurationError):
        m.declare_phase("x", 1.0, "")


def test_the_report_file_holds_the_phases_and_every_reader_shows_them(tmp_path):
    policy, _, loop = _rl()
    report = _metered(policy, loop, tmp_path, "file")
    path = tmp_path / "file.json"
    data = json.loads(path.read_text())
    assert data["schema_version"] == "2.2"
    assert [p["name"] for p in data["compute"]["phases"]][:2] == ["training", "generation"]
    read = read_report(path)
    assert read.compute.phases == report.compute.phases
    for text in (render(read, "text"), render(read, "md"), render(read, "html")):
        assert "Compute by phase" in text and "generation" in text and "Phase policy" in text


def test_a_2_1_report_reads_with_no_phases(tmp_path):
    policy, _, loop = _rl()
    _metered(policy, loop, tmp_path, "old")
    path = tmp_path / "old.json"
    data = json.loads(path.read_text())
    data["schema_version"] = "2.1"
    del data["compute"]["phases"], data["compute"]["phase_policy"]
    primary, verdict = data["compute"]["primary_flops"], data["verdict"]
    verdict["judged_flops"] = primary  # a 2.1 report judged its training passes alone
    verdict["ratio_to_threshold"] = primary / data["threshold"]["threshold_flops"]
    path.write_text(json.dumps(data))
    read = read_report(path)
    assert read.compute.phases == [] and read.compute.phase_policy is None
    assert "Compute by phase" not in read.to_text()


def test_a_named_model_is_its_own_phase(tmp_path):
    student, teacher, loop = _distill("before")
    with FlopMeter(student, pad_id=0, output=tmp_path / "n.json", ledger=False) as m:
        m.name_model(teacher, "teacher")
        loop()
    assert [p.name for p in m.report().compute.phases] == ["training", "model teacher"]


# -- the arithmetic, by hand -------------------------------------------------------------------


def test_a_form_is_exact_from_the_samples_that_span_its_totals():
    # FLOP = 10 per row + 3 per token + 2 per pair + 7 per head token, by construction
    def flops(u):
        return 10 * u[0] + 3 * u[1] + 2 * u[2] + 7 * u[3]

    calls = [(2, 12, 72, 2), (2, 2, 14, 2), (2, 2, 16, 2), (2, 2, 18, 2), (2, 22, 242, 22)]
    form = FormTally()
    for u in calls:
        form.add(u)
    for u in calls[:2] + calls[4:]:
        form.samples.append((u, flops(u)))
    # (2, 2, 16, 2) and (2, 2, 18, 2) are not in the span of the three samples (pairs move alone)
    assert form_flops(form) == (None, form_flops(form)[1])
    assert "outside" in form_flops(form)[1]
    form.samples.append((calls[2], flops(calls[2])))
    value, why = form_flops(form)
    assert why is None
    assert value == pytest.approx(sum(flops(u) for u in calls), rel=1e-12)


def test_samples_that_fit_no_linear_rule_give_no_figure():
    form = FormTally()
    for u, f in [((1, 1, 1, 1), 10), ((2, 2, 2, 2), 30), ((3, 3, 3, 3), 30)]:
        form.add(u)
        form.samples.append((u, f))
    value, why = form_flops(form)
    assert value is None and "no linear rule" in why


def test_a_phase_with_a_form_never_sampled_has_no_figure():
    tally = PhaseTally(forms={"text": FormTally(calls=3, totals=[3.0, 9.0, 27.0, 9.0])})
    (figure,) = phase_figures({"scoring": tally})
    assert figure.flops is None and "none of its 3 call(s)" in figure.reason


def test_call_units_read_the_cache_the_mask_and_logits_to_keep():
    class Cache:
        def get_seq_length(self) -> int:
            return 9

    ids = torch.zeros(2, 1, dtype=torch.long)
    form, units = call_units((), {"input_ids": ids, "cache": Cache(), "logits_to_keep": 1})
    assert form == "text, key-value cache, logits_to_keep=1"
    assert units == (2, 2, 2 * 1 * 10, 2)  # each row's one query against 9 cached keys + itself
    mask = torch.ones(2, 12)
    form, units = call_units((ids,), {"attention_mask": mask, "past_key_values": Cache()})
    assert units == (2, 2, 20, 2)  # the cache's length wins (a mask may be made wider)
    form, units = call_units((ids,), {"attention_mask": mask})
    assert units == (2, 2, 24, 2)  # else the mask's width
    form, units = call_units((torch.zeros(3, 5, dtype=torch.long),), {})
    assert (form, units) == ("text", (3, 15, 75, 15))
    form, units = call_units((torch.zeros(4, 3, 8, 8),), {})
    assert form == "shapes 0(4, 3, 8, 8)" and units == (1.0,)


# -- under torch.distributed and with a budget --------------------------------------------------


def _rank_distill(rank: int, world: int, store: str, out: str) -> None:
    from pathlib import Path

    from tests.support.dist import gloo_group

    with gloo_group(rank, world, store):
        student, teacher = tiny_llama(attn_implementation="eager"), _teacher()
        opt = torch.optim.SGD(student.parameters(), lr=1e-3)
        mine = _batches(4)[rank::world]  # each rank its own half of the data
        with FlopMeter(student, pad_id=0, output=Path(out) / "dist.json", ledger=False):
            for ids in mine:
                with torch.no_grad():
                    target = teacher(input_ids=ids).logits
                (student(input_ids=ids).logits - target).square().mean().backward()
                opt.step()
                opt.zero_grad()


@pytest.mark.slow
@pytest.mark.gloo
def test_two_ranks_sum_their_teachers_work(tmp_path):
    import torch.multiprocessing as mp

    mp.spawn(_rank_distill, args=(2, str(tmp_path / "store"), str(tmp_path)), nprocs=2, join=True)
    report = read_report(tmp_path / "dist.json")
    t = _teacher()
    alone = _truth(lambda: [t(input_ids=ids) for ids in _batches(4)])
    teacher = _phase(report, "model")
    assert teacher.calls == 4  # two per rank, summed
    assert teacher.flops == pytest.approx(alone, rel=REL)


def test_the_budget_counts_the_other_phases(tmp_path):
    # a step of the RL loop costs its training passes and about as much again besides: a
    # budget of 1.5 steps' training passes is crossed by the first step's whole work
    policy, _, loop = _rl()
    per_step = _metered(policy, loop, tmp_path, "plain").compute.primary_flops / 3
    from flopmeter.errors import BudgetExceeded

    policy, _, loop = _rl()
    with (
        pytest.raises(BudgetExceeded),
        FlopMeter(
            policy,
            pad_id=0,
            output=tmp_path / "b.json",
            ledger=False,
            budget=2.5 * per_step,
            budget_action="raise",
        ),
    ):
        loop()
    report = read_report(tmp_path / "b.json")
    assert report.budget.stopped_by_budget and report.tokens.optimizer_steps == 1
    assert report.verdict.judged_flops <= 2.5 * per_step
    # the training passes alone would have let a second step run within the budget
    assert 2 * report.compute.primary_flops < 2.5 * per_step


# -- the same without a line of flopmeter -------------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize("launcher", ["environment", "flopmeter run"])
def test_zero_code_gives_the_context_managers_phases(tmp_path, shared_runs, launcher):
    import sys
    from pathlib import Path

    from tests.support.exits import assert_exit_ok
    from tests.support.zero_code import launch

    script = Path(__file__).parent / "integrations" / "scripts" / "zero_code" / "distill_loop.py"
    root = str(Path(__file__).parent.parent)
    env = {"PYTHONPATH": root, "FLOPMETER_LEDGER": "0"}
    import subprocess

    from tests.support.zero_code import clean_env

    def context_manager_run(cm: Path) -> None:
        done = subprocess.run([sys.executable, str(script), "meter"], cwd=cm, env=clean_env(env),
                              capture_output=True, text=True, timeout=300, check=False)  # fmt: skip
        assert_exit_ok(done)

    # the context manager's run is deterministic: made once in the session, copied here
    cm = shared_runs.copy("distill_loop.py meter", tmp_path / "cm", context_manager_run)
    own = read_report(cm / "cm.json")
    for order in ("before", "after"):
        folder = tmp_path / f"{launcher}-{order}"
        folder.mkdir()
        assert_exit_ok(
            launch([sys.executable, str(script), order], launcher=launcher, cwd=folder, env=env)
        )
        zero = read_report(folder / "flops_meter.json")
        assert zero.attach is not None and zero.attach.method is not None
        assert [(p.name, p.flops, p.counted) for p in zero.compute.phases] == [
            (p.name, p.flops, p.counted) for p in own.compute.phases
        ]
        assert zero.verdict.judged_flops == own.verdict.judged_flops


def test_a_resumed_run_keeps_the_other_phases_of_its_checkpoint(tmp_path):
    truth = _truth(_distill("before")[2])
    student, teacher = tiny_llama(attn_implementation="eager"), _teacher()
    opt = torch.optim.AdamW(student.parameters(), lr=1e-3)
    batches = _batches()

    def steps(part):
        for ids in part:
            with torch.no_grad():
                target = teacher(input_ids=ids).logits
            F.kl_div(
                F.log_softmax(student(input_ids=ids).logits, -1),
                F.log_softmax(target, -1),
                log_target=True,
                reduction="batchmean",
            ).backward()
            opt.step()
            opt.zero_grad()

    with FlopMeter(student, pad_id=0, output=tmp_path / "a.json", ledger=False) as first:
        steps(batches[:2])
        state = json.loads(json.dumps(first.state_dict()))  # as a checkpoint holds it
    second = FlopMeter(student, pad_id=0, output=tmp_path / "b.json", ledger=False)
    second.load_state_dict(state)
    with second:
        steps(batches[2:])
    report = second.report()
    assert _phase(report, "model").calls == 4
    assert report.verdict.judged_flops == pytest.approx(truth, rel=REL)
    bad = {**state, "phases": {"model x": {"forms": {"text": {"calls": -1}}}}}
    with pytest.raises(ConfigurationError, match="phases"):
        FlopMeter(student, pad_id=0, ledger=False).load_state_dict(bad)


def test_the_html_bar_splits_the_judged_figure_by_phase(tmp_path):
    from flopmeter.render.svg import phase_segments, render_share_bar

    policy, _, loop = _rl()
    report = _metered(policy, loop, tmp_path, "bar")
    threshold = report.threshold.threshold_flops
    segments = phase_segments(report, threshold)
    assert [name for name, _, _ in segments] == [p.name for p in report.compute.phases if p.counted]
    assert segments[-1][2] == pytest.approx(report.verdict.judged_flops / threshold, rel=1e-12)
    svg = render_share_bar(report)
    assert svg.count('class="share-phase"') == len(segments)
    assert "generation: " in svg
