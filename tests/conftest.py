"""The suite's fixtures (what they are made of is in tests/support)."""

from __future__ import annotations

import os

# Under pytest-xdist (scripts/test) each worker gets its share of the cores for torch's own
# threads, set before torch is first imported: N workers of all-core thread pools on N cores
# spin against one another (the tests' subprocesses run with one thread already).
if "PYTEST_XDIST_WORKER_COUNT" in os.environ and "OMP_NUM_THREADS" not in os.environ:
    _share = (os.cpu_count() or 1) // max(1, int(os.environ["PYTEST_XDIST_WORKER_COUNT"]))
    os.environ["OMP_NUM_THREADS"] = str(max(1, _share))

import pytest

from tests.support.aws import fresh_resources, moto_endpoint
from tests.support.durations import DurationRecorder
from tests.support.exits import GLOO_TEARDOWN_ABORT
from tests.support.models import tiny_llama
from tests.support.scheduling import make_scheduler
from tests.support.shared_runs import SharedRuns, session_root


@pytest.fixture(autouse=True, scope="session")
def _no_pretrain_flops_from_the_shell():
    """A ``PRETRAIN_FLOPS`` set in the shell would change every threshold the tests work out by
    hand: the whole session runs without it, module fixtures included (a test that wants it sets
    it with ``monkeypatch``)."""
    with pytest.MonkeyPatch.context() as patch:
        patch.delenv("PRETRAIN_FLOPS", raising=False)
        yield


@pytest.fixture(autouse=True, scope="session")
def _plan_cache_of_the_session(tmp_path_factory):
    """``flopmeter estimate`` caches plans on disk (docs/planner.md, "Speed"): the session's
    go to a folder of its own, never the user's cache (module fixtures and subprocesses
    included)."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("FLOPMETER_CACHE_DIR", str(tmp_path_factory.mktemp("plan-cache")))
        yield


@pytest.fixture(autouse=True)
def _plan_cache_of_the_test(tmp_path_factory, monkeypatch):
    """Each test starts with an empty plan cache, so no test is served a plan another made
    (one that patches the planner would be)."""
    monkeypatch.setenv("FLOPMETER_CACHE_DIR", str(tmp_path_factory.mktemp("plan-cache")))


@pytest.fixture(scope="session")
def shared_runs(tmp_path_factory):
    """The runs made once in the session, shared by its xdist workers: a deterministic
    baseline several tests compare with (tests/support/shared_runs.py)."""
    return SharedRuns(session_root(tmp_path_factory.getbasetemp()))


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


def pytest_addoption(parser):
    parser.addoption(
        "--record-durations",
        action="store_true",
        help="write the seconds of each slow test that ran into tests/support/durations.json, "
        "which orders scripts/test's work units (tests/support/durations.py)",
    )


def pytest_configure(config):
    if config.getoption("record_durations"):
        config.pluginmanager.register(DurationRecorder(), "flopmeter-durations")


@pytest.hookimpl(optionalhook=True)  # a hook of pytest-xdist, there only when it is installed
def pytest_xdist_make_scheduler(config, log):
    """Under ``-n N --dist loadscope`` (scripts/test): a module that makes a module-scoped
    fixture is one work unit, every other test its own (tests/support/scheduling.py)."""
    if config.getoption("dist") != "loadscope":
        return None
    return make_scheduler(config, log)


def pytest_collection_modifyitems(config, items):
    """Tests marked ``gloo`` get one rerun for gloo's teardown abort alone."""
    for item in items:
        if item.get_closest_marker("gloo") is not None:
            item.add_marker(pytest.mark.flaky(reruns=1, only_rerun=GLOO_TEARDOWN_ABORT))
