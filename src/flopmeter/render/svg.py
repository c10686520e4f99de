"""The margin pictures, as inline SVG: each estimate with its band against the threshold on a
logarithmic axis, and the judged figure's share of the threshold on a linear bar.

The horizontal axis is FLOP on a logarithmic scale with a labelled tick per decade; the
threshold is a vertical line. Each estimate that has a figure is a point with a bar from
``(1 - margin)`` to ``(1 + margin)`` times it; the primary estimate is drawn bold, and the
cumulative figure (this run plus its parent runs) gets its own row when the report has parents.
:func:`layout` is the geometry (pure numbers, tested on its own); :func:`render_svg` draws it.

A run far below the threshold spans many decades on the log axis, where the bands shrink to
dots; :func:`render_share_bar` adds a linear bar (0 to 100 % and beyond) with the line where
``near_threshold`` starts (1 / 1.3 ≈ 77 %), so the margin is visible in both cases
(:func:`share_layout` is its geometry).
"""

from __future__ import annotations

import html
import math
import re
from dataclasses import dataclass
from typing import TYPE_CHECKING

from flopmeter.units import human_flops, percent

if TYPE_CHECKING:
    from flopmeter.report import FlopReport

__all__ = [
    "Plot",
    "PlotRow",
    "Point",
    "ShareBar",
    "layout",
    "points_of",
    "render_share_bar",
    "render_svg",
    "share_layout",
]

WIDTH = 900
LEFT = 190  # room for the row labels
RIGHT = 30
TOP = 30
ROW_HEIGHT = 34
AXIS_HEIGHT = 44


@dataclass(frozen=True)
class Point:
    """One figure to draw: a label, its FLOP, whether it is drawn bold, and the word why.

    Attributes:
        tag: ``"primary"`` for the primary estimate, ``"judged"`` for the cumulative figure
            the verdict uses when the run has parents; ``None`` for the others.
    """

    label: str
    flops: float
    primary: bool = False
    tag: str | None = None

    @property
    def caption(self) -> str:
        """The label with its tag, as the picture shows it."""
        tag = self.tag or ("primary" if self.primary else None)
        return self.label + (f" ({tag})" if tag else "")


@dataclass(frozen=True)
class PlotRow:
    """A point placed on the axis: its x, the band's ends, and its row's y (pixels)."""

    point: Point
    x: float
    band_low_x: float
    band_high_x: float
    y: float


@dataclass(frozen=True)
class Plot:
    """The picture's geometry: decades shown, tick positions, threshold x, and the rows."""

    width: float
    height: float
    low_decade: int
    high_decade: int
    ticks: tuple[tuple[int, float], ...]  # (exponent, x)
    threshold_x: float | None
    rows: tuple[PlotRow, ...]

    def x_of(self, flops: float) -> float:
        """The x (pixels) of ``flops`` on this plot's logarithmic axis."""
        span = self.high_decade - self.low_decade
        share = (math.log10(flops) - self.low_decade) / span
        return LEFT + share * (self.width - LEFT - RIGHT)


def points_of(report: FlopReport) -> list[Point]:
    """The figures of ``report`` worth drawing: each finite, positive estimate, then the
    cumulative figure when the report has parent runs."""
    points = [
        Point(name, est.flops, name == report.compute.primary_estimate)
        for name, est in report.compute.estimates.items()
        if _drawable(est.flops)
    ]
    if report.lineage.parent_runs and _drawable(report.lineage.cumulative_flops):
        assert report.lineage.cumulative_flops is not None
        points.append(Point("with parent runs", report.lineage.cumulative_flops, True, "judged"))
    return points


def _drawable(flops: float | None) -> bool:
    return flops is not None and math.isfinite(flops) and flops > 0


def layout(
    points: list[Point], threshold_flops: float | None, margin: float, width: float = WIDTH
) -> Plot:
    """Where everything goes (a pure function).

    Args:
        points: The figures, FLOP > 0.
        threshold_flops: The threshold, FLOP, or ``None`` when there is none to draw.
        margin: The relative margin of each band (0.3 for ±30%).
        width: The picture's width, pixels.
    """
    values = [p.flops for p in points]
    lows = [v * (1 - margin) for v in values if v * (1 - margin) > 0]
    highs = [v * (1 + margin) for v in values]
    if _drawable(threshold_flops):
        assert threshold_flops is not None
        lows.append(threshold_flops)
        highs.append(threshold_flops)
    low = math.floor(math.log10(min(lows))) if lows else 0
    high = max(math.ceil(math.log10(max(highs))) if highs else 1, low + 1)
    height = TOP + ROW_HEIGHT * max(len(points), 1) + AXIS_HEIGHT
    plot = Plot(width, height, low, high, (), None, ())
    step = max(1, math.ceil((high - low) / 14))  # at most ~15 labelled decades
    ticks = tuple((e, plot.x_of(10.0**e)) for e in range(low, high + 1, step))
    rows = tuple(
        PlotRow(
            p,
            plot.x_of(p.flops),
            plot.x_of(p.flops * (1 - margin)) if p.flops * (1 - margin) > 0 else LEFT,
            plot.x_of(p.flops * (1 + margin)),
            TOP + ROW_HEIGHT * (i + 0.5),
        )
        for i, p in enumerate(points)
    )
    threshold_x = plot.x_of(threshold_flops) if _drawable(threshold_flops) else None
    return Plot(width, height, low, high, ticks, threshold_x, rows)


def render_svg(report: FlopReport) -> str:
    """The picture of ``report`` as an ``<svg>`` element (every string escaped)."""
    margin = report.verdict.uncertainty_margin
    plot = layout(points_of(report), report.threshold.threshold_flops, margin)
    e = html.escape
    title = (
        f"Estimates with their −{margin:.0%} to +{margin:.0%} band against the threshold "
        f"({human_flops(report.threshold.threshold_flops)}), logarithmic FLOP axis"
    )
    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" id="margin-plot" role="img" '
        f'width="{plot.width:.0f}" height="{plot.height:.0f}" '
        f'viewBox="0 0 {plot.width:.0f} {plot.height:.0f}" aria-label="{e(title)}">',
        f"<title>{e(title)}</title>",
        f'<rect x="0" y="0" width="{plot.width:.0f}" height="{plot.height:.0f}" fill="#fbfbfd"/>',
    ]
    parts.extend(_axis(plot))
    parts.extend(_rows(plot))
    parts.extend(_threshold(plot))
    if not plot.rows:
        parts.append(
            f'<text x="{LEFT}" y="{TOP + ROW_HEIGHT / 2:.1f}" fill="#555">no estimate has a '
            "figure to draw</text>"
        )
    parts.append("</svg>")
    return "\n".join(parts)


def _axis(plot: Plot) -> list[str]:
    y = plot.height - AXIS_HEIGHT + 8
    out = [
        f'<line x1="{LEFT}" y1="{y:.1f}" x2="{plot.width - RIGHT:.1f}" y2="{y:.1f}" '
        'stroke="#333" stroke-width="1"/>'
    ]
    for exponent, x in plot.ticks:
        out.append(
            f'<line x1="{x:.1f}" y1="{TOP - 6}" x2="{x:.1f}" y2="{y + 5:.1f}" stroke="#ddd" '
            'stroke-width="1"/>'
        )
        out.append(
            f'<text class="tick" x="{x:.1f}" y="{y + 22:.1f}" text-anchor="middle" '
            f'font-size="12" fill="#333">10<tspan dy="-6" font-size="9">{exponent}</tspan></text>'
        )
    out.append(
        f'<text x="{plot.width - RIGHT:.1f}" y="{plot.height - 2:.1f}" text-anchor="end" '
        'font-size="11" fill="#555">FLOP (log scale)</text>'
    )
    return out


def _rows(plot: Plot) -> list[str]:
    e = html.escape
    out = []
    for row in plot.rows:
        colour = "#1f4e9c" if row.point.primary else "#6b7a90"
        weight = "bold" if row.point.primary else "normal"
        label = row.point.caption
        out += [
            f'<text x="{LEFT - 10}" y="{row.y + 4:.1f}" text-anchor="end" font-size="12" '
            f'font-weight="{weight}" fill="#222">{e(label)}</text>',
            f'<rect class="band" x="{row.band_low_x:.1f}" y="{row.y - 7:.1f}" '
            f'width="{max(row.band_high_x - row.band_low_x, 1):.1f}" height="14" '
            f'fill="{colour}" fill-opacity="0.25" stroke="{colour}"/>',
            f'<circle class="point" cx="{row.x:.1f}" cy="{row.y:.1f}" '
            f'r="{6 if row.point.primary else 4}" fill="{colour}">'
            f"<title>{e(label)}: {e(human_flops(row.point.flops))}</title></circle>",
            _value_label(plot, row),
        ]
    return out


def _value_label(plot: Plot, row: PlotRow) -> str:
    """The figure in words beside its band (right of it, or left when there is no room)."""
    text = re.sub(  # 10^22 with the power raised, as on the axis
        r"10\^(-?\d+)",
        r'10<tspan dy="-5" font-size="8">\1</tspan><tspan dy="5"> </tspan>',
        html.escape(human_flops(row.point.flops)),
    ).replace("</tspan> FLOP", "</tspan>FLOP")
    if row.band_high_x + 130 < plot.width - RIGHT:
        x, anchor = row.band_high_x + 6, "start"
    else:
        x, anchor = row.band_low_x - 6, "end"
    return (
        f'<text x="{x:.1f}" y="{row.y + 4:.1f}" text-anchor="{anchor}" font-size="11" '
        f'fill="#333">{text}</text>'
    )


def _threshold(plot: Plot) -> list[str]:
    if plot.threshold_x is None:
        return []
    x, bottom = plot.threshold_x, plot.height - AXIS_HEIGHT + 8
    return [
        f'<line id="threshold-line" x1="{x:.1f}" y1="{TOP - 12}" x2="{x:.1f}" '
        f'y2="{bottom:.1f}" stroke="#c0392b" stroke-width="2.5"/>',
        f'<text x="{x - 4:.1f}" y="{TOP - 16}" text-anchor="end" font-size="12" '
        'fill="#c0392b">threshold</text>',
    ]


#: The share bar's height in pixels, and the largest share of the threshold it draws (3 = 300 %).
BAR_HEIGHT = 64
BAR_MAX_SHARE = 3.0


@dataclass(frozen=True)
class ShareBar:
    """The linear "share of the threshold" bar's geometry (pixels), beside the log picture.

    Attributes:
        axis_max: The share at the right end of the axis (1.25 = 125 %).
        ticks: (share, x) of each labelled tick, every 25 % (every 50 % beyond 150 %).
        value_x: Where the judged figure's share ends (clipped to the axis).
        band_low_x, band_high_x: The judged figure −margin to +margin (clipped to the axis).
        near_x: Where near_threshold starts, 1 / (1 + margin) of the threshold.
        threshold_x: 100 % of the threshold.
        clipped: Whether the share is beyond the axis (drawn to its end, said in words).
    """

    width: float
    axis_max: float
    ticks: tuple[tuple[float, float], ...]
    value_x: float
    band_low_x: float
    band_high_x: float
    near_x: float
    threshold_x: float
    clipped: bool

    @staticmethod
    def x_of(share: float, axis_max: float, width: float) -> float:
        """The x (pixels) of a share of the threshold on a linear axis from 0 to axis_max."""
        return LEFT + min(max(share, 0.0), axis_max) / axis_max * (width - LEFT - RIGHT)


def share_layout(share: float, margin: float, width: float = WIDTH) -> ShareBar:
    """The share bar for a judged figure at ``share`` of the threshold (a fraction: 1 = 100 %).

    The axis is linear from 0 to 125 %, or further (in steps of 25 %) when the figure with its
    margin reaches past that, up to :data:`BAR_MAX_SHARE`; a figure beyond is drawn clipped.
    """
    high = share * (1 + margin)
    axis_max = min(max(1.25, math.ceil(high / 0.25) * 0.25), BAR_MAX_SHARE)
    step = 0.25 if axis_max <= 1.5 else 0.5
    ticks = tuple(
        (k * step, ShareBar.x_of(k * step, axis_max, width))
        for k in range(round(axis_max / step) + 1)
    )
    xs = [ShareBar.x_of(s, axis_max, width) for s in (share, share * (1 - margin), high)]
    near_x, threshold_x = (ShareBar.x_of(s, axis_max, width) for s in (1 / (1 + margin), 1.0))
    return ShareBar(width, axis_max, ticks, *xs, near_x, threshold_x, share > axis_max)


#: The fills of the judged bar's phase segments, in the order of the counted phases (the
#: training passes darkest); the judged figure's own fill shows under what no phase covers
#: (the parent runs' compute).
PHASE_FILLS = ("#1f4e9c", "#4f7fc9", "#7fa6dd", "#a9c4ea", "#c9daf2")


def phase_segments(report: FlopReport, threshold_flops: float) -> list[tuple[str, float, float]]:
    """The counted phases along the share axis, as ``(name, start share, end share)`` (a pure
    function); empty for a report without phases (older than schema 2.2)."""
    out, at = [], 0.0
    for phase in report.compute.phases:
        if phase.counted and phase.flops is not None and phase.flops > 0:
            end = at + phase.flops / threshold_flops
            out.append((phase.name, at, end))
            at = end
    return out


def _phase_segments(report: FlopReport, bar: ShareBar, y: float, h: float) -> list[str]:
    threshold = report.threshold.threshold_flops
    if not threshold or len(report.compute.phases) < 2:
        return []
    parts = []
    for i, (name, start, end) in enumerate(phase_segments(report, threshold)):
        x0 = ShareBar.x_of(start, bar.axis_max, bar.width)
        x1 = ShareBar.x_of(end, bar.axis_max, bar.width)
        fill = PHASE_FILLS[min(i, len(PHASE_FILLS) - 1)]
        label = html.escape(f"{name}: {percent(end - start)} of the threshold")
        parts.append(
            f'<rect class="share-phase" x="{x0:.1f}" y="{y:.1f}" width="{max(x1 - x0, 0.5):.1f}" '
            f'height="{h:.0f}" fill="{fill}"><title>{label}</title></rect>'
        )
    return parts


def render_share_bar(report: FlopReport) -> str:
    """The linear "share of the threshold" bar as an ``<svg>`` element; ``""`` when the report
    has no judged figure or no threshold (nothing to show, rather than a bar at 0)."""
    judged = report.verdict.judged_flops
    threshold = report.threshold.threshold_flops
    if not _drawable(judged) or not _drawable(threshold):
        return ""
    assert judged is not None and threshold is not None
    margin = report.verdict.uncertainty_margin
    bar = share_layout(judged / threshold, margin)
    title = (
        f"The judged figure is {percent(judged / threshold)} of the threshold (linear scale); "
        f"near_threshold from {percent(1 / (1 + margin))}, exceeded above 100 %"
    )
    y, h = 22.0, 14.0
    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" id="share-bar" role="img" width="{bar.width:.0f}"'
        f' height="{BAR_HEIGHT}" viewBox="0 0 {bar.width:.0f} {BAR_HEIGHT}" '
        f'aria-label="{html.escape(title)}">',
        f"<title>{html.escape(title)}</title>",
        f'<text x="{LEFT - 10}" y="{y + 11:.1f}" text-anchor="end" font-size="12" '
        'font-weight="bold" fill="#222">share of the threshold</text>',
        f'<rect x="{LEFT}" y="{y:.1f}" width="{bar.width - LEFT - RIGHT:.1f}" height="{h:.0f}" '
        'fill="#eef0f4"/>',
        f'<rect class="share-band" x="{bar.band_low_x:.1f}" y="{y - 3:.1f}" '
        f'width="{max(bar.band_high_x - bar.band_low_x, 1):.1f}" height="{h + 6:.0f}" '
        'fill="#1f4e9c" fill-opacity="0.2"/>',
        f'<rect class="share-value" x="{LEFT}" y="{y:.1f}" '
        f'width="{max(bar.value_x - LEFT, 1):.1f}" height="{h:.0f}" fill="#1f4e9c"/>',
    ]
    parts += _phase_segments(report, bar, y, h)
    parts += _share_marks(bar, y, h, margin, judged / threshold)
    parts.append("</svg>")
    return "\n".join(parts)


def _share_marks(bar: ShareBar, y: float, h: float, margin: float, share: float) -> list[str]:
    """The share bar's ticks, its near and threshold lines, and the figure in words."""
    out = [
        f'<line id="near-line" x1="{bar.near_x:.1f}" y1="{y - 8:.1f}" x2="{bar.near_x:.1f}" '
        f'y2="{y + h + 8:.1f}" stroke="#d68910" stroke-width="2" stroke-dasharray="4 3"/>',
        f'<text x="{bar.near_x - 4:.1f}" y="{y - 10:.1f}" text-anchor="end" font-size="11" '
        f'fill="#b9770e">near from {percent(1 / (1 + margin))}</text>',
        f'<line id="share-threshold-line" x1="{bar.threshold_x:.1f}" y1="{y - 8:.1f}" '
        f'x2="{bar.threshold_x:.1f}" y2="{y + h + 8:.1f}" stroke="#c0392b" stroke-width="2.5"/>',
    ]
    for share_tick, x in bar.ticks:
        out.append(
            f'<text class="share-tick" x="{x:.1f}" y="{y + h + 22:.1f}" text-anchor="middle" '
            f'font-size="10" fill="#555">{share_tick * 100:.0f} %</text>'
        )
    words = percent(share) + (" (beyond the axis)" if bar.clipped else "")
    inside = bar.value_x - LEFT > 90  # white on the bar, else dark right of its end
    x, colour = (LEFT + 4, "#fff") if inside else (bar.value_x + 6, "#222")
    out.append(
        f'<text class="share-words" x="{x:.1f}" y="{y + 11:.1f}" font-size="11" '
        f'fill="{colour}">{html.escape(words)}</text>'
    )
    return out
