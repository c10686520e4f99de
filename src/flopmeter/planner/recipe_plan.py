"""A recipe's part of a model's plan: the training passes' statistics, the other models'
forward costs (reward models, teacher), and each method's phases judged under the policy
(the arithmetic: :mod:`flopmeter.planner.phase_costs`)."""

from __future__ import annotations

from typing import Any

from flopmeter.errors import ConfigurationError
from flopmeter.flops.architecture import read_architecture
from flopmeter.flops.model_profile import ModelProfile
from flopmeter.planner.build import MethodSetup, hf_config
from flopmeter.planner.checking import check_length, checker, counts
from flopmeter.planner.costing import method_check, method_cost
from flopmeter.planner.families import FAMILY_NAMES, detect_family
from flopmeter.planner.models import resolve_model
from flopmeter.planner.phase_costs import (
    ForwardCost,
    forward_cost,
    fused_head_training,
    recipe_phases,
)
from flopmeter.planner.plan import MethodPlan, PlanPhase, PlanRequest, judged
from flopmeter.planner.recipe_shape import (
    FUSED_HEAD_RECIPES,
    Recipe,
    recipe_sequences,
    sequences_text,
)
from flopmeter.planner.tokens import totals_for_sequences

__all__ = ["recipe_context", "with_phases"]


def recipe_context(
    req: PlanRequest, recipe: Recipe, config: dict[str, Any], ctx: dict[str, Any]
) -> tuple[Any, str]:
    """Fills ``ctx`` for a recipe's plan (its totals, the policy, the other models' costs) and
    returns the model's architecture and how the tokens were obtained.

    Raises:
        ConfigurationError: the FLOP model cannot read the configuration, or another model of
            the recipe cannot be planned (one line naming it).
    """
    arch, why = read_architecture(config)
    if arch is None:
        raise ConfigurationError(
            f"--recipe {recipe.name} costs its phases from the FLOP model, which cannot "
            f"read this configuration ({why})"
        )
    sequences = recipe_sequences(recipe)
    ctx["seq_len"] = max(length for length, _ in sequences)
    totals = totals_for_sequences(sequences, req.batch_size)
    ctx.update(totals=totals, epochs=None, recipe=recipe, policy=req.phases)
    ctx.update(side=_side_costs(recipe, ctx))
    how = (
        f"--recipe {recipe.name}: the training passes over {sequences_text(sequences)}, "
        f"{req.batch_size} per micro-batch"
    )
    return arch, how


def with_phases(
    plan: MethodPlan, profile: ModelProfile, setup: MethodSetup, ctx: dict[str, Any]
) -> MethodPlan:
    """``plan`` with its recipe's phases, judged on those its policy counts."""
    recipe: Recipe = ctx["recipe"]
    training, how = plan.flops, ""
    if recipe.name in FUSED_HEAD_RECIPES:
        plain, fused = fused_head_training(profile, recipe_sequences(recipe))
        training += fused - plain
        how = ", the output head through TRL's fused LM head"
    others = recipe_phases(
        recipe,
        forward_cost(profile),
        forward_cost(profile, adapters=False),
        setup.method in ("lora", "qlora"),
        ctx["side"],
    )
    counts_all = ctx["policy"] == "modification"
    phases = [
        PlanPhase(
            name="training",
            flops=training,
            counted=True,
            how=f"the training passes over {sequences_text(recipe_sequences(recipe))}{how}",
        ),
        *(PlanPhase(name=o.name, flops=o.flops, counted=counts_all, how=o.how) for o in others),
    ]
    flops = sum(p.flops for p in phases if p.counted)
    return plan.model_copy(
        update={
            "phases": phases,
            "phase_policy": ctx["policy"],
            **judged(flops, ctx["totals"], ctx["threshold"], None),
        }
    )


def _side_costs(recipe: Recipe, ctx: dict[str, Any]) -> dict[str, ForwardCost]:
    """The forward costs of a recipe's other models (reward models, teacher), by the names the
    meter gives their phases; each a decoder the FLOP model covers (checked against the
    dispatch count of one sequence, as the trained model).

    Raises:
        ConfigurationError: a model that cannot be resolved, is not a decoder, or that the
            FLOP model does not cover (one line naming it).
    """
    named = [(f"reward model {i}", m) for i, m in enumerate(recipe.reward_models, start=1)]
    if recipe.teacher is not None:
        named.append(("teacher", recipe.teacher))
    out: dict[str, ForwardCost] = {}
    for name, model in named:
        resolved = resolve_model(model)
        family = detect_family(resolved.config, hf_config(resolved.config))
        arch, why = read_architecture(resolved.config)
        if family.name != "decoder" or arch is None:
            raise ConfigurationError(
                f"the {name} {model}: a recipe plans decoder models the FLOP model reads; "
                f"this is a {family.model_type} {FAMILY_NAMES[family.name]}"
                + (f" ({why})" if why else "")
            )
        setup = MethodSetup("full", 16, "all-linear", 0.25, None)
        cost = method_cost(resolved.config, setup, arch.num_layers, family)
        side_ctx = {**ctx, "family": family}
        disagreement = method_check(
            resolved.config,
            setup,
            arch.num_layers,
            family,
            check_length(side_ctx),
            checker(side_ctx),
            counts(side_ctx),
        )
        if not cost.profile.recognised or disagreement:
            reason = disagreement or "; ".join(cost.profile.notes)
            raise ConfigurationError(
                f"the {name} {model}: the FLOP model does not cover it ({reason})"
            )
        out[name] = forward_cost(cost.profile)
    return out
