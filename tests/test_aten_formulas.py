"""The dispatch registry's formulas (flopmeter.flops.aten_ops) against hand arithmetic.

Each figure here is counted by hand from the shapes (2 FLOP per multiply-add), never by another
formula: the convolutions (groups, stride, dilation, padding, transposed; 1-D to 3-D, forward
and both gradients), scaled-dot-product attention (CPU kernel, and the backward formulas of the
CUDA kernels from shapes), ``_grouped_mm``, ``addmm_``, and which batched products are filed as
attention work.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.flop_counter import FlopCounterMode

from flopmeter.flops.aten_ops import (
    OPS,
    cpu_sdpa_backward_flop,
    cpu_sdpa_flop,
    grouped_mm_flop,
    measured_formulas,
    op_kind,
    sdpa_backward_flop,
)
from flopmeter.flops.counter import SampleCounter


def counted(fn) -> dict[str, int]:
    """FLOP per aten operator of ``fn()`` under PyTorch's counter with flopmeter's registry."""
    with FlopCounterMode(display=False, custom_mapping=measured_formulas()) as counter:
        fn()
    return {
        op_name: n
        for op, n in counter.get_flop_counts()["Global"].items()
        if (op_name := str(op).split(".")[-1])
    }


# (conv, input shape, forward multiply-adds counted by hand)
CONVS = [
    # depthwise causal conv of Mamba: 8 channels, kernel 4, padding 3: L_out = 16 + 6 - 4 + 1 = 19;
    # each output: 1 input channel x 4 taps -> 2 * 8 * 19 * 4
    (nn.Conv1d(8, 8, 4, groups=8, padding=3), (2, 8, 16), 2 * 8 * 19 * 4),
    # grouped 1-D: 8 -> 12 channels in 4 groups (2 in, 3 out each), kernel 3, stride 2, no pad:
    # L_out = (16 - 3) // 2 + 1 = 7; MACs per output = 2 channels x 3 taps
    (nn.Conv1d(8, 12, 3, groups=4, stride=2), (2, 8, 16), 2 * 12 * 7 * 2 * 3),
    # dilated 1-D, dense: kernel 3 dilation 2 spans 5: L_out = 12; 4 in x 3 taps per output
    (nn.Conv1d(4, 6, 3, dilation=2), (1, 4, 16), 1 * 6 * 12 * 4 * 3),
    # 2-D, dense, padding 1: 10x10 out; 3 in x 3 x 3 taps per output, 5 out channels
    (nn.Conv2d(3, 5, 3, padding=1), (2, 3, 10, 10), 2 * 5 * 100 * 3 * 9),
    # 2-D depthwise, stride 2: out (9 - 3) // 2 + 1 = 4 per side; 1 channel x 9 taps
    (nn.Conv2d(6, 6, 3, groups=6, stride=2), (1, 6, 9, 9), 1 * 6 * 16 * 9),
    # 3-D, 2 groups: 4 -> 4 channels (2 in per group), kernel 2: out 3x3x3
    (nn.Conv3d(4, 4, 2, groups=2), (1, 4, 4, 4, 4), 1 * 4 * 27 * 2 * 8),
    # transposed 1-D, 2 groups: 4 -> 6 (2 in, 3 out per group), kernel 3, stride 2; each *input*
    # position scatters into 3 out channels x 3 taps: 8 inputs x 4 in channels x 3 x 3
    (nn.ConvTranspose1d(4, 6, 3, stride=2, groups=2), (1, 4, 8), 1 * 8 * 4 * 3 * 3),
    # transposed 2-D, dense: 2 -> 3, kernel 2: 5x5 inputs x 2 in x 3 out x 4 taps
    (nn.ConvTranspose2d(2, 3, 2), (1, 2, 5, 5), 1 * 25 * 2 * 3 * 4),
]


CONV_IDS = [
    "depthwise-1d",
    "grouped-strided-1d",
    "dilated-1d",
    "padded-2d",
    "depthwise-strided-2d",
    "grouped-3d",
    "transposed-grouped-1d",
    "transposed-2d",
]


@pytest.mark.parametrize("conv, shape, macs", CONVS, ids=CONV_IDS)
def test_convolution_forward_and_backward_against_hand_counts(
    conv: nn.Module, shape: tuple[int, ...], macs: int
) -> None:
    x = torch.randn(shape, requires_grad=True)
    flops = counted(lambda: conv(x).sum().backward())
    assert flops["convolution"] == 2 * macs
    # input gradient + weight gradient: as many products each as the forward (grouped
    # convolutions included, where PyTorch's own formula bills the weight gradient x groups)
    assert flops["convolution_backward"] == 2 * 2 * macs


def test_convolution_backward_counts_only_the_gradients_asked_for() -> None:
    conv = nn.Conv1d(8, 8, 4, groups=8, padding=3)
    macs = 2 * 8 * 19 * 4
    x = torch.randn(2, 8, 16)  # no input gradient: the weight's only
    assert counted(lambda: conv(x).sum().backward())["convolution_backward"] == 2 * macs
    conv.requires_grad_(False)
    xg = torch.randn(2, 8, 16, requires_grad=True)  # the input's only
    assert counted(lambda: conv(xg).sum().backward())["convolution_backward"] == 2 * macs


def test_depthwise_convolution_backward_is_twice_its_forward() -> None:
    """The sample's backward guard (backward at most twice the forward) holds for a depthwise
    convolution, as F.conv1d on the weight (the way transformers' Mamba mixers call it)."""
    weight = nn.Parameter(torch.randn(64, 1, 4))
    x = torch.randn(2, 64, 32, requires_grad=True)
    flops = counted(lambda: F.conv1d(x, weight, padding=3, groups=64).sum().backward())
    assert flops["convolution_backward"] == 2 * flops["convolution"]


def test_cpu_sdpa_forward_and_backward_against_hand_counts() -> None:
    # grouped-query attention: 4 query heads over 2 key/value heads (the CPU kernel needs one
    # width for keys and values; other widths fall back to the math path's bmm)
    b, h, s_q, s_k, d = 2, 4, 5, 7, 8
    q = torch.randn(b, h, s_q, d, requires_grad=True)
    k = torch.randn(b, 2, s_k, d, requires_grad=True)
    v = torch.randn(b, 2, s_k, d, requires_grad=True)
    flops = counted(
        lambda: F.scaled_dot_product_attention(q, k, v, enable_gqa=True).sum().backward()
    )
    pairs = b * h * s_q * s_k  # (query, key) pairs over the query heads
    # QK^T and AV: d multiply-adds per pair each
    assert flops["_scaled_dot_product_flash_attention_for_cpu"] == 2 * 2 * pairs * d
    # backward: dQ, dK, dP = dO V^T and dV (no recomputation of the scores)
    assert flops["_scaled_dot_product_flash_attention_for_cpu_backward"] == 2 * 4 * pairs * d


def test_cpu_sdpa_formula_keeps_key_and_value_widths_apart() -> None:
    b, h, s_q, s_k, d, d_v = 1, 4, 5, 7, 12, 6  # multi-head latent attention's widths differ
    q, k, v = (b, h, s_q, d), (b, 2, s_k, d), (b, 2, s_k, d_v)
    assert cpu_sdpa_flop(q, k, v) == 2 * (b * h * s_q * s_k * d + b * h * s_q * s_k * d_v)
    assert cpu_sdpa_backward_flop((b, h, s_q, d_v), q, k, v) == 2 * (
        2 * b * h * s_q * s_k * d + 2 * b * h * s_q * s_k * d_v
    )


def test_cuda_sdpa_backward_formula_against_hand_counts() -> None:
    b, h, s_q, s_k, d, d_v = 1, 8, 16, 32, 64, 48
    grad_out = (b, h, s_q, d_v)
    flops = sdpa_backward_flop(grad_out, (b, h, s_q, d), (b, 2, s_k, d), (b, 2, s_k, d_v))
    assert flops == 2 * (2 * b * h * s_q * s_k * d + 2 * b * h * s_q * s_k * d_v)
    for name in (
        "_scaled_dot_product_efficient_attention_backward",
        "_scaled_dot_product_flash_attention_backward",
        "_scaled_dot_product_cudnn_attention_backward",
    ):
        assert OPS[name].formula is sdpa_backward_flop and OPS[name].kind == "attention"


@pytest.mark.parametrize(
    "a, b, macs",
    [
        ((10, 4), (3, 4, 5), 10 * 4 * 5),  # rows grouped over 3 experts
        ((4, 10), (10, 5), 4 * 10 * 5),  # the shared dimension grouped (weight gradient)
        ((3, 10, 4), (4, 5), 10 * 4 * 5),  # columns grouped
        ((3, 10, 4), (3, 4, 5), 3 * 10 * 4 * 5),  # a batched matmul
    ],
)
def test_grouped_mm_formula_against_hand_counts(a, b, macs) -> None:
    assert grouped_mm_flop(a, b) == 2 * macs
    assert op_kind("_grouped_mm") == "linear"


def test_grouped_mm_formula_refuses_shapes_it_does_not_know() -> None:
    with pytest.raises(ValueError, match="unexpected shapes"):
        grouped_mm_flop((2, 3, 4, 5), (5, 6))


def test_inplace_addmm_against_hand_count() -> None:
    acc, a, b = torch.zeros(6, 5), torch.randn(6, 4), torch.randn(4, 5)
    assert counted(lambda: acc.addmm_(a, b))["addmm_"] == 2 * 6 * 4 * 5


def _sample(fn) -> SampleCounter:
    counter = SampleCounter()
    counter.enter()
    try:
        fn()
    finally:
        counter.exit()
    return counter


def test_batched_products_of_a_batched_weight_are_linear_work() -> None:
    """A bmm over a 3-D parameter (Llama 4's experts) grows with the tokens: its forward, its
    input gradient (the weight transposed) and its weight gradient are linear work."""
    weight = nn.Parameter(torch.randn(4, 8, 6))  # [experts, d_in, d_out]
    x = torch.randn(4, 5, 8, requires_grad=True)  # 5 rows per expert
    counter = _sample(lambda: torch.bmm(x, weight).sum().backward())
    assert counter.attention == 0
    assert counter.linear == 3 * 2 * 4 * 5 * 8 * 6


class CastExperts(nn.Module):
    """Experts applied through a copy of their weight (as autocast casts it): no operand of the
    products is the parameter or a view of it."""

    def __init__(self) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.randn(4, 8, 6, dtype=torch.float32))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.bmm(x, self.weight.to(torch.float64))


def test_batched_products_of_a_copied_batched_weight_are_linear_work() -> None:
    experts = CastExperts()
    x = torch.randn(4, 5, 8, dtype=torch.float64, requires_grad=True)
    counter = _sample(lambda: experts(x).sum().backward())
    assert counter.attention == 0
    assert counter.linear == 3 * 2 * 4 * 5 * 8 * 6


def test_batched_products_of_activations_stay_attention_work() -> None:
    q = torch.randn(8, 5, 4, requires_grad=True)  # [batch x heads, length, head_dim]
    k = torch.randn(8, 4, 5, requires_grad=True)
    counter = _sample(lambda: torch.bmm(q, k).sum().backward())
    assert counter.linear == 0
    assert counter.attention == 3 * 2 * 8 * 5 * 4 * 5


@pytest.mark.parametrize(
    ("q_grad", "k_grad", "v_grad"),
    [(True, True, True), (True, False, True), (False, False, True), (True, True, False)],
)
def test_a_sampled_fused_attention_backward_counts_the_gradients_its_inputs_need(
    q_grad: bool, k_grad: bool, v_grad: bool
) -> None:
    """The sample counts a fused kernel's backward as eager attention's autograd runs it (a
    product only for an input needing its gradient: a LoRA model's first-layer keys, from a
    frozen projection of the embeddings, need none), by hand over the pairs."""
    b, h, s, d = 2, 4, 6, 8
    q = torch.randn(b, h, s, d, requires_grad=q_grad)
    k = torch.randn(b, h, s, d, requires_grad=k_grad)
    v = torch.randn(b, h, s, d, requires_grad=v_grad)
    counter = _sample(lambda: F.scaled_dot_product_attention(q, k, v).sum().backward())
    pair_flops = 2 * b * h * s * s * d  # one product over the pairs at width d
    products = 2 + int(q_grad) + int(k_grad) + int(q_grad or k_grad) + int(v_grad)
    assert counter.attention == products * pair_flops
    # eager attention, the same products through autograd, counts the same
    eager = _sample(
        lambda: (torch.softmax(q @ k.transpose(-1, -2) / d**0.5, -1) @ v).sum().backward()
    )
    assert eager.attention + eager.linear == counter.attention
