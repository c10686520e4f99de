"""The trainers of the adapter tests: a Hugging Face ``Trainer`` and a Lightning ``Trainer``
that run quietly on the CPU, and a LightningModule around a Hugging Face causal LM.

Transformers and Lightning are imported where they are used, so a test module that needs only
one of them imports this module without the other installed.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import torch

#: The arguments of a quiet CPU run of a Hugging Face trainer: no reporting integration, no
#: progress bar.
QUIET: dict[str, Any] = dict(report_to=[], use_cpu=True, disable_tqdm=True)


def hf_arguments(output_dir: str | Path, **settings: Any):
    """``TrainingArguments`` of a quiet CPU run into ``output_dir`` (no reporting integration,
    no progress bar), with ``settings`` for everything else."""
    from transformers import TrainingArguments

    return TrainingArguments(output_dir=str(output_dir), **{**QUIET, **settings})


def hf_trainer(
    output_dir: str | Path,
    *,
    model: torch.nn.Module,
    train_dataset: Any,
    data_collator: Callable[..., Any],
    callbacks: list[Any],
    eval_dataset: Any = None,
    processing_class: Any = None,
    **settings: Any,
):
    """A Hugging Face ``Trainer`` of ``model`` with ``hf_arguments(output_dir, **settings)``."""
    from transformers import Trainer

    return Trainer(
        model=model,
        args=hf_arguments(output_dir, **settings),
        train_dataset=train_dataset,
        eval_dataset=eval_dataset,
        data_collator=data_collator,
        processing_class=processing_class,
        callbacks=callbacks,
    )


def sft_trainer(
    output_dir: str | Path,
    *,
    model: torch.nn.Module,
    train_dataset: Any,
    processing_class: Any,
    peft_config: Any,
    callbacks: list[Any],
    eval_dataset: Any = None,
    **settings: Any,
):
    """A TRL ``SFTTrainer`` of ``model`` on a quiet CPU run into ``output_dir`` (as
    ``hf_arguments``), with ``settings`` for the rest of its ``SFTConfig``."""
    from trl import SFTConfig, SFTTrainer

    return SFTTrainer(
        model=model,
        args=SFTConfig(output_dir=str(output_dir), **{**QUIET, **settings}),
        train_dataset=train_dataset,
        eval_dataset=eval_dataset,
        processing_class=processing_class,
        peft_config=peft_config,
        callbacks=callbacks,
    )


def lightning_trainer(root: str | Path, callbacks: Iterable[Any], **settings: Any):
    """A Lightning ``Trainer`` on one CPU device under ``root``: no logger, no progress bar, no
    model summary, and checkpointing exactly when ``callbacks`` hold a ``ModelCheckpoint``;
    ``settings`` override any of these or add more."""
    import lightning.pytorch as pl
    from lightning.pytorch.callbacks import ModelCheckpoint

    callbacks = list(callbacks)
    options: dict[str, Any] = dict(
        default_root_dir=str(root),
        accelerator="cpu",
        devices=1,
        logger=False,
        callbacks=callbacks,
        enable_checkpointing=any(isinstance(c, ModelCheckpoint) for c in callbacks),
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    options.update(settings)
    return pl.Trainer(**options)


def adamw(parameters: Iterable[torch.nn.Parameter]) -> torch.optim.Optimizer:
    """AdamW at learning rate 1e-3."""
    return torch.optim.AdamW(parameters, lr=1e-3)


def lightning_module(
    model: torch.nn.Module,
    optimizer: Callable[[Iterable[torch.nn.Parameter]], torch.optim.Optimizer] = adamw,
):
    """A LightningModule around a Hugging Face causal LM: ``training_step`` and
    ``validation_step`` return ``model(**batch).loss`` (``self.model``, never ``self(...)``),
    ``configure_optimizers`` gives ``optimizer(self.parameters())``, and ``batches`` counts the
    training batches it ran."""
    return _module_class()(model, optimizer)


@functools.cache
def _module_class() -> type:
    import lightning.pytorch as pl

    class CausalLM(pl.LightningModule):
        def __init__(self, model: torch.nn.Module, optimizer: Callable[..., Any]) -> None:
            super().__init__()
            self.model = model
            self.make_optimizer = optimizer
            self.batches = 0

        def training_step(self, batch, batch_idx):
            self.batches += 1
            return self.model(**batch).loss

        def validation_step(self, batch, batch_idx):
            return self.model(**batch).loss

        def configure_optimizers(self):
            return self.make_optimizer(self.parameters())

    return CausalLM
