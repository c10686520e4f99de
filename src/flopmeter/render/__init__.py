"""The report's human forms: plain text, Markdown and self-contained HTML with an SVG picture.

All three render one :class:`~flopmeter.render.sections.Document` built by
:func:`~flopmeter.render.sections.build_document`, so they say the same things. Nothing here
imports torch.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from flopmeter.render.html import render_html
from flopmeter.render.markdown import render_markdown
from flopmeter.render.text import render_text

if TYPE_CHECKING:
    from flopmeter.report import FlopReport

__all__ = [
    "FORMATS",
    "render",
]

#: The human formats, by the name ``flopmeter report --format`` takes.
FORMATS = {"text": render_text, "md": render_markdown, "html": render_html}


def render(report: FlopReport, fmt: str) -> str:
    """``report`` in format ``fmt`` (``text``, ``md`` or ``html``).

    Raises:
        KeyError: ``fmt`` is not one of :data:`FORMATS`.
    """
    return FORMATS[fmt](report)
