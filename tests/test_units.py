"""Human forms: two significant figures for FLOP, percentages for shares (flopmeter.units)."""

import pytest

from flopmeter.units import human_flops, percent


@pytest.mark.parametrize(
    ("value", "shown"),
    [
        (2.345e22, "2.3 × 10^22 FLOP"),
        (1e23 / 3, "3.3 × 10^22 FLOP"),
        (3.8e25, "3.8 × 10^25 FLOP"),
        (9.96e22, "1.0 × 10^23 FLOP"),  # rounding carries into the exponent
        (1.05e24, "1.1 × 10^24 FLOP"),  # 1.05 is stored just above: rounds up
        (1234.0, "1.2 × 10^3 FLOP"),
        (560.4, "560 FLOP"),
        (5.64, "5.6 FLOP"),
        (0.0, "0 FLOP"),
        (None, "n/a"),
        (float("nan"), "n/a"),
    ],
)
def test_human_flops(value, shown):
    assert human_flops(value) == shown


@pytest.mark.parametrize(
    ("share", "shown"),
    [
        (0.63, "63 %"),
        (0.0082, "0.82 %"),
        (1.3, "130 %"),
        (1.0, "100 %"),
        (0.000101, "0.010 %"),
        (8.24e-13, "< 0.01 %"),  # the tiny share; the JSON keeps the exact one
        (0.0, "0 %"),
        (None, "n/a"),
    ],
)
def test_percent(share, shown):
    assert percent(share) == shown
