"""Where a run's report goes, and whether this run may write it there.

:func:`resolve_output` turns ``output=`` into the report file's path (a folder gets
``flops_meter.json``). :func:`claim_path` checks what is at that path (the meter never replaces
a file that is not its own: folders, devices, FIFOs, sockets and files that are not flopmeter
reports are refused) and makes its folder; :func:`take_lock` takes the lock on it for the run's
lifetime, which refuses a second live run writing the same path, and :func:`release_lock`
gives it back. Every refusal is a :class:`~flopmeter.errors.ConfigurationError` naming
``output``. Writing the report is :mod:`flopmeter.report.writing`'s.
"""

from __future__ import annotations

import errno
import json
import math
import os
import stat
import tempfile
from dataclasses import dataclass
from pathlib import Path

from flopmeter.errors import ConfigurationError, OutputHeld

try:
    import fcntl
except ImportError:  # pragma: no cover - Windows: no lock
    fcntl = None  # type: ignore[assignment]

__all__ = [
    "DEFAULT_FILENAME",
    "FULL_REPORT_FILENAME",
    "PATH_ERRORS",
    "KeptReport",
    "check_writable",
    "claim_file",
    "claim_path",
    "keep_earlier_report",
    "lock_path",
    "named_path",
    "os_reason",
    "release_lock",
    "resolve_output",
    "run_named",
    "take_lock",
]

#: The file name used when ``output`` is a folder.
DEFAULT_FILENAME = "flops_meter.json"
#: The full report's file name beside an AWS-keyed ``flops_meter.json`` (the HF callback's
#: ``aws_keys=True``), which ``flopmeter upload`` points to.
FULL_REPORT_FILENAME = "flopmeter_report.json"

#: A file larger than this (bytes) is not taken for a report without reading it.
_MAX_REPORT_BYTES = 16 * 1024 * 1024

_SPECIAL_KINDS = (
    (stat.S_ISCHR, "character device"),
    (stat.S_ISBLK, "block device"),
    (stat.S_ISFIFO, "FIFO (named pipe)"),
    (stat.S_ISSOCK, "socket"),
)

#: What looking at a path may raise besides ConfigurationError.
PATH_ERRORS = (OSError, TypeError, ValueError, RuntimeError)


def _as_text(output: object) -> str:
    """``output`` as a path string.

    Raises:
        ConfigurationError: ``output`` is not a path (not ``str``/``bytes``/``os.PathLike``).
    """
    try:
        raw = os.fspath(output)  # type: ignore[call-overload]
        return os.fsdecode(raw) if isinstance(raw, bytes) else raw
    except PATH_ERRORS as exc:
        raise ConfigurationError(
            f"output must be a file or folder path, got {type(output).__name__} ({os_reason(exc)})."
        ) from None


def _as_path(output: object) -> Path:
    """``output`` as a user-expanded :class:`Path` (see :func:`_as_text`).

    Raises:
        ConfigurationError: ``output`` is not a path, or ``~user`` cannot be expanded.
    """
    raw = _as_text(output)
    try:
        return Path(raw).expanduser()
    except PATH_ERRORS as exc:
        raise ConfigurationError(f"output {raw!r} cannot be used: {os_reason(exc)}.") from None


def os_reason(exc: BaseException) -> str:
    """A short reason for ``exc``: its OS message where it has one."""
    return getattr(exc, "strerror", None) or str(exc) or type(exc).__name__


def resolve_output(output: str | os.PathLike[str] | None) -> Path | None:
    """The file the report goes to.

    A folder gets ``flops_meter.json`` inside it: an existing folder, a path with a trailing
    slash, and a path that does not exist and has no suffix (``output="runs/exp1"`` is the
    folder ``runs/exp1``, made at the start). A path with a suffix (``run.json``), and an
    existing file (or a link) whatever its name, is the report file itself.

    Raises:
        ConfigurationError: ``output`` is not a path, or the path cannot be used (a NUL byte,
            a symbolic link loop, too long, no permission on a parent folder...).
    """
    if output is None:
        return None
    raw = _as_text(output)
    if "\0" in raw:
        raise ConfigurationError(f"output {raw!r} holds a NUL byte, which no path can hold.")
    path = _as_path(raw)
    try:
        _check_links(path)
        folder = raw.endswith(("/", os.sep)) or path.is_dir()
        if folder or (not os.path.lexists(path) and not path.suffix):
            path = path / DEFAULT_FILENAME
    except ConfigurationError:
        raise
    except PATH_ERRORS as exc:
        raise ConfigurationError(f"output {raw!r} cannot be used: {os_reason(exc)}.") from None
    return path


def _check_links(path: Path, label: str = "output") -> None:
    """Refuses a path whose symbolic links never end (a loop).

    Raises:
        ConfigurationError: following the links of ``path`` goes round in a loop.
    """
    try:
        os.stat(path)
    except OSError as exc:
        if exc.errno != errno.ELOOP:
            return  # missing (made later) or refused: the later checks name it
        raise ConfigurationError(
            f"{label} {str(path)!r} cannot be used: it goes through a symbolic link loop (a link "
            "that leads back to itself), so it leads to no file. Remove the link or choose "
            "another path."
        ) from None


def lock_path(path: Path) -> Path:
    """The sidecar lock file of the report at ``path`` (``.flops_meter.json.lock`` next to it)."""
    return path.with_name(f".{path.name}.lock")


def named_path(output: Path, real: Path) -> str:
    """``output`` for messages, with the file it leads to when that is another one."""
    return repr(str(output)) + ("" if real == output else f" (-> {str(real)!r})")


def _not_a_report(data: bytes) -> str | None:
    """Why ``data`` is not a flopmeter report, or ``None`` when it is one (or is empty).

    Lenient on purpose: this keeps the meter from clobbering someone's file, it does not
    validate reports.
    """
    if not data.strip():
        return None  # an empty file holds nothing to lose (``mktemp`` makes them)
    try:
        parsed = json.loads(data)
    except (ValueError, RecursionError):
        return "it is not JSON"
    if not isinstance(parsed, dict):
        return f"it holds a JSON {type(parsed).__name__}, not a report object"
    run = parsed.get("run")  # schema 2.0: run.status; 1.x (flat): status or flops_architecture
    keys = parsed.keys() | (run.keys() if isinstance(run, dict) else set())
    if "schema_version" not in parsed or not {"status", "flops_architecture"} & keys:
        return "it is a JSON object without a report's schema_version and status keys"
    return None


def _check_kind(output: Path, real: Path, label: str = "output") -> os.stat_result | None:
    """Refuses ``real`` when it exists and is a folder or a special file.

    Returns:
        ``real``'s status (symlinks followed), or ``None`` when there is no such file.

    Raises:
        ConfigurationError: a folder, or a device, FIFO, socket or other special file.
    """
    try:
        st = os.stat(real)  # follows symlinks: a link to /dev/null is /dev/null
    except FileNotFoundError:
        return None
    if stat.S_ISDIR(st.st_mode):
        raise ConfigurationError(
            f"{label} {named_path(output, real)} is a folder where a file is needed."
        )
    if not stat.S_ISREG(st.st_mode):
        kind = next((name for test, name in _SPECIAL_KINDS if test(st.st_mode)), "special file")
        raise ConfigurationError(
            f"{label} {named_path(output, real)} is a {kind}, not a regular file; flopmeter "
            "replaces the file it writes, so it refuses special files. Choose a file path."
        )
    return st


def _check_existing(output: Path, real: Path) -> None:
    """Refuses ``real`` when it exists and is not a file this meter may replace.

    Raises:
        ConfigurationError: a folder, a special file, or a file that is not a flopmeter report.
    """
    st = _check_kind(output, real)
    if st is None:
        return
    if st.st_size > _MAX_REPORT_BYTES:
        why = f"it is {st.st_size} bytes, far larger than a report"
    else:
        why = _not_a_report(real.read_bytes())
    if why is not None:
        raise ConfigurationError(
            f"output {named_path(output, real)} exists and is not a flopmeter report ({why}); "
            "flopmeter does not overwrite other files. Move it away or choose another output."
        )


def claim_file(output: object, label: str = "output") -> tuple[Path, Path]:
    """Checks that a file may be written (replaced) at ``output``, and makes its folder: what
    ``flopmeter report -o`` writes, where any regular file may be replaced.

    Args:
        output: The path given.
        label: What to call it in messages (``"-o"``).

    Returns:
        ``output`` as a path, and the real file to write (symlinks followed: the link stays).

    Raises:
        ConfigurationError: ``output`` is not a path, holds a NUL byte, goes through a symbolic
            link loop, is a folder or a special file, or its folder cannot be made.
    """
    path = _as_path(output)
    try:
        if "\0" in str(path):
            raise ConfigurationError(f"{label} {str(path)!r} holds a NUL byte.")
        _check_links(path, label)
        real = Path(os.path.realpath(path))
        _check_kind(path, real, label)
        real.parent.mkdir(parents=True, exist_ok=True)
    except ConfigurationError:
        raise
    except PATH_ERRORS as exc:
        raise ConfigurationError(
            f"{label} {named_path(path, path)} cannot be written: {os_reason(exc)}."
        ) from None
    return path, real


def claim_path(output: object) -> tuple[Path, Path]:
    """Checks that the report may be written at ``output`` and makes its folder.

    Returns:
        ``output`` as a path, and the real file the report goes to (symlinks followed).

    Raises:
        ConfigurationError: ``output`` is not a path, is a folder, a special file or another
            file that is not a flopmeter report, or its folder cannot be made.
    """
    path = _as_path(output)
    try:
        real = Path(os.path.realpath(path))
        _check_existing(path, real)
        real.parent.mkdir(parents=True, exist_ok=True)
    except ConfigurationError:
        raise
    except PATH_ERRORS as exc:
        raise ConfigurationError(
            f"The report cannot be written to output {named_path(path, path)}: {os_reason(exc)}. "
            "Choose a folder this process can write to."
        ) from None
    return path, real


@dataclass(frozen=True)
class KeptReport:
    """Another run's report that was at a run's output path, kept under a name of its own.

    Attributes:
        path: Where it is now (``<stem>.<its run id><suffix>`` beside the output).
        run_id: The run it is the report of.
        status: Its status (``running`` for a run that died without a final report).
        primary_flops: Its compute figure, FLOP (``None``: it has none).
    """

    path: Path
    run_id: str
    status: str | None
    primary_flops: float | None


def _report_run(real: Path) -> tuple[str, str | None, float | None] | None:
    """The run id, status and compute figure of the schema 2.0 report at ``real``; ``None``
    when it is none, too large, or has no run id (read leniently, never raising)."""
    try:
        if real.stat().st_size > _MAX_REPORT_BYTES:
            return None
        data = json.loads(real.read_bytes())
    except (OSError, ValueError, RecursionError):
        return None
    run = data.get("run") if isinstance(data, dict) else None
    compute = data.get("compute") if isinstance(data, dict) else None
    run_id = run.get("run_id") if isinstance(run, dict) else None
    if not isinstance(run_id, str) or not run_id or not run_id.isalnum():
        return None  # a run id names a file below: letters and digits only (uuid4().hex)
    status = run.get("status") if isinstance(run.get("status"), str) else None  # type: ignore[union-attr]
    flops = compute.get("primary_flops") if isinstance(compute, dict) else None
    number = isinstance(flops, (int, float)) and not isinstance(flops, bool)
    return run_id, status, float(flops) if number and math.isfinite(flops) else None  # type: ignore[arg-type]


def run_named(path: Path, run_id: str) -> Path:
    """A run's own file beside ``path``: ``<stem>.<run id><suffix>`` (``flops_meter.<id>.json``),
    where another run's report is kept aside and where a zero-code run writes when ``path`` is
    held by another live run."""
    return path.with_name(f"{path.stem}.{run_id}{path.suffix}")


def keep_earlier_report(real: Path, run_id: str) -> KeptReport | None:
    """Moves another run's report at ``real`` aside, to ``<stem>.<its run id><suffix>``, so
    that this run (``run_id``) claiming the path does not overwrite it: a crashed session's
    final or stale ``running`` report is the only record of what it spent. Call it with the
    path's lock held (so no live run is writing it). Never raises.

    Returns:
        Where the report was kept, or ``None`` (nothing there, this run's own, not a report
        with a run id, or it could not be moved: then it is overwritten as before).
    """
    found = _report_run(real)
    if found is None or found[0] == run_id:
        return None
    other, status, flops = found
    target = run_named(real, other)
    try:
        os.replace(real, target)
    except OSError:
        return None
    return KeptReport(target, other, status, flops)


def check_writable(path: Path) -> None:
    """Fails now, not after hours of training, when the report cannot be written to ``path``.

    Raises:
        ConfigurationError: ``path`` is a folder, a special file or a file that is not a
            flopmeter report, or its folder cannot be made or written.
    """
    path, real = claim_path(path)
    try:
        with tempfile.NamedTemporaryFile(dir=real.parent, prefix=".flopmeter-check-"):
            pass
    except OSError as exc:
        raise ConfigurationError(
            f"The report cannot be written to output {named_path(path, real)}: {os_reason(exc)}. "
            "Choose a folder this process can write to."
        ) from None


def take_lock(output: Path, real: Path) -> int | None:
    """Takes the lock of ``real`` for this process's lifetime (dies with it, even on SIGKILL).

    The lock file is removed by :func:`release_lock` while still locked; a lock taken on a file
    that was removed (or replaced) meanwhile is dropped and taken again on the new one.

    Returns:
        The locked file descriptor, or ``None`` where ``fcntl`` does not exist.

    Raises:
        OutputHeld: another live run holds the lock (a ``ConfigurationError``).
        ConfigurationError: the lock file cannot be made.
    """
    if fcntl is None:  # pragma: no cover - Windows
        return None
    sidecar = lock_path(real)
    flags = os.O_RDWR | os.O_CREAT | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)
    for _ in range(8):
        try:
            fd = os.open(sidecar, flags, 0o644)
        except OSError as exc:
            raise ConfigurationError(
                f"The report cannot be written to output {named_path(output, real)}: its lock file "
                f"{str(sidecar)!r} cannot be made ({os_reason(exc)})."
            ) from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            holder = os.pread(fd, 64, 0).decode(errors="replace").strip() or "unknown"
            os.close(fd)
            raise OutputHeld(
                f"output {named_path(output, real)}: another run (process {holder}) is writing "
                f"this report (it holds {str(sidecar)!r}). Give each run its own output.",
                holder,
            ) from None
        if _is_current(fd, sidecar):
            try:  # the holder's pid, for the message a refused run gets; informational only
                os.ftruncate(fd, 0)
                os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
            except OSError:
                pass
            return fd
        os.close(fd)
    raise ConfigurationError(  # pragma: no cover - another run removes the lock file each time
        f"output {named_path(output, real)}: its lock file {str(sidecar)!r} keeps changing; "
        "another run is using this path."
    )


def _is_current(fd: int, sidecar: Path) -> bool:
    """Whether ``fd`` is still the file at ``sidecar`` (not removed or replaced meanwhile)."""
    try:
        return os.path.samestat(os.fstat(fd), os.stat(sidecar, follow_symlinks=False))
    except OSError:
        return False


def release_lock(sidecar: Path, fd: int) -> None:
    """Removes the lock file (while still holding it, so no other run ever locks a removed
    file and thinks itself alone) and releases the lock. Never raises."""
    try:
        if _is_current(fd, sidecar):
            sidecar.unlink()
    except OSError:
        pass
    finally:
        os.close(fd)
