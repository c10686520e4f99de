"""A method's plan costed by the dispatch count: the families the ``transformer`` estimate does
not know (encoder-decoders, vision-language and speech models), and text-only models whose
layers it does not recognise.

Each distinct sequence shape of the plan (:mod:`flopmeter.planner.shapes`) is run once on the
``meta`` device under PyTorch's counter with flopmeter's registry
(:func:`flopmeter.planner.dispatch.dispatch_flops`) and multiplied by its count. That is the
figure the meter's ``measured`` estimate takes of sampled micro-batches, over the plan's own
shapes, and the plan says so in its notes.
"""

from __future__ import annotations

import math
from collections import Counter
from fractions import Fraction
from typing import Any

from flopmeter.errors import ConfigurationError
from flopmeter.flops.formulas import seed_flops, six_nd_flops
from flopmeter.planner.build import MethodSetup
from flopmeter.planner.dispatch import SequenceShape, image_positions
from flopmeter.planner.families import Family
from flopmeter.planner.method_notes import method_notes_for
from flopmeter.planner.plan import MethodPlan, PlanRequest, judged
from flopmeter.planner.shapes import speech_shapes, with_decoder, with_images
from flopmeter.types import TokenTotals

__all__ = ["dispatch_method_plan", "dispatch_shapes"]


def _totals(shapes: Counter[SequenceShape], batch: int) -> TokenTotals:
    """The text (or encoder) stream's statistics of ``shapes``, image positions left out,
    ``batch`` sequences per micro-batch."""
    sequences = sum(shapes.values())
    return TokenTotals(
        tokens_processed=sum(s.tokens * n for s, n in shapes.items()),
        tokens_seen=sum(s.tokens * n for s, n in shapes.items()),
        sequences=sequences,
        sum_sq_seq_len=sum(s.tokens * s.tokens * n for s, n in shapes.items()),
        micro_batches=-(-sequences // batch),
    )


def _transcript_totals(
    shapes: Counter[SequenceShape], totals: TokenTotals, tokens: int
) -> TokenTotals:
    """A speech plan's text-stream statistics: its ``tokens`` transcript (decoder) tokens and
    their squared lengths (tokens^2) per clip of ``shapes``, the clips and micro-batches of
    ``totals`` (the encoder stream's)."""
    return TokenTotals(
        tokens_processed=tokens,
        tokens_seen=tokens,
        sequences=totals.sequences,
        sum_sq_seq_len=sum(s.decoder_tokens**2 * n for s, n in shapes.items()),
        micro_batches=totals.micro_batches,
    )


def dispatch_shapes(req: PlanRequest, family: Family, hf: Any, seq_len: int) -> dict[str, Any]:
    """The shapes, totals and words of a plan of a family costed by the dispatch count.

    Returns:
        ``shapes`` (:class:`SequenceShape` to count), ``totals`` (the text or encoder stream),
        ``epochs`` (``None``), ``how`` (the budgets in words), ``notes``, and the budgets
        ``decoder_tokens``, ``images``, ``clips`` (``None`` where they do not apply).
    """
    tokens = req.tokens
    assert tokens is not None
    notes: list[str] = []
    positions = 0
    if family.name == "encoder-decoder":
        decoder = int(req.decoder_tokens)  # type: ignore[arg-type]
        shapes = with_decoder(tokens, seq_len, decoder)
        how = (
            f"--tokens (encoder) in full sequences of {seq_len:,} tokens (--seq-len), the last "
            f"shorter; --decoder-tokens {decoder:,} spread evenly over them"
        )
    elif family.name == "vision-language":
        images = int(req.images)  # type: ignore[arg-type]
        shapes = with_images(tokens, seq_len, images)
        positions = image_positions(hf)
        vision = hf.vision_config
        how = (
            f"--tokens (text) in full sequences of {seq_len:,} tokens (--seq-len), the last "
            f"shorter; --images {images:,} spread evenly over them"
        )
        notes.append(
            f"Images: {vision.image_size} x {vision.image_size} pixels (the vision config's "
            f"image_size), {(vision.image_size // vision.patch_size) ** 2} patches of "
            f"{vision.patch_size} x {vision.patch_size} each; an image takes {positions} "
            "positions of the language model's sequence beside its text tokens (--tokens "
            "counts text only)."
        )
    else:  # speech
        clips = int(req.clips)  # type: ignore[arg-type]
        shapes = speech_shapes(tokens, clips, getattr(hf, "max_target_positions", None))
        frames = 2 * hf.max_source_positions
        how = (
            f"--clips {clips:,} audio clips of 30 s ({frames:,} mel frames, "
            f"{hf.max_source_positions:,} encoder positions each, the configuration's); "
            "--tokens are their transcripts (decoder tokens), spread evenly over them"
        )
        notes.append(
            "Speech: every clip is padded to 30 s, as Whisper's feature extractor does, so the "
            "encoder's work is per clip whatever the audio's length."
        )
    totals = _totals(shapes, req.batch_size)
    if family.name == "speech":  # the text stream is the transcripts, the decoder's tokens
        totals = _transcript_totals(shapes, totals, tokens)
    return {
        "shapes": shapes,
        "totals": totals,
        "epochs": None,
        "how": how,
        "notes": notes,
        "positions": positions,
        "decoder_tokens": req.decoder_tokens,
        "encoder_positions": (req.clips or 0) * getattr(hf, "max_source_positions", 0),
        "images": req.images,
        "clips": req.clips,
    }


def _seed_tokens(ctx: dict[str, Any]) -> int:
    """The tokens D the seed and 6ND formulas are given: every position the model computes
    (text or encoder tokens, decoder tokens, image positions), for comparison only."""
    totals: TokenTotals = ctx["totals"]
    images = ctx.get("images") or 0
    return (
        totals.tokens_processed
        + (ctx.get("decoder_tokens") or 0)
        + images * ctx.get("positions", 0)
        + ctx.get("encoder_positions", 0)
    )


def _tied(config: dict[str, Any]) -> bool:
    text = config.get("text_config") if isinstance(config.get("text_config"), dict) else config
    return bool(text.get("tie_word_embeddings", True))


def dispatch_method_plan(
    model_id: str,
    config: dict[str, Any],
    setup: MethodSetup,
    ctx: dict[str, Any],
    layers: int | None,
    why: str,
) -> MethodPlan:
    """One method's plan, costed by the dispatch count of each sequence shape on meta.

    Args:
        model_id: The model as the user named it.
        config: Its ``config.json``.
        setup: The method.
        ctx: The plan's context (``family``, ``totals``, ``threshold``, ``epochs``, and
            ``shapes`` or the text-only ``lengths`` callable).
        layers: The transformer blocks (spectrum, freeze); ``None`` when the family has no
            single stack.
        why: Why the transformer estimate does not cost it (said in the notes).

    Raises:
        ConfigurationError: the model cannot be built or run on meta (one line).
    """
    from flopmeter.planner.costing import dispatch_cost

    family: Family = ctx["family"]
    shapes: Counter[SequenceShape] = ctx["shapes"] if "shapes" in ctx else ctx["lengths"]()
    epochs = Fraction(1) if ctx.get("epochs") is None else Fraction(ctx["epochs"])
    cost = dispatch_cost(config, setup, layers, family, shapes)
    census, blocks, per_epoch = cost.census, cost.trainable_blocks, cost.flops
    flops = float(per_epoch * epochs)
    if not math.isfinite(flops) or flops <= 0:
        raise ConfigurationError(f"the dispatch count of the {setup.method} model is {flops}")
    totals: TokenTotals = ctx["totals"]
    seed_tokens = _seed_tokens(ctx)
    return MethodPlan(
        method=setup.method,  # type: ignore[arg-type]
        model=model_id,
        n_total=census.n_total,
        n_trainable=census.n_trainable,
        tokens=totals.tokens_processed,
        sequences=totals.sequences,
        sum_sq_seq_len=totals.sum_sq_seq_len,
        micro_batches=totals.micro_batches,
        decoder_tokens=ctx.get("decoder_tokens"),
        images=ctx.get("images"),
        clips=ctx.get("clips"),
        estimate="dispatch",
        seed_flops=seed_flops(census.n_total, census.n_trainable, seed_tokens),
        six_nd_flops=six_nd_flops(census.n_total, seed_tokens),
        trainable_blocks=list(blocks) if blocks else None,
        notes=[
            *method_notes_for(setup, layers, blocks, _tied(config)),
            f"Costed by PyTorch's dispatch count (FlopCounterMode with flopmeter's registry) of "
            f"one training step of each of the {len(shapes)} distinct sequence shape(s) on "
            f"meta, multiplied by their counts: {why}.",
        ],
        # tokens_to_threshold: --tokens scaled with every other budget in proportion
        **judged(flops, totals, ctx["threshold"], ctx["epochs"]),
    )
