"""flopmeter: measure the training compute of PyTorch runs against the EU AI Act thresholds.

Quick start::

    from flopmeter import FlopMeter

    with FlopMeter(model, pad_id=tokenizer.pad_token_id, output="out/") as meter:
        train(model)
    print(meter.report().to_text())
"""

from flopmeter.compliance import Threshold, determine_threshold, verdict
from flopmeter.errors import (
    BudgetExceeded,
    ConfigurationError,
    FlopMeterError,
    MissingExtraError,
)
from flopmeter.meter import FlopMeter
from flopmeter.report import Estimate, FlopReport

__version__ = "0.1.0"

__all__ = [
    "BudgetExceeded",
    "ConfigurationError",
    "Estimate",
    "FlopMeter",
    "FlopMeterError",
    "FlopReport",
    "MissingExtraError",
    "Threshold",
    "__version__",
    "determine_threshold",
    "verdict",
]
