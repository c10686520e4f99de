"""units: FLOP with two significant figures and shares as percentages, checked by hand."""

from __future__ import annotations

import math
import re

import pytest

from flopmeter.units import human_flops, percent


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (2.345e22, "2.3 × 10^22 FLOP"),
        (1e23 / 3, "3.3 × 10^22 FLOP"),  # the default threshold
        (1e25 / 3, "3.3 × 10^24 FLOP"),
        (9.96e22, "1.0 × 10^23 FLOP"),  # rounding up carries into the exponent
        (27_459_084_288.0, "2.7 × 10^10 FLOP"),
        (1000, "1.0 × 10^3 FLOP"),
        (12.3, "12 FLOP"),
        (0, "0 FLOP"),
        (None, "n/a"),
        (math.nan, "n/a"),
    ],
)
def test_human_flops(value, expected):
    assert human_flops(value) == expected


def test_human_flops_keeps_two_significant_figures_over_many_decades():
    pattern = re.compile(r"^(\d)\.(\d) × 10\^(-?\d+) FLOP$")
    for exponent in range(3, 30):
        for mantissa in (1.0, 1.04, 1.06, 2.5, 4.449, 9.94):
            value = mantissa * 10.0**exponent
            m = pattern.match(human_flops(value))
            assert m, human_flops(value)
            shown = float(f"{m[1]}.{m[2]}") * 10.0 ** int(m[3])
            assert 1 <= int(m[1]) <= 9
            # two significant figures: off by at most half a unit of the second figure
            assert abs(shown - value) <= 0.05 * 10.0 ** int(m[3]) * (1 + 1e-9)


@pytest.mark.parametrize(
    ("share", "expected"),
    [
        (0.9, "90%"),
        (1.3, "130%"),
        (1.0, "100%"),
        (0.123456, "12%"),
        (0.0012345, "0.12%"),
        (12.0, "1200%"),
        (8.24e-13, "8.2 × 10^-11 %"),  # the example run's share: 8.24e-11 percent
        (0, "0%"),
        (None, "n/a"),
        (math.nan, "n/a"),
    ],
)
def test_percent(share, expected):
    assert percent(share) == expected
