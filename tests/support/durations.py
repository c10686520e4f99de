"""How long each slow test took (setup, call and teardown together), kept in
tests/support/durations.json, so that scripts/test hands out the longest work units first
(tests/support/scheduling.py): with two workers, a five-minute unit that starts last is five
minutes of one worker alone at the end.

The file is written by a run with ``--record-durations`` (``scripts/test --record-durations``:
the whole suite, or any part of it: the tests that ran are updated, the others kept). Only tests
of at least :data:`RECORDED_FROM` seconds are kept; a test the file does not name counts as
:data:`UNKNOWN` seconds, so a new slow test is handed out late until the file is written again.
"""

from __future__ import annotations

import functools
import json
from collections import defaultdict
from collections.abc import Iterable, Mapping
from pathlib import Path

#: The committed durations, node id to seconds.
DURATIONS_FILE = Path(__file__).with_name("durations.json")
#: The shortest test the file keeps, in seconds.
RECORDED_FROM = 0.5
#: The seconds a test the file does not name is taken to take.
UNKNOWN = 0.1


@functools.cache
def known_durations(path: Path = DURATIONS_FILE) -> Mapping[str, float]:
    """The file's durations (none when it is missing or unreadable: the order is then
    xdist's own)."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return {str(k): float(v) for k, v in data.items()} if isinstance(data, dict) else {}


def unit_seconds(nodeids: Iterable[str], known: Mapping[str, float]) -> float:
    """The expected seconds of a work unit made of the tests ``nodeids``."""
    return sum(known.get(nodeid, UNKNOWN) for nodeid in nodeids)


def merged(old: Mapping[str, float], measured: Mapping[str, float]) -> dict[str, float]:
    """``old`` with each test of ``measured`` set to its new seconds (or dropped, under
    :data:`RECORDED_FROM`), sorted by node id."""
    out = {k: v for k, v in old.items() if k not in measured}
    out.update({k: round(v, 1) for k, v in measured.items() if v >= RECORDED_FROM})
    return dict(sorted(out.items()))


class DurationRecorder:
    """A pytest plugin (``--record-durations``) summing each test's phases, written to
    :data:`DURATIONS_FILE` at the session's end: on the controller under xdist, whose reports
    come from every worker."""

    def __init__(self, path: Path = DURATIONS_FILE) -> None:
        self.path = path
        self.seconds: defaultdict[str, float] = defaultdict(float)

    def pytest_runtest_logreport(self, report) -> None:
        self.seconds[report.nodeid] += report.duration

    def pytest_sessionfinish(self, session) -> None:
        if hasattr(session.config, "workerinput"):
            return  # an xdist worker: the controller writes it
        try:
            old = json.loads(self.path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            old = {}
        text = json.dumps(merged(old, self.seconds), indent=0) + "\n"
        self.path.write_text(text, encoding="utf-8")
