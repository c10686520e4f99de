"""An on-disk cache of model plans: a second ``flopmeter estimate`` of the same inputs reads
the plan back instead of importing transformers and building the models on meta again.

One JSON file per key, ``<sha256>.json``, in ``$FLOPMETER_CACHE_DIR/plans``, else
``$XDG_CACHE_HOME/flopmeter/plans``, else ``~/.cache/flopmeter/plans``. The key is the sha256 of
a canonical JSON of every input the plan depends on (:func:`key_material`): the request's
options as checked, the threshold and where it came from, the model's configuration (and each
recipe model's) as parsed, the dataset file's bytes, the installed versions of flopmeter, torch,
transformers, peft, accelerate and pydantic, the Python version, and a digest of every file of
the flopmeter package as installed (:func:`source_digest`), so an edited editable install is a
new key. A plan with ``--tokenizer`` is not cached (the tokenizer's files and code are more than
a key can name cheaply).

A cache file is untrusted input: JSON only (never pickle), at most :data:`MAX_BYTES`, with
exactly the fields ``schema``, ``key``, ``plan`` and ``plan_sha256``; its stored key must equal
the expected key, the plan's digest its content, and the plan must validate as a
:class:`~flopmeter.planner.plan.Plan` that dumps back to exactly the stored JSON. Anything else
is ignored with a one-line note on stderr, and the plan made afresh overwrites the file. Files
are written atomically (a temporary file in the same folder, then ``os.replace``); a folder that
cannot be written is a note, never a failure.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import stat
import sys
import tempfile
from collections.abc import Callable
from dataclasses import fields
from pathlib import Path
from typing import Any

from flopmeter.compliance.thresholds import Threshold
from flopmeter.errors import ConfigurationError
from flopmeter.planner.plan import Plan, PlanRequest
from flopmeter.safe_text import visible

__all__ = [
    "CACHE_DIR_ENV",
    "MAX_BYTES",
    "SCHEMA",
    "VERSIONED",
    "cache_folder",
    "cached_model_plan",
    "installed_versions",
    "key_digest",
    "key_material",
    "note",
    "read_entry",
    "source_digest",
    "write_entry",
]

#: The format of a cache file; a file of another format is ignored.
SCHEMA = "flopmeter-plan-cache/1"
#: Overrides the cache's root folder (plans go in its ``plans`` folder).
CACHE_DIR_ENV = "FLOPMETER_CACHE_DIR"
#: The largest cache file read, bytes (a plan is a few kilobytes).
MAX_BYTES = 4 * 2**20
#: The installed distributions whose versions are part of the key.
VERSIONED = ("flopmeter", "torch", "transformers", "peft", "accelerate", "pydantic")
_FIELDS = ("plan", "plan_sha256", "key", "schema")


def _canonical(value: Any) -> str:
    """``value`` as canonical JSON text (sorted keys, no spaces, no NaN)."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), allow_nan=False)


def _sha256(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def note(text: str) -> None:
    """Prints ``flopmeter: note: plan cache: <text>`` as one line on stderr."""
    print("flopmeter: note: plan cache: " + " ".join(visible(text).split()), file=sys.stderr)


def cache_folder() -> Path:
    """The folder of the cache files: ``$FLOPMETER_CACHE_DIR/plans``, else
    ``$XDG_CACHE_HOME/flopmeter/plans`` (an absolute path only, as the XDG spec says), else
    ``~/.cache/flopmeter/plans``."""
    root = os.environ.get(CACHE_DIR_ENV)
    if root:
        return Path(root).expanduser() / "plans"
    xdg = os.environ.get("XDG_CACHE_HOME")
    base = Path(xdg) if xdg and Path(xdg).is_absolute() else Path.home() / ".cache"
    return base / "flopmeter" / "plans"


def _package_root() -> Path:
    import flopmeter

    return Path(flopmeter.__file__).resolve().parent


@functools.lru_cache(maxsize=8)
def source_digest(root: Path | None = None) -> str:
    """The sha256 of every file of the flopmeter package (``root``, default the one imported):
    each file's path relative to it, its length and its bytes, in path order; ``__pycache__``
    left out. Kept per process (about 20 ms for the package's 1.4 MB on a 2-core VM)."""
    root = _package_root() if root is None else root
    digest = hashlib.sha256()
    for path in sorted(root.rglob("*")):
        if "__pycache__" in path.relative_to(root).parts or not path.is_file():
            continue
        data = path.read_bytes()
        name = path.relative_to(root).as_posix().encode("utf-8")
        digest.update(len(name).to_bytes(8, "big") + name + len(data).to_bytes(8, "big"))
        digest.update(data)
    return digest.hexdigest()


def _version(name: str) -> str | None:
    """The installed version of distribution ``name``; ``None`` when it is not installed."""
    from importlib import metadata

    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


def installed_versions() -> dict[str, str | None]:
    """The version of each of :data:`VERSIONED`, of Python (``major.minor.micro``) and the
    flopmeter package's :func:`source_digest`, read from the installation, not imported."""
    found: dict[str, str | None] = {name: _version(name) for name in VERSIONED}
    found["python"] = ".".join(map(str, sys.version_info[:3]))
    found["flopmeter_source"] = source_digest()
    return found


def _file_digest(path: str | Path) -> str:
    digest = hashlib.sha256()
    with Path(path).expanduser().open("rb") as handle:
        for block in iter(lambda: handle.read(2**20), b""):
            digest.update(block)
    return digest.hexdigest()


def _model_inputs(model: str | Path) -> dict[str, str]:
    """What a plan reads of a model: its configuration as parsed and where it came from."""
    from flopmeter.planner.models import resolve_model

    resolved = resolve_model(model)
    config = json.dumps(resolved.config, sort_keys=True, separators=(",", ":"))
    return {"source": resolved.source, "config_sha256": _sha256(config)}


def _request_fields(req: PlanRequest) -> dict[str, Any]:
    """The request's options as JSON values (paths as text, sequences as lists)."""
    out: dict[str, Any] = {}
    for f in fields(req):
        if f.name == "threshold":
            continue
        value = getattr(req, f.name)
        if isinstance(value, Path):
            value = str(value)
        elif isinstance(value, (tuple, list)):
            value = [str(v) for v in value]
        out[f.name] = value
    return out


def key_material(req: PlanRequest, threshold: Threshold, threshold_note: str) -> dict | None:
    """Every input the plan of ``req`` (checked, with a model) depends on, as JSON values;
    ``None`` when the plan is not cached (``--tokenizer``) or an input cannot be read (the
    plan made afresh then says why in its own error).

    The configurations are hashed as parsed (the plan reads nothing else of them), the dataset
    by its bytes.
    """
    if req.tokenizer is not None:
        return None
    try:
        inputs: dict[str, Any] = {"model": _model_inputs(req.model)}  # type: ignore[arg-type]
        if req.teacher is not None:
            inputs["teacher"] = _model_inputs(req.teacher)
        inputs["reward_models"] = [_model_inputs(m) for m in req.reward_models]
        if req.dataset is not None:
            inputs["dataset_sha256"] = _file_digest(req.dataset)
        material = {
            "schema": SCHEMA,
            "request": _request_fields(req),
            "threshold": {
                "value": threshold.value,
                "kind": threshold.kind,
                "source": threshold.source,
                "note": threshold_note,
            },
            "inputs": inputs,
            "installed": installed_versions(),
        }
        _canonical(material)  # JSON values only (no NaN): else not cached
    except (ConfigurationError, OSError, TypeError, ValueError):
        return None
    return material


def key_digest(material: dict) -> str:
    """The cache file's name (without ``.json``): the sha256 of the canonical key material."""
    return _sha256(_canonical(material))


def _read_json(path: Path) -> Any:
    """The JSON of ``path``, read as untrusted input.

    Raises:
        ValueError: not a regular file, too large, not UTF-8 or not JSON (the reason).
    """
    try:  # non-blocking: a FIFO put there (even after a check) never makes the open wait
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    except OSError as exc:
        raise ValueError(f"cannot be read ({exc.strerror or exc})") from None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):  # a folder, a FIFO, a device
            raise ValueError("not a regular file")
        with os.fdopen(fd, "rb") as handle:
            fd = -1
            data = handle.read(MAX_BYTES + 1)
    except OSError as exc:
        raise ValueError(f"cannot be read ({exc.strerror or exc})") from None
    finally:
        if fd >= 0:
            os.close(fd)
    if len(data) > MAX_BYTES:
        raise ValueError(f"larger than {MAX_BYTES:,} bytes")
    try:
        return json.loads(data.decode("utf-8"))
    except UnicodeDecodeError:
        raise ValueError("not UTF-8 text") from None
    except RecursionError:
        raise ValueError("nested too deeply") from None
    except ValueError as exc:  # JSONDecodeError, or an integer too long to read
        raise ValueError(f"not valid JSON ({exc})") from None


def read_entry(path: Path, material: dict) -> Plan:
    """The plan stored in ``path`` for the key ``material``.

    Raises:
        ValueError: the file is unreadable, not a cache file of :data:`SCHEMA`, for another
            key, or its plan is damaged or not exactly a :class:`Plan` (the reason, in words).
    """
    from pydantic import ValidationError

    entry = _read_json(path)
    if not isinstance(entry, dict) or sorted(entry) != sorted(_FIELDS):
        raise ValueError(f"not a plan cache file (fields {', '.join(sorted(_FIELDS))} expected)")
    if entry["schema"] != SCHEMA:
        raise ValueError(f"schema {str(entry['schema'])[:40]!r}, not {SCHEMA!r}")
    try:
        if _canonical(entry["key"]) != _canonical(material):
            raise ValueError("its stored key is not this plan's key")
        stored = _canonical(entry["plan"])
        if _sha256(stored) != entry["plan_sha256"]:
            raise ValueError("its plan does not match its digest")
        plan = Plan.model_validate(entry["plan"])
    except ValidationError as exc:
        raise ValueError(f"its plan is not a valid plan ({exc.error_count()} errors)") from None
    except (TypeError, RecursionError) as exc:  # a value canonical JSON cannot hold
        raise ValueError(f"not a plan cache file ({type(exc).__name__})") from None
    if _canonical(plan.model_dump(mode="json")) != stored:
        raise ValueError("its plan holds fields or values a plan does not")
    return plan


def write_entry(path: Path, material: dict, plan: Plan) -> None:
    """Stores ``plan`` for the key ``material`` in ``path``, atomically (a temporary file in
    the same folder, then ``os.replace``).

    Raises:
        OSError: the folder or the file cannot be written.
        ValueError: the plan does not come back exactly from JSON (not stored).
    """
    dumped = plan.model_dump(mode="json")
    stored = _canonical(dumped)
    if _canonical(Plan.model_validate_json(stored).model_dump(mode="json")) != stored:
        raise ValueError("the plan does not come back exactly from JSON")
    entry = {"schema": SCHEMA, "key": material, "plan": dumped, "plan_sha256": _sha256(stored)}
    text = json.dumps(entry, sort_keys=True, indent=1, allow_nan=False) + "\n"
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    handle, temporary = tempfile.mkstemp(prefix=".tmp-", suffix=".json", dir=path.parent)
    try:
        with os.fdopen(handle, "w", encoding="utf-8") as out:
            out.write(text)
        os.replace(temporary, path)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise


def _look_up(path: Path) -> tuple[bool, str | None]:
    """Whether ``path`` is there, and why the cache cannot be used at all (``None``: it can).

    A folder another user owns or may write to (group or world writable, as a
    ``FLOPMETER_CACHE_DIR`` under ``/tmp``) is not used: anyone who can write there could
    plant a well-formed plan with its digest. A path the system cannot look up (a name too
    long, a folder that cannot be searched) is not used either: a note, never a failure."""
    folder = path.parent
    try:
        info = os.stat(folder)
    except (FileNotFoundError, NotADirectoryError):
        return False, None  # made when the plan is stored (or a note says why it was not)
    except OSError as exc:
        return False, f"{folder} cannot be looked up ({exc.strerror or exc})"
    uid = os.getuid() if hasattr(os, "getuid") else info.st_uid
    if info.st_uid != uid or info.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        return False, f"{folder} is owned by another user or writable by others"
    try:
        os.lstat(path)
    except FileNotFoundError:
        return False, None
    except OSError as exc:
        return False, f"{path} cannot be looked up ({exc.strerror or exc})"
    return True, None


def cached_model_plan(
    req: PlanRequest,
    threshold: Threshold,
    threshold_note: str,
    folder: Path | None = None,
    make: Callable[[PlanRequest, Threshold, str], Plan] | None = None,
) -> Plan:
    """The plan of ``req`` (checked, with a model) from the cache in ``folder`` (default
    :func:`cache_folder`), else made by ``make`` (default
    :func:`flopmeter.planner.model_plan.model_plan`, imported only then) and stored.

    Raises:
        ConfigurationError: the inputs cannot make a plan (from ``make``; never cached).
    """
    material = key_material(req, threshold, threshold_note)
    path = None
    if material is not None:
        path = (cache_folder() if folder is None else folder) / f"{key_digest(material)}.json"
        present, unusable = _look_up(path)
        if unusable:
            note(f"not used: {unusable}; planning afresh")
            path = None
        elif present:
            try:
                plan = read_entry(path, material)
            except ValueError as exc:
                note(f"ignored {path}: {exc}; planning afresh")
            else:
                note(f"read from {path} (same inputs and versions); --no-cache plans afresh")
                return plan
    if make is None:
        from flopmeter.planner.model_plan import model_plan

        make = model_plan
    plan = make(req, threshold, threshold_note)
    if path is not None:
        try:
            write_entry(path, material, plan)  # type: ignore[arg-type]
        except (OSError, ValueError) as exc:
            why = exc.strerror if isinstance(exc, OSError) and exc.strerror else exc
            note(f"not stored in {path.parent} ({why}); the plan is made afresh next time")
    return plan
