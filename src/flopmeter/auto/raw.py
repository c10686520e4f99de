"""Zero-code attach to a raw loop's optimizer (issue 21, piece C): placeholder until that piece lands."""

from __future__ import annotations

from types import ModuleType

__all__ = ["patch_torch"]


def patch_torch(module: ModuleType) -> None:
    """Called by the import watch once ``module`` is imported (idempotent; never raises)."""
