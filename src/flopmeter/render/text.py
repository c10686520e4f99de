"""The report as plain text, for a terminal or a log (``FlopReport.to_text()``)."""

from __future__ import annotations

import textwrap
from typing import TYPE_CHECKING

from flopmeter.render.document import Document
from flopmeter.render.sections import build_document

if TYPE_CHECKING:
    from flopmeter.report import FlopReport

__all__ = ["render_text"]

LINE_WIDTH = 100
LABEL_WIDTH = 28


def render_text(report: FlopReport) -> str:
    """Renders ``report`` as aligned plain text: a title, the status banner, then sections."""
    return document_text(build_document(report))


def document_text(doc: Document) -> str:
    """Renders a :class:`~flopmeter.render.sections.Document` as plain text."""
    lines = [doc.title]
    if doc.banner is not None:
        lines.extend(_wrap(f"!! {doc.banner.text}", "   "))
    for section in doc.sections:
        lines.append("")
        lines.append(section.title)
        for row in section.rows:
            head = f"  {row.label:<{LABEL_WIDTH}}" if len(row.label) < LABEL_WIDTH else None
            if head is None:  # a long label gets its own line
                lines.append(f"  {row.label}")
                head = " " * (LABEL_WIDTH + 2)
            lines.extend(_wrap(head + row.value, " " * (LABEL_WIDTH + 2)))
        for paragraph in section.paragraphs:
            lines.extend(_wrap(f"  {paragraph}", "  "))
    lines.append("")
    lines.extend(_wrap(doc.disclaimer, ""))
    return "\n".join(lines)


def _wrap(text: str, indent: str) -> list[str]:
    return textwrap.wrap(
        text,
        LINE_WIDTH,
        subsequent_indent=indent,
        break_long_words=False,
        break_on_hyphens=False,
        drop_whitespace=True,
    ) or [text]
