"""The suite's fixtures (what they are made of is in tests/support)."""

from __future__ import annotations

import pytest

from tests.support.aws import fresh_resources, moto_endpoint
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


@pytest.fixture(scope="session")
def endpoint():
    """One local moto server (S3, DynamoDB) for the session, over real HTTP."""
    pytest.importorskip("moto.server")
    yield from moto_endpoint()


@pytest.fixture
def aws(endpoint, monkeypatch):
    """Fake credentials, and a fresh bucket and table on the moto server."""
    return fresh_resources(endpoint, monkeypatch)
