"""The plan of a model configuration, method by method: each method's model on meta, costed
by the meter's ``transformer`` estimate (checked against the dispatch count of one sequence),
else by the dispatch count of each sequence shape. torch and transformers are imported here;
:func:`flopmeter.planner.estimate` imports this module only for a plan of a model."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from flopmeter.compliance.thresholds import Threshold
from flopmeter.errors import ConfigurationError
from flopmeter.flops.architecture import Architecture, read_architecture
from flopmeter.flops.formulas import seed_flops, six_nd_flops
from flopmeter.planner.build import MethodSetup, hf_config, lora_targets_for
from flopmeter.planner.checking import check_length, checker, counts
from flopmeter.planner.costing import method_check, method_cost
from flopmeter.planner.dispatch import SequenceShape
from flopmeter.planner.dispatch_plan import dispatch_method_plan, dispatch_shapes
from flopmeter.planner.families import FAMILY_NAMES, Family, detect_family, refuse_diffusers
from flopmeter.planner.method_notes import method_notes
from flopmeter.planner.models import resolve_model
from flopmeter.planner.plan import (
    DEFAULT_SEQ_LEN,
    METHODS,
    STACK_METHODS,
    MethodPlan,
    Plan,
    PlanRequest,
    judged,
)
from flopmeter.planner.recipe_plan import recipe_context, with_phases
from flopmeter.planner.recipe_shape import (
    recipe_notes,
)
from flopmeter.planner.tokens import (
    dataset_lengths,
    totals_for_lengths,
    totals_for_tokens,
)
from flopmeter.types import TokenTotals

__all__ = ["model_plan"]


def _method_plan(
    model_id: str,
    config: dict[str, Any],
    arch: Architecture,
    setup: MethodSetup,
    ctx: dict[str, Any],
) -> MethodPlan:
    """One method of a text-only model: the transformer estimate where the meter's FLOP model
    recognises every layer, else the dispatch count of each sequence shape (said in a note)."""
    from flopmeter.flops.transformer import transformer_estimate

    family: Family = ctx["family"]
    cost = method_cost(config, setup, arch.num_layers, family)
    totals: TokenTotals = ctx["totals"]
    result = transformer_estimate(cost.profile, totals) if cost.profile.recognised else None
    disagreement = (
        None
        if result is None or result.flops is None
        else method_check(
            config,
            setup,
            arch.num_layers,
            family,
            check_length(ctx),
            checker(ctx),
            counts(ctx),
        )
    )
    if result is None or result.flops is None or disagreement:  # never a 0 for a figure
        why = disagreement or "; ".join(cost.profile.notes if result is None else result.notes)
        return _not_covered(model_id, config, arch, setup, ctx, why)
    plan = MethodPlan(
        method=setup.method,  # type: ignore[arg-type]
        model=model_id,
        n_total=cost.census.n_total,
        n_trainable=cost.census.n_trainable,
        tokens=totals.tokens_processed,
        sequences=totals.sequences,
        sum_sq_seq_len=totals.sum_sq_seq_len,
        micro_batches=totals.micro_batches,
        estimate="transformer",
        seed_flops=seed_flops(
            cost.census.n_total, cost.census.n_trainable, totals.tokens_processed
        ),
        six_nd_flops=six_nd_flops(cost.census.n_total, totals.tokens_processed),
        linear_flops=result.inputs["linear_flops"],
        attention_flops=result.inputs["attention_flops"],
        trainable_blocks=list(cost.trainable_blocks) if cost.trainable_blocks else None,
        # the estimate's own notes after its two plan-wide ones (LoRA on expert weights, ...)
        notes=[*method_notes(setup, arch, cost.trainable_blocks), *result.notes[2:]],
        **judged(result.flops, totals, ctx["threshold"], ctx["epochs"]),
    )
    return plan if ctx.get("recipe") is None else with_phases(plan, cost.profile, setup, ctx)


def _not_covered(
    model_id: str,
    config: dict[str, Any],
    arch: Architecture,
    setup: MethodSetup,
    ctx: dict[str, Any],
    why: str,
) -> MethodPlan:
    """One method of a text-only model the FLOP model does not cover (``why``): costed by the
    dispatch count of each sequence shape, or refused when a recipe's phases need the FLOP
    model.

    Raises:
        ConfigurationError: the plan has a recipe (one line, with ``why``).
    """
    if ctx.get("recipe") is not None:
        raise ConfigurationError(
            f"--recipe {ctx['recipe'].name} costs its phases from the FLOP model, which "
            f"does not cover this model ({why})"
        )
    return dispatch_method_plan(
        model_id,
        config,
        setup,
        ctx,
        arch.num_layers,
        why=f"the FLOP model does not cover this model ({why})",
    )


def _token_statistics(req: PlanRequest, seq_len: int) -> tuple[TokenTotals, str, bool, int | None]:
    """The totals, how they were obtained, whether approximate, and the epochs (dataset)."""
    if req.dataset is None:
        assert req.tokens is not None
        how = (
            f"--tokens in full sequences of {seq_len:,} tokens (--seq-len), the last shorter, "
            f"{req.batch_size} per micro-batch"
        )
        return totals_for_tokens(req.tokens, seq_len, req.batch_size), how, False, None
    found = dataset_lengths(req.dataset, seq_len, req.tokenizer)
    how = (
        f"{len(found.lengths):,} examples of {req.dataset} x {req.epochs} epoch(s), one "
        f"sequence each, cut at {seq_len:,} tokens ({found.truncated:,} cut), "
        f"{req.batch_size} per micro-batch; lengths from "
        f"{found.how}"
    )
    totals = totals_for_lengths(found.lengths, req.epochs, req.batch_size)
    return totals, how, found.approximate, req.epochs


def model_plan(req: PlanRequest, threshold: Threshold, note: str) -> Plan:
    """The plan of ``req.model`` (a checked request with a model), judged against
    ``threshold`` (``note``: where it came from); see :func:`flopmeter.planner.estimate`.

    Raises:
        ConfigurationError: any input that cannot make a plan (one line naming it).
    """
    resolved = resolve_model(req.model)  # type: ignore[arg-type]
    refuse_diffusers(resolved.config)
    family = detect_family(resolved.config, hf_config(resolved.config))
    recipe = req.recipe_shape()
    _check_recipe_family(recipe.name, family)
    _check_family_inputs(req, family)
    seq_len = req.seq_len or DEFAULT_SEQ_LEN
    ctx: dict[str, Any] = {"threshold": threshold, "family": family, "seq_len": seq_len}
    targets, ctx["lora_note"] = lora_targets_for(
        resolved.config.get("model_type"), req.lora_targets
    )
    arch, why, approximate = None, None, False
    if recipe.name != "sft":
        arch, how = recipe_context(req, recipe, resolved.config, ctx)
        seq_len = ctx["seq_len"]
    elif family.text_only:
        arch, why = read_architecture(resolved.config)
        totals, how, approximate, epochs = _token_statistics(req, seq_len)
        ctx.update(totals=totals, epochs=epochs, lengths=_lengths(req, seq_len))
    else:
        ctx.update(dispatch_shapes(req, family, hf_config(resolved.config), seq_len))
        how = ctx["how"]

    def plan_of(m: str) -> MethodPlan:
        setup = MethodSetup(m, req.lora_r, targets, req.spectrum_fraction, req.freeze_layers)
        if arch is not None:
            return _method_plan(resolved.model_id, resolved.config, arch, setup, ctx)
        return dispatch_method_plan(
            resolved.model_id,
            resolved.config,
            setup,
            ctx,
            None,
            why=_not_modelled(family, why if family.text_only else None),
        )

    asked, left_out = _methods_for(req.methods, arch is not None, family)
    methods = _in_build_order(asked, plan_of)
    costed = _costed_by(sorted({m.estimate for m in methods}))
    return Plan(
        model=str(Path(resolved.model_id))
        if Path(resolved.model_id).exists()
        else resolved.model_id,
        source=f"{resolved.source}; {FAMILY_NAMES[family.name]} ({family.model_type}) with "
        f"its {family.head}; {costed}",
        tokens_from=how,
        approximate_tokens=approximate,
        threshold_source=threshold.source,
        threshold_note=note,
        base_parameters=_base_parameters(methods),
        family=family.name,
        head=family.head,
        methods=methods,
        notes=[
            *recipe_notes(recipe),
            *_context_notes(resolved.config, seq_len),
            *_plan_notes(ctx, left_out, methods),
        ],
    )


def _check_recipe_family(recipe: str, family: Family) -> None:
    """Refuses (one line) a recipe other than ``sft`` for a model that is not a decoder."""
    if recipe != "sft" and family.name != "decoder":
        raise ConfigurationError(
            f"--recipe {recipe} plans decoder models; {family.model_type} is a "
            f"{FAMILY_NAMES[family.name]}"
        )


def _plan_notes(
    ctx: dict[str, Any], left_out: list[str], methods: Sequence[MethodPlan]
) -> list[str]:
    """The plan's notes after the recipe's and the context's: the family's (``ctx``), the
    methods left out, LoRA's targets where ``all-linear`` was narrowed (a LoRA method planned),
    and the conventions every method's figure follows."""
    lora = ctx.get("lora_note") if {"lora", "qlora"} & {m.method for m in methods} else None
    return [
        *ctx.get("notes", ()),
        *left_out,
        *([lora] if lora else []),
        "Attention pairs: the full square L^2 per sequence (the meter's default convention).",
        "Activation-checkpoint recomputation is not counted (Commission guidelines, Annex A.1).",
    ]


def _costed_by(estimates: list[str]) -> str:
    """How the plan's methods were costed, in words."""
    if estimates == ["transformer"]:
        return "the meter's transformer estimate of the model on meta"
    if estimates == ["dispatch"]:
        return "PyTorch's dispatch count of each sequence shape on meta"
    return "the transformer estimate or the dispatch count on meta (per method, below)"


def _methods_for(
    given: Sequence[str] | None, one_stack: bool, family: Family
) -> tuple[list[str], list[str]]:
    """The methods to plan, and the plan's note on those left out: ``given`` as given (a method
    the model cannot take is refused when it is planned); ``None``, every method the model can
    take (spectrum and freeze need ``one_stack``, one list of transformer blocks)."""
    if given is not None:
        return list(dict.fromkeys(given)), []
    if one_stack:
        return list(METHODS), []
    return [m for m in METHODS if m not in STACK_METHODS], [
        f"{' and '.join(STACK_METHODS)} are not planned: they choose among one list of "
        f"transformer blocks, and a {family.model_type} {FAMILY_NAMES[family.name]} model has "
        "no single stack to choose from."
    ]


def _in_build_order(methods: list[str], plan_of: Callable[[str], MethodPlan]) -> list[MethodPlan]:
    """``plan_of`` each method, in the order given; made with LoRA last, so that one meta build
    serves every method (LoRA wraps the model in place, see :mod:`flopmeter.planner.costing`).
    When one fails, the methods are made again in the order given (their costs are kept), so
    the error is that of the first method given that fails, as without the reordering."""
    order = sorted(methods, key=lambda m: m in ("lora", "qlora"))
    try:
        made = {m: plan_of(m) for m in order}
    except ConfigurationError:
        made = {m: plan_of(m) for m in methods}  # raises the first given method's error
    return [made[m] for m in methods]


def _not_modelled(family: Family, why: str | None) -> str:
    if family.text_only:
        return f"the FLOP model cannot read this configuration ({why})"
    return (
        f"the FLOP model does not know {FAMILY_NAMES[family.name]}s yet (encoder and decoder "
        "streams, cross-attention, vision or audio encoders)"
    )


def _lengths(req: PlanRequest, seq_len: int) -> Callable[[], Counter[SequenceShape]]:
    """The sequence shapes of a text-only plan, per epoch, for the dispatch count (a callable:
    read only when the FLOP model cannot cost the model)."""
    from flopmeter.planner.shapes import length_shapes, text_shapes

    if req.dataset is None:
        tokens = req.tokens
        assert tokens is not None
        return lambda: Counter({SequenceShape(n): c for n, c in text_shapes(tokens, seq_len)})
    return lambda: length_shapes(
        dataset_lengths(req.dataset, seq_len, req.tokenizer).lengths  # type: ignore[arg-type]
    )


#: The budget flags and the family each applies to.
_FAMILY_FLAGS = {
    "decoder_tokens": ("--decoder-tokens", "encoder-decoder"),
    "images": ("--images", "vision-language"),
    "clips": ("--clips", "speech"),
}


def _check_family_inputs(req: PlanRequest, family: Family) -> None:
    """Refuses (one line) a budget flag the family does not take, or a missing one it needs."""
    for name, (flag, owner) in _FAMILY_FLAGS.items():
        given = getattr(req, name) is not None
        if given and family.name != owner:
            raise ConfigurationError(
                f"{flag} applies to {FAMILY_NAMES[owner]}s; {family.model_type} is a "  # type: ignore[index]
                f"{FAMILY_NAMES[family.name]}"
            )
        if not given and family.name == owner:
            need = {
                "decoder_tokens": "the target tokens of all sequences, e.g. --decoder-tokens 2e8",
                "images": "the images of all sequences, e.g. --images 1e6 (0 for text only)",
                "clips": "the 30-s audio clips, e.g. --clips 1e5; --tokens are their transcripts",
            }[name]
            raise ConfigurationError(
                f"a {family.model_type} {FAMILY_NAMES[owner]} needs {flag}: {need}"  # type: ignore[index]
            )  # fmt: skip
    if req.dataset is not None and not family.text_only:
        raise ConfigurationError(
            f"--dataset is read for text-only models; a {family.model_type} "
            f"{FAMILY_NAMES[family.name]} plan takes --tokens and its own budget flag"
        )


def _base_parameters(methods: list[MethodPlan]) -> int:
    """The base model's parameters: LoRA's adapters (its only trainable ones) left out."""
    m = methods[0]
    return m.n_total - m.n_trainable if m.method in ("lora", "qlora") else m.n_total


def _context_notes(config: dict[str, Any], seq_len: int) -> list[str]:
    """A warning when ``seq_len`` is longer than the model's context (max_position_embeddings)."""
    text = config.get("text_config") if isinstance(config.get("text_config"), dict) else config
    context = text.get("max_position_embeddings")
    if isinstance(context, int) and not isinstance(context, bool) and seq_len > context:
        return [
            f"Warning: --seq-len {seq_len:,} is longer than the model's context "
            f"(max_position_embeddings {context:,}); the plan costs sequences the model was "
            "not configured for."
        ]
    return []
