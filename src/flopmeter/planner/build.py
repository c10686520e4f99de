"""A model on the ``meta`` device, set up as each fine-tuning method trains it, and its cost.

Nothing is downloaded and nothing is allocated: the weights are meta tensors. One forward pass
over a few meta tokens under the meter's own profiler (:func:`flopmeter.flops.profile_model`)
gives the :class:`~flopmeter.flops.model_profile.ModelProfile` that the meter's ``transformer``
estimate costs; the parameter census is the meter's too (:func:`flopmeter.counting.census.take_census`).
torch, transformers and peft are imported here, when a plan is made, never by the command line
at start.
"""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from flopmeter.counting.census import Census, take_census
from flopmeter.errors import ConfigurationError
from flopmeter.flops.model_profile import ModelProfile
from flopmeter.planner.families import Family
from flopmeter.planner.plan import STACK_METHODS

__all__ = [
    "MetaCost",
    "MethodSetup",
    "blocks_of",
    "check_stack",
    "cost_on_meta",
    "hf_config",
    "lora_targets_for",
    "meta_autocast",
    "method_model",
    "profile_on_meta",
    "spectrum_layers",
]

#: Tokens of the one meta forward pass that takes the profile (the profile is per token).
PROFILE_TOKENS = 8


@dataclass(frozen=True)
class MethodSetup:
    """How a method sets up the model.

    Attributes:
        method: ``full``, ``lora``, ``qlora``, ``spectrum`` or ``freeze``.
        lora_r: LoRA rank (lora and qlora).
        lora_targets: ``"all-linear"`` or module names (lora and qlora).
        spectrum_fraction: Share of the blocks whose linear weights train (spectrum).
        freeze_layers: Blocks frozen from the bottom, embeddings too (freeze).
    """

    method: str
    lora_r: int = 16
    lora_targets: str | tuple[str, ...] = "all-linear"
    spectrum_fraction: float = 0.25
    freeze_layers: int | None = None


@dataclass(frozen=True)
class MetaCost:
    """What the meter would see of the model: its census and its profile (and the model on
    meta, set up for its method, for the planner's dispatch-count check)."""

    census: Census
    profile: ModelProfile
    trainable_blocks: tuple[int, ...] | None = None
    model: Any = field(default=None, compare=False, repr=False)


def blocks_of(model: Any, layers: int) -> Any:
    """The model's list of transformer blocks (the ``nn.ModuleList`` of ``layers`` entries)."""
    from torch import nn

    for module in model.modules():
        if isinstance(module, nn.ModuleList) and len(module) == layers:
            return module
    raise ConfigurationError(f"the model has no list of {layers} transformer blocks")


def spectrum_layers(layers: int, fraction: float) -> tuple[int, ...]:
    """The blocks whose linear weights train under spectrum: ``round(fraction * layers)`` of
    them (at least one), spread evenly from block 0 up, so gradients flow through every block
    (the most compute any selection of that many blocks can take)."""
    count = max(1, min(layers, round(fraction * layers)))
    return tuple(sorted({(i * layers) // count for i in range(count)}))


class _MetaAutocast:
    """``torch.autocast`` that accepts ``device_type="meta"`` when disabled (a no-op there).

    peft's LoRA on 3-D expert weights folds its factors under ``torch.autocast(device_type=
    W.device.type, enabled=False)``; autocast has no meta backend. A disabled autocast where
    none is active changes nothing.
    """

    real: Any = None

    def __new__(cls, device_type: str, *args: Any, enabled: bool = True, **kwargs: Any) -> Any:
        if device_type == "meta" and not enabled:
            return contextlib.nullcontext()
        return cls.real(device_type, *args, enabled=enabled, **kwargs)


@contextlib.contextmanager
def meta_autocast() -> Iterator[None]:
    """Within: ``torch.autocast`` is :class:`_MetaAutocast` (restored on the way out)."""
    import torch

    _MetaAutocast.real = torch.autocast
    torch.autocast = _MetaAutocast  # type: ignore[misc,assignment]
    try:
        yield
    finally:
        torch.autocast = _MetaAutocast.real  # type: ignore[misc]


def hf_config(config: dict[str, Any]) -> Any:
    """The transformers configuration of a ``config.json`` dictionary (mixture-of-experts
    models in bfloat16, which the grouped-experts meta kernel requires; no FLOP changes)."""
    import torch
    import transformers

    try:  # transformers' typed configs refuse a field of another type with this error
        from huggingface_hub.errors import StrictDataclassError
    except ImportError:  # an older huggingface_hub, whose configs raise the built-in errors
        StrictDataclassError = ValueError
    try:
        hf = transformers.AutoConfig.for_model(**config)
    except (ValueError, KeyError, TypeError, StrictDataclassError) as exc:
        first = str(exc).split(". Should contain")[0]  # not the list of every model type
        raise ConfigurationError(
            f"the configuration cannot be read by transformers: {first}"
        ) from None
    text = hf.get_text_config() if hasattr(hf, "get_text_config") else hf
    if getattr(text, "num_local_experts", None) or getattr(text, "num_experts", None):
        hf.dtype = torch.bfloat16  # grouped_mm's meta kernel takes bfloat16 only; FLOP unchanged
    return hf


def _base_model(config: dict[str, Any], family: Family | None = None) -> Any:
    """The model of ``config`` on meta, built by its family's auto class (a causal LM when no
    family is given); families costed by the dispatch count use eager attention, whose
    matmuls PyTorch's counter sees (SDPA's mask checks read values meta tensors lack)."""
    import torch
    import transformers

    hf = hf_config(config)
    auto = "AutoModelForCausalLM" if family is None else family.auto_class
    kwargs = {} if family is None or family.name == "decoder" else {"attn_implementation": "eager"}
    what = "a causal LM" if family is None else f"an {auto} model"
    try:
        with torch.device("meta"):
            return getattr(transformers, auto).from_config(hf, **kwargs)
    except (ValueError, KeyError) as exc:
        raise ConfigurationError(f"transformers cannot build {what} from it: {exc}") from None


#: peft's task type per family (None: a plain LoraModel, no task wrapper). Whisper has none:
#: peft's seq2seq wrapper passes ``input_ids``, which Whisper's forward does not take.
_TASK_TYPES = {
    "decoder": "CAUSAL_LM",
    "encoder-decoder": "SEQ_2_SEQ_LM",
}


#: What ``all-linear`` means on the model types where peft (0.21) refuses LoRA on a Mamba
#: mixer's ``out_proj`` and ``conv1d``: every other linear layer (the output layer left out, as
#: ``all-linear`` leaves it out).
MAMBA_ALL_LINEAR: dict[str, tuple[str, ...]] = {
    "mamba": ("in_proj", "x_proj", "dt_proj"),
    "falcon_mamba": ("in_proj", "x_proj", "dt_proj"),
    "mamba2": ("in_proj",),
    "falcon_h1": (
        *("q_proj", "k_proj", "v_proj", "o_proj"),
        *("gate_proj", "up_proj", "down_proj", "in_proj"),
    ),
}


def lora_targets_for(
    model_type: Any, targets: str | Sequence[str]
) -> tuple[str | tuple[str, ...], str | None]:
    """LoRA's targets for a model type, and a note when ``all-linear`` was narrowed.

    Args:
        model_type: The configuration's ``model_type``.
        targets: The targets asked for (``"all-linear"`` or module names).

    Returns:
        ``targets``, or on a Mamba-based model asked for ``all-linear`` the linear layers peft
        accepts there (:data:`MAMBA_ALL_LINEAR`), with a note saying so; else ``None``.
    """
    narrowed = MAMBA_ALL_LINEAR.get(model_type) if targets == "all-linear" else None
    if narrowed is None:
        return (targets if isinstance(targets, str) else tuple(targets)), None
    return narrowed, (
        f"LoRA's all-linear on {model_type} is taken as {', '.join(narrowed)}: peft refuses "
        "LoRA on a Mamba mixer's out_proj and conv1d."
    )


def _apply_lora(model: Any, setup: MethodSetup, family: Family | None = None) -> Any:
    """``model`` with peft's LoRA adapters; made on meta (peft would otherwise allocate and
    initialise each adapter on the CPU and then move it to the base weight's meta device:
    the same shapes, seconds of work for a large model)."""
    import peft
    import torch

    targets = setup.lora_targets
    lora = peft.LoraConfig(
        r=setup.lora_r,
        lora_alpha=2 * setup.lora_r,
        target_modules=targets if isinstance(targets, str) else list(targets),
        lora_dropout=0.0,
        task_type="CAUSAL_LM" if family is None else _TASK_TYPES.get(family.name),
    )
    try:
        with warnings.catch_warnings(), torch.device("meta"):  # peft's notes on MoE patterns
            warnings.filterwarnings("ignore", category=RuntimeWarning, module="peft")
            return peft.get_peft_model(model, lora)
    except ValueError as exc:
        raise ConfigurationError(f"LoRA targets {targets!r}: {exc}") from None


def _apply(
    model: Any, setup: MethodSetup, layers: int, family: Family | None = None
) -> tuple[Any, tuple[int, ...] | None]:
    """The model set up for ``setup.method``, and the blocks that train (None: all/adapters)."""
    if setup.method == "full":
        return model, None
    if setup.method in ("lora", "qlora"):
        return _apply_lora(model, setup, family), None
    from torch import nn

    blocks = blocks_of(model, layers)
    if setup.method == "spectrum":
        chosen = spectrum_layers(layers, setup.spectrum_fraction)
        model.requires_grad_(False)
        for i in chosen:
            for module in blocks[i].modules():
                for param in module.parameters(recurse=False):
                    if param.ndim >= 2 or isinstance(module, nn.Linear):
                        param.requires_grad_(True)
        return model, chosen
    if setup.method == "freeze":
        frozen = layers // 2 if setup.freeze_layers is None else setup.freeze_layers
        if frozen > layers:
            raise ConfigurationError(f"--freeze-layers {frozen}: the model has {layers} blocks")
        model.get_input_embeddings().requires_grad_(False)
        for block in blocks[:frozen]:
            block.requires_grad_(False)
        return model, tuple(range(frozen, layers))
    raise ConfigurationError(f"unknown method {setup.method!r}")


def check_stack(setup: MethodSetup, layers: int | None, family: Family) -> None:
    """Raises the one-line refusal of spectrum or freeze on a family without one list of
    blocks (``layers`` is ``None``)."""
    if layers is None and setup.method in STACK_METHODS:
        raise ConfigurationError(
            f"{setup.method} needs the model's one list of transformer blocks; "
            f"a {family.model_type} {family.name} model has no single stack to choose from "
            "(plan full, lora or qlora)"
        )


def method_model(
    config: dict[str, Any], setup: MethodSetup, layers: int | None, family: Family
) -> tuple[Any, tuple[int, ...] | None]:
    """The model of ``config`` built for ``family`` on meta, set up for ``setup``, in training
    mode; and the blocks that train (spectrum, freeze; ``None`` otherwise).

    Raises:
        ConfigurationError: transformers or peft cannot build it, or the method needs one list
            of blocks the family does not have (``layers`` is ``None``).
    """
    check_stack(setup, layers, family)
    with warnings.catch_warnings():  # transformers' deprecation notices are not the user's
        warnings.simplefilter("ignore", FutureWarning)
        model, blocks = _apply(_base_model(config, family), setup, layers or 0, family)
    return model.train(), blocks


def cost_on_meta(
    config: dict[str, Any], setup: MethodSetup, layers: int, family: Family | None = None
) -> MetaCost:
    """The census and profile of the model of ``config`` set up for ``setup`` (on meta).

    Args:
        config: A ``config.json`` dictionary.
        setup: The method and its settings.
        layers: The number of transformer blocks (from the architecture).
        family: The text-only family to build (decoder or encoder; default a causal LM).

    Raises:
        ConfigurationError: transformers or peft cannot build it, or the profile fails.
    """
    with warnings.catch_warnings():  # transformers' deprecation notices are not the user's
        warnings.simplefilter("ignore", FutureWarning)
        model, blocks = _apply(_base_model(config, family), setup, layers, family)
    model.train()
    return MetaCost(take_census(model), profile_on_meta(model, setup, family), blocks, model)


def profile_on_meta(model: Any, setup: MethodSetup, family: Family | None = None) -> ModelProfile:
    """The meter's profile of ``model`` (on meta, set up for ``setup``, in training mode): one
    forward pass of :data:`PROFILE_TOKENS` meta tokens.

    Raises:
        ConfigurationError: the profile fails (the first line of why).
    """
    import torch

    from flopmeter.flops.capture import profile_model

    ids = torch.zeros((1, PROFILE_TOKENS), dtype=torch.long, device="meta")
    classifier = family is not None and family.auto_class == "AutoModelForSequenceClassification"
    labels = torch.zeros((1,), dtype=torch.long, device="meta") if classifier else ids
    try:
        with meta_autocast(), warnings.catch_warnings():
            warnings.simplefilter("ignore", FutureWarning)
            return profile_model(model, input_ids=ids, labels=labels)
    except (ValueError, RuntimeError, NotImplementedError) as exc:
        first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise ConfigurationError(
            f"the {setup.method} model cannot be profiled on meta: {first}"
        ) from None
