"""Value types every layer may import: token totals, one estimate, and the report's literals.

This module imports nothing from flopmeter, so ``flops/``, ``compliance/``, ``hardware/`` and the
report can all depend on it without reaching up or across.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

#: A run's status: ``running`` while the meter runs, else how training ended.
Status = Literal["running", "completed", "failed", "interrupted"]
#: Where a run's compute stands against its threshold (see :mod:`flopmeter.compliance.verdict`).
Verdict = Literal["below_threshold", "near_threshold", "exceeds_threshold"]
#: Which rule gave the threshold (see :mod:`flopmeter.compliance.thresholds`).
ThresholdKind = Literal["one_third_of_original", "default_gpai", "default_systemic_risk"]
#: The names of the architecture-side estimates, keys of ``FlopReport.estimates``.
EstimateName = Literal["seed", "six_nd", "transformer", "measured"]
#: Whether a report's counts are summed over every rank or are this rank's only.
CountsScope = Literal["all_ranks", "this_rank"]


class InputShapeCount(BaseModel):
    """Training micro-batches of one shape key (see :class:`flopmeter.counting.work_units.ShapeUnits`)."""

    model_config = ConfigDict(frozen=True)

    key: str = Field(description="The inputs' shapes without the batch dimension.")
    micro_batches: int = Field(0, description="Training forward calls with this key.")
    items: int = Field(0, description="Items (batch dimension) summed over those calls.")


class TokenTotals(BaseModel):
    """A run's token statistics (counts, summed over micro-batches and ranks)."""

    model_config = ConfigDict(frozen=True)

    tokens_processed: int = Field(0, description="Non-padding training tokens.")
    tokens_seen: int = Field(0, description="Training tokens including padding.")
    sequences: int = Field(0, description="Training sequences.")
    sum_sq_seq_len: int = Field(
        0, description="Sum over sequences of (non-padding length)^2, in tokens^2."
    )
    sum_sq_seq_len_seen: int | None = Field(
        0,
        description="Sum over the training micro-batches of rows x (padded width)^2, in "
        "tokens^2: the squared lengths with padding, as tokens_seen is the tokens with padding "
        "(from the shapes); null when a restored state did not keep it.",
    )
    micro_batches: int = Field(0, description="Training forward passes counted.")
    decoder_tokens: int = Field(
        0,
        description="Non-padding decoder tokens of an encoder-decoder model (by "
        "decoder_attention_mask, else labels that are not -100, else every position); 0 "
        "without a decoder stream.",
    )
    decoder_sum_sq_len: int = Field(
        0, description="Sum over sequences of the non-padding decoder length squared, tokens^2."
    )
    cross_pairs: int = Field(
        0,
        description="Sum over sequences of non-padding encoder length x decoder length: "
        "cross-attention query-key pairs, in tokens^2.",
    )
    items: int = Field(
        0,
        description="Items in the batch dimension of the training forward calls (sequences, "
        "images, audio clips, latents).",
    )
    non_text_micro_batches: int = Field(
        0,
        description="Training micro-batches whose work is not all in one text-token stream "
        "(a decoder stream, images, audio or float inputs: ShapeUnits.text false).",
    )
    input_shapes: tuple[InputShapeCount, ...] = Field(
        (),
        description="Training micro-batches and items per shape key (the inputs' shapes "
        "without the batch dimension), at most flopmeter.counting.work_units.MAX_INPUT_SHAPES keys.",
    )
    input_shapes_dropped: int = Field(
        0, description="Training micro-batches whose shape key was beyond the kept keys."
    )


class Estimate(BaseModel):
    """One compute estimate, with the formula and inputs that reproduce it."""

    flops: float | None = Field(description="The estimate in FLOP; null when it cannot be made.")
    method: str = Field(description="The method's name (a key of FlopReport.estimates).")
    formula: str = Field(description="How the figure is computed from the inputs.")
    inputs: dict[str, Any] = Field(default_factory=dict, description="The formula's inputs.")
    notes: list[str] = Field(default_factory=list, description="Assumptions and caveats.")


#: The basis of a catalogue figure for an original model's training compute.
CatalogBasis = Literal["stated", "6nd", "independent_estimate", "not_disclosed"]


class CatalogFigure(BaseModel):
    """What the bundled pretraining-compute catalogue says about a run's base model."""

    model_id: str = Field(description="The model id looked up (as the user or model named it).")
    base_model: str = Field(description="The catalogue entry it resolved to (instruct -> base).")
    flops: float | None = Field(
        description="Published or estimated compute, FLOP; null when "
        "the developer did not disclose it."
    )
    basis: CatalogBasis = Field(
        description="stated by the developer, 6ND from the model card, "
        "an independent estimate, or not disclosed."
    )
    source: str = Field(description="Where the figure comes from (document or URL).")
    date: str | None = Field(
        description="The date of the source document itself (ISO 8601: a paper's year, an "
        "Epoch AI snapshot's month, or a day), when the catalogue's sources give it; null "
        "otherwise. Not when the figure was typed in: that is catalog_compiled."
    )
    catalog_compiled: str | None = Field(
        None, description="The day the bundled catalogue was compiled from its sources, ISO 8601."
    )
    params: float | None = Field(
        None, description="For basis 6nd: the parameters N used (6 x N x D)."
    )
    tokens: float | None = Field(
        None, description="For basis 6nd: the training tokens D used (6 x N x D)."
    )
    threshold_flops: float | None = Field(
        None, description="The threshold this figure would give, FLOP (whether used or not)."
    )


class ParentRun(BaseModel):
    """An earlier run this run continues (fine-tune, then fine-tune the result)."""

    ref: str = Field(description="What the user named: a report path or a run id.")
    path: str | None = Field(
        None, description="The parent report's file as read, an absolute path (ref resolved)."
    )
    run_id: str | None = Field(None, description="The parent report's run id.")
    flops: float | None = Field(
        description="The parent's compute, FLOP (its own plus its "
        "parents'); null when it has none, which withholds the verdict."
    )
    own_flops: float | None = Field(
        None,
        description="The parent run's own compute, FLOP, without its parents' (its "
        "compute.primary_flops); null when unknown or in reports written before it was recorded.",
    )
    ancestor_flops: dict[str, float] = Field(
        default_factory=dict,
        description="The earlier runs counted in flops besides the parent itself (its own "
        "ancestor_flops): run id -> that run's own compute, FLOP. Lets a run that names two "
        "parents of one chain count each run once.",
    )
    status: str | None = Field(None, description="The parent report's status.")
    reason: str | None = Field(
        None, description="Why flops is null (the parent report's own reason), when it is."
    )
    threshold_flops: float | None = Field(
        None, description="The threshold the parent was judged against, FLOP."
    )
    base_model: str | None = Field(
        None, description="The catalogue's base model of the parent, when it knew it."
    )


class Obligation(BaseModel):
    """One obligation that follows under the AI Act when a modifier becomes a provider."""

    title: str = Field(description="The obligation, in a few words.")
    article: str = Field(description="Where the Act or the guidelines state it.")
    text: str = Field(description="What it asks, in plain words (not legal advice).")
