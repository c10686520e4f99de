"""Zero-code metering: the meter attached to a training job whose code does not mention it.

Two ways switch it on, and both end in :func:`flopmeter.auto.boot.boot`, run by Python itself as
each process of the job starts (nothing is imported before it is needed, so a process that never
trains pays a dictionary lookup per import):

* ``flopmeter run [meter options] -- CMD ARGS...`` puts a folder holding a ``sitecustomize``
  first on ``PYTHONPATH`` for the command, sets the switch and the options as environment
  variables, waits for the command, prints where the report is and exits with its status;
* ``FLOPMETER_AUTO=1`` alone (a SageMaker ``environment``, a pod spec, a SLURM script), read by
  the ``flopmeter-auto.pth`` file the wheel installs into site-packages.

Then, in every Python process of the job: a Hugging Face ``Trainer`` (any subclass) gets the
:class:`~flopmeter.integrations.hf.FlopMeterCallback` when it is built, a Lightning ``Trainer``
the Lightning callback, and a raw loop a :class:`~flopmeter.FlopMeter` on the module whose
parameters its first optimizer steps. A meter the script makes itself always wins (the
zero-code one stands down: never two meters on one run), and nothing here may break the job:
what cannot attach is recorded, and the job's report says why.

The processes of a job share a job folder (``FLOPMETER_JOB_DIR``) where each records what it
attached (:mod:`flopmeter.auto.job`); the job's root process (``flopmeter run`` itself, or the
first process under the switch alone) reads it at the end and writes a report of its own when
nothing attached.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

__all__ = [
    "JOB_CWD_ENV",
    "JOB_DIR_ENV",
    "JOB_ID_ENV",
    "JOB_ROOT_ENV",
    "LAUNCHER_ENV",
    "OUTPUT_ENV",
    "SWITCH_ENV",
    "default_report_folder",
    "output_chosen",
    "switched_on",
]

#: The one variable that switches zero-code metering on (``1``, ``true``, ``yes`` or ``on``).
SWITCH_ENV = "FLOPMETER_AUTO"
#: The job's folder, where each process records what it attached (set by the job's root).
JOB_DIR_ENV = "FLOPMETER_JOB_DIR"
#: The job's id, the same in every process of the job.
JOB_ID_ENV = "FLOPMETER_JOB_ID"
#: The process id of the job's root: the process that reads the records at the end.
JOB_ROOT_ENV = "FLOPMETER_JOB_ROOT"
#: The folder the job's root started in: where a zero-code report goes by default when a
#: process of the job runs in a temporary folder (a Ray Train worker's session folder).
JOB_CWD_ENV = "FLOPMETER_JOB_CWD"
#: What switched metering on: ``flopmeter run`` or ``environment`` (the report's
#: ``attach.launcher``).
LAUNCHER_ENV = "FLOPMETER_LAUNCHER"
#: The report file the user chose for a zero-code job (``flopmeter run --output``).
OUTPUT_ENV = "FLOPMETER_OUTPUT"

_ON = frozenset({"1", "true", "yes", "on"})


def switched_on(value: str | None) -> bool:
    """Whether a value of ``FLOPMETER_AUTO`` switches zero-code metering on (case and spaces
    ignored; anything but ``1``, ``true``, ``yes``, ``on`` leaves it off)."""
    return value is not None and value.strip().lower() in _ON


def default_report_folder(environ: Mapping[str, str] | None = None) -> str:
    """The folder a zero-code report goes to when none was chosen: this process's folder, unless
    it lies in the system's temporary folder while the job's root started elsewhere (a Ray Train
    worker runs in Ray's session folder, deleted with the session): then the root's folder."""
    import tempfile

    env = os.environ if environ is None else environ
    here, root = os.getcwd(), env.get(JOB_CWD_ENV) or ""

    def temporary(path: str) -> bool:
        temp = os.path.realpath(tempfile.gettempdir())
        real = os.path.realpath(path)
        return real == temp or real.startswith(temp + os.sep)

    if root and os.path.isdir(root) and temporary(here) and not temporary(root):
        return root
    return here


def output_chosen(environ: Mapping[str, str] | None = None) -> bool:
    """Whether the user chose the report file of a zero-code job (``FLOPMETER_OUTPUT``, which
    ``flopmeter run --output`` sets, is not empty). A file they chose and another live run holds
    is refused; a default one (``./flops_meter.json``, the trainer's output folder's) is not:
    the run writes its own file beside it, ``flops_meter.<run id>.json``."""
    env = os.environ if environ is None else environ
    return bool((env.get(OUTPUT_ENV) or "").strip())
