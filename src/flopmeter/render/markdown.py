"""The report as Markdown (GitHub-flavoured), for a pull request, a wiki or a ticket.

Every string from the report is escaped, so a model name such as ``a|b <script>`` stays text:
table pipes, emphasis, links and raw HTML are neutralised.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from flopmeter.render.sections import build_document

if TYPE_CHECKING:
    from flopmeter.report import FlopReport

__all__ = ["escape_markdown", "render_markdown"]

_BACKSLASHED = "\\`*_[]|~#"
_ENTITIES = {"&": "&amp;", "<": "&lt;", ">": "&gt;"}


def escape_markdown(text: str) -> str:
    """``text`` as literal Markdown on one line: punctuation that would format or break a
    table is escaped, HTML characters become entities, line breaks become spaces."""
    out = []
    for ch in " ".join(text.splitlines()):
        if ch in _BACKSLASHED:
            out.append("\\" + ch)
        else:
            out.append(_ENTITIES.get(ch, ch))
    return "".join(out)


def render_markdown(report: FlopReport) -> str:
    """Renders ``report`` as Markdown: a heading, the status as a quote, a table per section."""
    doc = build_document(report)
    e = escape_markdown
    lines = [f"# {e(doc.title)}", ""]
    if doc.banner is not None:
        lines += [f"> **{e(doc.banner.text)}**", ""]
    for section in doc.sections:
        lines += [f"## {e(section.title)}", ""]
        if section.rows:
            lines += ["| | |", "| --- | --- |"]
            for row in section.rows:
                value = f"**{e(row.value)}**" if row.mark == "primary" else e(row.value)
                lines.append(f"| {e(row.label)} | {value} |")
            lines.append("")
        lines += [f"- {e(paragraph)}" for paragraph in section.paragraphs]
        if section.paragraphs:
            lines.append("")
    lines += [f"*{e(doc.disclaimer)}*", ""]
    return "\n".join(lines)
