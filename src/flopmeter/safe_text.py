"""Text from outside made safe to store, show and export: the one place for each rule.

A report carries strings the meter does not control: the model's name, exception messages,
notes built from them, run ids read back from files. Before they reach a report, a terminal, a
spreadsheet or an object key, each goes through one function here:

* :func:`redact`: credentials in a message (tokens, keys, URL passwords, PEM blocks) replaced,
  used for the report's ``error`` (:func:`describe_error`) and every problem note;
* :func:`visible`: terminal control characters (ESC, BEL, CSI, other C0/C1 controls) and Unicode
  bidi controls (U+202E ...) shown as ``\\x1b`` / ``\\u202e`` escapes, never sent as they are;
* :func:`csv_cell`: a cell that a spreadsheet would run as a formula (``=``, ``+``, ``-``, ``@``,
  tab or CR first) made literal with a leading ``'``;
* :func:`check_run_id`: a run id is letters, digits, ``.``, ``_``, ``-`` (no ``/``, no ``..``),
  so that it names one object under a prefix and one file in a folder.

Pure functions of strings; this module imports nothing of flopmeter.
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Callable

__all__ = [
    "MAX_ERROR_CHARS",
    "RUN_ID_PATTERN",
    "check_run_id",
    "csv_cell",
    "describe_error",
    "json_visible",
    "redact",
    "run_id_problem",
    "visible",
]

#: The longest ``error`` a report holds, characters.
MAX_ERROR_CHARS = 2000

#: Credentials that exception messages sometimes carry, and what replaces them (in order: a PEM
#: block before the ``key=...`` rule, so the whole block goes).
_SECRETS: tuple[tuple[re.Pattern[str], str | Callable[[re.Match[str]], str]], ...] = (
    (
        re.compile(
            r"-----BEGIN [A-Z0-9 ]*PRIVATE KEY-----.*?(-----END [A-Z0-9 ]*PRIVATE KEY-----|$)",
            re.DOTALL,
        ),
        "[REDACTED PRIVATE KEY]",
    ),
    (re.compile(r"\bhf_[A-Za-z0-9]{20,}"), "hf_[REDACTED]"),
    (re.compile(r"\b(AKIA|ASIA)[A-Z0-9]{16}\b"), "[REDACTED AWS KEY ID]"),
    (
        re.compile(r"\b(gh[pousr]_[A-Za-z0-9]{20,}|github_pat_[A-Za-z0-9_]{20,})"),
        "[REDACTED GITHUB TOKEN]",
    ),
    (re.compile(r"\bsk-(proj-|ant-)?[A-Za-z0-9_-]{20,}"), "sk-[REDACTED]"),
    (re.compile(r"\bxox[abposr]-[A-Za-z0-9-]{10,}"), "xox-[REDACTED]"),
    (
        re.compile(r"https://hooks\.slack\.com/services/[A-Za-z0-9/]+"),
        "https://hooks.slack.com/[REDACTED]",
    ),
    (re.compile(r"\beyJ[A-Za-z0-9_-]{5,}\.eyJ[A-Za-z0-9_-]{5,}\.[A-Za-z0-9_-]*"), "[REDACTED JWT]"),
    (
        # name, its closing quote when it is a dict key ('password': ...), the separator, then
        # a quoted value (spaces and all, to its quote on the same line) or a bare word
        re.compile(
            r"(?i)(aws_secret_access_key|aws_session_token|secret|password|passwd|token|api[_-]?key)"
            r"(['\"]?\s*(?:=>|[=:])\s*)(?:(['\"])[^\n]*?\3|[^\s'\",;]+)"
        ),
        lambda m: f"{m[1]}{m[2]}{m[3] or ''}[REDACTED]{m[3] or ''}",
    ),
    (  # AWS's own names need no separator: "AWS_SECRET_ACCESS_KEY wJalr..." (a shell's form)
        re.compile(r"(?i)\b(aws_secret_access_key|aws_session_token)(\s+)[A-Za-z0-9/+=]{16,}"),
        r"\1\2[REDACTED]",
    ),
    (re.compile(r"(?i)\b(bearer|basic)\s+[A-Za-z0-9._~+/=-]{8,}"), r"\1 [REDACTED]"),
    (re.compile(r"(?i)\b([a-z][a-z0-9+.-]*://)[^/\s:@]+:[^/\s@]+@"), r"\1[REDACTED]@"),
)

#: Unicode's bidirectional controls (they reorder the text a reader sees) and line separators.
_BIDI = frozenset(
    "\u061c\u200e\u200f\u2028\u2029\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069"
)
#: What a spreadsheet reads as the start of a formula.
_FORMULA_START = ("=", "+", "-", "@", "\t", "\r")
#: The form of a run id (the meter's own are 32 hex digits).
RUN_ID_PATTERN = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")  # fmt: skip


def redact(text: str) -> str:
    """``text`` with the credentials it may carry replaced: Hugging Face, GitHub, OpenAI and
    Slack tokens, AWS key ids, JWTs, PEM private keys, bearer and basic tokens,
    ``password=...``/``token=...``/``secret=...``, and the password of a URL's user info."""
    for pattern, replacement in _SECRETS:
        text = pattern.sub(replacement, text)
    return text


def describe_error(exc: BaseException) -> str:
    """``"Type: message"`` for a report: never raises, at most :data:`MAX_ERROR_CHARS`
    characters, credentials redacted (:func:`redact`)."""
    name = type(exc).__name__
    try:
        message = str(exc)
    except Exception as inner:  # an exception whose __str__ raises
        message = f"<the message could not be read: {type(inner).__name__}>"
    text = redact(f"{name}: {message}" if message else name)
    if len(text) > MAX_ERROR_CHARS:
        cut = " [... truncated]"
        text = text[: MAX_ERROR_CHARS - len(cut)] + cut
    return text


def _escape(ch: str) -> str:
    code = ord(ch)
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def visible(text: str, *, keep_newlines: bool = False) -> str:
    """``text`` safe to print on a terminal: control characters (C0 but tab, DEL, C1: ESC, BEL,
    CSI ...) and bidi controls shown as ``\\x1b`` / ``\\u202e``; newlines too unless
    ``keep_newlines``."""
    if text.isprintable():
        return text
    out = []
    for ch in text:
        if (ch == "\n" and keep_newlines) or ch == "\t":
            out.append(ch)
        elif ch in _BIDI or unicodedata.category(ch) == "Cc":
            out.append(_escape(ch))
        else:
            out.append(ch)
    return "".join(out)


def json_visible(text: str) -> str:
    """JSON text (``json.dumps(..., ensure_ascii=False)``) with the controls it leaves as they
    are (C1 controls such as CSI, DEL, bidi controls) written as ``\\uXXXX`` escapes: the same
    JSON, safe to print. (JSON escapes C0 controls itself.)"""
    if text.isprintable():
        return text
    return "".join(
        f"\\u{ord(ch):04x}"
        if ch in _BIDI or (unicodedata.category(ch) == "Cc" and ch != "\n")
        else ch
        for ch in text
    )


def csv_cell(value: object) -> object:
    """A CSV cell that a spreadsheet shows as text: a string starting with ``=``, ``+``,
    ``-``, ``@``, a tab or a CR gets a leading ``'``; numbers and other values unchanged."""
    if isinstance(value, str) and value.startswith(_FORMULA_START):
        return "'" + value
    return value


def run_id_problem(run_id: object) -> str | None:
    """Why ``run_id`` is not a run id (see :data:`RUN_ID_PATTERN`), or ``None`` when it is."""
    if not isinstance(run_id, str):
        return f"a run id is a string, got {type(run_id).__name__}"
    if RUN_ID_PATTERN.fullmatch(run_id) is None or ".." in run_id:
        shown = visible(repr(run_id[:80]))
        return (
            f"{shown} is not a run id (1 to 128 letters, digits, '.', '_' or '-', starting with a "
            "letter or digit, no '..': it must name one file and one object key)"
        )
    return None


def check_run_id(run_id: object) -> str:
    """``run_id``, when it has the form of a run id.

    Raises:
        ValueError: it does not (the message says why).
    """
    problem = run_id_problem(run_id)
    if problem is not None:
        raise ValueError(problem)
    return run_id  # type: ignore[return-value]
