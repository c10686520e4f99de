"""flopmeter: measure the training compute of PyTorch runs against the EU AI Act thresholds.

Quick start::

    from flopmeter import FlopMeter

    with FlopMeter(model, pad_id=tokenizer.pad_token_id, output="out/") as meter:
        train(model)
    print(meter.report().to_text())

The names below are imported when first used (PEP 562), so ``import flopmeter`` and the
``flopmeter`` command's report, schema and threshold subcommands do not import torch.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from flopmeter._version import __version__

#: Each public name and the module that defines it.
_EXPORTS = {
    "BudgetExceeded": "flopmeter.errors",
    "ConfigurationError": "flopmeter.errors",
    "Estimate": "flopmeter.types",
    "FlopMeter": "flopmeter.meter",
    "FlopMeterError": "flopmeter.errors",
    "FlopReport": "flopmeter.report",
    "MeterOptions": "flopmeter.options",
    "MissingExtraError": "flopmeter.errors",
    "ReportFileError": "flopmeter.errors",
    "Threshold": "flopmeter.compliance.thresholds",
    "determine_threshold": "flopmeter.compliance.thresholds",
    "read_report": "flopmeter.report.reading",
    "verdict": "flopmeter.compliance.verdict",
}

__all__ = [
    "BudgetExceeded",
    "ConfigurationError",
    "Estimate",
    "FlopMeter",
    "FlopMeterError",
    "FlopReport",
    "MeterOptions",
    "MissingExtraError",
    "ReportFileError",
    "Threshold",
    "__version__",
    "determine_threshold",
    "read_report",
    "verdict",
]

if TYPE_CHECKING:
    from flopmeter.compliance.thresholds import Threshold, determine_threshold
    from flopmeter.compliance.verdict import verdict
    from flopmeter.errors import (
        BudgetExceeded,
        ConfigurationError,
        FlopMeterError,
        MissingExtraError,
        ReportFileError,
    )
    from flopmeter.meter import FlopMeter
    from flopmeter.options import MeterOptions
    from flopmeter.report import FlopReport
    from flopmeter.report.reading import read_report
    from flopmeter.types import Estimate


def __getattr__(name: str) -> Any:
    """Imports a public name on first use (``from flopmeter import FlopMeter`` works as ever)."""
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'flopmeter' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # later lookups skip this function
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_EXPORTS})
