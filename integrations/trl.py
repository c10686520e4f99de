"""TRL's post-training trainers, named for the meter: their other models (reference,
teacher, reward and value models, reward functions that are models) each its own phase from
the start, and what the meter cannot see (vLLM generation, precomputed reference log-probs)
declared as not seen. Used by the Hugging Face callback; needs neither TRL nor transformers."""

from __future__ import annotations

import logging
from typing import Any

logger = logging.getLogger("flopmeter")

__all__ = ["TRAINER_MODELS", "name_trainer_models"]


#: A post-training trainer's other models, by attribute (TRL's DPO, GRPO, PPO, RLOO, GKD and
#: distillation trainers): their forward passes while the model trains are their own phase.
TRAINER_MODELS = {
    "ref_model": "reference",
    "teacher_model": "teacher",
    "reward_model": "reward model",
    "value_model": "value model",
}


def name_trainer_models(meter: Any, trainer: Any) -> None:
    """Names a post-training trainer's other models in ``meter`` (each its own phase, watched
    from the start), and declares as not seen what the meter cannot watch: generation in vLLM
    (``use_vllm``), reference log-probs a DPO trainer computed in its ``__init__``
    (``precompute_ref_log_probs``). Never raises: a model not named is still found by the
    meter's discovery."""
    import torch

    try:
        seen: set[int] = set()
        named: list[tuple[Any, str]] = [
            (getattr(trainer, attr, None), name) for attr, name in TRAINER_MODELS.items()
        ]
        funcs = getattr(trainer, "reward_funcs", None) or []
        named += [(f, f"reward model {i + 1}") for i, f in enumerate(funcs)]
        for module, name in named:
            if isinstance(module, torch.nn.Module) and id(module) not in seen:
                seen.add(id(module))
                meter.name_model(module, name)
        args = getattr(trainer, "args", None)
        if getattr(args, "use_vllm", False):
            meter.declare_phase(
                "generation (vLLM)",
                None,
                "TRL generated the completions in vLLM (use_vllm=True), outside this process's "
                "PyTorch: the meter does not see that work; declare its figure with "
                "meter.declare_phase, or judge the training passes alone (phases='updates')",
            )
        if getattr(args, "precompute_ref_log_probs", False):
            meter.declare_phase(
                "reference log-probs (precomputed)",
                None,
                "TRL computed the reference log-probs when the trainer was made "
                "(precompute_ref_log_probs=True), before the meter started, or read them from "
                "its cache: declare their figure with meter.declare_phase, or judge the "
                "training passes alone (phases='updates')",
            )
    except Exception as exc:  # the meter never breaks training
        logger.warning("flopmeter: could not name the trainer's other models: %s", exc)
