"""The reports a person reads: text, Markdown, HTML (with its SVG picture) and JSON.

Built from a real run (a tiny Llama trained under FlopMeter, tokens counted here) and from
reports made by hand with the schema-1.2 fields set (catalogue, parent runs, obligations).
Expected figures are worked out by hand in the comments, not copied from the output.
"""

from __future__ import annotations

import json
import math
import re

import pytest

from flopmeter.cli import main
from flopmeter.render.html import render_html
from flopmeter.render.markdown import render_markdown
from flopmeter.render.svg import Point, layout, render_svg
from flopmeter.render.text import render_text
from flopmeter.report.reading import read_report
from flopmeter.types import CatalogFigure, Obligation, ParentRun
from tests.support.reports import merged, valid_report

# ---- a real run ------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def real_report_path(tmp_path_factory):
    from flopmeter import FlopMeter
    from tests.support.batches import padded_batch
    from tests.support.models import tiny_llama

    folder = tmp_path_factory.mktemp("run")
    model = tiny_llama()
    with FlopMeter(model, 0, output=folder, model_name="tiny/llama-test"):
        model(**padded_batch([3, 5], 8)).loss.backward()  # 8 real tokens of 16
    return folder / "flops_meter.json"


def _cli(capsys, *argv: str) -> str:
    assert main(list(argv)) == 0
    return capsys.readouterr().out


@pytest.mark.slow
def test_text_of_a_real_run_says_what_a_compliance_officer_looks_for(real_report_path, capsys):
    out = _cli(capsys, "report", str(real_report_path))
    report = read_report(real_report_path)
    assert out.splitlines()[0] == "flopmeter report — tiny/llama-test (completed)"
    for title in ("Model and parameters", "Training compute", "Training time",
                  "Hardware and energy", "Threshold", "Verdict",
                  "Assumptions behind each estimate", "Run record"):  # fmt: skip
        assert f"\n{title}\n" in out, title
    assert "8 non-padding of 16 in 2 sequences" in out  # counted from the batch above
    # the default threshold: 1e23 / 3 = 3.33e22, two significant figures
    assert "3.3 × 10^22 FLOP" in out
    # every estimate with its figure; the primary one marked, with its reason
    primary = report.compute.primary_estimate
    assert primary is not None and report.compute.primary_reason in out
    for name, est in report.compute.estimates.items():
        mantissa, exponent = f"{est.flops:.1e}".split("e")
        line = next(li for li in out.splitlines() if li.strip().startswith(f"Estimate {name} "))
        assert f"{mantissa} × 10^{int(exponent)} FLOP" in line
        assert ("(primary)" in line) == (name == primary)
        assert est.formula.split()[0] in out  # its assumptions
    # the share of the threshold as a percentage: ~1e-11 %, shown as below 0.01 %
    assert report.verdict.ratio_to_threshold < 1e-6
    assert "Share of the threshold      < 0.01 %" in out
    assert "from 77 % of the threshold" in out and "Below the threshold" in out
    assert (
        report.run.run_id in out
        and report.run.flopmeter_version in out
        and report.run.torch_version in out
    )
    assert "not legal advice" in out


@pytest.mark.slow
def test_a_cpu_run_says_plainly_that_no_gpu_was_measured(real_report_path, capsys):
    out = _cli(capsys, "report", str(real_report_path))
    hardware = out.split("\nHardware and energy\n")[1].split("\n\n")[0]
    assert "not measured" in hardware
    assert "note:" not in out  # the hardware explanation is in its section, not an alarm


@pytest.mark.slow
def test_markdown_html_and_json_of_a_real_run(real_report_path, capsys):
    report = read_report(real_report_path)
    md = _cli(capsys, "report", str(real_report_path), "--format", "md")
    assert md.startswith("# flopmeter report — tiny/llama-test (completed)\n")
    assert "## Training compute" in md and "| --- | --- |" in md
    page = _cli(capsys, "report", str(real_report_path), "--format", "html")
    assert page.startswith("<!DOCTYPE html>") and page.rstrip().endswith("</html>")
    assert "<script" not in page.lower()
    assert not re.search(r"""(src|href)\s*=\s*["']?(https?:)?//""", page)  # nothing fetched
    assert page.count("<svg") == 2 and "threshold-line" in page  # the log picture and the bar
    assert 'id="share-bar"' in page and 'id="near-line"' in page
    as_json = json.loads(_cli(capsys, "report", str(real_report_path), "--format", "json"))
    # full precision: the very numbers of the file
    on_disk = json.loads(real_report_path.read_text())
    assert (
        as_json["compute"]["primary_flops"]
        == on_disk["compute"]["primary_flops"]
        == report.compute.primary_flops
    )
    assert as_json == on_disk


def test_the_near_rule_is_worded_as_the_code_applies_it():
    # 0.72 x threshold: within 30 % of it, but 0.72 x 1.3 = 0.936 is still below: not near
    t = 1e23 / 3
    six_nd = valid_report().compute.estimates["six_nd"].model_copy(update={"flops": 0.72 * t})
    below = valid_report(compute={"primary_flops": 0.72 * t, "estimates": {"six_nd": six_nd}}, verdict={"ratio_to_threshold": 0.72, "outcome": "below_threshold"})  # fmt: skip
    for out in (render_text(below), render_markdown(below), render_html(below)):
        assert "within ±30%" not in out and "comes within" not in out
        assert "would be with 30% added" in out and "77 % of the threshold" in out
    verdict = render_text(below).split("\nVerdict\n")[1].split("\n\n")[0]
    # the band row says what it is: 0.72 t x 0.7 = 0.504 t, 0.72 t x 1.3 = 0.936 t
    assert "50 % to 94 % of the threshold" in verdict and "off by up to 30%" in verdict


NO_DRIVER = (
    "Not measured: no NVIDIA GPU driver was found on this machine (its NVML library is not "
    "installed), so there are no GPU hardware or energy figures; the training compute does not "
    "depend on them. Detail: NVML Shared Library Not Found."
)  # hardware/monitor.py's note where libnvidia-ml is absent


def test_small_wording_a_reader_sees():
    report = valid_report(
        tokens={"micro_batches": 1, "optimizer_steps": 1},
        run={"epochs": 1.0},
        hardware={"notes": [NO_DRIVER]},
    )
    text = render_text(report)
    assert "1 micro-batch, 1 optimizer step, 1 epoch\n" in text  # singular for one
    assert "2 micro-batches, 2 optimizer steps" in render_text(
        valid_report(tokens={"micro_batches": 2, "optimizer_steps": 2})
    )
    # the plain "no GPU" line, without the NVML detail, in every human form; the JSON keeps it
    for out in (text, render_markdown(report), render_html(report)):
        assert "Not measured: no NVIDIA GPU driver" in out
        assert "Detail:" not in out and "Shared Library" not in out
    assert report.hardware.notes == [NO_DRIVER]
    # HTML writes powers of ten as superscripts, as the picture does
    page = render_html(report)
    assert "3.3 × 10<sup>22</sup> FLOP" in page
    assert not re.search(r"10\^-?\d", page.split("</svg>")[1])


# ---- status banners ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("status", "fields", "words"),
    [
        ("running", dict(run={"ended_at": None}), "NOT FINAL"),
        (
            "failed",
            dict(run={"error": "RuntimeError: CUDA out of memory"}),
            "FAILED: RuntimeError: CUDA",
        ),
        ("interrupted", {}, "INTERRUPTED"),
    ],
)
def test_a_report_that_is_not_final_says_so_at_the_top(status, fields, words):
    report = valid_report(run={"status": status, **fields.get("run", {})})
    text = render_text(report)
    assert words in "\n".join(text.splitlines()[1:3])  # right under the title
    md = render_markdown(report)
    assert words in md.split("\n## ")[0]  # before the first section
    page = render_html(report)
    assert words in page.split("<section")[0] and 'class="banner' in page


def test_a_completed_report_has_no_banner():
    report = valid_report()
    for out in (render_text(report), render_markdown(report), render_html(report)):
        assert "NOT FINAL" not in out and "FAILED" not in out and "INTERRUPTED" not in out
    assert 'class="banner' not in render_html(report)


# ---- the compliance fields ----------------------------------------------------------------------

OBLIGATIONS = [
    Obligation(title="Technical documentation", article="Art. 53(1)(a)", text="Document it."),
    Obligation(title="Copyright policy", article="Art. 53(1)(c)", text="Have one."),
]


def _exceeding(**overrides):
    # 5e22 FLOP against 1e23 / 3: a share of 1.5, i.e. 150 %
    fields = dict(compute={"primary_flops": 5e22}, verdict={"ratio_to_threshold": 1.5,
                  "exceeds_threshold": True, "outcome": "exceeds_threshold",
                  "obligations": OBLIGATIONS})  # fmt: skip
    fields["compute"]["estimates"] = {"six_nd": valid_report().compute.estimates[
        "six_nd"].model_copy(update={"flops": 5e22})}  # fmt: skip
    fields = merged(fields, overrides)
    return valid_report(**fields)


def test_exceeding_shows_what_follows_with_each_article():
    report = _exceeding()
    text = render_text(report)
    assert "Exceeds the threshold" in text and "150 %" in text
    section = text.split("\nWhat follows under the AI Act\n")[1]
    for o in OBLIGATIONS:
        assert o.title in section and o.article in section and o.text in section
    md, page = render_markdown(report), render_html(report)
    assert "## What follows under the AI Act" in md and "Art. 53(1)(c)" in md
    assert 'id="obligations"' in page and "Copyright policy (Art. 53(1)(c))" in page
    for out in (text, md, page):
        assert out.lower().count("not legal advice") == 1  # the disclaimer, once
    # no systemic risk: the notification was considered, and the reader is told why it is absent
    assert "Art. 52(1)" in section and "only to a general-purpose AI model with systemic" in section


def test_a_systemic_exceeds_report_lists_the_notification_without_the_not_listed_line():
    from flopmeter.compliance.obligations import obligations

    report = _exceeding(verdict={"obligations": obligations(systemic_risk=True)})
    section = render_text(report).split("\nWhat follows under the AI Act\n")[1]
    assert "Notification to the Commission (AI Act Art. 52(1))" in section
    assert "Not listed" not in section


def test_below_the_threshold_has_no_obligations_section():
    assert "What follows under the AI Act" not in render_text(
        valid_report(verdict={"outcome": "below_threshold"})
    )


def test_parent_runs_and_the_cumulative_figure_are_shown():
    parent = ParentRun(ref="runs/first/flops_meter.json", run_id="parent-77", flops=2e22,
                       status="completed")  # fmt: skip
    # this run 3e22 + parent 2e22 = 5e22, judged against 3.33e22
    report = valid_report(
        lineage={"parent_runs": [parent], "cumulative_flops": 5e22},
        verdict={"ratio_to_threshold": 1.5},
    )
    text = render_text(report)
    verdict = text.split("\nVerdict\n")[1].split("\n\n")[0]
    assert "runs/first/flops_meter.json" in verdict and "parent-77" in verdict
    assert "2.0 × 10^22 FLOP" in verdict  # the parent's compute
    assert "5.0 × 10^22 FLOP (this run plus its parents)" in verdict
    # the margin band of the judged figure: 5e22 x 0.7 = 3.5e22, 5e22 x 1.3 = 6.5e22
    assert "3.5 × 10^22 FLOP to 6.5 × 10^22 FLOP" in verdict
    svg = render_svg(report)
    assert "with parent runs" in svg
    assert "parent-77" in render_markdown(report) and "parent-77" in render_html(report)


# ../shared/docs/pretrain-compute.md: Llama 3.2 3B, 1.7e23 FLOP (6ND); no source date given
CATALOG = CatalogFigure(
    model_id="meta-llama/Llama-3.2-3B-Instruct",
    base_model="Llama 3.2 3B",
    flops=1.7e23,
    basis="6nd",
    source="Llama 3.2 model card",
    date=None,
    catalog_compiled="2026-12-01",
    threshold_flops=1.7e23 / 3,  # 5.67e22
)


def test_the_catalogue_figure_is_shown_even_when_not_chosen():
    report = valid_report(
        threshold={"catalog": CATALOG}
    )  # pretrain_flops unknown: the default threshold
    threshold = render_text(report).split("\nThreshold\n")[1].split("\n\n")[0]
    assert "not known" in threshold  # the original compute was not given
    assert "1.7 × 10^23 FLOP for Llama 3.2 3B" in threshold
    assert "not used" in threshold and "5.7 × 10^22 FLOP" in threshold  # what it would give
    unwrapped = " ".join(threshold.split())
    assert "Llama 3.2 model card (source date not recorded, catalogue compiled 2026-12-01)" in (
        unwrapped
    )
    assert "1.7 × 10^23 FLOP" in render_markdown(report) and "not used" in render_markdown(report)
    page = render_html(report)
    assert "1.7 × 10<sup>23</sup> FLOP" in page and "not used" in page


def test_a_chosen_catalogue_figure_is_named_as_the_source():
    report = valid_report(threshold={"catalog": CATALOG, "original_flops": 1.7e23, "original_flops_source": "catalog", "threshold_flops": 1.7e23 / 3, "kind": "one_third_of_original"})  # fmt: skip
    threshold = render_text(report).split("\nThreshold\n")[1].split("\n\n")[0]
    assert "1.7 × 10^23 FLOP (from the bundled catalogue)" in threshold
    assert "used" in threshold and "not used" not in threshold
    assert "one third of the original model's training compute" in threshold


def test_a_known_original_below_1e23_shows_both_thresholds():
    from flopmeter.compliance.thresholds import determine_threshold

    rule = determine_threshold(8.4e22)  # one third: 2.8e22; the fallback 1e23 / 3 = 3.3e22
    report = valid_report(threshold={"original_flops": 8.4e22, "original_flops_source": "argument", "source": rule.source})  # fmt: skip
    threshold = render_text(report).split("\nThreshold\n")[1].split("\n\n")[0]
    assert "8.4 × 10^22 FLOP (from the pretrain_flops argument)" in threshold
    assert "One third of it" in threshold and "2.8 × 10^22 FLOP: not applied" in threshold
    assert "would be 2.8 × 10^22 FLOP" in rule.source and "less strict" in rule.source
    assert "cautious" not in rule.source and "stated" not in rule.source
    assert "flopmeter's reading, not the guidelines'" in rule.source
    unknown = determine_threshold(None).source  # the guidelines' own fallback: nothing added
    assert "flopmeter" not in unknown and "below 10^23" not in unknown


# ---- hostile strings --------------------------------------------------------------------------

HOSTILE = '<script>alert("x")</script> a|b *bold* [link](http://e.x) & `code`'


def test_html_escapes_every_string():
    report = valid_report(
        notes=[HOSTILE], model={"name": HOSTILE}, run={"error": HOSTILE, "status": "failed"}
    )
    page = render_html(report)
    assert "<script" not in page.lower()
    assert "&lt;script&gt;alert(&quot;x&quot;)&lt;/script&gt;" in page
    assert page.count("&lt;script&gt;") >= 3  # title, banner and the note
    assert "http://e.x" in page and 'href="http' not in page


def _unescaped_pipes(line: str) -> int:
    return len(re.findall(r"(?<!\\)\|", line))


def test_markdown_escapes_pipes_and_html():
    report = valid_report(notes=[HOSTILE + "\nsecond line"], model={"name": HOSTILE})
    md = render_markdown(report)
    assert "<script" not in md
    assert "&lt;script&gt;" in md
    for line in md.splitlines():
        if line.startswith("|"):
            assert _unescaped_pipes(line) == 3, line  # two cells, whatever the values hold
    assert "a\\|b" in md and "\\*bold\\*" in md and "\\[link\\]" in md
    assert "second line" in md and "\nsecond line" not in md  # one line per note


# ---- the SVG's geometry -----------------------------------------------------------------------


def test_positions_grow_with_flop_on_a_log_axis_and_the_threshold_sits_between_its_decades():
    points = [Point("a", 1e10), Point("b", 3e12), Point("c", 1e20, primary=True)]
    threshold = 1e23 / 3
    plot = layout(points, threshold, 0.3)
    xs = [row.x for row in plot.rows]
    assert xs == sorted(xs) and len(set(xs)) == 3
    # decades: from 10^9 (below 0.7e10) to 10^23 (above the threshold), evenly spaced
    assert (plot.low_decade, plot.high_decade) == (9, 23)
    tick_x = dict(plot.ticks)
    gaps = [tick_x[e + 1] - tick_x[e] for e in range(9, 23)]
    assert max(gaps) - min(gaps) < 1e-9
    decade = gaps[0]
    # log10(3.333e22) = 22 + log10(3.333) = 22.523: 52.3 % of the way from 10^22 to 10^23
    assert plot.threshold_x == pytest.approx(tick_x[22] + 0.5229 * decade, abs=0.01 * decade)
    # 3e12 sits log10(3) = 0.477 of a decade right of 10^12
    assert plot.rows[1].x == pytest.approx(tick_x[12] + 0.4771 * decade, abs=0.01 * decade)
    # each band spans log10(1.3 / 0.7) = 0.269 of a decade around its point
    for row in plot.rows:
        assert row.band_low_x < row.x < row.band_high_x
        assert row.band_high_x - row.band_low_x == pytest.approx(0.2688 * decade, rel=1e-3)
    ys = [row.y for row in plot.rows]
    assert ys == sorted(ys) and len(set(ys)) == 3  # one row each


def test_the_drawn_svg_matches_its_layout():
    report = valid_report()  # six_nd 3e22 (primary), seed 2.01e22, threshold 3.33e22
    svg = render_svg(report)
    cxs = [float(v) for v in re.findall(r'<circle class="point" cx="([\d.]+)"', svg)]
    assert len(cxs) == 2 and cxs[0] > cxs[1]  # six_nd (3e22) right of seed (2.01e22)
    line_x = float(re.search(r'id="threshold-line" x1="([\d.]+)"', svg)[1])
    # the primary 3e22 is left of the threshold 3.33e22, but its +30% band reaches past it
    bands = re.findall(r'<rect class="band" x="([\d.]+)" y="[\d.]+" width="([\d.]+)"', svg)
    primary_low, primary_width = map(float, bands[0])
    assert cxs[0] < line_x < primary_low + primary_width
    assert "six_nd (primary)" in svg
    labels = re.findall(r'<text class="tick"[^>]*>10<tspan[^>]*>(-?\d+)</tspan>', svg)
    assert [int(v) for v in labels] == list(range(22, 24))  # 1.4e22 .. 3.9e22 lies in 10^22..10^23


def test_the_share_bar_is_linear_with_the_near_line_at_1_over_1_3():
    from flopmeter.render.svg import LEFT, RIGHT, WIDTH, share_layout

    inner = WIDTH - LEFT - RIGHT
    # far below: 1e-11 of the threshold; axis 0..125 %, the bar at its left end
    far = share_layout(1e-11, 0.3)
    assert far.axis_max == 1.25 and not far.clipped
    assert far.value_x == pytest.approx(LEFT, abs=1e-6)
    assert far.near_x == pytest.approx(LEFT + (1 / 1.3) / 1.25 * inner)  # 76.9 % of 125 %
    assert far.threshold_x == pytest.approx(LEFT + 0.8 * inner)  # 100 % of 125 %
    assert [s for s, _ in far.ticks] == [0, 0.25, 0.5, 0.75, 1.0, 1.25]
    # 90 %: the band 63 % .. 117 % crosses the near line, the bar ends short of the threshold
    near = share_layout(0.9, 0.3)
    assert near.value_x == pytest.approx(LEFT + 0.9 / 1.25 * inner)
    assert near.band_low_x < near.near_x < near.value_x < near.threshold_x < near.band_high_x
    # 150 %: +30 % is 195 %, so the axis runs to 200 % in steps of 50 %
    over = share_layout(1.5, 0.3)
    assert over.axis_max == 2.0 and [s for s, _ in over.ticks] == [0, 0.5, 1.0, 1.5, 2.0]
    assert over.threshold_x < over.value_x
    # far above: clipped to 300 %, and said so
    assert share_layout(40.0, 0.3).clipped and share_layout(40.0, 0.3).axis_max == 3.0


def test_the_share_bar_is_drawn_with_its_figure_and_left_out_without_one():
    from flopmeter.render.svg import render_share_bar

    svg = render_share_bar(valid_report())  # six_nd 3e22 of 1e23 / 3: 90 %
    assert 'id="share-bar"' in svg and "90 %" in svg and "near from 77 %" in svg
    withheld = valid_report(compute={"primary_flops": None, "withheld_reason": "x"}, verdict={"ratio_to_threshold": None, "exceeds_threshold": None, "outcome": None})  # fmt: skip
    assert render_share_bar(withheld) == ""  # no bar at 0 for a figure that is not known


def test_an_estimate_without_a_figure_is_not_drawn():
    est = valid_report().compute.estimates
    report = valid_report(compute={"estimates": {**est, "measured": est["seed"].model_copy(
        update={"flops": None, "method": "measured"})}})  # fmt: skip
    svg = render_svg(report)
    assert svg.count('<circle class="point"') == 2
    assert all(math.isfinite(float(v)) for v in re.findall(r'cx="([^"]+)"', svg))


@pytest.mark.slow
def test_the_original_compute_and_its_source_are_printed_when_pretrain_flops_is_set(
    tmp_path, monkeypatch
):
    from flopmeter import FlopMeter
    from tests.support.batches import padded_batch
    from tests.support.models import tiny_llama

    monkeypatch.setenv("PRETRAIN_FLOPS", "3.8e25")
    model = tiny_llama()
    with FlopMeter(model, 0, output=tmp_path) as meter:
        model(**padded_batch([4], 8)).loss.backward()
    threshold = meter.report().to_text().split("\nThreshold\n")[1].split("\n\n")[0]
    assert "3.8 × 10^25 FLOP (from" in threshold and "PRETRAIN_FLOPS" in threshold
    # one third of 3.8e25 = 1.27e25
    assert "1.3 × 10^25 FLOP" in threshold
    assert "one third of the original model's training compute" in threshold
