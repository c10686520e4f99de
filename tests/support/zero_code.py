"""Running an unmodified script under zero-code metering, as a user would: in a new Python
process, switched on by the environment alone (``FLOPMETER_AUTO=1``, read by the
``flopmeter-auto.pth`` the install put into site-packages) or by ``flopmeter run -- CMD``."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

#: The two ways a user switches zero-code metering on.
LAUNCHERS = ("environment", "flopmeter run")


def clean_env(extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """The test process's environment without flopmeter's variables (a job's, an option's),
    one thread per process, plus ``extra``."""
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith("FLOPMETER_") and k not in ("PRETRAIN_FLOPS", "FLOPS_METER_OUT")
    }
    env.update({"OMP_NUM_THREADS": "1", "FLOPMETER_NVML": "0", "TOKENIZERS_PARALLELISM": "false"})
    env.update(extra or {})
    return env


def launch(
    command: Sequence[str],
    *,
    launcher: str,
    cwd: Path,
    options: Sequence[str] = (),
    env: Mapping[str, str] | None = None,
    timeout: float = 300,
) -> subprocess.CompletedProcess[str]:
    """Runs ``command`` (e.g. ``[sys.executable, "train.py"]``) under zero-code metering.

    Args:
        command: The user's command, unchanged.
        launcher: ``"environment"`` (``FLOPMETER_AUTO=1``; ``options`` must be empty: give
            them as ``FLOPMETER_*`` variables in ``env``) or ``"flopmeter run"``
            (``flopmeter run [options] -- command``).
        cwd: The folder it runs in.
        options: ``flopmeter run``'s meter flags.
        env: Variables added to the cleaned environment.
        timeout: Seconds before the run is killed (the test fails).
    """
    environ = clean_env(env)
    if launcher == "environment":
        assert not options, "give the options as FLOPMETER_* variables under the environment"
        environ["FLOPMETER_AUTO"] = "1"
        full = list(command)
    elif launcher == "flopmeter run":
        full = [sys.executable, "-m", "flopmeter.cli", "run", *options, "--", *command]
    else:
        raise ValueError(f"unknown launcher {launcher!r}")
    return subprocess.run(
        full, cwd=cwd, env=environ, capture_output=True, text=True, timeout=timeout, check=False
    )
