"""``flopmeter schema``: the report's JSON schema (docs/report-schema.json is a copy)."""

from __future__ import annotations

import argparse
import json


def schema_text() -> str:
    """``FlopReport``'s JSON schema as indented JSON text, ending with a newline."""
    from flopmeter.report import FlopReport  # not at start: the other commands need none of it

    return json.dumps(FlopReport.model_json_schema(), indent=2, ensure_ascii=False) + "\n"


def run(args: argparse.Namespace) -> int:
    """Prints the schema."""
    print(schema_text(), end="")
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    """Adds the ``schema`` subcommand."""
    p = sub.add_parser("schema", help="print the JSON schema of a report file")
    p.set_defaults(func=run)
