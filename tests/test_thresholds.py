import math

import pytest

from flopmeter import ConfigurationError, determine_threshold, verdict
from flopmeter.compliance.thresholds import pretrain_flops_from_env


def test_known_original_compute_gives_one_third_of_it():
    t = determine_threshold(3.8e25)
    assert t.kind == "one_third_of_original"
    assert t.value == pytest.approx(3.8e25 / 3)
    assert "3.2" in t.source


def test_known_original_at_exactly_1e23_uses_one_third_of_it():
    t = determine_threshold(1e23)
    assert t.kind == "one_third_of_original"
    assert t.value == pytest.approx(1e23 / 3)


def test_known_original_below_1e23_falls_back_to_the_gpai_default():
    # Llama 2 7B: 8.4e22 by 6ND, below the GPAI indicative criterion.
    t = determine_threshold(8.4e22)
    assert t.kind == "default_gpai"
    assert t.value == pytest.approx(1e23 / 3)


def test_unknown_original_gives_one_third_of_1e23():
    t = determine_threshold(None)
    assert t.kind == "default_gpai"
    assert t.value == pytest.approx(3.333e22, rel=1e-3)


def test_unknown_systemic_risk_original_gives_one_third_of_1e25():
    t = determine_threshold(None, original_systemic_risk=True)
    assert t.kind == "default_systemic_risk"
    assert t.value == pytest.approx(1e25 / 3)


def test_known_compute_wins_over_the_systemic_risk_default():
    t = determine_threshold(3.8e25, original_systemic_risk=True)
    assert t.kind == "one_third_of_original"


def test_exceeding_means_strictly_greater():
    t = determine_threshold(3e24)  # threshold exactly 1e24
    assert t.value == 1e24
    assert not t.exceeded_by(1e24)
    assert t.exceeded_by(math.nextafter(1e24, math.inf))


@pytest.mark.parametrize("bad", [-1.0, float("nan"), float("inf"), "many", True])
def test_invalid_pretrain_flops_is_refused(bad):
    with pytest.raises(ConfigurationError):
        determine_threshold(bad)


def test_env_variable_is_read_and_validated():
    assert pretrain_flops_from_env({"PRETRAIN_FLOPS": "1.2e24"}) == 1.2e24
    assert pretrain_flops_from_env({"PRETRAIN_FLOPS": "  "}) is None
    assert pretrain_flops_from_env({}) is None
    with pytest.raises(ConfigurationError, match="PRETRAIN_FLOPS"):
        pretrain_flops_from_env({"PRETRAIN_FLOPS": "1.2e24 FLOP"})


def test_verdict_uses_the_thirty_percent_margin():
    threshold = 1e22
    assert verdict(1.01e22, threshold) == "exceeds_threshold"
    assert verdict(1e22, threshold) == "near_threshold"  # not strictly greater
    assert verdict(0.8e22, threshold) == "near_threshold"  # 0.8 * 1.3 = 1.04 > 1
    assert verdict(0.76e22, threshold) == "below_threshold"  # 0.76 * 1.3 = 0.988
