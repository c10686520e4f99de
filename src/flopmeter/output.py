"""The report file on disk: where it goes, whether it can be written, and writing it.

Rank 0 writes the report; the path is checked when the meter starts, so a path that cannot be
written costs seconds, not a training run.
"""

from __future__ import annotations

import logging
import os
import tempfile
from pathlib import Path

from flopmeter.errors import ConfigurationError
from flopmeter.report import FlopReport

__all__ = ["DEFAULT_FILENAME", "check_writable", "resolve_output", "write_report"]

logger = logging.getLogger("flopmeter")

#: The file name used when ``output`` is a folder.
DEFAULT_FILENAME = "flops_meter.json"


def resolve_output(output: str | os.PathLike[str] | None) -> Path | None:
    """The file the report goes to; a folder (existing, or named with a trailing slash) gets
    ``flops_meter.json`` inside it.

    Raises:
        ConfigurationError: ``output`` is not a path.
    """
    if output is None:
        return None
    try:
        raw = os.fspath(output)
    except TypeError:
        raise ConfigurationError(
            f"output must be a file or folder path, got {type(output).__name__}."
        ) from None
    if isinstance(raw, bytes):
        raw = os.fsdecode(raw)
    path = Path(raw).expanduser()
    if path.is_dir() or raw.endswith(("/", os.sep)):
        path = path / DEFAULT_FILENAME
    return path


def check_writable(path: Path) -> None:
    """Fails now, not after hours of training, when ``path`` cannot be written.

    Raises:
        ConfigurationError: ``path`` is a folder, or its folder cannot be made or written.
    """
    if path.is_dir():
        raise ConfigurationError(f"output {str(path)!r} is a folder where a file is needed.")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=path.parent, prefix=".flopmeter-check-"):
            pass
    except OSError as exc:
        raise ConfigurationError(
            f"The report cannot be written to {str(path)!r}: {exc.strerror or exc}. "
            "Choose a folder this process can write to."
        ) from None


def write_report(report: FlopReport, path: Path) -> bool:
    """Writes ``report`` to ``path`` atomically; a failure is logged, never raised.

    Returns:
        Whether the file was written.
    """
    try:
        report.write_json(path)
    except OSError:
        logger.exception("flopmeter could not write its report to %s", path)
        return False
    return True
