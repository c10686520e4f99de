"""Zero-code metering's start in each Python process (from the ``.pth`` file or ``flopmeter
run``'s ``sitecustomize``): installs the import watch, and nothing heavier.

(Placeholder signature; the implementation lands with issue 21's boot work.)
"""

from __future__ import annotations

__all__ = ["boot"]


def boot(launcher: str = "environment") -> None:
    """Switches zero-code metering on in this process (once; never raises)."""
