"""The plan: each method's compute and verdict before training, as pydantic models.

:func:`estimate` is what ``flopmeter estimate`` runs. For a model with a configuration each
method's model is built on meta (:mod:`flopmeter.planner.build`) and costed by the meter's own
``transformer`` estimate (:func:`flopmeter.flops.transformer_estimate`) over the planned token
statistics, so the plan and a metered run of the same plan agree. For bare numbers
(``params=``), the seed and 6ND formulas (:mod:`flopmeter.flops.formulas`), the larger one.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, Field

from flopmeter.compliance.original import ENV_SOURCE, OriginalCompute, resolve_original_compute
from flopmeter.compliance.thresholds import (
    PRETRAIN_FLOPS_ENV,
    Threshold,
    determine_threshold,
    pretrain_flops_from_env,
    validate_pretrain_setting,
)
from flopmeter.compliance.verdict import verdict as judge
from flopmeter.errors import ConfigurationError
from flopmeter.planner.numbers import parse_count
from flopmeter.planner.recipe_shape import Recipe
from flopmeter.types import TokenTotals, Verdict
from flopmeter.units import human_flops

__all__ = ["METHODS", "STACK_METHODS", "MethodPlan", "Plan", "PlanPhase", "PlanRequest"]

#: The fine-tuning methods a plan compares, in the order it shows them.
METHODS = ("full", "lora", "qlora", "spectrum", "freeze")
#: The methods that choose among one stack of transformer blocks (refused without one).
STACK_METHODS = ("spectrum", "freeze")
Method = Literal["full", "lora", "qlora", "spectrum", "freeze", "given"]
#: The default sequence length of a plan (tokens), when neither ``seq_len`` nor a dataset says.
DEFAULT_SEQ_LEN = 2048


class PlanPhase(BaseModel):
    """One phase of a planned run: the training passes, or another part of a recipe's compute
    (named as the meter names it, docs/methodology.md, "Phases")."""

    name: str = Field(description="training, generation, scoring, model reference, ...")
    flops: float = Field(description="The phase's planned compute, FLOP.")
    counted: bool = Field(description="Whether flops enters the judged figure (the policy).")
    how: str = Field(description="What the phase is made of, in words.")


class MethodPlan(BaseModel):
    """One method's planned compute and where it stands against the threshold."""

    method: Method = Field(description="The fine-tuning method; 'given' for bare numbers.")
    model: str | None = Field(description="The model id or config path; null for bare numbers.")
    n_total: int = Field(description="Parameters of the model as set up (adapters included).")
    n_trainable: int = Field(description="Parameters that train.")
    tokens: int = Field(description="Training tokens (non-padding, all epochs).")
    sequences: int | None = Field(
        description="Training sequences (all epochs); null for bare numbers (not known)."
    )
    sum_sq_seq_len: int | None = Field(
        description="Sum over sequences of length^2, tokens^2; null for bare numbers."
    )
    micro_batches: int | None = Field(
        description="Training forward passes (sequences / batch); null for bare numbers."
    )
    decoder_tokens: int | None = Field(
        None, description="Decoder tokens (encoder-decoder and speech models); null otherwise."
    )
    images: int | None = Field(None, description="Images (vision-language models); else null.")
    clips: int | None = Field(
        None, description="Audio clips of the model's fixed length (speech); null otherwise."
    )
    flops: float = Field(
        description="Planned compute judged against the threshold, FLOP: the training passes, "
        "plus a recipe's other phases that its policy counts."
    )
    phases: list[PlanPhase] = Field(
        default_factory=list,
        description="A recipe's phases (training first), each with its FLOP and whether the "
        "policy counts it; empty without a recipe (flops is then the training passes).",
    )
    phase_policy: str | None = Field(
        None, description="Which phases are judged (modification or updates); null without one."
    )
    estimate: str = Field(
        description="Which estimate gives flops: transformer, dispatch (PyTorch's dispatch "
        "count of each sequence shape on meta, multiplied out), seed or six_nd."
    )
    linear_flops: float | None = Field(None, description="Weight-matrix part of flops, FLOP.")
    attention_flops: float | None = Field(None, description="Attention-score part, FLOP.")
    seed_flops: float = Field(description="(4 n_total + 2 n_trainable) x tokens, FLOP.")
    six_nd_flops: float = Field(description="6 x n_total x tokens, FLOP.")
    threshold_value: float = Field(description="The threshold, FLOP.")
    threshold_kind: str = Field(description="Which rule gave the threshold.")
    share_of_threshold: float = Field(description="flops / threshold_value.")
    verdict: Verdict = Field(description="flopmeter.compliance.verdict of flops.")
    tokens_to_threshold: float | None = Field(
        description="Training tokens (same length mix, a recipe's phases in proportion) at "
        "which flops would reach the threshold; null when flops is 0."
    )
    epochs_to_threshold: float | None = Field(
        None, description="Epochs over the dataset that would reach the threshold."
    )
    trainable_blocks: list[int] | None = Field(
        None, description="Transformer blocks whose weights train (spectrum, freeze)."
    )
    notes: list[str] = Field(default_factory=list, description="This method's assumptions.")


class Plan(BaseModel):
    """A plan: the methods side by side, with what the token figures rest on."""

    model: str | None = Field(description="The model id or config path; null for numbers.")
    source: str = Field(description="Where the configuration came from, or the formulas used.")
    tokens_from: str = Field(description="How the token statistics were obtained.")
    approximate_tokens: bool = Field(description="Token counts are an approximation.")
    threshold_source: str = Field(description="The rule behind the threshold, with its source.")
    threshold_note: str = Field(
        "", description="Where the original compute came from, when not given as a number."
    )
    base_parameters: int | None = Field(
        None, description="Parameters of the base model, without any method's adapters."
    )
    family: str | None = Field(
        None,
        description="decoder, encoder, encoder-decoder, vision-language or speech; null for "
        "bare numbers.",
    )
    head: str | None = Field(None, description="The training head the model was built with.")
    methods: list[MethodPlan] = Field(description="One entry per planned method.")
    notes: list[str] = Field(default_factory=list, description="Notes for the whole plan.")


@dataclass
class PlanRequest:
    """The inputs of a plan (the command line's options; see :func:`flopmeter.planner.estimate`).

    Exactly one of ``model`` and ``params``; exactly one of ``tokens`` and ``dataset``
    (``params`` takes ``tokens`` only). ``decoder_tokens`` (an encoder-decoder's target
    tokens, all sequences), ``images`` (a vision-language model's images) and ``clips`` (a
    speech model's 30-s clips) are counts for the families that take them.
    """

    model: str | Path | None = None
    tokens: int | float | str | None = None
    dataset: str | Path | None = None
    recipe: str = "sft"
    prompts: int | float | str | None = None
    prompt_len: int | None = None
    completion_len: int | None = None
    rejected_len: int | None = None
    generations: int | None = None
    iterations: int | None = None
    reference: bool = False
    old_logps: bool | None = None
    reward_models: Sequence[str] = ()
    reward_len: int | None = None
    teacher: str | None = None
    on_policy: float | None = None
    phases: str | None = None
    tokenizer: str | Path | None = None
    epochs: float = 1
    seq_len: int | None = None
    batch_size: int = 1
    methods: Sequence[str] | None = None
    lora_r: int = 16
    lora_targets: str | Sequence[str] = "all-linear"
    spectrum_fraction: float = 0.25
    freeze_layers: int | None = None
    params: int | float | str | None = None
    decoder_tokens: int | float | str | None = None
    images: int | float | str | None = None
    clips: int | float | str | None = None
    trainable: int | float | str | None = None
    pretrain_flops: float | str | None = None
    systemic_risk: bool = False
    threshold: Threshold | None = field(default=None, repr=False)

    def check(self) -> None:
        """Raises ConfigurationError (one line) on inputs that cannot make a plan.

        Counts (``tokens``, ``params``, ``trainable``) are normalised to ``int`` as the command
        line reads them: ``1e9``, ``1000000000.0`` and ``"3.2B"`` are accepted, ``0.5`` is not.
        """
        if self.model is not None and self.params is not None:
            raise ConfigurationError(
                "give a MODEL (config.json, folder or id) or --params, not both: they are "
                "exclusive (--params is for a model without a configuration)"
            )
        if self.model is None and self.params is None:
            raise ConfigurationError("give a MODEL (config.json, folder or id) or --params")
        self._check_recipe()
        if self.recipe == "sft" and (self.tokens is None) == (self.dataset is None):
            raise ConfigurationError("give --tokens or --dataset (one of them)")
        if self.params is not None and self.dataset is not None:
            raise ConfigurationError("--dataset needs a MODEL; with --params give --tokens")
        for name in (
            "tokens", "params", "trainable", "decoder_tokens", "images", "clips", "prompts"
        ):  # fmt: skip
            setattr(self, name, _count(getattr(self, name), name))
        for name in ("lora_r", "seq_len", "batch_size"):
            value = getattr(self, name)
            if value is not None and (isinstance(value, bool) or not isinstance(value, int)):
                raise ConfigurationError(f"{name} must be a whole number, got {value!r}")
            if value is not None and value < 1:
                raise ConfigurationError(f"{name} must be positive, got {value!r}")
        for name in ("tokens", "params"):
            value = getattr(self, name)
            if value is not None and value < 1:
                raise ConfigurationError(f"{name} must be positive (at least 1), got {value}")
        self._check_epochs()
        if not 0 < self.spectrum_fraction <= 1:
            raise ConfigurationError("--spectrum-fraction must be in (0, 1]")
        unknown = [m for m in self.methods or () if m not in METHODS]
        if unknown or (self.methods is not None and not self.methods):
            raise ConfigurationError(f"unknown method {unknown}; methods: {', '.join(METHODS)}")
        if self.trainable is not None and self.params is not None and self.trainable > self.params:
            raise ConfigurationError("--trainable cannot exceed --params.")
        self.pretrain_flops = validate_pretrain_setting(self.pretrain_flops)

    def _check_recipe(self) -> None:
        """The recipe's options belong to it; a recipe takes a model, no tokens or dataset."""
        self.recipe_shape().check()
        if self.recipe == "sft":
            if self.phases is not None:
                raise ConfigurationError(
                    "--phases applies to a --recipe (grpo, dpo, distill): without one the "
                    "plan has only the training passes"
                )
            return
        from flopmeter.flops.phases import DEFAULT_PHASE_POLICY, PHASE_POLICIES

        self.phases = DEFAULT_PHASE_POLICY if self.phases is None else self.phases
        if self.phases not in PHASE_POLICIES:
            raise ConfigurationError(
                f"--phases must be one of {', '.join(PHASE_POLICIES)}, got {self.phases!r}"
            )
        if self.params is not None:
            raise ConfigurationError(
                f"--recipe {self.recipe} needs a MODEL (config.json, folder or id): its "
                "phases are costed from the models' layers, not from --params"
            )
        if self.tokens is not None or self.dataset is not None or self.seq_len is not None:
            raise ConfigurationError(
                f"--recipe {self.recipe} takes its tokens from --prompts, --prompt-len and "
                "--completion-len, not --tokens, --dataset or --seq-len"
            )

    def recipe_shape(self) -> Recipe:
        """The request's recipe (unchecked), with the options given named in ``given``."""
        names = ("prompts", "prompt_len", "completion_len", "rejected_len", "generations",
                 "iterations", "old_logps", "reward_len", "teacher", "on_policy")  # fmt: skip
        given = {n for n in names if getattr(self, n) is not None}
        given |= {"reference"} if self.reference else set()
        given |= {"reward_models"} if self.reward_models else set()
        defaults = Recipe()
        prompts = self.prompts
        if isinstance(prompts, float) and prompts.is_integer():
            prompts = int(prompts)
        return Recipe(
            name=self.recipe,
            prompts=prompts if not isinstance(prompts, str) else _count(prompts, "prompts"),
            prompt_len=self.prompt_len,
            completion_len=self.completion_len,
            rejected_len=self.rejected_len,
            generations=defaults.generations if self.generations is None else self.generations,
            iterations=defaults.iterations if self.iterations is None else self.iterations,
            reference=self.reference or self.recipe == "dpo",
            old_logps=self.old_logps,
            reward_models=tuple(self.reward_models),
            reward_len=self.reward_len,
            teacher=self.teacher,
            on_policy=defaults.on_policy if self.on_policy is None else self.on_policy,
            given=frozenset(given),
        )

    def _check_epochs(self) -> None:
        """``epochs``: a finite number above 0 (fractions allowed), with ``dataset`` only."""
        value = self.epochs
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ConfigurationError(f"epochs must be a number, got {value!r}")
        if not math.isfinite(value) or value <= 0:
            raise ConfigurationError(f"epochs must be above 0 (0.5, 1, 3), got {value!r}")
        if self.tokens is not None and value != 1:
            raise ConfigurationError(
                "--epochs applies to --dataset only; with --tokens give the total tokens of "
                "all epochs (e.g. --tokens 2e9 for 2 epochs of 1e9)"
            )

    def resolve_threshold(self) -> tuple[Threshold, str]:
        """The given threshold, else the one for ``pretrain_flops`` (a number or ``"catalog"``,
        looked up for ``model``), else ``PRETRAIN_FLOPS``; and a note saying where the original
        compute came from when it was not ``pretrain_flops`` as a number (empty otherwise)."""
        if self.threshold is not None:
            return self.threshold, ""
        argument = self.pretrain_flops
        environment = pretrain_flops_from_env() if argument is None else None
        model_id = None if self.model is None else str(self.model)
        original = resolve_original_compute(
            argument, environment, model_id, original_systemic_risk=self.systemic_risk
        )
        threshold = determine_threshold(original.flops, original_systemic_risk=self.systemic_risk)
        return threshold, threshold_note(original)


def threshold_note(original: OriginalCompute) -> str:
    """Where the original compute came from, as the tail of the threshold line (``""`` for a
    number given as ``pretrain_flops``), the words ``flopmeter threshold`` uses."""
    if original.source == ENV_SOURCE:
        return f", original compute {human_flops(original.flops)} from {PRETRAIN_FLOPS_ENV}"
    if original.source == "catalog" and original.catalog is not None:
        where = f"the catalogue: {original.catalog.base_model}, {original.catalog.basis}"
        return f", original compute {human_flops(original.flops)} from {where}"
    if original.catalog_asked:
        return ", the catalogue was asked for but has no figure for the model"
    return ""


def _count(value: object, name: str) -> int | None:
    """A whole, non-negative count from an int, an integral float or a string (``"3.2B"``)."""
    if value is None:
        return None
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if not isinstance(value, (int, str)) or isinstance(value, bool):
        raise ConfigurationError(f"{name} must be a whole number, got {value!r}")
    try:
        return parse_count(value, name)
    except ValueError as exc:
        raise ConfigurationError(str(exc)) from None


def judged(
    flops: float, totals: TokenTotals, threshold: Threshold, epochs: float | None
) -> dict[str, object]:
    """The threshold fields of a :class:`MethodPlan` (compute scales with the tokens at a fixed
    mix of lengths, so the tokens and epochs that reach the threshold are proportional)."""
    to_threshold = threshold.value / flops if flops > 0 else None
    return {
        "flops": flops,
        "threshold_value": threshold.value,
        "threshold_kind": threshold.kind,
        "share_of_threshold": flops / threshold.value,
        "verdict": judge(flops, threshold.value),
        "tokens_to_threshold": None
        if to_threshold is None
        else to_threshold * totals.tokens_processed,
        "epochs_to_threshold": None
        if to_threshold is None or epochs is None
        else to_threshold * epochs,
    }
