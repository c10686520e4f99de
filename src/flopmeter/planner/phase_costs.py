"""The phases of a post-training recipe, costed: GRPO, DPO and distillation, by phase.

A recipe's run is more than its training passes: completions are generated, a reference, a
teacher or reward models run forward. The meter reports each as a phase
(:mod:`flopmeter.flops.phases`); the plan costs the same phases, with the same names, from the
models' profiles (:class:`~flopmeter.flops.model_profile.ModelProfile`), so that a plan and a
metered run of the same recipe can be read side by side. Pure arithmetic: no torch here.

Forward passes (no gradients), per model, from its profile (:func:`forward_cost`): 2 FLOP per
multiply-add of every weight matrix for every position that runs through it, the output head
for the positions whose logits are computed, and ``2 * (query_width + value_width)`` per
(query, key) pair and layer (the full square of eager and math attention, as PyTorch's counter
counts; a cached decode step is one query against every cached key). The recipes' conventions
follow TRL (1.16):

* **GRPO** (``prompts`` prompts, ``generations`` completions each, ``completion_len`` tokens
  generated in full): generation is one prefill of the prompt (logits for its last position)
  and ``completion_len - 1`` cached decode steps; the training passes run ``iterations`` times
  over every prompt + completion; with ``reference``, a reference forward of each (a separate
  copy of the model; for LoRA the model with its adapters disabled, which the meter names
  ``scoring``); with ``old_logps`` (TRL: ``num_iterations > 1`` or generations not aligned
  with the optimizer steps; RLOO always), one more forward of the policy; each reward model,
  one forward of each.
* **DPO** (``prompts`` pairs): a chosen and a rejected sequence per pair in the training
  passes, and the reference's forward of both (``precompute_ref_log_probs`` runs it before
  training: the same work, which the meter then cannot see).
* **Distillation** (``prompts`` prompts with ``completion_len`` tokens): the teacher's forward
  of every training sequence, and, for the share ``on_policy`` of them (TRL's
  DistillationTrainer: all; GKD: ``lmbda``), the student's generation of the completion.

The output head: GRPO's and DPO's forwards (training and scoring) go through TRL's fused LM
head, which projects the ``L - 1`` positions that have a next token, in tiles, without
gradients, and projects them again in backward with gradients (:func:`fused_head_training`): 2
FLOP per MAC more than a plain head, at one position fewer per sequence. On a GPU with Triton
it projects only the positions with a label (the completion), so the plan, which projects all
``L - 1``, is an upper bound there. Distillation's forwards compute the head at every position
(a raw loop, GKD); TRL's DistillationTrainer projects only the completion, in a chunked loss
that runs the teacher's head inside the student's call, and costs up to a few percent less
than planned (docs/planner.md). Generated completions are planned at their full length:
completions that stop early cost less, so the plan is an upper bound for them.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from flopmeter.errors import ConfigurationError
from flopmeter.planner.recipe_shape import FUSED_HEAD_RECIPES, Recipe, recipe_sequences

if TYPE_CHECKING:
    from flopmeter.flops.model_profile import ModelProfile

__all__ = [
    "ForwardCost",
    "PhaseCost",
    "forward_cost",
    "fused_head_training",
    "generation_flops",
    "head_positions",
    "recipe_phases",
    "scoring_flops",
]


@dataclass(frozen=True)
class ForwardCost:
    """A model's forward pass (no gradients) per unit, FLOP.

    Attributes:
        token_flops: Per position, every weight matrix but the output head (2 per MAC).
        head_flops: Per position whose logits (or scores) are computed.
        pair_flops: Per (query, key) pair, all attention layers.
        call_flops: Per forward call (LoRA's ``B @ A`` products on single parameters).
    """

    token_flops: float
    head_flops: float
    pair_flops: float
    call_flops: float = 0.0


def forward_cost(profile: ModelProfile, *, adapters: bool = True) -> ForwardCost:
    """The forward cost of a model with ``profile`` (text stream only).

    Args:
        profile: The model's profile (a decoder: every group in the text stream).
        adapters: LoRA's adapters run (``False``: disabled, as TRL's reference of a LoRA
            policy).

    Raises:
        ConfigurationError: the profile has work outside the text stream (a recipe plans
            decoder models only).
    """
    other = sorted({g.stream for g in profile.linear} | {a.stream for a in profile.attention})
    if other not in ([], ["text"]):
        raise ConfigurationError(
            "a post-training recipe plans decoder models (text only); this model has work in "
            f"the {', '.join(s for s in other if s != 'text')} stream"
        )
    linear = [g for g in profile.linear if adapters or g.kind != "lora"]
    return ForwardCost(
        token_flops=2 * sum(g.macs_per_token for g in linear if g.kind != "lm_head"),
        head_flops=2 * sum(g.macs_per_token for g in linear if g.kind == "lm_head"),
        pair_flops=sum(2 * (a.query_width + a.value_width) for a in profile.attention),
        call_flops=sum(2 * g.macs for g in profile.lora_delta) if adapters else 0.0,
    )


def head_positions(recipe: str, length: int) -> int:
    """Positions of a ``length``-token sequence whose logits a recipe's forward computes:
    ``length - 1`` through TRL's fused head (:data:`FUSED_HEAD_RECIPES`), else ``length``."""
    return length - 1 if recipe in FUSED_HEAD_RECIPES else length


def scoring_flops(cost: ForwardCost, rows: float, length: int, heads: int | None = None) -> float:
    """``rows`` forward calls over ``length`` tokens each, FLOP: ``rows * (length * token +
    heads * head + length^2 * pair + call)``, ``heads`` the head positions (default every
    position)."""
    heads = length if heads is None else heads
    per_row = length * cost.token_flops + heads * cost.head_flops
    return rows * (per_row + length * length * cost.pair_flops + cost.call_flops)


def fused_head_training(
    profile: ModelProfile, sequences: Sequence[tuple[int, int]]
) -> tuple[float, float]:
    """The training passes' head through TRL's fused LM head, against a plain head, FLOP.

    Returns:
        ``(plain, fused)``: the plain head's FLOP in the ``transformer`` estimate (each head
        group's ``flops_per_mac`` at every position) and the fused head's (2 more per MAC for
        the projection recomputed in backward, at ``L - 1`` positions per sequence).
    """
    tokens = sum(length * count for length, count in sequences)
    shifted = sum((length - 1) * count for length, count in sequences)
    heads = [g for g in profile.linear if g.kind == "lm_head"]
    plain = sum(g.macs_per_token * g.flops_per_mac for g in heads) * tokens
    fused = sum(g.macs_per_token * (g.flops_per_mac + 2) for g in heads) * shifted
    return plain, fused


def generation_flops(cost: ForwardCost, rows: float, prompt_len: int, completion_len: int) -> float:
    """``rows`` completions of ``completion_len`` tokens from ``prompt_len``-token prompts with
    a key-value cache, FLOP: a prefill of the prompt (logits of its last position) and
    ``completion_len - 1`` decode steps, step ``t`` one query against ``prompt_len + t`` keys.

    ``rows * ((P + C - 1) * token + C * head + (P^2 + (C - 1) P + (C - 1) C / 2) * pair
    + C * call)``.
    """
    p, c = prompt_len, completion_len
    pairs = p * p + (c - 1) * p + (c - 1) * c // 2
    per_row = (p + c - 1) * cost.token_flops + c * cost.head_flops + pairs * cost.pair_flops
    return rows * (per_row + c * cost.call_flops)


@dataclass(frozen=True)
class PhaseCost:
    """One planned phase besides the training passes: its name (the meter's), FLOP and how."""

    name: str
    flops: float
    how: str


def recipe_phases(
    recipe: Recipe,
    policy: ForwardCost,
    base: ForwardCost,
    lora: bool,
    side: dict[str, ForwardCost],
) -> list[PhaseCost]:
    """The phases of ``recipe`` besides its training passes, in the meter's order.

    Args:
        recipe: A checked recipe (not ``sft``).
        policy: The trained model's forward cost, adapters on.
        base: Its forward cost with adapters off (a separate reference's, or the reference of
            a LoRA policy).
        lora: The trained model has adapters (its reference is itself with them disabled).
        side: The forward costs of the other models, by the names the plan gives them:
            ``"teacher"``, ``"reward model 1"``...

    Returns:
        The phases, FLOP.
    """
    if recipe.name == "grpo":
        return _grpo_phases(recipe, policy, base, lora, side)
    if recipe.name == "dpo":
        return _dpo_phases(recipe, base, lora)
    return _distill_phases(recipe, policy, side["teacher"])


def _grpo_phases(
    recipe: Recipe, policy: ForwardCost, base: ForwardCost, lora: bool, side: dict[str, ForwardCost]
) -> list[PhaseCost]:
    """GRPO's generation, scoring (old log-probs; a LoRA policy's reference), reference and
    reward models."""
    p, c, n = recipe.prompt_len or 0, recipe.completion_len or 0, recipe.prompts or 0
    length, rows = p + c, n * recipe.generations
    heads = head_positions(recipe.name, length)
    generated = f"{rows:,} completions of {c:,} tokens from {p:,}-token prompts, with a cache"
    out = [PhaseCost("generation", generation_flops(policy, rows, p, c), generated)]
    scoring, how = 0.0, []
    if recipe.recomputes_old_logps:
        scoring += scoring_flops(policy, rows, length, heads)
        how.append(f"the old log-probs: one forward of each of {rows:,} sequences")
    if recipe.reference and lora:
        scoring += scoring_flops(base, rows, length, heads)
        how.append(f"the reference (adapters disabled): one forward of each of {rows:,} sequences")
    if how:
        out.append(PhaseCost("scoring", scoring, "; ".join(how)))
    each = f"one forward of each of {rows:,} sequences of {length:,} tokens"
    if recipe.reference and not lora:
        out.append(PhaseCost("model reference", scoring_flops(base, rows, length, heads), each))
    scored = recipe.reward_len or length
    for name, cost in side.items():
        how_rm = f"one forward of each of {rows:,} sequences of {scored:,} tokens"
        out.append(PhaseCost(f"model {name}", scoring_flops(cost, rows, scored), how_rm))
    return out


def _dpo_phases(recipe: Recipe, base: ForwardCost, lora: bool) -> list[PhaseCost]:
    """DPO's reference: a forward of each chosen and rejected sequence (a LoRA policy's with its
    adapters disabled, which the meter names ``scoring``)."""
    flops = sum(
        scoring_flops(base, count, k, head_positions("dpo", k))
        for k, count in recipe_sequences(recipe)
    )
    how = f"one forward of each chosen and rejected sequence ({2 * (recipe.prompts or 0):,})"
    if lora:
        return [PhaseCost("scoring", flops, how + ", the policy with its adapters disabled")]
    return [PhaseCost("model reference", flops, how)]


def _distill_phases(recipe: Recipe, policy: ForwardCost, teacher: ForwardCost) -> list[PhaseCost]:
    """Distillation's on-policy generation (its share) and the teacher's forward."""
    p, c, n = recipe.prompt_len or 0, recipe.completion_len or 0, recipe.prompts or 0
    out = []
    generated = n * recipe.on_policy
    if generated:
        how = (
            f"{_count(generated)} completions of {c:,} tokens (on-policy share "
            f"{recipe.on_policy:g}), with a cache"
        )
        out.append(PhaseCost("generation", generation_flops(policy, generated, p, c), how))
    how = f"one forward of each of {n:,} sequences of {p + c:,} tokens"
    out.append(PhaseCost("model teacher", scoring_flops(teacher, n, p + c), how))
    return out


def _count(value: float) -> str:
    return f"{int(value):,}" if float(value).is_integer() else f"{value:,.1f}"
