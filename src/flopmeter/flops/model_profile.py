"""The model profile's data: what the ``transformer`` estimate knows about a model.

Plain frozen values, built by :mod:`flopmeter.flops.build` from what the hooks of
:mod:`flopmeter.flops.capture` saw in the first training micro-batch.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import asdict, dataclass
from typing import Any

from flopmeter.flops.architecture import Architecture

__all__ = ["AttentionLayerWork", "LinearGroup", "LoraDeltaGroup", "ModelProfile"]


@dataclass(frozen=True)
class LinearGroup:
    """Weight matrices that cost the same per multiply-add.

    Attributes:
        kind: "linear", "lm_head", "lora", "experts" (routed expert weights) or "router".
        input_grad: Autograd computes the gradient of their input (2 FLOP per MAC).
        weight_grad: Their weights train (2 FLOP per MAC for the weight gradient).
        macs_per_token: Multiply-adds per training token (experts: top-k of them).
        modules: How many modules the group holds.
    """

    kind: str
    input_grad: bool
    weight_grad: bool
    macs_per_token: float
    modules: int

    @property
    def flops_per_mac(self) -> int:
        """FLOP per multiply-add: 2 forward, + 2 for the input gradient, + 2 for the weight's."""
        return 2 + 2 * self.input_grad + 2 * self.weight_grad


@dataclass(frozen=True)
class LoraDeltaGroup:
    """LoRA products ``delta_W = B @ A`` built once per micro-batch, not per token.

    peft's ``ParamWrapper`` (``target_parameters``, or ``target_modules="all-linear"`` on
    mixture-of-experts models) adds ``B @ A`` to a wrapped parameter (3-D experts, or a 2-D
    router weight) on every forward call: its cost is the parameter's elements times the rank,
    whatever the tokens.

    Attributes:
        macs: Multiply-adds of one evaluation of the products, per micro-batch
            (``sum(param.numel() * r)`` over the group's wrapped parameters and calls).
        forward_products: Evaluations of each product in the forward pass (peft's folded
            single-adapter path evaluates it twice: its parametrization check, then the use).
        factor_grads: Trainable factors (0, 1 or 2 of A and B) whose gradient backward computes,
            ``macs`` multiply-adds each.
        modules: Wrapped parameters in the group.
        lora_params: Elements of their A and B factors.
    """

    macs: float
    forward_products: int
    factor_grads: int
    modules: int
    lora_params: int

    @property
    def flops_per_mac(self) -> int:
        """FLOP per multiply-add: 2 per forward evaluation, + 2 per trainable factor."""
        return 2 * (self.forward_products + self.factor_grads)


@dataclass(frozen=True)
class AttentionLayerWork:
    """One self-attention layer's score work (``QK^T`` and ``AV``).

    Attributes:
        query_width: Query heads x query/key head width (key/value heads are repeated to
            match), elements: the width of ``QK^T``, ``dQ`` and ``dK``.
        window: Sliding-window length in tokens, None for full attention.
        q_grad: The queries require a gradient.
        k_grad: The keys require a gradient.
        v_grad: The values require a gradient.
        value_width: Query heads x value head width, elements: the width of ``AV``,
            ``dP = dO V^T`` and ``dV``. None given: :attr:`query_width` (one ``head_dim`` for
            queries, keys and values); multi-head latent attention differs (DeepSeek-V3:
            ``qk_nope_head_dim + qk_rope_head_dim`` against ``v_head_dim``).
    """

    query_width: int
    window: int | None
    q_grad: bool
    k_grad: bool
    v_grad: bool
    value_width: int | None = None

    def __post_init__(self) -> None:
        if self.value_width is None:
            object.__setattr__(self, "value_width", self.query_width)

    @property
    def backward_matmuls(self) -> tuple[int, int]:
        """Backward matmuls over ``(query_width, value_width)``: ``dQ = dS K`` and ``dK = dS^T Q``
        over the query width when the queries / keys need gradients; ``dP = dO V^T`` (when
        either does) and ``dV = P^T dO`` (when the values do) over the value width."""
        qk = int(self.q_grad) + int(self.k_grad)
        v = int(self.q_grad or self.k_grad) + int(self.v_grad)
        return qk, v

    def to_dict(self) -> dict[str, Any]:
        """The layer as plain data (the report's keys, ``value_width`` included)."""
        return {
            "query_width": self.query_width,
            "value_width": self.value_width,
            "window": self.window,
            "q_grad": self.q_grad,
            "k_grad": self.k_grad,
            "v_grad": self.v_grad,
        }


@dataclass(frozen=True)
class ModelProfile:
    """What the ``transformer`` estimate needs to know about a model beyond its token counts.

    Attributes:
        linear: Weight-matrix work, grouped by what backward computes.
        attention: Per self-attention layer, its score work; empty for a model without one.
        architecture: The configuration's numbers, when it has a configuration flopmeter reads.
        recognised: Whether the estimate covers all the model's matmul work (else ``seed``
            stays the primary figure).
        notes: What was and was not counted, and why.
        inactive_expert_params: Expert parameters a token does not pass through
            (``n_active = n_total - inactive_expert_params``), elements; ``None`` when the
            routing is not known.
        batch_tokens: Tokens (padding included) of the micro-batch profiled.
        cross_check: Modules whose work the profile could not fully model; a measured sample
            is forced when any (the recorder's).
        lora_delta: LoRA products built per micro-batch (wrapped expert or router weights).
    """

    linear: tuple[LinearGroup, ...]
    attention: tuple[AttentionLayerWork, ...]
    architecture: Architecture | None
    recognised: bool
    notes: tuple[str, ...] = ()
    inactive_expert_params: int | None = 0
    batch_tokens: int = 0
    cross_check: tuple[str, ...] = ()
    lora_delta: tuple[LoraDeltaGroup, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        """The profile as plain data (for a report's ``inputs``), attention layers grouped."""
        groups: dict[tuple[Any, ...], int] = defaultdict(int)
        for layer in self.attention:
            groups[tuple(layer.to_dict().items())] += 1
        attention = [{"layers": count, **dict(key)} for key, count in groups.items()]
        return {
            "linear_groups": [asdict(g) for g in self.linear],
            "attention_layers": attention,
            "architecture": self.architecture.to_dict() if self.architecture else None,
            "profiled_batch_tokens": self.batch_tokens,
            "lora_delta_groups": [asdict(g) for g in self.lora_delta],
        }
