"""Post-training recipes in the plan: GRPO, DPO and distillation, costed by phase.

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
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from flopmeter.errors import ConfigurationError

if TYPE_CHECKING:
    from flopmeter.flops.model_profile import ModelProfile

__all__ = [
    "FUSED_HEAD_RECIPES",
    "RECIPES",
    "ForwardCost",
    "PhaseCost",
    "Recipe",
    "forward_cost",
    "fused_head_training",
    "generation_flops",
    "head_positions",
    "recipe_notes",
    "recipe_phases",
    "recipe_sequences",
    "scoring_flops",
    "sequences_text",
]

#: The recipes a plan costs; ``sft`` is training passes only (the plan without a recipe).
RECIPES = ("sft", "grpo", "dpo", "distill")
#: Largest prompt, completion or sequence length a recipe takes (tokens): no model has a
#: context near it, and a typo of a few digits is refused before any arithmetic.
MAX_LENGTH = 10**8
#: Largest count of prompts, generations or iterations (a number no run approaches).
MAX_COUNT = 10**15


@dataclass(frozen=True)
class Recipe:
    """A post-training recipe's shape (the ``flopmeter estimate`` options of the same names).

    Attributes:
        name: One of :data:`RECIPES`.
        prompts: Prompts (GRPO, distillation) or preference pairs (DPO) of the whole run.
        prompt_len: Tokens of each prompt.
        completion_len: Tokens of each completion (GRPO, distillation; DPO: the chosen one).
        rejected_len: Tokens of DPO's rejected completion (default ``completion_len``).
        generations: GRPO's completions per prompt (TRL's ``num_generations``).
        iterations: GRPO's training passes over each generation (``num_iterations``).
        reference: GRPO has a KL reference (TRL: ``beta > 0``); DPO always has one.
        old_logps: GRPO recomputes the old log-probabilities (``None``: when ``iterations >
            1``).
        reward_models: Model ids or config paths of GRPO's reward models.
        reward_len: Tokens of each prompt + completion as the reward models' tokenizer reads
            the text (default ``prompt_len + completion_len``).
        teacher: Model id or config path of the distillation teacher.
        on_policy: Share of distillation sequences whose completion the student generates.
    """

    name: str = "sft"
    prompts: int | None = None
    prompt_len: int | None = None
    completion_len: int | None = None
    rejected_len: int | None = None
    generations: int = 8
    iterations: int = 1
    reference: bool = False
    old_logps: bool | None = None
    reward_models: tuple[str, ...] = ()
    reward_len: int | None = None
    teacher: str | None = None
    on_policy: float = 1.0
    given: frozenset[str] = field(default_factory=frozenset, compare=False)

    def check(self) -> None:
        """Raises ConfigurationError (one line naming the option) on a recipe that cannot be
        planned: an unknown name, a missing or out-of-range length or count, an option of
        another recipe."""
        if self.name not in RECIPES:
            raise ConfigurationError(f"unknown recipe {self.name!r}; recipes: {', '.join(RECIPES)}")
        own = _OWN_OPTIONS[self.name]
        foreign = sorted(self.given - own)
        if foreign:
            flags = ", ".join("--" + n.replace("_", "-") for n in foreign)
            raise ConfigurationError(
                f"{flags} {'does' if len(foreign) == 1 else 'do'} not apply to --recipe "
                f"{self.name}"
                + ("" if self.name != "sft" else " (give --recipe grpo, dpo or distill)")
            )
        if self.name == "sft":
            return
        for name in ("prompts", "prompt_len", "completion_len"):
            if getattr(self, name) is None:
                raise ConfigurationError(
                    f"--recipe {self.name} needs --{name.replace('_', '-')}"
                    f" ({_NEEDS[self.name][name]})"
                )
        bounds = {
            "prompts": MAX_COUNT,
            "prompt_len": MAX_LENGTH,
            "completion_len": MAX_LENGTH,
            "rejected_len": MAX_LENGTH,
            "reward_len": MAX_LENGTH,
            "generations": MAX_COUNT,
            "iterations": MAX_COUNT,
        }
        for name, most in bounds.items():
            _whole(getattr(self, name), name, most)
        if self.name == "distill" and self.teacher is None:
            raise ConfigurationError(
                "--recipe distill needs --teacher (a config.json, folder or id)"
            )
        if (
            isinstance(self.on_policy, bool)
            or not isinstance(self.on_policy, (int, float))
            or not 0 <= self.on_policy <= 1
        ):
            raise ConfigurationError(
                f"--on-policy must be a share in [0, 1], got {self.on_policy!r}"
            )

    @property
    def recomputes_old_logps(self) -> bool:
        """GRPO's old log-probabilities are recomputed (given, else ``iterations > 1``)."""
        return self.iterations > 1 if self.old_logps is None else self.old_logps


#: The options each recipe takes (any other one given is refused).
_OWN_OPTIONS: dict[str, frozenset[str]] = {
    "sft": frozenset(),
    "grpo": frozenset(
        {
            "prompts",
            "prompt_len",
            "completion_len",
            "generations",
            "iterations",
            "reference",
            "old_logps",
            "reward_models",
            "reward_len",
        }
    ),
    "dpo": frozenset({"prompts", "prompt_len", "completion_len", "rejected_len"}),
    "distill": frozenset({"prompts", "prompt_len", "completion_len", "teacher", "on_policy"}),
}
_NEEDS = {
    "grpo": {
        "prompts": "prompts of the whole run, each generating --generations completions",
        "prompt_len": "tokens per prompt",
        "completion_len": "tokens per completion (max_completion_length)",
    },
    "dpo": {
        "prompts": "preference pairs of the whole run",
        "prompt_len": "tokens per prompt",
        "completion_len": "tokens of the chosen completion (--rejected-len for the other)",
    },
    "distill": {
        "prompts": "training sequences of the whole run",
        "prompt_len": "tokens per prompt",
        "completion_len": "tokens per completion",
    },
}


def _whole(value: Any, name: str, most: int) -> None:
    if value is None:
        return
    flag = "--" + name.replace("_", "-")
    if isinstance(value, bool) or not isinstance(value, int):
        raise ConfigurationError(f"{flag} must be a whole number, got {value!r}")
    if not 1 <= value <= most:
        raise ConfigurationError(f"{flag} must be between 1 and {most:.0e}, got {value:,}")


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


#: The recipes whose forwards go through TRL's fused LM head (``L - 1`` head positions).
FUSED_HEAD_RECIPES = ("grpo", "dpo")


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


def recipe_sequences(recipe: Recipe) -> list[tuple[int, int]]:
    """The training passes' sequences of a recipe, as ``(length, count)`` pairs."""
    p, c = recipe.prompt_len or 0, recipe.completion_len or 0
    n = recipe.prompts or 0
    if recipe.name == "grpo":
        return [(p + c, n * recipe.generations * recipe.iterations)]
    if recipe.name == "dpo":
        rejected = recipe.rejected_len or c
        return [(p + c, n), (p + rejected, n)] if rejected != c else [(p + c, 2 * n)]
    return [(p + c, n)]


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
    p, c, n = recipe.prompt_len or 0, recipe.completion_len or 0, recipe.prompts or 0
    length = p + c
    heads = head_positions(recipe.name, length)
    out: list[PhaseCost] = []
    if recipe.name == "grpo":
        rows = n * recipe.generations
        out.append(
            PhaseCost(
                "generation",
                generation_flops(policy, rows, p, c),
                f"{rows:,} completions of {c:,} tokens from {p:,}-token prompts, with a cache",
            )
        )
        scoring = 0.0
        how = []
        if recipe.recomputes_old_logps:
            scoring += scoring_flops(policy, rows, length, heads)
            how.append(f"the old log-probs: one forward of each of {rows:,} sequences")
        if recipe.reference and lora:
            scoring += scoring_flops(base, rows, length, heads)
            how.append(
                f"the reference (adapters disabled): one forward of each of {rows:,} sequences"
            )
        if how:
            out.append(PhaseCost("scoring", scoring, "; ".join(how)))
        if recipe.reference and not lora:
            out.append(
                PhaseCost(
                    "model reference",
                    scoring_flops(base, rows, length, heads),
                    f"one forward of each of {rows:,} sequences of {length:,} tokens",
                )
            )
        scored = recipe.reward_len or length
        for name, cost in side.items():
            out.append(
                PhaseCost(
                    f"model {name}",
                    scoring_flops(cost, rows, scored),
                    f"one forward of each of {rows:,} sequences of {scored:,} tokens",
                )
            )
        return out
    if recipe.name == "dpo":
        flops = sum(
            scoring_flops(base, count, k, head_positions("dpo", k))
            for k, count in recipe_sequences(recipe)
        )
        how = f"one forward of each chosen and rejected sequence ({2 * n:,})"
        name = "scoring" if lora else "model reference"
        if lora:
            how += ", the policy with its adapters disabled"
        return [PhaseCost(name, flops, how)]
    generated = n * recipe.on_policy
    if generated:
        out.append(
            PhaseCost(
                "generation",
                generation_flops(policy, generated, p, c),
                f"{_count(generated)} completions of {c:,} tokens (on-policy share "
                f"{recipe.on_policy:g}), with a cache",
            )
        )
    out.append(
        PhaseCost(
            "model teacher",
            scoring_flops(side["teacher"], n, length),
            f"one forward of each of {n:,} sequences of {length:,} tokens",
        )
    )
    return out


def recipe_notes(recipe: Recipe) -> list[str]:
    """The plan-wide notes of a recipe: what its phases assume."""
    if recipe.name == "sft":
        return []
    notes = [
        "Phases: named as the meter names them (docs/methodology.md, 'Phases'); forwards "
        "without gradients cost 2 FLOP per multiply-add, attention the full square of each "
        "call's queries and keys (a cached decode step: one query against every cached key)."
    ]
    if recipe.name in ("grpo", "distill"):
        notes.append(
            "Completions are planned at their full length (--completion-len); completions "
            "that stop early cost less: for them the plan is an upper bound."
        )
    if recipe.name in FUSED_HEAD_RECIPES:
        notes.append(
            "The output head through TRL's fused LM head: the L - 1 positions with a next "
            "token, projected again in backward; on a GPU with Triton TRL projects only the "
            "completion's positions, so the plan is an upper bound there."
        )
    else:
        notes.append(
            "The heads at every position (a raw loop, GKD); TRL's DistillationTrainer "
            "projects only the completion's positions and costs a little less "
            "(docs/planner.md)."
        )
    return notes


def _count(value: float) -> str:
    return f"{int(value):,}" if float(value).is_integer() else f"{value:,.1f}"


def sequences_text(sequences: Sequence[tuple[int, int]]) -> str:
    """The training sequences in words (``"8 sequences of 11 tokens"``)."""
    return " and ".join(f"{count:,} sequences of {length:,} tokens" for length, count in sequences)
