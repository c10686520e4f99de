"""Which model a plan is for: a ``config.json``, a model folder, or a bundled model id.

The bundled configurations (``src/flopmeter/data/configs/*.json``) are copies of the public
``config.json`` of the models people fine-tune most. A model id resolves by its name, with the
organisation and an instruct/chat suffix left out (``meta-llama/Llama-3.2-3B-Instruct`` is
``llama-3.2-3b``: an instruct model has its base model's architecture), or through
:data:`ALIASES` where the published name differs from the bundled one.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from flopmeter.errors import ConfigurationError
from flopmeter.flops.architecture import BUNDLED_CONFIGS, bundled_config
from flopmeter.planner.config_checks import check_config_sizes

__all__ = ["ALIASES", "ResolvedModel", "bundled_model_ids", "known_model_ids", "resolve_model"]

#: Published names (lower case, organisation left out) whose bundled configuration has
#: another name: the same architecture under a later version or a longer name.
ALIASES: dict[str, str] = {
    "meta-llama-3.1-8b": "llama-3.1-8b",
    "meta-llama-3.1-70b": "llama-3.1-70b",
    "llama-3.3-70b": "llama-3.1-70b",  # Llama 3.3 70B: the 3.1 70B architecture
    "mistral-7b": "mistral-7b-v0.3",
    "phi-3.5-mini": "phi-3-mini-4k",  # same geometry; only the RoPE scaling differs
    "mixtral-8x7b-v0.1": "mixtral-8x7b",
    "llava-1.5-7b-hf": "llava-1.5-7b",  # llava-hf/llava-1.5-7b-hf
}

#: The organisation of each bundled family, to print ids as people write them.
_ORGS = {
    "llama": "meta-llama",
    "qwen": "Qwen",
    "mistral": "mistralai",
    "mixtral": "mistralai",
    "gemma": "google",
    "phi": "microsoft",
    "smollm2": "HuggingFaceTB",
    "bert": "google-bert",
    "bart": "facebook",
    "whisper": "openai",
    "llava": "llava-hf",
}
_SUFFIX = re.compile(r"-(instruct|it|chat)(?=(-v\d+(\.\d+)*)?$)")


@dataclass(frozen=True)
class ResolvedModel:
    """A model a plan is for.

    Attributes:
        model_id: As the user named it (a model id, or the path given).
        config: The ``config.json`` contents.
        source: Where the configuration came from, in words.
    """

    model_id: str
    config: dict[str, Any]
    source: str


def known_model_ids() -> list[str]:
    """The bundled configurations' names (each also answers to its ``org/Name`` id)."""
    return sorted(BUNDLED_CONFIGS)


def bundled_model_ids() -> list[str]:
    """Every bundled configuration by the id a user gives (``meta-llama/llama-3.2-3b``):
    what ``flopmeter estimate --list`` prints."""
    return [_org_id(name) for name in known_model_ids()]


def _org_id(name: str) -> str:
    """``llama-3.2-3b`` as ``meta-llama/llama-3.2-3b`` (ids match case-insensitively)."""
    org = next((o for prefix, o in _ORGS.items() if name.startswith(prefix)), None)
    return f"{org}/{name}" if org else name


def _bundled_name(model_id: str) -> str | None:
    name = model_id.strip().rsplit("/", 1)[-1].lower()
    for candidate in (name, _SUFFIX.sub("", name)):
        candidate = ALIASES.get(candidate, candidate)
        if candidate in BUNDLED_CONFIGS:
            return candidate
        # "-4k-instruct" and "-v0.3" forms: drop the suffix, keep the version
        versioned = re.sub(r"-(instruct|it|chat)", "", candidate)
        versioned = ALIASES.get(versioned, versioned)
        if versioned in BUNDLED_CONFIGS:
            return versioned
    return None


#: transformers writes a float JSON has no literal for as ``{"__float__": TAG}`` (Mamba2's
#: ``time_step_limit``: ``[0.0, {"__float__": "Infinity"}]``) and reads it back as the float.
_FLOAT_TAGS = {"Infinity": float("inf"), "-Infinity": float("-inf"), "NaN": float("nan")}


def _float_tags_decoded(value: Any) -> Any:
    """``value`` with transformers' float tags read as the floats they stand for (a dict of
    the one key ``__float__`` and a known tag); anything else as it is."""
    if isinstance(value, dict):
        tag = value.get("__float__") if len(value) == 1 else None
        if isinstance(tag, str) and tag in _FLOAT_TAGS:
            return _FLOAT_TAGS[tag]
        return {k: _float_tags_decoded(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_float_tags_decoded(v) for v in value]
    return value


def _read_config(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise ConfigurationError(f"cannot read {path}: {exc.strerror or exc}") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ConfigurationError(f"{path} is not valid JSON: {exc}") from None
    except RecursionError:
        raise ConfigurationError(f"{path} is nested too deeply to be a config.json") from None
    except ValueError as exc:  # an integer past Python's 4,300-digit limit for text
        raise ConfigurationError(f"{path} holds a number that cannot be read: {exc}") from None
    if not isinstance(data, dict):
        raise ConfigurationError(f"{path} is not a config.json (a JSON object is expected)")
    try:
        data = _float_tags_decoded(data)
    except RecursionError:
        raise ConfigurationError(f"{path} is nested too deeply to be a config.json") from None
    if "model_type" not in data and "text_config" not in data and "_class_name" not in data:
        raise ConfigurationError(f"{path} has no model_type: not a Hugging Face config.json")
    check_config_sizes(data, str(path))
    return data


def resolve_model(model: str | Path) -> ResolvedModel:
    """The configuration of ``model``: a ``config.json``, a folder holding one, or a model id.

    Raises:
        ConfigurationError: a path that does not hold a readable ``config.json``, or an id with
            no bundled configuration (the message lists a few that exist).
    """
    text = str(model)
    path = Path(text).expanduser()
    if path.is_dir():
        config = path / "config.json"
        if not config.is_file():
            raise ConfigurationError(f"{path} holds no config.json")
        return ResolvedModel(text, _read_config(config), f"local config {config}")
    if path.is_file() or text.endswith(".json"):
        if not path.is_file():
            raise ConfigurationError(f"no such file: {path}")
        return ResolvedModel(text, _read_config(path), f"local config {path}")
    name = _bundled_name(text)
    if name is None:
        examples = ", ".join(_org_id(n) for n in known_model_ids()[::4])
        raise ConfigurationError(
            f"unknown model {text!r}: not a path, and no bundled configuration for it "
            f"(bundled: {examples}, ... {len(BUNDLED_CONFIGS)} in all: `flopmeter estimate "
            "--list` names them; or pass a config.json, "
            "or --params for a model without one)"
        )
    return ResolvedModel(text, bundled_config(name), f"bundled config {name}")
