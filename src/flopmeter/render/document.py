"""The shape of a report as a person reads it: a document of titled sections of rows.

:func:`flopmeter.render.sections.build_document` fills it; each human form renders it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

__all__ = ["Banner", "Document", "Row", "Section"]


@dataclass(frozen=True)
class Row:
    """One labelled figure or statement.

    Attributes:
        label: What the value is.
        value: The value, in words and rounded figures.
        mark: A short tag a renderer may emphasise (``"primary"``), or ``None``.
    """

    label: str
    value: str
    mark: str | None = None


@dataclass(frozen=True)
class Section:
    """A titled part of the report: rows, then paragraphs of prose."""

    key: str
    title: str
    rows: tuple[Row, ...] = ()
    paragraphs: tuple[str, ...] = ()


@dataclass(frozen=True)
class Banner:
    """The line at the top of a report that is not a completed one.

    Attributes:
        level: ``"warning"`` (running, interrupted) or ``"error"`` (failed).
        text: What it means, in words.
    """

    level: Literal["warning", "error"]
    text: str


@dataclass(frozen=True)
class Document:
    """A report as a person reads it: title, status banner, sections, disclaimer."""

    title: str
    banner: Banner | None
    sections: tuple[Section, ...] = field(default_factory=tuple)
    disclaimer: str = ""
