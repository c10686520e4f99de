"""The plan: each method's compute and verdict before training, as pydantic models.

:func:`estimate` is what ``flopmeter estimate`` runs. For a model with a configuration each
method's model is built on meta (:mod:`flopmeter.planner.build`) and costed by the meter's own
``transformer`` estimate (:func:`flopmeter.flops.transformer_estimate`) over the planned token
statistics, so the plan and a metered run of the same plan agree. For bare numbers
(``params=``), the seed and 6ND formulas (:mod:`flopmeter.flops.formulas`), the larger one.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, Field

from flopmeter.compliance import Threshold, determine_threshold, pretrain_flops_from_env
from flopmeter.compliance import verdict as judge
from flopmeter.errors import ConfigurationError
from flopmeter.types import TokenTotals, Verdict

__all__ = ["METHODS", "MethodPlan", "Plan", "PlanRequest"]

#: The fine-tuning methods a plan compares, in the order it shows them.
METHODS = ("full", "lora", "qlora", "spectrum", "freeze")
Method = Literal["full", "lora", "qlora", "spectrum", "freeze", "given"]
#: The default sequence length of a plan (tokens), when neither ``seq_len`` nor a dataset says.
DEFAULT_SEQ_LEN = 2048


class MethodPlan(BaseModel):
    """One method's planned compute and where it stands against the threshold."""

    method: Method = Field(description="The fine-tuning method; 'given' for bare numbers.")
    model: str | None = Field(description="The model id or config path; null for bare numbers.")
    n_total: int = Field(description="Parameters of the model as set up (adapters included).")
    n_trainable: int = Field(description="Parameters that train.")
    tokens: int = Field(description="Training tokens (non-padding, all epochs).")
    sequences: int = Field(description="Training sequences (all epochs).")
    sum_sq_seq_len: int = Field(description="Sum over sequences of length^2, tokens^2.")
    micro_batches: int = Field(0, description="Training forward passes (sequences / batch).")
    flops: float = Field(description="Planned training compute, FLOP.")
    estimate: str = Field(description="Which estimate gives flops: transformer, seed or six_nd.")
    linear_flops: float | None = Field(None, description="Weight-matrix part of flops, FLOP.")
    attention_flops: float | None = Field(None, description="Attention-score part, FLOP.")
    seed_flops: float = Field(description="(4 n_total + 2 n_trainable) x tokens, FLOP.")
    six_nd_flops: float = Field(description="6 x n_total x tokens, FLOP.")
    threshold_value: float = Field(description="The threshold, FLOP.")
    threshold_kind: str = Field(description="Which rule gave the threshold.")
    share_of_threshold: float = Field(description="flops / threshold_value.")
    verdict: Verdict = Field(description="flopmeter.compliance.verdict of flops.")
    tokens_to_threshold: float | None = Field(
        description="Tokens (same length mix) at which flops would reach the threshold; "
        "null when flops is 0."
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
    methods: list[MethodPlan] = Field(description="One entry per planned method.")
    notes: list[str] = Field(default_factory=list, description="Notes for the whole plan.")


@dataclass
class PlanRequest:
    """The inputs of a plan (the command line's options; see :func:`flopmeter.planner.estimate`).

    Exactly one of ``model`` and ``params``; exactly one of ``tokens`` and ``dataset``
    (``params`` takes ``tokens`` only).
    """

    model: str | Path | None = None
    tokens: int | None = None
    dataset: str | Path | None = None
    tokenizer: str | Path | None = None
    epochs: int = 1
    seq_len: int | None = None
    batch_size: int = 1
    methods: Sequence[str] = METHODS
    lora_r: int = 16
    lora_targets: str | Sequence[str] = "all-linear"
    spectrum_fraction: float = 0.25
    freeze_layers: int | None = None
    params: int | None = None
    trainable: int | None = None
    pretrain_flops: float | None = None
    systemic_risk: bool = False
    threshold: Threshold | None = field(default=None, repr=False)

    def check(self) -> None:
        """Raises ConfigurationError (one line) on inputs that cannot make a plan."""
        if (self.model is None) == (self.params is None):
            raise ConfigurationError("give a MODEL (config.json, folder or id) or --params")
        if (self.tokens is None) == (self.dataset is None):
            raise ConfigurationError("give --tokens or --dataset (one of them)")
        if self.params is not None and self.dataset is not None:
            raise ConfigurationError("--dataset needs a MODEL; with --params give --tokens")
        for name in ("tokens", "params", "trainable", "lora_r", "epochs", "seq_len", "batch_size"):
            value = getattr(self, name)
            if value is not None and (isinstance(value, bool) or not isinstance(value, int)):
                raise ConfigurationError(f"{name} must be a whole number, got {value!r}")
            if value is not None and value < (0 if name in ("tokens", "trainable") else 1):
                raise ConfigurationError(f"{name} must be positive, got {value!r}")
        if not 0 < self.spectrum_fraction <= 1:
            raise ConfigurationError("--spectrum-fraction must be in (0, 1]")
        unknown = [m for m in self.methods if m not in METHODS]
        if unknown or not self.methods:
            raise ConfigurationError(f"unknown method {unknown}; methods: {', '.join(METHODS)}")
        if self.trainable is not None and self.params is not None and self.trainable > self.params:
            raise ConfigurationError("--trainable cannot exceed --params.")

    def resolve_threshold(self) -> Threshold:
        """The given threshold, else the one for ``pretrain_flops`` (or PRETRAIN_FLOPS)."""
        if self.threshold is not None:
            return self.threshold
        flops = self.pretrain_flops
        if flops is None:
            flops = pretrain_flops_from_env()
        return determine_threshold(flops, original_systemic_risk=self.systemic_risk)


def judged(
    flops: float, totals: TokenTotals, threshold: Threshold, epochs: int | None
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
