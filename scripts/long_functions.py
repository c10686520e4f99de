"""Lists functions longer than a limit (default 60 lines of code: docstrings, comments and blank
lines not counted), for the rule that no function in src/ or integrations/ runs past ~60 lines.

Usage: python scripts/long_functions.py [LIMIT] [PATH ...]
"""

from __future__ import annotations

import ast
import io
import sys
import tokenize
from pathlib import Path


def _code_lines(source: str) -> set[int]:
    """Line numbers holding code (not only comments, blanks or a docstring's text)."""
    lines: set[int] = set()
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type in (
            tokenize.COMMENT,
            tokenize.NL,
            tokenize.NEWLINE,
            tokenize.INDENT,
            tokenize.DEDENT,
            tokenize.ENDMARKER,
        ):
            continue
        lines.update(range(tok.start[0], tok.end[0] + 1))
    return lines


def long_functions(path: Path, limit: int) -> list[tuple[int, str, int]]:
    source = path.read_text()
    code = _code_lines(source)
    found = []
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        body = node.body
        doc = set()
        if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
            doc = set(range(body[0].lineno, body[0].end_lineno + 1))
        span = set(range(node.lineno, node.end_lineno + 1))
        n = len((span & code) - doc)
        if n > limit:
            found.append((node.lineno, node.name, n))
    return found


def main(argv: list[str]) -> int:
    limit = int(argv[0]) if argv and argv[0].isdigit() else 60
    roots = [Path(a) for a in argv[1:] if not a.isdigit()] or [Path("src"), Path("integrations")]
    bad = 0
    for root in roots:
        for path in sorted(root.rglob("*.py") if root.is_dir() else [root]):
            for line, name, n in long_functions(path, limit):
                print(f"{path}:{line}: {name} has {n} lines of code (limit {limit})")
                bad += 1
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
