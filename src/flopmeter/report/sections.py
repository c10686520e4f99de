"""The sections of a report (schema 2.0): one pydantic model per concept.

:class:`~flopmeter.report.FlopReport` holds one of each: the run's identity and life, the model's
parameters, the token counts, the compute estimates, the original compute and the threshold, the
verdict, the hardware figures, the budget and the lineage. Names carry their units (``_flops``,
``_seconds``, ``_joules``, ``_watts``, ``_flops_per_second``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Literal

from pydantic import BaseModel, Field

from flopmeter.compliance.verdict import UNCERTAINTY_MARGIN
from flopmeter.types import (
    CatalogFigure,
    CountsScope,
    Estimate,
    EstimateName,
    InputShapeCount,
    Obligation,
    Status,
    ThresholdKind,
    TokenTotals,
    Verdict,
)

__all__ = [
    "TOKENS_ADDED_IN_2_0",
    "TOKENS_MEANING",
    "ComputeSection",
    "ModelSection",
    "RunModality",
    "RunSection",
    "ThresholdSection",
    "TokenSection",
    "VerdictSection",
    "run_modality",
    "tokens_meaning",
]


class RunSection(BaseModel):
    """The run's identity, its life, and who wrote the report."""

    run_id: str | None = Field(None, description="This run's id (a new one per meter).")
    status: Status = Field(
        "running",
        description="running: the counts so far, written while training goes on (a running "
        "report whose writer is gone is incomplete: the process was killed); completed, "
        "failed or interrupted: the final report.",
    )
    error: str | None = Field(
        None,
        description="Exception type and message when the run failed (at most 2000 characters, "
        "credentials redacted).",
    )
    started_at: str | None = Field(None, description="ISO 8601, UTC.")
    ended_at: str | None = Field(None, description="ISO 8601, UTC; null while running.")
    updated_at: str | None = Field(None, description="When this report was made, ISO 8601, UTC.")
    pid: int | None = Field(None, description="Process id of the writer (rank 0).")
    hostname: str | None = Field(None, description="Host of the writer.")
    training_duration_seconds: float | None = Field(
        0.0,
        description="Wall-clock training time, s; null in the report of a job no meter saw "
        "(attach.method null).",
    )
    epochs: float | None = Field(None, description="Epochs, when a framework adapter knows them.")
    world_size: int = Field(1, description="Processes in the run.")
    counts_scope: CountsScope = Field(
        "all_ranks", description="all_ranks: counts summed over every rank; this_rank: one's."
    )
    torch_version: str | None = None
    flopmeter_version: str | None = None


class ModelSection(BaseModel):
    """The model and its parameters (logical counts)."""

    name: str | None = Field(None, description="The model's name (a Hugging Face id or given).")
    n_total: int | None = Field(None, description="Parameters, tied weights once, logical size.")
    n_trainable: int | None = None
    n_frozen: int | None = None
    n_embedding: int | None = Field(None, description="Parameters of embedding tables.")
    n_active: int | None = Field(
        None, description="Parameters a token passes through (mixture-of-experts: top-k)."
    )


#: What a run's "tokens" are: its micro-batches' modality (flopmeter.counting.work_units.Modality), or
#: ``mixed`` when its ranks counted micro-batches of several.
RunModality = Literal["text", "image", "audio", "items", "mixed"]

#: What ``tokens_processed`` counts, per modality (the report's ``tokens.tokens_meaning``).
TOKENS_MEANING: dict[str, str] = {
    "text": "tokens_processed counts the non-padding text tokens the model sees: its input_ids "
    "(a vision-language model's image placeholder tokens included, as its language model sees "
    "them) or inputs_embeds positions; for an encoder-decoder, the encoder's tokens "
    "(the decoder's are decoder_tokens).",
    "image": "tokens_processed counts image patches: (height // patch) x (width // patch) per "
    "image of pixel_values, the patch size read from the model's config (class and register "
    "tokens not included).",
    "audio": "tokens_processed counts audio frames: the frames (last dimension) of "
    "input_features, padding included, since the encoder computes every frame; an "
    "encoder-decoder's decoder tokens are decoder_tokens.",
    "items": "tokens_processed counts items: the batch dimension of inputs that are not tokens "
    "(latents, float features), each item one token.",
    "items_images": "tokens_processed counts images, not patches: the model's config gives no "
    "patch size, so each image (the batch dimension of pixel_values) is one token.",
    "mixed": "the ranks counted micro-batches of several modalities ({}): tokens_processed adds "
    "unlike units; read items and input_shapes instead.",
}


def run_modality(micro_batches: Mapping[str, int] | None) -> RunModality | None:
    """A run's modality from its counted micro-batches per modality: the one, ``mixed`` for
    several, ``None`` for none."""
    seen = [m for m, n in (micro_batches or {}).items() if n]
    if not seen:
        return None
    return "mixed" if len(seen) > 1 else seen[0]  # type: ignore[return-value]


def tokens_meaning(
    modality: RunModality | None,
    input_shapes: Sequence[InputShapeCount] = (),
    micro_batches: Mapping[str, int] | None = None,
) -> str | None:
    """The sentence saying what ``tokens_processed`` counts (``None`` before any counted
    micro-batch); images without a known patch size are told apart by their shape keys."""
    if modality is None:
        return None
    if modality == "mixed":
        return TOKENS_MEANING["mixed"].format(", ".join(sorted(micro_batches or {})))
    if modality == "items" and any("pixel_values" in c.key for c in input_shapes):
        return TOKENS_MEANING["items_images"]
    return TOKENS_MEANING[modality]


def _totals_field(name: str) -> str:
    return (
        f"{TokenTotals.model_fields[name].description} Null in a report written before the "
        "meter counted it."
    )


#: The tokens section's fields that came within schema 2.0 (issue 20): a 2.0 report written
#: before them is read with them null (not recorded, never 0).
TOKENS_ADDED_IN_2_0 = (
    "modality",
    "tokens_meaning",
    "decoder_tokens",
    "decoder_sum_sq_len",
    "cross_pairs",
    "items",
    "non_text_micro_batches",
    "input_shapes",
    "input_shapes_dropped",
)


#: The counts' note on null (schema 2.1): a run the meter never saw has no counts, not zero ones.
_NULL = "; null when no meter saw the run (a zero-code job nothing attached to), never 0."


class TokenSection(BaseModel):
    """What training passed through the model: tokens, sequences, micro-batches, steps."""

    tokens_processed: int | None = Field(0, description="Non-padding training tokens" + _NULL)
    tokens_seen: int | None = Field(0, description="Training tokens including padding" + _NULL)
    sequences: int | None = Field(0, description="Training sequences" + _NULL)
    sum_sq_seq_len: int | None = Field(
        0, description="Sum of squared per-sequence lengths, tokens^2" + _NULL
    )
    micro_batches: int | None = Field(0, description="Training forward passes counted" + _NULL)
    modality: RunModality | None = Field(
        None,
        description="What the run's tokens are: text tokens seen by the model, image patches, "
        "audio frames, or items (inputs that are not tokens); mixed when ranks counted several; "
        "null before any counted micro-batch.",
    )
    tokens_meaning: str | None = Field(
        None, description="What tokens_processed counts for this run, in one sentence."
    )
    decoder_tokens: int | None = Field(0, description=_totals_field("decoder_tokens"))
    decoder_sum_sq_len: int | None = Field(0, description=_totals_field("decoder_sum_sq_len"))
    cross_pairs: int | None = Field(0, description=_totals_field("cross_pairs"))
    items: int | None = Field(0, description=_totals_field("items"))
    non_text_micro_batches: int | None = Field(
        0, description=_totals_field("non_text_micro_batches")
    )
    input_shapes: list[InputShapeCount] | None = Field(
        default_factory=list, description=_totals_field("input_shapes")
    )
    input_shapes_dropped: int | None = Field(0, description=_totals_field("input_shapes_dropped"))
    micro_batches_unread: int = Field(
        0,
        description="Training micro-batches whose tokens the meter could not find or read "
        "(not in the counts; any makes the compute and verdict null).",
    )
    micro_batches_inconsistent: int = Field(
        0,
        description="Training micro-batches with inconsistent inputs (a mask of another shape "
        "than the ids, document offsets that decrease or run past the batch); any makes the "
        "compute and verdict null.",
    )
    optimizer_steps: int | None = Field(0, description="Optimizer steps counted" + _NULL)


class PhaseSection(BaseModel):
    """One phase of the run's compute (schema 2.2): the training passes, the trained model's
    forward passes without gradients (generation, scoring), another model's forward passes,
    a declared phase, or evaluation."""

    name: str = Field(
        description="training, generation, scoring, 'model <name>' (another model's forward "
        "passes while the trained model trains), evaluation (never counted), or a declared "
        "phase's name."
    )
    flops: float | None = Field(
        None, description="The phase's compute, FLOP; null when not known (reason says why)."
    )
    counted: bool = Field(
        description="Whether the phase enters verdict.judged_flops under compute.phase_policy."
    )
    method: str = Field(description="How the phase was counted.")
    calls: int | None = Field(
        None, description="Forward calls in the phase (null for training and declared phases)."
    )
    samples: int | None = Field(None, description="Calls counted at dispatch level.")
    modules: list[str] = Field(default_factory=list, description="The modules it covers.")
    notes: list[str] = Field(default_factory=list)
    reason: str | None = Field(None, description="Why flops is null, when it is.")


class ComputeSection(BaseModel):
    """The run's training compute: every estimate, which one is the primary figure (the
    trained model's training passes), and the run's phases."""

    primary_flops: float | None = Field(
        None, description="The primary compute figure, FLOP: estimates[primary_estimate]."
    )
    primary_estimate: EstimateName | None = None
    primary_reason: str | None = Field(
        None,
        description="Why primary_estimate is the primary figure, e.g. "
        "'transformer: architecture recognised, measured within 1%'.",
    )
    estimates: dict[str, Estimate] = Field(default_factory=dict)
    measured_to_transformer_ratio: float | None = Field(
        None,
        description="estimates.measured / estimates.transformer: the run's consistency check "
        "(the transformer estimate is judged only when a dispatch-level count agrees with it "
        "within 1%; a warning note beyond 10%).",
    )
    withheld_reason: str | None = Field(
        None,
        description="Why compute.primary_flops, verdict.ratio_to_threshold, "
        "verdict.exceeds_threshold and verdict.outcome are null, when they are.",
    )
    phase_policy: str | None = Field(
        None,
        description="Which phases enter verdict.judged_flops: 'modification' (every phase that "
        "fed this run's updates) or 'updates' (the training passes only); null in a report "
        "older than schema 2.2, whose judged figure is its training passes.",
    )
    phases: list[PhaseSection] = Field(
        default_factory=list,
        description="The run's compute by phase (schema 2.2); the training phase is "
        "compute.primary_flops. Empty in a report older than 2.2.",
    )


class ThresholdSection(BaseModel):
    """The original model's compute and the threshold the run is judged against."""

    original_flops: float | None = Field(None, description="Original model's compute, FLOP.")
    original_flops_source: str | None = Field(
        None,
        description="Where original_flops came from: 'argument', 'environment variable "
        "PRETRAIN_FLOPS' or 'catalog'; null when unknown. Checked in that order.",
    )
    catalog: CatalogFigure | None = Field(
        None,
        description="The bundled catalogue's figure for the base model when it knows it, shown "
        "whether or not it was chosen (pretrain_flops='catalog' opts in).",
    )
    threshold_flops: float | None = Field(
        None, description="The threshold, FLOP; exceeded when strictly above."
    )
    kind: ThresholdKind | None = Field(None, description="Which rule gave the threshold.")
    source: str | None = Field(None, description="The rule and its source, in words.")


class VerdictSection(BaseModel):
    """Where the judged figure stands against the threshold, and what follows."""

    outcome: Verdict | None = Field(
        None,
        description="below_threshold, near_threshold (not above the threshold, but above it "
        "with 30% added: from 1/1.3 ≈ 77% of it) or exceeds_threshold; null when withheld.",
    )
    exceeds_threshold: bool | None = None
    ratio_to_threshold: float | None = Field(
        None, description="judged_flops / threshold.threshold_flops."
    )
    judged_flops: float | None = Field(
        None,
        description="The figure the verdict judges, FLOP: lineage.cumulative_flops when the run "
        "has parent runs or a resumed session's compute beyond its checkpoint "
        "(lineage.resumed.beyond_checkpoint_flops), else compute.primary_flops (null when not "
        "known).",
    )
    basis: str | None = Field(
        None,
        description="Which figure decided the verdict, in words (e.g. the measured cross-check "
        "would pass the threshold with the margin added).",
    )
    uncertainty_margin: float = Field(
        UNCERTAINTY_MARGIN,
        description="The error margin of the guidelines (Annex A.2) used for near_threshold: "
        "near when the figure is not above the threshold but would be with this share added "
        "(from 1/1.3 ≈ 77% of the threshold).",
    )
    obligations: list[Obligation] = Field(
        default_factory=list,
        description="When the outcome is exceeds_threshold: what follows for the modifier.",
    )
