"""Zero-code attach to the Hugging Face Trainer (issue 21, piece B): placeholder until that piece lands."""

from __future__ import annotations

from types import ModuleType

__all__ = ["patch_trainer_module"]


def patch_trainer_module(module: ModuleType) -> None:
    """Called by the import watch once ``module`` is imported (idempotent; never raises)."""
