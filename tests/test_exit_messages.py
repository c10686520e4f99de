"""The message a failed subprocess is reported with keeps gloo's teardown signature, wherever it
was printed, so the one-rerun rule (tests/conftest.py) can see it; nothing else matches it."""

from __future__ import annotations

import re
import subprocess

import pytest

from tests.support.exits import (
    GLOO_TEARDOWN_ABORT,
    assert_exit_ok,
    exit_message,
    tries_past_teardown_abort,
)


def _failed(stderr: str, returncode: int = 1) -> subprocess.CompletedProcess[str]:
    return subprocess.CompletedProcess(["torchrun"], returncode, stdout="", stderr=stderr)


def _rerun(message: str) -> bool:
    """The conftest rule's test of a failure: the rerunfailures plugin searches every pattern
    in ``"AssertionError: <message>"``."""
    return any(re.search(p, f"AssertionError: {message}") for p in GLOO_TEARDOWN_ABORT)


def test_a_signature_far_above_the_tail_is_in_the_message():
    # stop 26's shape: rank 1 aborts, then rank 0 logs pages of checkpoint output
    stderr = "rank 1 done\nterminate called without an active exception\n" + "x" * 50_000
    message = exit_message(_failed(stderr))
    assert "terminate called without an active exception" in message
    assert "terminate called" not in stderr[-6000:]  # the old message's tail had lost it
    assert _rerun(message)


def test_a_real_failure_is_not_taken_for_the_teardown_abort():
    stderr = "y" * 10_000 + "\nTraceback\nRuntimeError: counts disagree\n"
    message = exit_message(_failed(stderr))
    assert "counts disagree" in message and not _rerun(message)
    with pytest.raises(AssertionError) as caught:
        assert_exit_ok(_failed(stderr))
    assert not _rerun(str(caught.value))


def test_a_clean_exit_passes():
    assert_exit_ok(subprocess.CompletedProcess(["x"], 0, stdout="", stderr=""))


def _tries(outcomes: list[tuple[int, str]]):
    made: list[int] = []

    def attempt(i: int) -> subprocess.CompletedProcess[str]:
        made.append(i)
        rc, err = outcomes[i]
        return subprocess.CompletedProcess(["torchrun"], rc, stdout="", stderr=err)

    return made, attempt


def test_a_run_is_tried_again_only_past_the_teardown_abort():
    abort = "saving\nterminate called without an active exception\n" + "z" * 9000
    made, attempt = _tries([(1, abort), (1, abort), (0, "")])
    i, done = tries_past_teardown_abort(attempt)
    assert (i, done.returncode, made) == (2, 0, [0, 1, 2])
    # any other failure ends it at once, and comes back failed
    made, attempt = _tries([(1, "RuntimeError: counts disagree"), (0, "")])
    i, done = tries_past_teardown_abort(attempt)
    assert (i, done.returncode, made) == (0, 1, [0])
    # an abort on every try comes back failed, after the tries allowed
    made, attempt = _tries([(1, abort)] * 3)
    i, done = tries_past_teardown_abort(attempt)
    assert (i, done.returncode, made) == (2, 1, [0, 1, 2])
    assert _rerun(exit_message(done))
