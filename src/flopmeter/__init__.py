"""flopmeter: measure the training compute of PyTorch runs against the EU AI Act thresholds.

Quick start::

    from flopmeter import FlopMeter

    with FlopMeter(model, pad_id=tokenizer.pad_token_id, output="out/") as meter:
        train(model)
    print(meter.report().to_text())
"""

from typing import TYPE_CHECKING, Any

from flopmeter.compliance import Threshold, determine_threshold, verdict
from flopmeter.errors import ConfigurationError, FlopMeterError, MissingExtraError
from flopmeter.report import Estimate, FlopReport

if TYPE_CHECKING:
    from flopmeter.meter import FlopMeter


def __getattr__(name: str) -> Any:
    """``FlopMeter`` (and torch with it) is imported on first use, so that the command line
    (``flopmeter threshold``, ``estimate --params``, ``show``) starts without torch."""
    if name == "FlopMeter":
        from flopmeter.meter import FlopMeter

        return FlopMeter
    raise AttributeError(f"module 'flopmeter' has no attribute {name!r}")


__version__ = "0.1.0"

__all__ = [
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
