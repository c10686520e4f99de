"""The parent runs a run continues: named by report path or run id, read strictly, up front.

``FlopMeter(parent_runs=[...])`` names the reports of the earlier runs of the same modification
(fine-tune, then fine-tune the result). Each is read with
:func:`~flopmeter.report.reading.read_report` when the meter is made, before training: a name that
does not lead to a readable report is a :class:`~flopmeter.errors.ConfigurationError` then, not
a surprise at the end. What a parent counts, and the sum, are :mod:`flopmeter.compliance.lineage`.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterable
from pathlib import Path

from flopmeter.compliance.lineage import node_from_report, parent_record
from flopmeter.errors import ConfigurationError, ReportFileError
from flopmeter.report import FlopReport
from flopmeter.report.output_path import DEFAULT_FILENAME
from flopmeter.report.reading import read_report
from flopmeter.types import ParentRun

__all__ = ["parent_run", "read_parent_runs", "validate_parent_refs"]

logger = logging.getLogger("flopmeter")


def validate_parent_refs(value: object) -> tuple[str, ...]:
    """``parent_runs`` as given: a list (or tuple) of report paths or run ids.

    Raises:
        ConfigurationError: not a list or tuple of non-empty strings or paths.
    """
    if value is None:
        return ()
    if isinstance(value, (str, bytes, os.PathLike)) or not isinstance(value, (list, tuple)):
        raise ConfigurationError(
            "parent_runs must be a list of report paths or run ids (for one parent: "
            f"parent_runs=[...]), got {type(value).__name__}."
        )
    refs = []
    for item in value:
        if isinstance(item, os.PathLike):
            item = os.fspath(item)
        if not isinstance(item, str) or not item.strip():
            raise ConfigurationError(
                f"parent_runs: each parent is a report path or a run id, got {item!r}."
            )
        refs.append(item)
    return tuple(refs)


def _by_run_id(ref: str, folder: Path | None) -> Path:
    """The report in ``folder`` whose ``run_id`` is ``ref``."""
    if folder is None or not folder.is_dir():
        raise ConfigurationError(
            f"parent_runs: {ref!r} is not a report file, and a run id can only be looked up in "
            "the folder of output= (none given here). Give the parent's report path."
        )
    skipped: list[str] = []
    for candidate in sorted(folder.glob("*.json")):
        try:
            report = read_report(candidate)
        except ReportFileError as exc:  # not ours to judge: skipped, and said so
            logger.warning(
                "flopmeter: parent_runs: looking up run id %r, skipped %s: %s",
                ref, candidate, exc.reason,
            )  # fmt: skip
            skipped.append(candidate.name)
            continue
        if report.run.run_id == ref:
            return candidate
    also = ""
    if skipped:
        shown = ", ".join(skipped[:5]) + (
            f" and {len(skipped) - 5} more" if len(skipped) > 5 else ""
        )
        also = f" ({len(skipped)} file(s) there are not reports and were skipped: {shown})"
    raise ConfigurationError(
        f"parent_runs: {ref!r} is neither a report file nor the run id of a report in "
        f"{folder}{also}."
    )


def parent_run(ref: str, report: FlopReport, path: Path | None = None) -> ParentRun:
    """What a run records about a parent it read (``path``: the report file, resolved): the
    parent's report as a lineage node (:func:`~flopmeter.compliance.lineage.node_from_report`),
    recorded with its cumulative compute and the earlier runs that compute counts."""
    node = node_from_report(report.model_dump())
    return parent_record(ref, node, None if path is None else str(path))


def read_parent_runs(refs: Iterable[str], output: Path | None) -> tuple[ParentRun, ...]:
    """Reads every parent named, strictly.

    Args:
        refs: Report paths (files, or folders holding ``flops_meter.json``) or run ids; a run id
            is looked up among the reports in the folder of ``output``.
        output: This run's report file, or ``None``.

    Raises:
        ConfigurationError: a name leads to no report; a report is not a valid flopmeter report
            (:class:`~flopmeter.errors.ReportFileError`); a parent is this run's own output file
            (it would be replaced); or one parent is named twice.
    """
    parents: list[ParentRun] = []
    seen: dict[Path, str] = {}
    mine = output.resolve() if output is not None else None
    for ref in refs:
        path = Path(ref).expanduser()
        if not path.exists():
            path = _by_run_id(ref, output.parent if output is not None else None)
        if path.is_dir():
            path = path / DEFAULT_FILENAME
        real = path.resolve()
        if real == mine:
            raise ConfigurationError(
                f"parent_runs: {ref!r} is this run's own output file ({output}), which the run "
                "would replace. Give this run another output=."
            )
        if real in seen:
            raise ConfigurationError(
                f"parent_runs: {ref!r} and {seen[real]!r} are the same report; a parent counts once."
            )
        seen[real] = ref
        parent = parent_run(ref, read_report(path), real)
        twin = next((p.ref for p in parents if p.run_id and p.run_id == parent.run_id), None)
        if twin is not None:
            raise ConfigurationError(
                f"parent_runs: {ref!r} and {twin!r} are reports of the same run "
                f"({parent.run_id}); a parent counts once."
            )
        parents.append(parent)
    return tuple(parents)
