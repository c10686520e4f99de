"""The meter's options as environment variables, for zero-code metering (placeholder: the table
of every option lands with issue 21's ``flopmeter run`` piece).

Each option ``name`` is ``FLOPMETER_<NAME>`` (``pretrain_flops`` keeps ``PRETRAIN_FLOPS``).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

__all__ = ["options_from_env"]


def options_from_env(environ: Mapping[str, str] | None = None) -> dict[str, Any]:
    """The meter options the environment gives, by option name (values parsed, not yet
    validated: ``MeterOptions`` checks them)."""
    env = os.environ if environ is None else environ
    out: dict[str, Any] = {}
    if env.get("FLOPMETER_OUTPUT"):
        out["output"] = env["FLOPMETER_OUTPUT"]
    if env.get("FLOPMETER_PAD_ID"):
        out["pad_id"] = int(env["FLOPMETER_PAD_ID"])
    return out
