"""The exceptions flopmeter raises on bad input."""

from __future__ import annotations


class FlopMeterError(Exception):
    """Base class of flopmeter's own errors."""


class ConfigurationError(FlopMeterError, ValueError):
    """An argument, environment variable or file path the meter was given cannot be used.

    Raised before training starts, so that a mistake costs seconds, not hours.
    """


class OutputHeld(ConfigurationError):
    """The report file is being written by another live run (it holds the file's lock).

    Attributes:
        holder: That run's process id as its lock file says it (``"unknown"`` when unsaid).
    """

    def __init__(self, message: str, holder: str) -> None:
        super().__init__(message)
        self.holder = holder


class BudgetExceeded(FlopMeterError):
    """Raised from the optimizer step after which the next step would cross the compute budget
    (``FlopMeter(..., budget_action="raise")``, see :mod:`flopmeter.budget`). The step it is
    raised from has completed (its update is applied), and its total is within the budget
    unless that very step was the first or larger than any before it (``flops_at_stop``). A
    resumed run already within one step of its budget raises it (``step`` 0) from its first
    training forward pass, before anything of the session has trained.

    Attributes:
        budget_flops: The budget, FLOP.
        flops_at_stop: The run's compute when it stopped, FLOP.
        step: The optimizer step (of this session) it stopped at.
    """

    def __init__(self, budget_flops: float, flops_at_stop: float, step: int) -> None:
        super().__init__(
            f"the compute budget of {budget_flops:.3e} FLOP would be crossed by the next "
            f"optimizer step: training stopped at step {step} with {flops_at_stop:.3e} FLOP"
        )
        self.budget_flops = budget_flops
        self.flops_at_stop = flops_at_stop
        self.step = step


class MissingExtraError(FlopMeterError, ImportError):
    """An optional dependency is needed for a feature and is not installed."""

    def __init__(self, package: str, extra: str, feature: str) -> None:
        super().__init__(
            f"{feature} needs the '{package}' package, which is not installed. "
            f"Install it with: pip install '{package}' (it is in flopmeter's '{extra}' extra; "
            'the README\'s "Install it in your project" says how to install flopmeter with its extras)'
        )
        self.package = package
        self.extra = extra


class ReportFileError(ConfigurationError):
    """A report file cannot be read as a flopmeter report: missing, not JSON, or not the schema.

    The message names the file and, where there is one, the field (``path``: ``field`` ...).

    Attributes:
        path: The file, as it was named.
        field: The field at fault (dotted for nested ones, e.g.
            ``compute.estimates.seed.flops``), or ``None`` when the fault is the file as a whole.
        reason: The message without the file and field.
    """

    def __init__(self, path: str, message: str, field: str | None = None) -> None:
        where = f"{path}: field {field!r}: " if field is not None else f"{path}: "
        super().__init__(where + message)
        self.path = path
        self.field = field
        self.reason = message
