"""The report as one self-contained HTML page: inline CSS, an inline SVG picture, no scripts.

Nothing is fetched (no fonts, images, styles or scripts from elsewhere), so the file can be
attached to a ticket or archived as it is. Every string from the report is escaped.
"""

from __future__ import annotations

import html
import re
from typing import TYPE_CHECKING

from flopmeter.render.document import Document, Section
from flopmeter.render.sections import build_document
from flopmeter.render.svg import render_share_bar, render_svg
from flopmeter.units import percent

if TYPE_CHECKING:
    from flopmeter.report import FlopReport

__all__ = ["render_html"]

CSS = """
body { font-family: system-ui, -apple-system, "Segoe UI", Roboto, sans-serif; color: #222;
       max-width: 980px; margin: 2em auto; padding: 0 1em; line-height: 1.4; background: #fff; }
h1 { font-size: 1.5em; border-bottom: 2px solid #1f4e9c; padding-bottom: .3em; }
h2 { font-size: 1.15em; margin-top: 1.6em; color: #1f4e9c; }
table { border-collapse: collapse; width: 100%; }
th, td { text-align: left; vertical-align: top; padding: .3em .6em;
         border-bottom: 1px solid #e3e3e8; }
th { width: 30%; font-weight: 600; color: #444; }
td { overflow-wrap: anywhere; }
tr.primary td { font-weight: 700; }
.banner { padding: .8em 1em; border-radius: 4px; font-weight: 600; margin: 1em 0; }
.banner.warning { background: #fff4d6; border: 1px solid #e0b000; }
.banner.error { background: #fde2e0; border: 1px solid #c0392b; }
#summary td { font-weight: 600; }
figure { margin: 1em 0; }
figcaption { font-size: .9em; color: #555; }
.disclaimer { margin-top: 2em; font-size: .9em; color: #555; }
"""


def render_html(report: FlopReport) -> str:
    """Renders ``report`` as a complete HTML document (a string)."""
    doc = build_document(report)
    e = html.escape
    body = [f"<h1>{e(doc.title)}</h1>"]
    if doc.banner is not None:
        body.append(f'<p class="banner {doc.banner.level}" role="alert">{e(doc.banner.text)}</p>')
    first = [s for s in doc.sections if s.key == "summary"]  # the answer, then the picture
    body.extend(_section(section) for section in first)
    body.append(_figure(report))  # the answer at a glance, before the details
    body.extend(_section(section) for section in doc.sections if section.key != "summary")
    body.append(f'<p class="disclaimer">{e(doc.disclaimer)}</p>')
    return _page(doc, "\n".join(body))


def _page(doc: Document, body: str) -> str:
    return (
        "<!DOCTYPE html>\n"
        '<html lang="en">\n<head>\n<meta charset="utf-8">\n'
        # no network: nothing may be loaded from anywhere, and no script may run
        '<meta http-equiv="Content-Security-Policy" content="default-src \'none\'; '
        "style-src 'unsafe-inline'\">\n"
        '<meta name="viewport" content="width=device-width, initial-scale=1">\n'
        f"<title>{html.escape(doc.title)}</title>\n<style>{CSS}</style>\n</head>\n"
        f"<body>\n{body}\n</body>\n</html>\n"
    )


_POWER = re.compile(r"10\^(-?\d+)")


def _text(value: str) -> str:
    """``value`` escaped, with powers of ten as superscripts (``10^22`` -> 10<sup>22</sup>),
    as the picture writes them."""
    return _POWER.sub(r"10<sup>\1</sup>", html.escape(value))


def _section(section: Section) -> str:
    e = html.escape
    out = [f'<section id="{e(section.key)}">', f"<h2>{e(section.title)}</h2>"]
    if section.rows:
        out.append("<table>")
        for row in section.rows:
            cls = f' class="{e(row.mark)}"' if row.mark else ""
            out.append(f"<tr{cls}><th>{_text(row.label)}</th><td>{_text(row.value)}</td></tr>")
        out.append("</table>")
    out.extend(f"<p>{_text(p)}</p>" for p in section.paragraphs)
    out.append("</section>")
    return "\n".join(out)


def _figure(report: FlopReport) -> str:
    margin = report.verdict.uncertainty_margin
    caption = (
        f"Each estimate (dot) with its band from −{margin:.0%} to +{margin:.0%} (where the "
        f"compute lies if the estimate is off by up to {margin:.0%}, the error margin of Annex "
        "A.2), against the threshold (red line), on a logarithmic FLOP axis. A dot past the line "
        "exceeds the threshold; a dot short of it whose band's upper end passes it is near the "
        "threshold."
    )
    bar = render_share_bar(report)
    if bar:
        caption += (
            " Below it, the judged figure's share of the threshold on a linear scale (0 to 100 % "
            "and beyond), with its band, the line where near_threshold starts "
            f"({percent(1 / (1 + margin))}) and the threshold (100 %), so the margin shows "
            "whether the run is far below the threshold or close to it."
        )
    svgs = render_svg(report) + ("\n" + bar if bar else "")
    return f"<figure>\n{svgs}\n<figcaption>{html.escape(caption)}</figcaption>\n</figure>"
