"""Shared test setup: keep the developer's environment out of config tests; no test leaves a
thread running; the ``aic`` marker (tests needing the ``[aic]`` extra); the real
``kubernetes`` client for tests that run a kmock API server; the real traces (``tests/traces``)."""

from __future__ import annotations

import asyncio
import os
import threading
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client as k8s_client

from disagg_planner.connectors.kubernetes import planner_api_client
from tests.traces import (
    AZURE_CONV,
    MOONCAKE_CONV,
    SERVEGEN_M_LARGE,
    TRACE_DIR_ENV,
    SharedTrace,
    TraceMissing,
)
from tests.traces import head as trace_head
from tests.traces import locate as locate_trace


@pytest.fixture(autouse=True)
def _no_planner_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    """Config tests must not see PLANNER_*/PROMETHEUS_* variables of the machine."""
    for key in list(os.environ):
        if key == TRACE_DIR_ENV:
            continue  # where the tests find the real traces, not a planner setting
        if key.startswith(("PLANNER_", "PROMETHEUS_", "DYN_")) or key == "POD_NAMESPACE":
            monkeypatch.delenv(key, raising=False)


# FpmPublisherWatcher names its threads so (observe/fpm_discovery.py): they are daemons, so
# one left behind would go on retrying a stopped test server until the session ends.
DISCOVERY_THREAD_PREFIX = "fpm-discovery-"
# How long a thread may take to notice it was stopped (a watch blocked on a socket that its
# server's teardown just closed ends within this).
THREAD_EXIT_GRACE_S = 5.0


def _lingering(before: set[threading.Thread]) -> list[threading.Thread]:
    return [
        t
        for t in threading.enumerate()
        if t not in before
        and t.is_alive()
        and (not t.daemon or t.name.startswith(DISCOVERY_THREAD_PREFIX))
    ]


@pytest.fixture(autouse=True)
def _no_thread_left_running(request: pytest.FixtureRequest) -> Iterator[None]:
    """Fail a test that leaves a new non-daemon thread (which would keep the interpreter
    alive) or an FPM-discovery thread running once all its fixtures were torn down.

    Autouse and defined here, it is set up before, so torn down after, every other
    function-scoped fixture of the test (its event loop, servers and harnesses included).
    """
    before = set(threading.enumerate())
    yield
    deadline = time.monotonic() + THREAD_EXIT_GRACE_S
    for thread in _lingering(before):
        thread.join(max(0.0, deadline - time.monotonic()))
    left = _lingering(before)
    if left:
        names = ", ".join(f"{t.name!r} ({'daemon' if t.daemon else 'non-daemon'})" for t in left)
        pytest.fail(
            f"{request.node.nodeid} left {len(left)} thread(s) running "
            f"{THREAD_EXIT_GRACE_S:g} s after its teardown: {names}; stop them in the "
            "test or in the fixture that started them",
            pytrace=False,
        )


def in_ci() -> bool:
    """Under CI (``CI=true``) the traces and the ``[aic]`` extra are there: a missing one is
    a broken setup that fails the test, not a reason to skip it."""
    return os.environ.get("CI") == "true"


# The extra that tests marked ``aic`` need (``.ci/run`` installs it; the README says how).
AIC_MODULE = "aiconfigurator_core"
AIC_REASON = "needs the [aic] extra (aiconfigurator-core): pip install -e '.[aic]'"


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    """Skip a test marked ``aic`` when the extra is not installed (before its fixtures build
    an aic engine); under ``CI=true`` fail it instead: CI installs the extra, so a missing
    one there is a broken setup, not a test to leave out."""
    if item.get_closest_marker("aic") is None:
        return
    if in_ci():
        try:
            __import__(AIC_MODULE)
        except ImportError as missing:
            pytest.fail(f"{AIC_REASON} ({missing})", pytrace=False)
        return
    pytest.importorskip(AIC_MODULE, reason=AIC_REASON)


# --- the parallel run (pytest-xdist, ``-n auto --dist loadfile`` in pyproject.toml) ----------
#
# Each test file runs whole on one worker, so that a module's fixtures (a sweep, a fitted
# curve) are computed once, as in a serial run. (``--dist loadgroup`` would let files that
# share a process's memo run on one worker, but xdist 3.8 marks a group by rewriting the
# item's ``_nodeid``, which pytest 9 no longer reads: every test was scheduled alone.)
# Scheduling only: the longest files start first, so that none starts last and runs alone
# (the live e2e waits on its ticks for over a minute; the reference searches are minutes of
# CPU). The rest follow in collection order. A stale entry costs wall time, nothing else.
LONGEST_FILES = (
    "tests/e2e/test_live_loop.py",
    "tests/unit/replay/test_bounds.py",
    "tests/unit/replay/test_oracle_plan.py",
    "tests/unit/replay/test_best_static.py",
    "tests/e2e/test_chaos.py",
    "tests/unit/replay/test_replay.py",
    "tests/integration/prometheus/test_traffic_observer.py",
    "tests/integration/operator/test_pool.py",
    "tests/unit/replay/test_parallel.py",
    "tests/unit/benchmarks/test_scorecard.py",
    "tests/unit/benchmarks/test_scripts_start.py",
    "tests/e2e/test_restart.py",
)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Under pytest-xdist (``--no-loadscope-reorder`` keeps this order of the files), the
    longest files first."""
    if config.getoption("dist", default="no") == "no":
        return

    def rank(item: pytest.Item) -> int:
        path = item.nodeid.split("::", 1)[0]
        return LONGEST_FILES.index(path) if path in LONGEST_FILES else len(LONGEST_FILES)

    items.sort(key=rank)  # stable: collection order within a file and among the rest


@pytest.fixture
async def api_client(kmock: Any) -> AsyncIterator[k8s_client.ApiClient]:
    """The real ``kubernetes`` client pointed at the test's kmock server, configured as the
    planner configures its own (no hidden urllib3 retries, the pool sized to its threads)."""
    configuration = k8s_client.Configuration()
    configuration.host = str(kmock.url).rstrip("/")
    api = planner_api_client(configuration)
    yield api
    await asyncio.to_thread(api.close)


def real_trace(trace: SharedTrace) -> Path:
    """The shared trace's path. Missing, it skips the test, but fails it under ``CI=true``:
    CI has the folder, so a missing file there is a broken setup, not a test to leave out."""
    try:
        return locate_trace(trace)
    except TraceMissing as missing:
        if in_ci():
            pytest.fail(str(missing), pytrace=False)
        pytest.skip(str(missing))


@pytest.fixture(scope="session")
def azure_trace() -> Path:
    return real_trace(AZURE_CONV)


@pytest.fixture(scope="session")
def mooncake_trace() -> Path:
    return real_trace(MOONCAKE_CONV)


@pytest.fixture(scope="session")
def servegen_m_large() -> Path:
    """The folder of ServeGen's m-large client descriptions (ten clients, 14 days)."""
    return real_trace(SERVEGEN_M_LARGE).parent


@pytest.fixture(scope="session")
def azure_head(azure_trace: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The header and first 300 rows of the Azure 2023 conversation trace, byte-exact."""
    folder = tmp_path_factory.mktemp("traces")
    return trace_head(azure_trace, 301, folder / "azure_conv_2023_head300.csv")


@pytest.fixture(scope="session")
def mooncake_head(mooncake_trace: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The first 300 lines of the Mooncake conversation trace, byte-exact."""
    folder = tmp_path_factory.mktemp("traces")
    return trace_head(mooncake_trace, 300, folder / "mooncake_conversation_head300.jsonl")
