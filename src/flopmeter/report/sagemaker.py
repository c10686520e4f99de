"""Where a SageMaker training job's copy of the report goes, and the AWS meter's keys.

Pure functions of the environment and the report, shared by the Hugging Face callback
(:mod:`flopmeter.integrations.hf`) and the end of a zero-code job (:mod:`flopmeter.auto.finish`).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from flopmeter.report import FlopReport
from flopmeter.report.output_path import DEFAULT_FILENAME

__all__ = ["SAGEMAKER_OUTPUT_ENV", "aws_keyed_report", "sagemaker_output_path"]

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
