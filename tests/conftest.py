"""Shared test setup: keep the developer's environment out of config tests; the real
``kubernetes`` client for tests that run a kmock API server."""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator
from typing import Any

import pytest
from kubernetes import client as k8s_client


@pytest.fixture(autouse=True)
def _no_planner_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    """Config tests must not see PLANNER_*/PROMETHEUS_* variables of the machine."""
    for key in list(os.environ):
        if key.startswith(("PLANNER_", "PROMETHEUS_", "DYN_")) or key == "POD_NAMESPACE":
            monkeypatch.delenv(key, raising=False)


@pytest.fixture
async def api_client(kmock: Any) -> AsyncIterator[k8s_client.ApiClient]:
    """The real ``kubernetes`` client pointed at the test's kmock server."""
    configuration = k8s_client.Configuration()
    configuration.host = str(kmock.url).rstrip("/")
    api = k8s_client.ApiClient(configuration)
    yield api
    await asyncio.to_thread(api.close)
