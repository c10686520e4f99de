"""A SageMaker training job's copy of the report: where it goes, the AWS meter's keys, the copy.

:func:`sagemaker_output_path` and :func:`aws_keyed_report` are pure functions of the environment
and the report. :class:`SageMakerCopy` writes the copy; it is a sink like S3's and DynamoDB's
(``name`` and ``put``, :class:`flopmeter.ledger.sinks.Sink`), so a meter's final report reaches
it the way it reaches every copy besides its file (``FlopMeter.add_copy``: the Hugging Face
callback's), and the end of a zero-code job writes the job's report with it
(:mod:`flopmeter.auto.finish`).
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from flopmeter.report import FlopReport, write_text_atomic
from flopmeter.report.output_path import DEFAULT_FILENAME, FULL_REPORT_FILENAME
from flopmeter.report.writing import write_report

__all__ = ["SAGEMAKER_OUTPUT_ENV", "SageMakerCopy", "aws_keyed_report", "sagemaker_output_path"]

#: Environment variable naming the extra copy of the report (the AWS meter's variable).
SAGEMAKER_OUTPUT_ENV = "FLOPS_METER_OUT"

_SAGEMAKER_MARKERS = (
    "SM_TRAINING_ENV",
    "SM_MODEL_DIR",
    "SM_OUTPUT_DIR",
    "SM_OUTPUT_DATA_DIR",
    "TRAINING_JOB_NAME",
)


def sagemaker_output_path(environ: Mapping[str, str] | None = None) -> Path | None:
    """Where the extra copy of the report goes, ``None`` when there is none.

    ``FLOPS_METER_OUT`` (a file, as for the AWS meter) when set; otherwise, on a SageMaker
    training job (``SM_TRAINING_ENV``, ``SM_MODEL_DIR``, ``SM_OUTPUT_DIR``,
    ``SM_OUTPUT_DATA_DIR`` or ``TRAINING_JOB_NAME`` set), ``$SM_OUTPUT_DATA_DIR/flops_meter.json``
    (``/opt/ml/output/data/flops_meter.json`` by default): the folder SageMaker uploads to S3 at
    the end of the job (as ``output.tar.gz``), unlike ``/opt/ml/output`` itself.

    Args:
        environ: The environment to read; ``os.environ`` by default.
    """
    env = os.environ if environ is None else environ
    explicit = env.get(SAGEMAKER_OUTPUT_ENV, "").strip()
    if explicit:
        return Path(explicit).expanduser()
    if any(env.get(name) for name in _SAGEMAKER_MARKERS):
        data_dir = env.get("SM_OUTPUT_DATA_DIR") or ""
        if not data_dir:
            data_dir = str(Path(env.get("SM_OUTPUT_DIR") or "/opt/ml/output") / "data")
        return Path(data_dir) / DEFAULT_FILENAME
    return None


def aws_keyed_report(
    report: FlopReport, environ: Mapping[str, str] | None = None
) -> dict[str, Any]:
    """The AWS FlopsMeterCallback's keys (:meth:`FlopReport.to_sagemaker_dict`), with the run
    id, status, schema version and the SageMaker job's name (``TRAINING_JOB_NAME``) added, so a
    pipeline parsing the AWS meter's ``flops_meter.json`` keeps working unchanged."""
    env = os.environ if environ is None else environ
    return {
        **report.to_sagemaker_dict(),
        "training_job_name": env.get("TRAINING_JOB_NAME") or None,
        "run_id": report.run.run_id,
        "status": report.run.status,
        "schema_version": report.schema_version,
    }


@dataclass(frozen=True)
class SageMakerCopy:
    """The copy of a final report for a SageMaker pipeline, at ``path`` (a file).

    Attributes:
        path: The copy's file (``flops_meter.json`` where :func:`sagemaker_output_path` says).
        aws_keys: Write it with the AWS FlopsMeterCallback's keys (:func:`aws_keyed_report`),
            the full report beside it (``flopmeter_report.json``); else the full report.
        environ: The environment the AWS keys read (``TRAINING_JOB_NAME``); ``os.environ``
            when ``None``.
    """

    path: Path
    aws_keys: bool = True
    environ: Mapping[str, str] | None = None

    @property
    def name(self) -> str:
        """The copy, as the report's problems and the logs name it."""
        return f"sagemaker copy {self.path}"

    def write(self, report: FlopReport) -> str:
        """Writes the copy (atomically) and says where.

        Raises:
            OSError: the AWS-keyed file cannot be written (the full report beside it is
                written, or saved at the fallback path, first).
        """
        if not self.aws_keys:
            write_report(report, self.path)
            return str(self.path)
        write_report(report, self.path.with_name(FULL_REPORT_FILENAME))
        text = json.dumps(aws_keyed_report(report, self.environ), indent=2) + "\n"
        write_text_atomic(self.path, text)
        return str(self.path)

    def put(self, payload: Any, timeout_seconds: float) -> str:
        """:meth:`write` of a sink's payload (``SinkPayload``: the report as canonical JSON);
        a local file, so ``timeout_seconds`` is not needed."""
        return self.write(FlopReport.model_validate(payload.report()))
