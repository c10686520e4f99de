"""The suite's fixtures (what they are made of is in tests/support)."""

from __future__ import annotations

import pytest

from tests.support.models import tiny_llama


@pytest.fixture(autouse=True, scope="session")
def _no_pretrain_flops_from_the_shell():
    """A ``PRETRAIN_FLOPS`` set in the shell would change every threshold the tests work out by
    hand: the whole session runs without it, module fixtures included (a test that wants it sets
    it with ``monkeypatch``)."""
    with pytest.MonkeyPatch.context() as patch:
        patch.delenv("PRETRAIN_FLOPS", raising=False)
        yield


@pytest.fixture
def model():
    return tiny_llama()
