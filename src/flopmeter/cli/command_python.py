"""``flopmeter run``'s check of the Python its command starts, before the command runs.

Zero-code metering starts in a Python process through ``site``: this package's
``sitecustomize`` (first on ``PYTHONPATH``) or the ``flopmeter-auto.pth`` file in the
site-packages of the environment flopmeter is installed in. A Python started with ``-S`` runs
neither, and a Python of another environment (a bare ``python3`` of the system, another
virtual environment's interpreter) cannot import flopmeter: the job would train unmetered and
end with no report. When the command is a Python interpreter (``python``, ``python3.11``,
``/path/to/python``), or a script whose ``#!`` line names one (``torchrun``, ``accelerate``,
``deepspeed``), that Python is started once with the command's flags and environment, and
asked whether zero-code metering booted in it: when it did not, the command is refused (exit 2)
with the reason, before hours of training. The probe runs in the job (its variables set), where
it records nothing: it imports no torch. A probe that cannot run (a timeout, a missing
interpreter) refuses nothing: the job's end says what it finds.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

from flopmeter.errors import ConfigurationError

__all__ = ["PROBE_TIMEOUT_SECONDS", "check_command_python", "python_of_command"]

#: How long the probe may take to start a Python and answer, seconds.
PROBE_TIMEOUT_SECONDS = 30.0

_PYTHON_NAME = re.compile(r"python(\d+(\.\d+)*)?[a-z]?(\.exe)?$")
#: Python options that take the next argument as their value.
_WITH_VALUE = frozenset("XWQ")
#: The probe: exit 0 when zero-code metering booted in this process, else 3.
_PROBE = "import sys; sys.exit(0 if 'flopmeter.auto.boot' in sys.modules else 3)"


def python_of_command(cmd: Sequence[str], env: Mapping[str, str]) -> tuple[str, list[str]] | None:
    """The Python interpreter ``cmd`` starts first and the interpreter options it gives it.

    Args:
        cmd: The command (``["python", "-u", "train.py"]``, ``["torchrun", ...]``).
        env: Its environment (``PATH`` finds the program).

    Returns:
        ``(interpreter, options)`` (options such as ``["-S"]``, before the script), or ``None``
        when the command is not a Python or a script with a Python ``#!`` line.
    """
    if not cmd:
        return None
    program = shutil.which(cmd[0], path=env.get("PATH")) or cmd[0]
    if _PYTHON_NAME.search(os.path.basename(program)):
        return program, _interpreter_options(cmd[1:])
    shebang = _shebang(program)
    if shebang is None or not _PYTHON_NAME.search(os.path.basename(shebang[0])):
        return None
    return shebang[0], [a for a in shebang[1:] if a.startswith("-")]


def _interpreter_options(args: Sequence[str]) -> list[str]:
    """The options before the script, ``-c`` or ``-m`` (with the values of ``-X``/``-W``)."""
    out: list[str] = []
    pending = False
    for arg in args:
        if pending:
            out.append(arg)
            pending = False
        elif arg.startswith("-") and arg not in ("-", "--") and arg[1:2] not in ("c", "m"):
            out.append(arg)
            pending = arg[-1] in _WITH_VALUE and len(arg) == 2
        else:
            break
    return out


def _shebang(program: str) -> list[str] | None:
    """The ``#!`` line of ``program`` split into words (``/usr/bin/env python3`` gives
    ``["python3"]`` resolved nowhere: the name is enough), or ``None``."""
    try:
        with open(program, "rb") as f:
            first = f.readline(512)
    except OSError:
        return None
    if not first.startswith(b"#!"):
        return None
    words = first[2:].decode("utf-8", "replace").split()
    if words and os.path.basename(words[0]) == "env":  # env's own options, then the program
        words = words[1:]
        while words and words[0].startswith("-"):
            words = words[1:]
    return words or None


def check_command_python(cmd: Sequence[str], env: Mapping[str, str]) -> None:
    """Refuses a command whose Python zero-code metering cannot start in (see the module).

    Args:
        cmd: The command ``flopmeter run`` is about to start.
        env: The environment it will have (the switch, the job's variables, ``PYTHONPATH``).

    Raises:
        ConfigurationError: The Python was started with ``-S``, or metering did not boot in it
            (flopmeter is not installed in that environment).
    """
    found = python_of_command(cmd, env)
    if found is None:
        return
    python, options = found
    if any(o.startswith("-") and not o.startswith("--") and "S" in o[1:] for o in options):
        raise ConfigurationError(
            f"flopmeter run: the command starts {python} with -S (no site module), so "
            "zero-code metering cannot start in it and the job would train unmetered: drop -S, "
            "or meter the script itself with FlopMeter."
        )
    try:
        probe = subprocess.run(
            [python, *options, "-c", _PROBE],
            env=dict(env),  # in the job: it records nothing (no torch) and is not its root
            capture_output=True,
            timeout=PROBE_TIMEOUT_SECONDS,
            check=False,
        )
    except (OSError, subprocess.SubprocessError):
        return  # the probe could not run: the job's end says what it finds
    if probe.returncode == 3:
        here = Path(sys.executable)
        raise ConfigurationError(
            f"flopmeter run: zero-code metering does not start in {python} (flopmeter is not "
            "installed in that Python's environment), so the job would train unmetered: "
            f"install flopmeter there, or run the command with {here}."
        )
