"""A ``config.json``'s sizes checked before any model is built: whole numbers within real bounds.

The planner builds the model of a configuration on the meta device, and transformers allocates
(or refuses, with errors of its own) from whatever numbers it is given: a negative width, a
layer count of 10^12, a string, a NaN. :func:`check_config_sizes` reads every size a model's
shape is made of, at any depth of the configuration (the text, vision and audio sub-configs),
and refuses one that is not a whole number within a bound no released model comes near, with
the bound in the message; and a configuration nested too deeply or too large to be a model's.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from flopmeter.errors import ConfigurationError

__all__ = ["MAX_CONFIG_DEPTH", "MAX_CONFIG_ENTRIES", "SIZE_BOUNDS", "check_config_sizes"]

#: The deepest nesting of objects and lists a configuration may have (real ones: 3 or 4).
MAX_CONFIG_DEPTH = 16
#: The most entries (keys and list items, at every depth) a configuration may have.
MAX_CONFIG_ENTRIES = 100_000

_LAYERS = (1, 512)  # the deepest released models have about 160 layers
_WIDTH = (1, 1 << 16)  # 65,536: the widest released models are about 25,600 wide
_FFN = (1, 1 << 20)
_HEADS = (1, 4096)
_EXPERTS = (0, 1 << 14)  # 0: a dense model's configuration of a mixture-of-experts class

#: Each size key, and the whole numbers it may hold (inclusive).
SIZE_BOUNDS: dict[str, tuple[int, int]] = {
    **dict.fromkeys(
        ("num_hidden_layers", "num_layers", "n_layer", "encoder_layers", "decoder_layers"),
        _LAYERS,
    ),
    **dict.fromkeys(("hidden_size", "d_model", "n_embd", "projection_dim"), _WIDTH),
    **dict.fromkeys(
        (
            "intermediate_size",
            "moe_intermediate_size",
            "encoder_ffn_dim",
            "decoder_ffn_dim",
            "ffn_dim",
            "n_inner",
            "d_ff",
        ),
        _FFN,
    ),
    **dict.fromkeys(
        (
            "num_attention_heads",
            "num_key_value_heads",
            "encoder_attention_heads",
            "decoder_attention_heads",
            "n_head",
            "num_heads",
            "head_dim",
            "d_kv",
        ),
        _HEADS,
    ),
    **dict.fromkeys(("num_local_experts", "num_experts"), _EXPERTS),
    "num_experts_per_tok": (0, 1024),
    "vocab_size": (1, 1 << 23),
    "max_position_embeddings": (1, 1 << 25),
    "image_size": (1, 1 << 14),
    "patch_size": (1, 1024),
    "num_mel_bins": (1, 1024),
    "state_size": (1, 4096),
    "conv_kernel": (1, 64),
}

#: Sizes a configuration may leave null (transformers then derives them).
_MAY_BE_NULL = frozenset(
    {
        "num_key_value_heads",
        "head_dim",
        "intermediate_size",
        "moe_intermediate_size",
        "n_inner",
        "num_local_experts",
        "num_experts",
        "num_experts_per_tok",
        "max_position_embeddings",
    }
)


def _shown(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 40 else f"{text[:20]}...({len(text)} characters)"


def _check_size(where: str, key: str, value: Any) -> None:
    low, high = SIZE_BOUNDS[key]
    if value is None and key in _MAY_BE_NULL:
        return
    whole = isinstance(value, int) and not isinstance(value, bool)
    if isinstance(value, float) and math.isfinite(value):
        whole = False  # 64.0 is not a size transformers accepts everywhere: say so
    if not whole or not low <= value <= high:
        raise ConfigurationError(
            f"{where}{key} must be a whole number from {low:,} to {high:,} (no released model "
            f"is outside that), got {_shown(value)}"
        )


def check_config_sizes(config: Mapping[str, Any], source: str) -> None:
    """Checks the sizes of ``config`` (a ``config.json`` object) before a model is built.

    Args:
        config: The configuration.
        source: Where it came from, for the message (a path, a bundled name).

    Raises:
        ConfigurationError: a size (:data:`SIZE_BOUNDS`) that is not a whole number within its
            bound, at any depth; nesting deeper than :data:`MAX_CONFIG_DEPTH`, or more than
            :data:`MAX_CONFIG_ENTRIES` entries.
    """
    stack: list[tuple[str, Any, int]] = [("", config, 1)]
    entries = 0
    while stack:
        where, node, depth = stack.pop()
        if depth > MAX_CONFIG_DEPTH:
            raise ConfigurationError(
                f"{source}: the configuration is nested deeper than {MAX_CONFIG_DEPTH} levels "
                f"(at {where.rstrip('.') or 'its top'}): not a model's configuration"
            )
        items = node.items() if isinstance(node, Mapping) else enumerate(node)
        for key, value in items:
            entries += 1
            if entries > MAX_CONFIG_ENTRIES:
                raise ConfigurationError(
                    f"{source}: the configuration has more than {MAX_CONFIG_ENTRIES:,} entries: "
                    "not a model's configuration"
                )
            if isinstance(key, str) and key in SIZE_BOUNDS:
                for size in value if isinstance(value, list) else [value]:  # per block, as Swin's
                    _check_size(f"{source}: {where}", key, size)
            if isinstance(value, (Mapping, list)):
                stack.append((f"{where}{key}.", value, depth + 1))
