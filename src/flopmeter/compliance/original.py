"""Where the original model's training compute comes from, in one order, with its notes.

The order (docs/compliance.md, "Where the original compute comes from"):

1. ``pretrain_flops=`` given as a number (``"argument"``);
2. else the ``PRETRAIN_FLOPS`` environment variable as a number
   (``"environment variable PRETRAIN_FLOPS"``);
3. else, when the user opted in to the catalogue (``pretrain_flops="catalog"`` or
   ``PRETRAIN_FLOPS=catalog``), the bundled catalogue's figure for the model id (``"catalog"``);
4. else unknown: the fallback rule of the guidelines.

The first source that is set decides: ``pretrain_flops="catalog"`` beats a number in
``PRETRAIN_FLOPS``. A catalogue opt-in that finds no figure (unknown model, no model id, or a
figure the developer never disclosed) falls back to the default rule with a note naming why.
Whenever the catalogue knows the model, its figure and the threshold it would give are returned
too (:attr:`OriginalCompute.catalog`), used or not, so the user decides with both in view.
"""

from __future__ import annotations

from dataclasses import dataclass

from flopmeter.compliance.catalog import CatalogEntry, compiled, lookup
from flopmeter.compliance.thresholds import (
    CATALOG,
    PRETRAIN_FLOPS_ENV,
    PretrainSetting,
    determine_threshold,
)
from flopmeter.types import CatalogFigure
from flopmeter.units import human_flops

__all__ = [
    "ENV_SOURCE",
    "OriginalCompute",
    "catalog_figure",
    "describe_entry",
    "resolve_original_compute",
    "source_dates",
]

#: ``threshold.original_flops_source`` when the figure came from the environment variable.
ENV_SOURCE = f"environment variable {PRETRAIN_FLOPS_ENV}"


@dataclass(frozen=True)
class OriginalCompute:
    """The original model's training compute as a run uses it.

    Attributes:
        flops: FLOP, or ``None`` when unknown (the fallback rule applies).
        source: ``"argument"``, ``"environment variable PRETRAIN_FLOPS"``, ``"catalog"``, or
            ``None`` when unknown.
        catalog: The catalogue's figure for the model, when it knows the model (used or not).
        notes: What the report says about it (the figure not chosen, a failed opt-in).
        catalog_asked: Whether the user opted in to the catalogue (whether or not it had a
            figure for the model).
    """

    flops: float | None
    source: str | None
    catalog: CatalogFigure | None
    notes: tuple[str, ...] = ()
    catalog_asked: bool = False


def catalog_figure(
    model_id: str | None, *, original_systemic_risk: bool = False
) -> CatalogFigure | None:
    """The catalogue's figure for ``model_id`` and the threshold it would give, or ``None``."""
    entry = lookup(model_id)
    if entry is None or model_id is None:
        return None
    threshold = determine_threshold(entry.flops, original_systemic_risk=original_systemic_risk)
    return CatalogFigure(
        model_id=model_id,
        base_model=entry.name,
        flops=entry.flops,
        basis=entry.basis,
        source=entry.source,
        date=entry.source_date,
        catalog_compiled=compiled(),
        params=entry.params,
        tokens=entry.tokens,
        threshold_flops=threshold.value,
    )


def _describe(figure: CatalogFigure) -> str:
    """``"Llama 3.2 3B: 1.7 × 10^23 FLOP (6nd; <source>)"``."""
    value = "not disclosed" if figure.flops is None else human_flops(figure.flops)
    return f"{figure.base_model}: {value} ({figure.basis}; {figure.source})"


def _opt_in(model_id: str | None, figure: CatalogFigure | None, asked_by: str) -> OriginalCompute:
    """The catalogue opt-in: its figure, or the fallback with the reason."""
    if figure is not None and figure.flops is not None:
        note = (
            f"The original model's compute is the catalogue's figure (opted in by {asked_by}) "
            f"for {_describe(figure)}. Published estimates for one model can differ by up to "
            "10x; the choice of this figure is the user's."
        )
        return OriginalCompute(figure.flops, "catalog", figure, (note,), catalog_asked=True)
    if figure is not None:
        why = f"the catalogue lists {figure.base_model} as not disclosed ({figure.source})"
    elif model_id is None:
        why = "the model has no id to look up (no config name_or_path); pass model_id='org/name'"
    else:
        why = f"the catalogue does not know the model {model_id!r}"
    note = (
        f"The catalogue was asked for (by {asked_by}), but {why}: the original compute is "
        "unknown and the fallback threshold applies. Give the compute with pretrain_flops=... "
        "if you know it."
    )
    return OriginalCompute(None, None, figure, (note,), catalog_asked=True)


def resolve_original_compute(
    argument: PretrainSetting,
    environment: PretrainSetting,
    model_id: str | None,
    *,
    original_systemic_risk: bool = False,
) -> OriginalCompute:
    """The original compute from the first source set, in the order of the module's docstring.

    Args:
        argument: ``pretrain_flops=`` as validated (FLOP, ``"catalog"`` or ``None``).
        environment: ``PRETRAIN_FLOPS`` as validated (FLOP, ``"catalog"`` or ``None``).
        model_id: The Hugging Face id of the model being modified, or ``None``.
        original_systemic_risk: Chooses the fallback rule, and the threshold the catalogue's
            figure would give when it is not disclosed.
    """
    figure = catalog_figure(model_id, original_systemic_risk=original_systemic_risk)
    if argument == CATALOG:
        return _opt_in(model_id, figure, "pretrain_flops='catalog'")
    if argument is None and environment == CATALOG:
        return _opt_in(model_id, figure, f"{PRETRAIN_FLOPS_ENV}=catalog")
    if argument is not None:
        flops, source = float(argument), "argument"
    elif environment is not None:
        flops, source = float(environment), ENV_SOURCE
    else:
        flops, source = None, None
    notes: tuple[str, ...] = ()
    if figure is not None:
        given = "the pretrain_flops argument" if source == "argument" else f"the {source}"
        used = (
            f"the threshold uses the figure from {given}"
            if source
            else ("the fallback threshold applies")
        )
        notes = (
            f"The bundled catalogue knows this model, {_describe(figure)}; it would give a "
            f"threshold of {human_flops(figure.threshold_flops)}. It was not chosen, so {used}; "
            "pass pretrain_flops='catalog' (or PRETRAIN_FLOPS=catalog) to use it.",
        )
    return OriginalCompute(flops, source, figure, notes)


def describe_entry(entry: CatalogEntry) -> str:
    """One line for a catalogue entry: name, figure, basis and source (for the command line)."""
    value = "not disclosed" if entry.flops is None else human_flops(entry.flops)
    dates = source_dates(entry.source_date, compiled())
    return f"{entry.name}: {value} ({entry.basis}; {entry.source}; {dates})"


def source_dates(source_date: str | None, catalog_compiled: str | None) -> str:
    """When a catalogue figure's source is dated, and when the catalogue was compiled (left out
    when not recorded: a report's figure is never given today's catalogue date)."""
    dated = f"source dated {source_date}" if source_date else "source date not recorded"
    return dated + (f", catalogue compiled {catalog_compiled}" if catalog_compiled else "")
