"""The bundled catalogue of base models' pretraining compute, looked up by Hugging Face id.

The data is ``flopmeter/data/pretrain_catalog.json`` (read once, with :mod:`importlib.resources`;
no torch). Each entry carries its figure in FLOP (``None`` when the developer never disclosed
it), its basis (stated, 6ND with the parameters and tokens used, an independent estimate, or
not disclosed), the source, and the source's own date where the catalogue's sources give one
(``source_date``: a paper's year, an Epoch AI snapshot's month; ``None`` otherwise, never the
day the entry was typed). The file's ``compiled`` date (:func:`compiled`) is the day the
catalogue was compiled, the same for every entry.

Lookup (:func:`lookup`) is by model id, case-insensitive, with or without the organisation (or
a local folder's path): ``meta-llama/Llama-3.2-3B-Instruct`` and ``llama-3.2-3b`` are both
Llama 3.2 3B. Fine-tuned, instruct, chat, ``-it`` and quantised variants whose names end in a
known suffix resolve to their base. Anything else is unknown: ``None``, never the figure of
another size or family.

Using a catalogue figure to set the threshold is the user's choice (``pretrain_flops="catalog"``):
published estimates for one model differ by up to 10x.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import lru_cache
from importlib import resources

from flopmeter.types import CatalogBasis

__all__ = ["CatalogEntry", "compiled", "entries", "lookup", "normalise_model_id"]

#: Name endings of variants that share their base's pretraining: post-training stages (instruct,
#: chat, SFT, DPO), packaging (``-hf``, ``-pt``, ``-base``), context-length variants of Phi-3,
#: and quantised copies. Stripped from the end, repeatedly, before the exact match.
VARIANT_SUFFIXES = (
    "-instruct",
    "-chat",
    "-it",
    "-hf",
    "-pt",
    "-base",
    "-sft",
    "-dpo",
    "-4k",
    "-8k",
    "-128k",
    "-unsloth-bnb-4bit",
    "-bnb-4bit",
    "-unsloth",
    "-4bit",
    "-8bit",
    "-fp8",
    "-awq",
    "-gptq",
)


@dataclass(frozen=True)
class CatalogEntry:
    """One base model's pretraining compute as the catalogue records it.

    Attributes:
        name: The base model, in words ("Llama 3.2 3B").
        ids: Its Hugging Face repository names (without the organisation).
        flops: Pretraining compute, FLOP; ``None`` when not disclosed.
        basis: ``stated``, ``6nd``, ``independent_estimate`` or ``not_disclosed``.
        source: Where the figure comes from.
        source_date: The date of the source document (ISO 8601: year, year-month or day), or
            ``None`` when the catalogue's sources do not give it.
        params: For ``6nd``: the parameters N used.
        tokens: For ``6nd``: the training tokens D used.
        note: Anything else a reader should know (other estimates, hardware hours).
    """

    name: str
    ids: tuple[str, ...]
    flops: float | None
    basis: CatalogBasis
    source: str
    source_date: str | None
    params: float | None = None
    tokens: float | None = None
    note: str | None = None


def normalise_model_id(model_id: str) -> str:
    """The part of a model id the catalogue matches: lower case, the last path component
    (no organisation or folder), known variant suffixes removed.

    ``"meta-llama/Llama-3.2-3B-Instruct"`` -> ``"llama-3.2-3b"``;
    ``"unsloth/Phi-3-mini-4k-instruct-bnb-4bit"`` -> ``"phi-3-mini"``.
    """
    name = model_id.strip().rstrip("/").lower()
    name = name.rsplit("/", 1)[-1]
    changed = True
    while changed:
        changed = False
        for suffix in VARIANT_SUFFIXES:
            if name.endswith(suffix) and len(name) > len(suffix):
                name = name[: -len(suffix)]
                changed = True
    return name


@lru_cache(maxsize=1)
def _data() -> dict:
    """The bundled catalogue file, parsed (read once)."""
    text = resources.files("flopmeter").joinpath("data", "pretrain_catalog.json").read_text("utf-8")
    return json.loads(text)


def compiled() -> str:
    """The day the catalogue was compiled from its sources (ISO 8601), for every entry."""
    return str(_data()["compiled"])


@lru_cache(maxsize=1)
def entries() -> tuple[CatalogEntry, ...]:
    """Every entry of the bundled catalogue (read once)."""
    raw = _data()["models"]
    return tuple(
        CatalogEntry(
            name=e["name"],
            ids=tuple(e["ids"]),
            flops=None if e["flops"] is None else float(e["flops"]),
            basis=e["basis"],
            source=e["source"],
            source_date=e["source_date"],
            params=e.get("params"),
            tokens=e.get("tokens"),
            note=e.get("note"),
        )
        for e in raw
    )


@lru_cache(maxsize=1)
def _index() -> dict[str, CatalogEntry]:
    index: dict[str, CatalogEntry] = {}
    for entry in entries():
        for rid in entry.ids:
            key = normalise_model_id(rid)
            if key in index and index[key] is not entry:  # a data error, found by the tests
                raise ValueError(
                    f"catalogue: {rid!r} names both {index[key].name} and {entry.name}"
                )
            index[key] = entry
    return index


def lookup(model_id: str | None) -> CatalogEntry | None:
    """The catalogue entry of a model id's base model, or ``None`` when the catalogue does not
    know it (no guess across sizes or families).

    Args:
        model_id: A Hugging Face model id (with or without organisation), or a local path whose
            last component is one; ``None`` or empty gives ``None``.
    """
    if not model_id or not model_id.strip():
        return None
    return _index().get(normalise_model_id(model_id))
