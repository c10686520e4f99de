"""The exceptions flopmeter raises on bad input."""

from __future__ import annotations


class FlopMeterError(Exception):
    """Base class of flopmeter's own errors."""


class ConfigurationError(FlopMeterError, ValueError):
    """An argument, environment variable or file path the meter was given cannot be used.

    Raised before training starts, so that a mistake costs seconds, not hours.
    """


class MissingExtraError(FlopMeterError, ImportError):
    """An optional dependency is needed for a feature and is not installed."""

    def __init__(self, package: str, extra: str, feature: str) -> None:
        super().__init__(
            f"{feature} needs the '{package}' package, which is not installed. "
            f"Install it with: pip install 'flopmeter[{extra}]'"
        )
        self.package = package
        self.extra = extra
