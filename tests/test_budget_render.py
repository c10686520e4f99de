"""The human reports (text, Markdown, HTML) show the compute budget of a run that had one.

A real run (tiny Llama, raw loop) stopped by its budget; the expected figures are worked out
here: the budget in two significant figures written by hand, the stop step from PyTorch's own
count (``FlopCounterMode``) of a step.
"""

from __future__ import annotations

import html
import math
import re

import pytest
import torch

from flopmeter import FlopMeter
from flopmeter.render.html import render_html
from flopmeter.render.markdown import render_markdown
from flopmeter.render.text import render_text
from tests.support.batches import PAD_ID, padded_batch
from tests.support.models import eager_llama
from tests.support.truth import STEP_ROWS, rows_truth


def two_figures(flops: float) -> str:
    """``2.3 × 10^7 FLOP``, written here from the number."""
    exponent = math.floor(math.log10(flops))
    mantissa = round(flops / 10**exponent, 1)
    if mantissa >= 10:
        mantissa, exponent = mantissa / 10, exponent + 1
    return f"{mantissa:.1f} × 10^{exponent} FLOP"


@pytest.fixture(scope="module")
def stopped():
    step = rows_truth(STEP_ROWS)
    budget = 5.5 * step
    model = eager_llama()
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
    batch = padded_batch(STEP_ROWS, 12, seed=1)
    with FlopMeter(model, PAD_ID, budget=budget) as meter:
        for _ in range(30):
            model(**batch).loss.backward()
            optimizer.step()
            optimizer.zero_grad()
            if meter.should_stop:
                break
    return meter.report(), budget, step


def test_text_markdown_and_html_show_the_budget_section(stopped):
    report, budget, step = stopped
    assert report.budget.stopped_by_budget and report.tokens.optimizer_steps == 5  # 5 of 5.5 steps
    at_stop = two_figures(5 * step)
    page = html.unescape(render_html(report))
    page = re.sub(r"10<sup>(-?\d+)</sup>", r"10^\1", page)  # the HTML writes powers raised
    for form in (render_text(report), render_markdown(report), page):
        assert "Compute budget" in form
        assert two_figures(budget) in form
        assert "argument" in form  # the source
        assert at_stop in form
        assert "Stopped by the budget" in form and "yes" in form


def test_a_clean_budget_stop_is_noted_in_the_report(stopped):
    report, budget, _ = stopped
    (note,) = [n for n in report.notes if n.startswith("Compute budget")]
    assert "after optimizer step 5" in note and f"{budget:.3e}" in note
    assert "within the budget" in note
    assert note in " ".join(render_text(report).split())  # the text wraps its paragraphs


def test_no_budget_no_section():
    model = eager_llama()
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
    with FlopMeter(model, PAD_ID) as meter:
        model(**padded_batch(STEP_ROWS, 12)).loss.backward()
        optimizer.step()
    text = render_text(meter.report())
    assert "Compute budget" not in text and "Stopped by the budget" not in text
