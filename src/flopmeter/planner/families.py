"""Which family a configuration belongs to, and so which model the planner builds for it.

A plan builds the model the way people fine-tune it: a decoder-only LM as a causal LM; an
encoder (BERT, RoBERTa, ModernBERT) as its masked-LM model, or as a sequence classifier when
its ``architectures`` say so; an encoder-decoder (T5, BART) as a sequence-to-sequence LM; a
vision-language model (LLaVA) as an image-text-to-text model; a speech model (Whisper) as a
speech sequence-to-sequence model. Anything else (a diffusion model, an image-only or
audio-only encoder, an architecture transformers has no training head for) is refused in one
line that names the family and what a plan of it would need.

transformers is imported inside :func:`detect_family`, when a plan is made.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from flopmeter.errors import ConfigurationError

__all__ = ["FAMILY_NAMES", "Family", "FamilyName", "detect_family", "refuse_diffusers"]

FamilyName = Literal["decoder", "encoder", "encoder-decoder", "vision-language", "speech"]

#: The families a plan covers, as the plan names them.
FAMILY_NAMES: dict[FamilyName, str] = {
    "decoder": "decoder-only language model",
    "encoder": "encoder",
    "encoder-decoder": "encoder-decoder",
    "vision-language": "vision-language model",
    "speech": "speech encoder-decoder",
}

#: Vision-language model types whose images are ``pixel_values`` of ``[images, 3, H, W]`` at
#: the vision config's ``image_size``, each standing in for a fixed number of positions of the
#: language model's sequence (``get_image_features`` then the language model on embeddings).
FIXED_IMAGE_VLMS = ("llava",)


@dataclass(frozen=True)
class Family:
    """The family of a configuration and the model the planner builds for it.

    Attributes:
        name: ``decoder``, ``encoder``, ``encoder-decoder``, ``vision-language`` or ``speech``.
        model_type: The configuration's ``model_type``.
        auto_class: The ``transformers`` auto class that builds it (``AutoModelForMaskedLM``).
        head: The training head, in words (``masked-LM head``).
    """

    name: FamilyName
    model_type: str
    auto_class: str
    head: str

    @property
    def text_only(self) -> bool:
        """Whether the model's only input is one text-token stream (the transformer estimate's
        and the meter's text rule's case)."""
        return self.name in ("decoder", "encoder")


def _in(mapping: Any, config: Any) -> bool:
    try:
        return type(config) in mapping
    except Exception:  # a lazy mapping that cannot import one of its models
        return False


def _architectures(config: dict[str, Any]) -> list[str]:
    names = config.get("architectures")
    return [n for n in names if isinstance(n, str)] if isinstance(names, list) else []


def _refuse(model_type: str, family: str, need: str) -> ConfigurationError:
    return ConfigurationError(
        f"{model_type}: {family} models are not planned ({need}); "
        "meter the run instead, or give --params for the seed and 6ND formulas"
    )


def refuse_diffusers(config: dict[str, Any]) -> None:
    """Raises the one-line refusal for a diffusers configuration (``_class_name``)."""
    if config.get("_class_name") or config.get("_diffusers_version"):
        raise _refuse(
            str(config.get("_class_name")),
            "diffusion",
            "the work is per denoising step on latents of a chosen resolution, and the "
            "timesteps and latent size are not a token budget",
        )


def detect_family(config: dict[str, Any], hf: Any) -> Family:
    """The family of ``config`` (a ``config.json`` dictionary; ``hf`` its transformers config).

    Raises:
        ConfigurationError: a family the planner cannot build on meta and cost (one line naming
            the family and what a plan would need).
    """
    import transformers.models.auto.modeling_auto as auto

    model_type = str(config.get("model_type") or getattr(hf, "model_type", "") or "unknown")
    refuse_diffusers(config)
    if _in(auto.MODEL_FOR_SPEECH_SEQ_2_SEQ_MAPPING, hf):
        if model_type != "whisper":
            raise _refuse(model_type, "speech", "only Whisper's fixed 30-s clips are planned")
        return Family("speech", model_type, "AutoModelForSpeechSeq2Seq", "speech-to-text LM head")
    if getattr(hf, "vision_config", None) is not None and _in(
        auto.MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING, hf
    ):
        if model_type not in FIXED_IMAGE_VLMS:
            raise _refuse(
                model_type,
                "vision-language",
                "images of a fixed size, each taking a fixed number of positions, are planned "
                f"for {', '.join(FIXED_IMAGE_VLMS)} only; this model's image tokens per image "
                "depend on the image",
            )
        return Family(
            "vision-language", model_type, "AutoModelForImageTextToText", "causal LM head"
        )
    if getattr(hf, "is_encoder_decoder", False):
        if not _in(auto.MODEL_FOR_SEQ_TO_SEQ_CAUSAL_LM_MAPPING, hf):
            raise _refuse(model_type, "encoder-decoder", "transformers has no seq2seq LM for it")
        return Family("encoder-decoder", model_type, "AutoModelForSeq2SeqLM", "seq2seq LM head")
    causal = _in(auto.MODEL_FOR_CAUSAL_LM_MAPPING, hf)
    masked = _in(auto.MODEL_FOR_MASKED_LM_MAPPING, hf)
    classifier = any(
        a.endswith("ForSequenceClassification") for a in _architectures(config)
    ) and _in(auto.MODEL_FOR_SEQUENCE_CLASSIFICATION_MAPPING, hf)
    # BERT-like models are in both mappings; their causal LM exists only with is_decoder=True.
    encoder = masked and (not causal or not getattr(hf, "is_decoder", False))
    if classifier and (encoder or causal):  # a decoder classifier: a reward model
        labels = getattr(hf, "num_labels", 2)
        head = f"sequence-classification head ({labels} labels, from architectures)"
        kind = "encoder" if encoder else "decoder"
        return Family(kind, model_type, "AutoModelForSequenceClassification", head)
    if encoder:
        return Family("encoder", model_type, "AutoModelForMaskedLM", "masked-LM head")
    if causal:
        return Family("decoder", model_type, "AutoModelForCausalLM", "causal LM head")
    if getattr(hf, "vision_config", None) is not None or "image_size" in config:
        raise _refuse(
            model_type,
            "vision",
            "an image-only model takes no token budget; a plan would need an image count and "
            "size, not built yet",
        )
    raise _refuse(model_type, "this", "transformers has no causal, masked or seq2seq LM for it")
