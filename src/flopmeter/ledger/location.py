"""Where the ledger is: the ``ledger=`` option, ``FLOPMETER_LEDGER`` and the per-user file.

:func:`resolve_ledger` applies the one precedence rule (:func:`flopmeter.checks.by_precedence`)
to the ledger's location; :func:`default_ledger_path` is the per-user file that ``ledger=True``
(and ``flopmeter ledger`` without ``--ledger``) falls back to. Paths only: nothing is opened.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

from flopmeter.checks import by_precedence
from flopmeter.errors import ConfigurationError

__all__ = ["LEDGER_ENV", "default_ledger_path", "resolve_ledger"]

#: Environment variable naming the ledger file (turns the ledger on for every meter).
LEDGER_ENV = "FLOPMETER_LEDGER"


def default_ledger_path(environ: Mapping[str, str] | None = None) -> Path:
    """The per-user ledger: ``$XDG_DATA_HOME/flopmeter/ledger.sqlite``, else
    ``~/.local/share/flopmeter/ledger.sqlite``."""
    env = os.environ if environ is None else environ
    base = env.get("XDG_DATA_HOME", "").strip()
    root = Path(base).expanduser() if base else Path.home() / ".local" / "share"
    return root / "flopmeter" / "ledger.sqlite"


def resolve_ledger(value: object, environ: Mapping[str, str] | None = None) -> Path | None:
    """The ledger file a meter appends to, or ``None`` for none.

    ``False``: none, whatever the environment says. ``None`` (not given): ``FLOPMETER_LEDGER``
    when set, else none. ``True``: ``FLOPMETER_LEDGER`` when set, else the per-user ledger
    (:func:`default_ledger_path`). A path: that file.

    Raises:
        ConfigurationError: ``value`` is neither a bool, ``None`` nor a path.
    """
    env = os.environ if environ is None else environ
    if value is False:
        return None
    # True and None name no file: the location is then the variable's, else the default
    given = {} if value is None or value is True else {"ledger": value}
    chosen, where = by_precedence(given, "ledger", env, LEDGER_ENV)
    if where is None:
        return default_ledger_path(env) if value is True else None
    if where == LEDGER_ENV:
        return Path(chosen).expanduser()
    try:
        raw = os.fspath(value)  # type: ignore[call-overload]
    except TypeError:
        raise ConfigurationError(
            f"ledger must be True, False or the ledger file's path, got {type(value).__name__}."
        ) from None
    text = os.fsdecode(raw) if isinstance(raw, bytes) else raw
    if not text.strip():
        raise ConfigurationError("ledger must be True, False or a path, got an empty path.")
    return Path(text).expanduser()
