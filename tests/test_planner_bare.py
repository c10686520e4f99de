"""The plan of bare numbers (``--params``) is pure arithmetic, by the meter's own formulas.

:mod:`flopmeter.planner.bare` uses :mod:`flopmeter.flops.formulas` (which imports nothing, so
``flopmeter estimate --params`` imports no torch), the module the meter's estimates use; the
plan's figures are compared with the formulas written out by hand.
"""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from flopmeter.compliance.thresholds import determine_threshold
from flopmeter.compliance.verdict import verdict
from flopmeter.flops import estimates, formulas
from flopmeter.planner import bare, estimate

counts = st.integers(min_value=1, max_value=10**15)


@settings(max_examples=500, deadline=None)
@given(n_total=counts, n_trainable=st.integers(0, 10**15), tokens=counts)
def test_the_formulas_are_the_meters_own(n_total, n_trainable, tokens):
    # one copy: the planner's names are the estimates' functions, and they are the formulas
    assert bare.seed_flops is estimates.seed_flops is formulas.seed_flops
    assert bare.six_nd_flops is estimates.six_nd_flops is formulas.six_nd_flops
    assert formulas.seed_flops(n_total, n_trainable, tokens) == float(
        (4 * n_total + 2 * n_trainable) * tokens
    )
    assert formulas.six_nd_flops(n_total, tokens) == float(6 * n_total * tokens)


@settings(max_examples=200, deadline=None)
@given(params=counts, share=st.fractions(0, 1), tokens=counts, pretrain=st.sampled_from(
    [None, 1e22, 3.8e25, 5e26]))  # fmt: skip
def test_a_plan_of_bare_numbers_is_the_larger_formula_judged(params, share, tokens, pretrain):
    trainable = int(params * share)
    plan = estimate(params=params, trainable=trainable, tokens=tokens, pretrain_flops=pretrain)
    (m,) = plan.methods
    seed = float((4 * params + 2 * trainable) * tokens)
    six = float(6 * params * tokens)
    threshold = determine_threshold(pretrain)
    assert (m.seed_flops, m.six_nd_flops) == (seed, six)
    assert m.flops == max(seed, six)
    assert m.estimate == ("six_nd" if six >= seed else "seed")
    assert m.threshold_value == threshold.value and m.threshold_kind == threshold.kind
    assert m.verdict == verdict(max(seed, six), threshold.value)
    assert m.tokens_to_threshold == pytest.approx(threshold.value / max(seed, six) * tokens)
    assert (m.sequences, m.sum_sq_seq_len, m.micro_batches) == (None, None, None)
    assert plan.base_parameters == params and m.n_trainable == trainable


def test_trainable_defaults_to_every_parameter():
    (m,) = estimate(params="3.2B", tokens="1e9").methods
    assert m.n_trainable == m.n_total == 3_200_000_000
    assert m.seed_flops == 6 * 3.2e9 * 1e9 == m.six_nd_flops
