"""The selective-scan mixers the FLOP model reads (Mamba's and Jamba's): their short causal
convolution and their recurrent scan, as transformers' PyTorch path dispatches them.

Their weight matrices (``in_proj``, ``x_proj``, ``out_proj``, and ``dt_proj``'s weight, applied
outside its module and found by the weight watch) are linear work like any other. Beside them,
per mixer, on a sequence of ``L`` tokens (``I``: the mixer's inner channels, ``N``: its state
size, ``k``: the convolution's kernel):

* the depthwise causal convolution (``F.conv1d`` on ``conv1d.weight``, padding ``k - 1`` on
  both sides, then cut to ``L``) computes ``L + k - 1`` positions: ``2 * I * k`` FLOP per
  position forward, as much again for the input's gradient and for the weight's;
* the recurrent scan multiplies the state ``[I, N]`` by ``C`` at each token (a ``bmm``):
  ``2 * I * N`` FLOP per token forward, as much again for the state's gradient and for ``C``'s.

The scan's other steps (``exp``, the products with ``dt`` and ``B``, the skip, the gate) are
elementwise, not counted (docs/methodology.md, Units). On a padded batch the convolution and
the scan run over the padding too; the figure counts the non-padding tokens, each sequence on
its own (``tokens + sequences * (k - 1)`` positions). A sequence shorter than ``k`` run with a
cache (Jamba keeps one in training) is first padded to ``k``: ``k - L`` positions more than
counted here (the totals keep no count of such sequences). mamba_ssm's fused kernels do the same
arithmetic in custom operators PyTorch's counter has no formula for; the formula is the PyTorch
path's. Mamba2's chunked scan (Mamba2, Falcon-H1, Zamba2) and gated delta-nets (Qwen3-Next) are
not modelled: their work depends on each sequence's length modulo the chunk, which the run's
totals do not keep (:mod:`flopmeter.flops.classify` marks them, and the ``transformer``
estimate has no figure for a model with one).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from torch import nn

from flopmeter.types import TokenTotals

__all__ = [
    "SCAN_MIXERS",
    "ScanMixerLayer",
    "ScanMixerWork",
    "scan_mixer_flops",
    "scan_mixer_layer",
    "scan_mixer_work",
]

#: The mixer classes whose PyTorch path is the one modelled here, by class name.
SCAN_MIXERS = frozenset({"MambaMixer", "JambaMambaMixer"})


@dataclass(frozen=True)
class ScanMixerLayer:
    """A selective-scan mixer's sizes, read from the module.

    Attributes:
        inner: Inner channels ``I`` (the convolution's and the scan's).
        state: State size ``N`` per channel.
        kernel: The convolution's kernel ``k``, positions.
    """

    inner: int
    state: int
    kernel: int


def scan_mixer_layer(module: nn.Module) -> ScanMixerLayer | None:
    """The sizes of ``module`` when it is a mixer of :data:`SCAN_MIXERS` with the layout read
    here (``in_proj``, a depthwise ``conv1d``, ``x_proj``, ``dt_proj``), else ``None``."""
    if type(module).__name__ not in SCAN_MIXERS:
        return None
    conv = getattr(module, "conv1d", None)
    inner = getattr(module, "intermediate_size", None)
    state = getattr(module, "ssm_state_size", None)
    if not (
        isinstance(conv, nn.Conv1d)
        and all(isinstance(getattr(module, c, None), nn.Module) for c in ("in_proj", "x_proj"))
        and isinstance(inner, int)
        and isinstance(state, int)
        and conv.groups == conv.in_channels == inner
    ):
        return None
    return ScanMixerLayer(inner, state, int(conv.kernel_size[0]))


@dataclass(frozen=True)
class ScanMixerWork:
    """One selective-scan mixer's work, as the profiled micro-batch ran it.

    Attributes:
        name: The mixer's module name.
        inner: Inner channels ``I``.
        state: State size ``N``.
        kernel: The convolution's kernel ``k``.
        conv_grads: Gradients the convolution's backward computes (its input's, its
            weight's): 0 to 2.
        scan_grads: Gradients each scan product's backward computes (the state's, ``C``'s): 0
            to 2.
    """

    name: str
    inner: int
    state: int
    kernel: int
    conv_grads: int
    scan_grads: int

    def flops(self, tokens: int, sequences: int) -> float:
        """FLOP over ``tokens`` tokens in ``sequences`` sequences.

        Returns:
            ``2 * I * k * (tokens + sequences * (k - 1)) * (1 + conv_grads)
            + 2 * I * N * tokens * (1 + scan_grads)``, FLOP.
        """
        positions = tokens + sequences * (self.kernel - 1)
        conv = 2 * self.inner * self.kernel * positions * (1 + self.conv_grads)
        return float(conv + 2 * self.inner * self.state * tokens * (1 + self.scan_grads))


def _trains(*modules: Any) -> bool:
    """Whether any parameter of ``modules`` (modules or parameters; ``None`` skipped) trains."""
    for m in modules:
        if isinstance(m, nn.Parameter) and m.requires_grad:
            return True
        if isinstance(m, nn.Module) and any(p.requires_grad for p in m.parameters()):
            return True
    return False


def scan_mixer_work(
    name: str, module: nn.Module, layer: ScanMixerLayer, input_grad: bool
) -> ScanMixerWork:
    """The work of one call of the mixer ``module``, from its ``requires_grad`` flags.

    Args:
        name: The mixer's module name.
        module: The mixer.
        layer: Its sizes.
        input_grad: Whether the mixer's input required a gradient.
    """
    into_conv = input_grad or _trains(module.in_proj)
    conv_weight = _trains(module.conv1d.weight)
    conv_out = into_conv or _trains(module.conv1d)
    # C comes from x_proj (and Jamba's c_layernorm); the state from dt, B and the input
    c_grad = conv_out or _trains(module.x_proj, getattr(module, "c_layernorm", None))
    state_grad = conv_out or _trains(
        module.x_proj,
        getattr(module, "dt_proj", None),
        getattr(module, "A_log", None),
        getattr(module, "dt_layernorm", None),
        getattr(module, "b_layernorm", None),
    )
    return ScanMixerWork(
        name,
        layer.inner,
        layer.state,
        layer.kernel,
        conv_grads=int(into_conv) + int(conv_weight),
        scan_grads=int(state_grad) + int(c_grad),
    )


def scan_mixer_flops(mixers: Iterable[ScanMixerWork], totals: TokenTotals) -> float:
    """FLOP of the mixers' convolutions and scans over a run's text tokens.

    Args:
        mixers: The profile's selective-scan mixers.
        totals: The run's token statistics (``tokens_processed``, ``sequences``).

    Returns:
        The sum of :meth:`ScanMixerWork.flops` over the mixers, FLOP.
    """
    return sum(m.flops(totals.tokens_processed, totals.sequences) for m in mixers)
