"""Which modules of a model do matmul work, and of what kind: read from the modules alone.

For every module the profile hooks, :func:`classify` says what it is: a weight matrix applied to
its input (``nn.Linear`` and subclasses, so LoRA's A and B and quantized layers too;
transformers' ``Conv1D``; other modules with one 2-D ``weight``, such as MoE routers), a
mixture-of-experts module whose experts are 3-D parameters, or a module with weights whose work
flopmeter cannot read. Attention modules are found by class name, their query, key and value
projections by child name.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass

import torch
from torch import nn

from flopmeter import internals
from flopmeter.flops.architecture import Architecture, read_architecture
from flopmeter.flops.mixers import ScanMixerLayer, scan_mixer_layer

__all__ = [
    "ExpertLayer",
    "OpaqueLayer",
    "WeightLayer",
    "attention_modules",
    "classify",
    "find_architecture",
    "lora_param_wrappers",
    "output_embeddings",
    "projections",
    "sequence_mixer",
]

_ATTENTION_CLASS = re.compile(r"(Attention|Attn)\d*$")
_Q_NAMES = ("q_proj", "query", "wq", "q_lin", "q")
_K_NAMES = ("k_proj", "key", "wk", "k_lin", "k")
_V_NAMES = ("v_proj", "value", "wv", "v_lin", "v")
_QKV_NAMES = ("c_attn", "qkv_proj", "query_key_value", "Wqkv", "qkv", "W_pack", "in_proj")
#: State-space and linear-attention mixers, by class name (transformers' ``MambaMixer``,
#: ``Mamba2Mixer``, ``JambaMambaMixer``, ``FalconH1Mixer``, ``Qwen3NextGatedDeltaNet``, ...).
_MIXER_CLASS = re.compile(r"(Mixer|DeltaNet|LinearAttention)$")


@dataclass(frozen=True)
class WeightLayer:
    """A weight matrix applied to the module's input.

    Attributes:
        kind: "linear", "lm_head", "lora" or "router".
        d_in: Input features.
        d_out: Output features (multiply-adds per row: ``d_in * d_out``).
        strict: Whether the module is known to apply the matrix to its input; when not (a
            module with one 2-D weight), a call whose input does not fit is opaque work.
    """

    kind: str
    d_in: int
    d_out: int
    strict: bool = True


@dataclass(frozen=True)
class ExpertLayer:
    """Mixture-of-experts weights: 3-D parameters, one slice per expert.

    Attributes:
        params: The 3-D parameters.
        experts: Experts (their first dimension).
        numel: Weights of all experts, elements.
        names: The parameters' attribute names on the module, in the order of ``params``.
    """

    params: tuple[nn.Parameter, ...]
    experts: int
    numel: int
    names: tuple[str, ...] = ()

    @property
    def per_expert(self) -> int:
        """Weights (multiply-adds per routed row) of one expert, elements."""
        return self.numel // self.experts


@dataclass(frozen=True)
class OpaqueLayer:
    """A module with weight matrices whose matmul work flopmeter cannot read.

    Attributes:
        numel: Its weights of two or more dimensions, elements (a sequence mixer: all its
            weights but those of its linear children, which are read on their own).
        why: What flopmeter cannot read in it, naming its class (sequence mixers); None for
            a module with weights of an unknown use.
    """

    numel: int
    why: str | None = None


def is_conv1d(module: nn.Module) -> bool:
    """Whether ``module`` is transformers' ``Conv1D`` (a linear layer with a transposed weight)."""
    weight = getattr(module, "weight", None)
    return (
        type(module).__name__ == "Conv1D"
        and hasattr(module, "nf")
        and isinstance(weight, torch.Tensor)
        and weight.dim() == 2
    )


def _expert_params(module: nn.Module, num_experts: int | None) -> list[tuple[str, nn.Parameter]]:
    if internals.is_convolution(module):
        return []
    params = [(n, p) for n, p in module.named_parameters(recurse=False) if p.dim() == 3]
    if not params:
        return []
    count = num_experts or getattr(module, "num_experts", None)
    if not isinstance(count, int) or any(p.shape[0] != count for _, p in params):
        return []
    return params


def _single_weight(module: nn.Module) -> nn.Parameter | None:
    """The module's one 2-D ``weight`` parameter, when it has exactly one matrix and is no
    convolution."""
    weight = getattr(module, "weight", None)
    if (
        isinstance(weight, nn.Parameter)
        and weight.dim() == 2
        and not internals.is_convolution(module)
        and sum(1 for p in module.parameters(recurse=False) if p.dim() >= 2) == 1
    ):
        return weight
    return None


def _depthwise_conv(module: nn.Module) -> bool:
    """Whether ``module`` is a 1-D convolution over each channel on its own (groups = channels):
    the short causal convolution of state-space and linear-attention mixers."""
    return (
        isinstance(module, nn.Conv1d)
        and module.groups > 1
        and module.groups == module.in_channels == module.out_channels
    )


def sequence_mixer(module: nn.Module) -> str | None:
    """Why flopmeter cannot model ``module``'s work, when it is a state-space or
    linear-attention mixer (Mamba, Mamba2, Jamba's and Falcon-H1's mamba mixers, Qwen3-Next's
    gated delta-net): None otherwise.

    Told by class name, or by a depthwise ``Conv1d`` child: transformers applies that
    convolution as ``F.conv1d(x, self.conv1d.weight)`` (the child's module never runs) and
    runs the scan as plain matmuls on activations (``einsum``, ``bmm``), none of it through a
    module the profile reads, so without this the model would look fully modelled.
    """
    children = list(module.children())
    has_conv = any(_depthwise_conv(child) for child in children)
    if not has_conv and not (_MIXER_CLASS.search(type(module).__name__) and children):
        return None
    return (
        f"{type(module).__name__} is a state-space / linear-attention mixer: its short "
        "convolution (F.conv1d on its weight) and its scan (matmuls over activations, per "
        "token and per chunk) run outside the modules flopmeter reads, so they are not in the "
        "transformer estimate"
    )


def classify(
    name: str, module: nn.Module, lm_head: nn.Module | None, arch: Architecture | None
) -> WeightLayer | ExpertLayer | ScanMixerLayer | OpaqueLayer | None:
    """What matmul work ``module`` does itself (its children are classified on their own).

    Args:
        name: The module's qualified name in the model.
        module: The module.
        lm_head: The model's output projection, if known.
        arch: The architecture, if read (its expert count identifies expert parameters).

    Returns:
        The layer (a selective-scan mixer's sizes: :mod:`flopmeter.flops.mixers`), or ``None``
        for a module without weight matrices of its own (or an embedding, whose lookup costs
        nothing).
    """
    if isinstance(module, nn.Embedding):
        return None
    kind = "lm_head" if module is lm_head else "lora" if "lora_" in name else "linear"
    if isinstance(module, nn.Linear):
        return WeightLayer(kind, module.in_features, module.out_features)
    if is_conv1d(module):
        return WeightLayer(kind, module.weight.shape[0], int(module.nf))
    if named := _expert_params(module, arch.num_experts if arch else None):
        params = tuple(p for _, p in named)
        return ExpertLayer(
            params, params[0].shape[0], sum(p.numel() for p in params), tuple(n for n, _ in named)
        )
    if (scan := scan_mixer_layer(module)) is not None:  # a mixer the FLOP model reads
        return scan
    why = sequence_mixer(module)
    if why is not None:
        parts = [module, *(c for c in module.children() if not isinstance(c, nn.Linear))]
        numel = sum(p.numel() for part in parts for p in part.parameters(recurse=False))
        return OpaqueLayer(max(numel, 1), why)
    if not any(p.dim() >= 2 for p in module.parameters(recurse=False)):
        return None
    weight = _single_weight(module)
    if weight is not None:
        router = "router" if arch and arch.num_experts else "linear"
        return WeightLayer(router, weight.shape[1], weight.shape[0], strict=False)
    return OpaqueLayer(sum(p.numel() for p in module.parameters(recurse=False) if p.dim() >= 2))


def lora_param_wrappers(model: nn.Module) -> Iterator[tuple[str, nn.Module, nn.Module]]:
    """peft's LoRA wrappers of single parameters (``ParamWrapper``: ``target_parameters``, or
    ``target_modules="all-linear"`` on mixture-of-experts weights), read by duck typing so that
    peft need not be installed.

    Yields:
        ``(wrapper's name, wrapper, the module holding the wrapped parameter)``; the parameter
        is ``getattr(holder, wrapper.parameter_name)`` outside the wrapper's forward call.
    """
    for name, module in model.named_modules():
        if (
            type(module).__name__ == "ParamWrapper"
            and type(module).__module__.startswith("peft.")
            and isinstance(getattr(module, "parameter_name", None), str)
        ):
            yield name, module, module.get_base_layer()


def attention_modules(model: nn.Module) -> Iterator[nn.Module]:
    """The model's attention modules, outermost only (by class name: ``...Attention``)."""
    seen: list[str] = []
    for name, module in model.named_modules():
        if isinstance(module, nn.Embedding):
            continue
        if _ATTENTION_CLASS.search(type(module).__name__) and not any(
            name.startswith(prefix + ".") for prefix in seen
        ):
            seen.append(name)
            yield module


def projections(attention: nn.Module) -> Iterator[tuple[nn.Module, tuple[str, ...]]]:
    """An attention module's projection children, each with what its output is: ``("q",)``,
    ``("k",)``, ``("v",)``, or ``("q", "k", "v")`` for a fused projection."""
    children = dict(attention.named_children())
    for names, attrs in (
        (_Q_NAMES, ("q",)),
        (_K_NAMES, ("k",)),
        (_V_NAMES, ("v",)),
        (_QKV_NAMES, ("q", "k", "v")),
    ):
        child = next((children[n] for n in names if n in children), None)
        if child is not None:
            yield child, attrs


def find_architecture(model: nn.Module) -> tuple[Architecture | None, str | None, nn.Module]:
    """The architecture from the model's configuration, or from the first submodule that has
    one (a model wrapped by DDP, FSDP, a Lightning module or PEFT).

    Returns:
        ``(architecture, reason it is missing, the module that holds the configuration)``.
    """
    arch, reason = read_architecture(getattr(model, "config", None))
    if arch is not None:
        return arch, None, model
    for module in model.modules():
        config = getattr(module, "config", None)
        if module is model or config is None:
            continue
        found, _ = read_architecture(config)
        if found is not None:
            return found, None, module
    return None, reason, model


def output_embeddings(owner: nn.Module) -> nn.Module | None:
    """The output projection (``get_output_embeddings()``) of a Hugging Face model, if any."""
    get_out = getattr(owner, "get_output_embeddings", None)
    if not callable(get_out):
        return None
    try:
        return get_out()
    except Exception:  # pragma: no cover - models without one raise here
        return None
