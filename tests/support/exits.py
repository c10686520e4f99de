"""Exit checks of the processes a test launches, and gloo's teardown abort (rerun once).

A failing subprocess's message is the tail of its output; a line that names gloo's teardown
abort can be far above that tail (under torchrun, rank 0 logs on for pages after rank 1 died),
so the message always carries such lines first, wherever they were printed: the rerun rule in
tests/conftest.py matches the message, and a signature cut off by the tail was a failed CI run
(stop 26: rank 1's ``terminate called`` above rank 0's checkpoint log)."""

from __future__ import annotations

import re
import subprocess
from collections.abc import Callable

#: What gloo's teardown prints when a rank aborts after the test's work is done: at the process's
#: exit, after ``destroy_process_group``, a C++ thread of the process group is destroyed while
#: still joinable ("terminate called without an active exception", SIGABRT). Seen about once in
#: twenty fresh-clone CI runs in most gloo tests, each time in rank 1 of a two-process test whose
#: outputs were all written; in the LLaMA-Factory torchrun test, whose rank 0 saves a checkpoint
#: after rank 1 has left, in 3 of its last 4 full-suite runs (never in 7 runs of it alone), so
#: that test tries each run up to three times past it (:func:`tries_past_teardown_abort`). An upstream race (pytorch/pytorch
#: PR 179291 describes gloo threads outliving the interpreter's teardown); a test that spawns
#: gloo processes is run once more when, and only when, it fails with this signature: a wrong
#: count, a hang or any other failure is never retried.
GLOO_TEARDOWN_ABORT = [
    r"terminate called without an active exception",
    r"terminated with signal SIGABRT",
]


def teardown_lines(text: str) -> list[str]:
    """The lines of ``text`` that carry the teardown abort's signature."""
    return [
        line for line in text.splitlines() if any(re.search(p, line) for p in GLOO_TEARDOWN_ABORT)
    ]


def exit_message(done: subprocess.CompletedProcess[str], *, tail_chars: int = 3000) -> str:
    """What a failed ``done`` is reported with: its exit status, every teardown-signature line
    of its output (wherever it was printed), then the tails of stdout and stderr."""
    out, err = done.stdout or "", done.stderr or ""
    found = teardown_lines(out) + teardown_lines(err)
    head = ["gloo teardown signature:", *found] if found else []
    return "\n".join([f"exit {done.returncode}", *head, out[-tail_chars:], err[-2 * tail_chars :]])


def tries_past_teardown_abort(
    attempt: Callable[[int], subprocess.CompletedProcess[str]], tries: int = 3
) -> tuple[int, subprocess.CompletedProcess[str]]:
    """``attempt(i)`` for ``i = 0, 1, ...`` until a try does not fail with gloo's teardown
    abort, at most ``tries`` times; the index and result of the last try made.

    Each try must run in a folder of its own (a report left by an aborted try would be
    another run's report to the next). A try that exits 0, or fails without the signature,
    ends it at once: any other failure is never tried again, and a run that aborts on every
    try comes back failed. For the two-rank runs whose rank 0 works on for seconds after
    rank 1 has left (a checkpoint save), where the abort comes far more often than once in
    twenty runs under the suite's load (tests/integrations/test_frameworks_llamafactory.py).
    """
    for i in range(tries):
        done = attempt(i)
        if done.returncode == 0 or not teardown_lines(f"{done.stdout or ''}\n{done.stderr or ''}"):
            break
    return i, done


def assert_exit_ok(done: subprocess.CompletedProcess[str], *, tail_chars: int = 3000) -> None:
    """Fails unless ``done`` exited 0, with :func:`exit_message`."""
    assert done.returncode == 0, exit_message(done, tail_chars=tail_chars)
