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


class ReportFileError(ConfigurationError):
    """A report file cannot be read as a flopmeter report: missing, not JSON, or not the schema.

    The message names the file and, where there is one, the field (``path``: ``field`` ...).

    Attributes:
        path: The file, as it was named.
        field: The field at fault (dotted for nested ones, e.g. ``estimates.seed.flops``), or
            ``None`` when the fault is the file as a whole.
    """

    def __init__(self, path: str, message: str, field: str | None = None) -> None:
        where = f"{path}: field {field!r}: " if field is not None else f"{path}: "
        super().__init__(where + message)
        self.path = path
        self.field = field
