"""The aten operators the ``measured`` estimate tells apart, each named once with its kind.

Every operator is registered here once, with its kind and, when flopmeter supplies one, its FLOP
formula (the way :mod:`torch.utils.flop_counter` registers formulas next to their operators
with ``register_flop_formula``):

* ``attention``: attention-score work (``QK^T``, ``AV`` and their gradients), which grows with
  the square of the sequence length;
* ``linear``: work that grows with the tokens (linear layers, experts, the output projection).
  An operator not registered here that PyTorch's counter counts is linear work;
* ``per_micro_batch``: work that is the same in every micro-batch (LoRA's ``B @ A`` for
  parameters peft's ``ParamWrapper`` wraps). No operator has this kind by itself: the counter
  gives it to any operator dispatched while such a product is built or differentiated
  (:mod:`flopmeter.flops.counter`), whatever the operator's registered kind.

PyTorch's counter leaves some operators at zero; flopmeter's formulas fill them:

* CPU scaled-dot-product attention (``_scaled_dot_product_flash_attention_for_cpu`` and its
  backward), which ``attn_implementation="sdpa"`` dispatches on CPU;
* ``_grouped_mm`` (and ``_scaled_grouped_mm``), which transformers 5 uses by default for
  mixture-of-experts layers (``experts_implementation="grouped_mm"``).

And flopmeter replaces one of PyTorch's: ``convolution_backward``, whose weight gradient
ignores ``groups`` (a depthwise convolution's, as in Mamba's and gated delta-net's short
convolutions, billed ``channels`` times over); the forward (``convolution``) is registered with
it, so both follow one hand-checked rule (groups, stride, dilation, transposed; 1-D to 3-D).

Flex attention (``flex_attention`` and its backward) computes only the blocks its block mask
keeps (a causal, sliding-window or document mask skips the rest), but its formula, PyTorch's,
counts the whole square: the figure is the cautious upper value (:data:`FLEX_ATTENTION_NOTE`).

Convention: the backward of fused attention is counted as four matmuls (``dP = dO V^T``,
``dV = P^T dO``, ``dQ = dS K``, ``dK = dS^T Q``), like eager attention; the recomputation of the
scores that fused kernels do to save memory is not counted (the Commission's guidelines,
Annex A.1, do not require recomputation; PyTorch's own formula counts it as a fifth matmul).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal, TypeVar

import torch

__all__ = [
    "ATTENTION_OPS",
    "BLOCK_SPARSE_OPS",
    "FLEX_ATTENTION_NOTE",
    "OPS",
    "AtenOp",
    "OpKind",
    "conv_backward_flop",
    "conv_flop",
    "cpu_sdpa_backward_flop",
    "cpu_sdpa_flop",
    "grouped_mm_flop",
    "is_compute_like",
    "measured_formulas",
    "op_kind",
    "op_name",
    "sdpa_backward_flop",
]

#: Operators that compute only the blocks a block mask keeps, counted as the full square.
BLOCK_SPARSE_OPS = frozenset({"flex_attention", "flex_attention_backward"})
#: What a report says when a sample counted one of :data:`BLOCK_SPARSE_OPS`.
FLEX_ATTENTION_NOTE = (
    "Flex attention computes only the blocks its mask keeps; the dispatch count bills the full "
    "square of each sequence (the cautious upper value)."
)

#: ``attention``: grows with seq_len^2; ``linear``: grows with tokens; ``per_micro_batch``: the
#: same in every micro-batch (given by the counter from the running module, never registered).
OpKind = Literal["attention", "linear", "per_micro_batch"]
#: A FLOP formula, called as PyTorch's counter calls its own: shapes in, FLOP out.
Formula = Callable[..., int]
_F = TypeVar("_F", bound=Formula)


@dataclass(frozen=True)
class AtenOp:
    """One aten operator the ``measured`` estimate knows.

    Attributes:
        name: The operator's name in ``torch.ops.aten`` (the overload packet).
        kind: ``attention`` (work grows with seq_len^2) or ``linear`` (grows with tokens).
            ``per_micro_batch`` is never registered (see the module's docstring).
        formula: flopmeter's FLOP formula for it, or ``None`` where PyTorch's counter has one.
    """

    name: str
    kind: OpKind
    formula: Formula | None = None


#: The registry, by operator name; filled below, each operator once.
OPS: dict[str, AtenOp] = {}


def _register(kind: OpKind, names: tuple[str, ...], formula: Formula | None = None) -> None:
    for name in names:
        if name in OPS:
            raise ValueError(f"aten operator {name} registered twice")
        OPS[name] = AtenOp(name, kind, formula)


def register_formula(kind: OpKind, *names: str) -> Callable[[_F], _F]:
    """Decorator: registers ``formula`` for the operators ``names``, of kind ``kind``."""

    def register(formula: _F) -> _F:
        _register(kind, names, formula)
        return formula

    return register


def _bmm_flops(b: int, m: int, k: int, n: int) -> int:
    return 2 * b * m * k * n


def _attention_flops(query_shape: Any, key_shape: Any, value_shape: Any, matmuls: int) -> int:
    """``matmuls`` products of size (query heads) x s_q x s_k x head_dim, 2 FLOP per MAC."""
    b, h_q, s_q, d_q = query_shape[-4:] if len(query_shape) == 4 else (1, *query_shape[-3:])
    s_k = key_shape[-2]
    d_v = value_shape[-1]
    # QK^T and dQ / dK use d_q; AV, dO V^T and dV use d_v. Half the matmuls each.
    return (matmuls // 2) * _bmm_flops(b * h_q, s_q, d_q, s_k) + (
        matmuls - matmuls // 2
    ) * _bmm_flops(b * h_q, s_q, d_v, s_k)


@register_formula("attention", "_scaled_dot_product_flash_attention_for_cpu")
def cpu_sdpa_flop(
    query_shape: Any, key_shape: Any, value_shape: Any, *args: Any, **kwargs: Any
) -> int:
    """Forward of CPU scaled-dot-product attention: ``QK^T`` and ``AV`` over the full square.

    Grouped-query attention (fewer key/value heads) costs the query heads' count.

    Args:
        query_shape: ``[B, H_q, S_q, D]``.
        key_shape: ``[B, H_kv, S_k, D]``.
        value_shape: ``[B, H_kv, S_k, D_v]``.

    Returns:
        FLOP: ``2 * B * H_q * S_q * S_k * (D + D_v)``.
    """
    return _attention_flops(query_shape, key_shape, value_shape, 2)


@register_formula(
    "attention",
    "_scaled_dot_product_efficient_attention_backward",
    "_scaled_dot_product_flash_attention_backward",
    "_scaled_dot_product_cudnn_attention_backward",
)
def sdpa_backward_flop(
    grad_out_shape: Any,
    query_shape: Any,
    key_shape: Any,
    value_shape: Any,
    *args: Any,
    **kwargs: Any,
) -> int:
    """Backward of scaled-dot-product attention as four matmuls, without score recomputation.

    ``dP = dO V^T``, ``dV = P^T dO``, ``dQ = dS K`` and ``dK = dS^T Q``: twice the forward.

    Returns:
        FLOP: ``4 * B * H_q * S_q * S_k * (D + D_v)``.
    """
    return _attention_flops(query_shape, key_shape, value_shape, 4)


@register_formula("attention", "_scaled_dot_product_flash_attention_for_cpu_backward")
def cpu_sdpa_backward_flop(
    grad_out_shape: Any,
    query_shape: Any,
    key_shape: Any,
    value_shape: Any,
    *args: Any,
    **kwargs: Any,
) -> int:
    """Backward of CPU scaled-dot-product attention (see :func:`sdpa_backward_flop`)."""
    return sdpa_backward_flop(grad_out_shape, query_shape, key_shape, value_shape)


#: The backward operators of fused attention: (grad_out, query, key, value, ...).
SDPA_BACKWARD_OPS = frozenset(
    {
        "_scaled_dot_product_efficient_attention_backward",
        "_scaled_dot_product_flash_attention_backward",
        "_scaled_dot_product_cudnn_attention_backward",
        "_scaled_dot_product_flash_attention_for_cpu_backward",
    }
)


def sdpa_backward_needed_flop(
    query_shape: Any,
    key_shape: Any,
    value_shape: Any,
    q_grad: bool,
    k_grad: bool,
    v_grad: bool,
) -> int:
    """Backward of fused attention counted as the gradients the inputs need, FLOP.

    The convention of the ``transformer`` estimate and of eager attention (autograd runs a
    product only for an input that needs its gradient): ``dQ = dS K`` when the queries need a
    gradient, ``dK = dS^T Q`` when the keys do (over the query/key width), ``dP = dO V^T`` when
    either does and ``dV = P^T dO`` when the values do (over the value width). A fused kernel
    may compute all four whatever is needed; the figure counts the model's training work, the
    same whichever attention implementation runs it.
    """
    b, h_q, s_q, d_q = query_shape[-4:] if len(query_shape) == 4 else (1, *query_shape[-3:])
    s_k = key_shape[-2]
    d_v = value_shape[-1]
    qk = int(q_grad) + int(k_grad)
    v = int(q_grad or k_grad) + int(v_grad)
    return qk * _bmm_flops(b * h_q, s_q, d_q, s_k) + v * _bmm_flops(b * h_q, s_q, d_v, s_k)


@register_formula("linear", "addmm_")
def addmm_inplace_flop(
    self_shape: Any, a_shape: Any, b_shape: Any, *args: Any, **kwargs: Any
) -> int:
    """FLOP of the in-place ``acc.addmm_(a, b)`` (``acc += a @ b``), as PyTorch counts ``addmm``:
    the product's multiply-adds, twice (TRL's fused LM head accumulates its gradients so)."""
    m, k = a_shape
    n = b_shape[1]
    return 2 * m * k * n


@register_formula("linear", "_grouped_mm", "_scaled_grouped_mm")
def grouped_mm_flop(
    a_shape: Any, b_shape: Any, *args: Any, out_shape: Any = None, **kwargs: Any
) -> int:
    """FLOP of ``torch._grouped_mm(a, b, offs)`` from the shapes alone (no host sync).

    The groups partition one dimension, so the total is that of one matmul over it:

    * 2-D x 3-D (``[M, K] x [G, K, N]``, rows grouped): ``2 * M * K * N``;
    * 2-D x 2-D (``[K, M] x [M, N] -> [G, K, N]``, the shared dimension grouped, as in the
      weight gradient): ``2 * K * M * N``;
    * 3-D x 2-D (``[G, M, K] x [K, N]``, columns grouped): ``2 * M * K * N``;
    * 3-D x 3-D (``[G, M, K] x [G, K, N]``, a batched matmul): ``2 * G * M * K * N``.

    Rows past the last offset are skipped by the kernel but counted here (the offsets live on
    the device; reading them would synchronise), so this is exact when every row is routed.
    """
    if len(a_shape) == 2 and len(b_shape) == 3:
        return 2 * a_shape[0] * a_shape[1] * b_shape[2]
    if len(a_shape) == 2 and len(b_shape) == 2:
        return 2 * a_shape[0] * a_shape[1] * b_shape[1]
    if len(a_shape) == 3 and len(b_shape) == 2:
        return 2 * a_shape[1] * a_shape[2] * b_shape[1]
    if len(a_shape) == 3 and len(b_shape) == 3:
        return 2 * a_shape[0] * a_shape[1] * a_shape[2] * b_shape[2]
    raise ValueError(f"grouped_mm_flop: unexpected shapes {tuple(a_shape)} x {tuple(b_shape)}")


def _conv_macs(x_shape: Any, w_shape: Any, out_shape: Any, transposed: bool) -> int:
    """Multiply-adds of one convolution (any of 1-D, 2-D, 3-D), from its shapes.

    Each output position multiplies one weight slice of ``C_in / groups`` input channels by the
    kernel: ``B * prod(out spatial) * C_out * (C_in / groups) * prod(kernel)``. The weight's
    shape already holds the grouping (``[C_out, C_in / groups, *kernel]``; transposed:
    ``[C_in, C_out / groups, *kernel]``, each *input* position scattered over the kernel), and
    stride, padding and dilation are in the output's shape. Padded positions are computed, so
    counted.
    """
    spatial = (x_shape if transposed else out_shape)[2:]
    macs = int(x_shape[0]) * int(w_shape[0]) * int(w_shape[1])
    for size in (*spatial, *w_shape[2:]):
        macs *= int(size)
    return macs


@register_formula("linear", "convolution", "_convolution")
def conv_flop(
    x_shape: Any,
    w_shape: Any,
    bias: Any,
    stride: Any,
    padding: Any,
    dilation: Any,
    transposed: bool,
    *args: Any,
    out_shape: Any = None,
    **kwargs: Any,
) -> int:
    """Forward of a convolution: 2 FLOP per multiply-add of :func:`_conv_macs` (bias not
    counted, as for ``addmm``).

    Args:
        x_shape: ``[B, C_in, *spatial_in]``.
        w_shape: ``[C_out, C_in / groups, *kernel]`` (transposed: ``[C_in, C_out / groups,
            *kernel]``).
        out_shape: ``[B, C_out, *spatial_out]``.

    Returns:
        FLOP: ``2 * B * prod(out spatial) * C_out * (C_in / groups) * prod(kernel)``.
    """
    return 2 * _conv_macs(x_shape, w_shape, out_shape, bool(transposed))


@register_formula("linear", "convolution_backward")
def conv_backward_flop(
    grad_out_shape: Any,
    x_shape: Any,
    w_shape: Any,
    bias_sizes: Any,
    stride: Any,
    padding: Any,
    dilation: Any,
    transposed: bool,
    output_padding: Any,
    groups: int,
    output_mask: Any,
    *args: Any,
    **kwargs: Any,
) -> int:
    """Backward of a convolution: the input gradient and the weight gradient, each as many
    multiply-adds as the forward (every forward product ``x * w`` has one product in each).

    PyTorch's own formula counts the weight gradient as a convolution over all ``C_in`` input
    channels, ignoring ``groups``: a depthwise convolution's weight gradient is billed
    ``channels`` times over. This one keeps the grouping the weight's shape holds.

    Args:
        grad_out_shape: The output's shape, ``[B, C_out, *spatial_out]``.
        x_shape: The input's shape.
        w_shape: The weight's shape (see :func:`conv_flop`).
        output_mask: Which of (input, weight, bias) gradients are computed.

    Returns:
        FLOP: ``2 * forward MACs * (input gradient + weight gradient)``; the bias gradient (a
        sum) is not counted.
    """
    macs = _conv_macs(x_shape, w_shape, grad_out_shape, bool(transposed))
    return 2 * macs * (int(bool(output_mask[0])) + int(bool(output_mask[1])))


# Attention operators PyTorch's counter has formulas for (eager attention's bmm included).
_register(
    "attention",
    (
        "bmm",
        "baddbmm",
        "_scaled_dot_product_efficient_attention",
        "_scaled_dot_product_flash_attention",
        "_scaled_dot_product_cudnn_attention",
        "_flash_attention_forward",
        "_flash_attention_backward",
        "_efficient_attention_forward",
        "_efficient_attention_backward",
        "flex_attention",
        "flex_attention_backward",
    ),
)

#: Operators whose work grows with the square of the sequence length (attention scores).
ATTENTION_OPS = frozenset(name for name, op in OPS.items() if op.kind == "attention")

# Operator names that look like compute; seen without a formula, they are named in the notes.
_COMPUTE_HINTS = ("mm", "matmul", "gemm", "attention", "attn", "conv", "linear", "einsum")


def op_name(packet: Any) -> str:
    """The bare name of an aten overload packet (``aten.mm`` -> ``mm``)."""
    name = getattr(packet, "__name__", None) or str(packet)
    return name.rsplit(".", 1)[-1]


def op_kind(name: str) -> OpKind:
    """The kind of the operator ``name``: registered here, else ``linear``."""
    op = OPS.get(name)
    return op.kind if op is not None else "linear"


def is_compute_like(name: str) -> bool:
    """Whether an operator's name looks like compute (a matmul, attention, convolution)."""
    lowered = name.lower()
    return any(hint in lowered for hint in _COMPUTE_HINTS)


def measured_formulas() -> dict[Any, Any]:
    """The formulas flopmeter adds to (or changes in) PyTorch's counter, by operator.

    Returns:
        A ``custom_mapping`` for :class:`torch.utils.flop_counter.FlopCounterMode`; operators
        this PyTorch version lacks are left out.
    """
    mapping: dict[Any, Any] = {}
    for op in OPS.values():
        packet = getattr(torch.ops.aten, op.name, None)
        if op.formula is not None and packet is not None:
            mapping[packet] = op.formula
    return mapping
