"""A post-training recipe's shape: the options of ``flopmeter estimate --recipe``, checked
before any model is built, the training passes' sequences, and the plan's notes on what the
recipe assumes (the phases' arithmetic: :mod:`flopmeter.planner.phase_costs`)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from flopmeter.errors import ConfigurationError

__all__ = [
    "FUSED_HEAD_RECIPES",
    "MAX_COUNT",
    "MAX_LENGTH",
    "RECIPES",
    "Recipe",
    "recipe_notes",
    "recipe_sequences",
    "sequences_text",
]

#: The recipes whose forwards go through TRL's fused LM head (``L - 1`` head positions).
FUSED_HEAD_RECIPES = ("grpo", "dpo")

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


def sequences_text(sequences: Sequence[tuple[int, int]]) -> str:
    """The training sequences in words (``"8 sequences of 11 tokens"``)."""
    return " and ".join(f"{count:,} sequences of {length:,} tokens" for length, count in sequences)
