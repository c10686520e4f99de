"""The architecture of a transformer, read from its configuration.

What the modules cannot show is read from the model's configuration: the attention geometry
(layers, query heads, key/value heads, ``head_dim``, sliding windows per layer) and the
mixture-of-experts routing (experts, experts per token). Hugging Face configuration objects and
plain ``config.json`` dictionaries both work; the configurations of a few public models are
bundled (:func:`bundled_config`).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from importlib import resources
from typing import Any

__all__ = [
    "BUNDLED_CONFIGS",
    "Architecture",
    "bundled_config",
    "read_architecture",
]

#: Bundled ``config.json`` files (public facts from the models' repositories), by short name:
#: every ``data/configs/*.json``.
BUNDLED_CONFIGS = tuple(
    sorted(
        entry.name.removesuffix(".json")
        for entry in resources.files("flopmeter").joinpath("data", "configs").iterdir()
        if entry.name.endswith(".json")
    )
)

_ALIASES: dict[str, tuple[str, ...]] = {
    "layers": ("num_hidden_layers", "n_layer", "num_layers"),
    "hidden": ("hidden_size", "n_embd", "d_model"),
    "heads": ("num_attention_heads", "n_head"),
    "kv_heads": ("num_key_value_heads", "num_kv_heads", "multi_query_group_num"),
    "head_dim": ("head_dim",),
    "intermediate": ("intermediate_size", "n_inner", "ffn_dim"),
    "vocab": ("vocab_size",),
    "experts": ("num_local_experts", "num_experts", "n_routed_experts"),
    "top_k": ("num_experts_per_tok", "moe_top_k", "top_k_experts"),
    "moe_intermediate": ("moe_intermediate_size",),
}


@dataclass(frozen=True)
class Architecture:
    """The numbers of a decoder-only transformer that its FLOP depend on, beyond its weights.

    Attributes:
        model_type: The configuration's ``model_type`` ("llama", "gpt2", ...), or "unknown".
        num_layers: Transformer blocks (each with one self-attention).
        hidden_size: Width of the residual stream.
        num_attention_heads: Query heads.
        num_key_value_heads: Key/value heads (fewer than query heads: grouped-query attention).
        head_dim: Width of one query/key head, the width the scores are taken over (may differ
            from ``hidden_size / num_attention_heads``; multi-head latent attention:
            ``qk_nope_head_dim + qk_rope_head_dim``).
        intermediate_size: Width of the MLP (of one expert in a mixture-of-experts).
        vocab_size: Vocabulary entries.
        tie_word_embeddings: Whether the output projection shares the embedding table.
        layer_windows: Per layer, the sliding-window length, or None for full attention.
        num_experts: Experts per mixture-of-experts layer; None for a dense model.
        experts_per_token: Experts each token is routed to (top-k); None for a dense model.
        value_head_dim: Width of one value head where it differs from ``head_dim``
            (multi-head latent attention's ``v_head_dim``); None when it is ``head_dim``.
    """

    model_type: str
    num_layers: int
    hidden_size: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    intermediate_size: int | None
    vocab_size: int | None
    tie_word_embeddings: bool
    layer_windows: tuple[int | None, ...]
    num_experts: int | None = None
    experts_per_token: int | None = None
    value_head_dim: int | None = None

    @property
    def query_width(self) -> int:
        """``num_attention_heads * head_dim``: the width the attention scores are taken over."""
        return self.num_attention_heads * self.head_dim

    @property
    def value_width(self) -> int:
        """``num_attention_heads * value head dim``: the width of ``AV`` and its gradients."""
        return self.num_attention_heads * (self.value_head_dim or self.head_dim)

    @property
    def sliding_window(self) -> int | None:
        """The window of the windowed layers (None when every layer attends in full)."""
        windows = {w for w in self.layer_windows if w is not None}
        return min(windows) if windows else None

    def to_dict(self) -> dict[str, Any]:
        """Plain data for a report's ``inputs`` (per-layer windows compressed)."""
        data = asdict(self)
        windows = data.pop("layer_windows")
        data["sliding_window"] = self.sliding_window
        data["windowed_layers"] = [i for i, w in enumerate(windows) if w is not None]
        return data


def _get(config: Any, key: str) -> Any:
    for name in _ALIASES.get(key, (key,)):
        value = config.get(name) if isinstance(config, Mapping) else getattr(config, name, None)
        if value is not None:
            return value
    return None


def _positive_int(value: Any) -> int | None:
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        return None
    return value


def _text_config(config: Any) -> Any:
    if isinstance(config, Mapping):
        inner = config.get("text_config")
        return inner if isinstance(inner, Mapping) else config
    get_text = getattr(config, "get_text_config", None)
    if callable(get_text):
        try:
            return get_text()
        except Exception:  # pragma: no cover - unusual configs
            return config
    return config


def _layer_windows(config: Any, layers: int) -> tuple[int | None, ...]:
    window = _positive_int(_get(config, "sliding_window"))
    if isinstance(config, Mapping) and config.get("use_sliding_window") is False:
        window = None
    layer_types = _get(config, "layer_types")
    if isinstance(layer_types, (list, tuple)) and len(layer_types) == layers:
        return tuple(window if t == "sliding_attention" else None for t in layer_types)
    return (window,) * layers


def read_architecture(config: Any) -> tuple[Architecture | None, str | None]:
    """Reads a decoder-only transformer's architecture from its configuration.

    Args:
        config: A Hugging Face configuration object, or a ``config.json`` dictionary.

    Returns:
        ``(architecture, None)``, or ``(None, reason)`` when the configuration does not
        describe a decoder-only transformer flopmeter can read.
    """
    if config is None:
        return None, "the model has no configuration"
    config = _text_config(config)
    if _get(config, "is_encoder_decoder"):
        return None, "encoder-decoder models are not modelled (cross-attention lengths differ)"
    layers = _positive_int(_get(config, "layers"))
    hidden = _positive_int(_get(config, "hidden"))
    heads = _positive_int(_get(config, "heads"))
    if layers is None or hidden is None or heads is None:
        return None, (
            "the configuration lacks the number of layers, hidden size or attention heads"
        )
    kv_heads = _positive_int(_get(config, "kv_heads")) or heads
    head_dim = _positive_int(_get(config, "head_dim")) or hidden // heads
    value_head_dim = None
    nope = _positive_int(_get(config, "qk_nope_head_dim"))
    rope = _positive_int(_get(config, "qk_rope_head_dim"))
    if nope is not None and rope is not None:
        # multi-head latent attention (DeepSeek-V2/V3): ``head_dim`` is the rope part; the
        # scores are taken over nope + rope, the values are v_head_dim wide
        head_dim = nope + rope
        value_head_dim = _positive_int(_get(config, "v_head_dim"))
        if value_head_dim == head_dim:
            value_head_dim = None
    if heads % kv_heads:
        return None, f"{heads} query heads cannot be grouped over {kv_heads} key/value heads"
    experts = _positive_int(_get(config, "experts"))
    top_k = _positive_int(_get(config, "top_k")) if experts else None
    intermediate = _positive_int(_get(config, "intermediate"))
    if (
        intermediate is None
        and _get(config, "n_inner") is None
        and "n_embd" in (config if isinstance(config, Mapping) else vars(config))
    ):
        intermediate = 4 * hidden  # GPT-2: n_inner None means 4 * n_embd
    tie = _get(config, "tie_word_embeddings")
    model_type = _get(config, "model_type")
    return (
        Architecture(
            model_type=str(model_type) if model_type else "unknown",
            num_layers=layers,
            hidden_size=hidden,
            num_attention_heads=heads,
            num_key_value_heads=kv_heads,
            head_dim=head_dim,
            intermediate_size=intermediate,
            vocab_size=_positive_int(_get(config, "vocab")),
            tie_word_embeddings=bool(tie) if tie is not None else True,
            layer_windows=_layer_windows(config, layers),
            num_experts=experts,
            experts_per_token=top_k,
            value_head_dim=value_head_dim,
        ),
        None,
    )


def bundled_config(name: str) -> dict[str, Any]:
    """A bundled ``config.json`` (see :data:`BUNDLED_CONFIGS`) as a dictionary.

    Raises:
        KeyError: ``name`` is not bundled.
    """
    if name not in BUNDLED_CONFIGS:
        raise KeyError(f"No bundled configuration {name!r}; bundled: {', '.join(BUNDLED_CONFIGS)}")
    text = (
        resources.files("flopmeter")
        .joinpath("data", "configs", f"{name}.json")
        .read_text(encoding="utf-8")
    )
    return json.loads(text)
