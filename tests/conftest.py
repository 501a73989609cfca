"""Shared test setup: keep the developer's environment out of config tests."""

from __future__ import annotations

import os

import pytest


@pytest.fixture(autouse=True)
def _no_planner_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    """Config tests must not see PLANNER_*/PROMETHEUS_* variables of the machine."""
    for key in list(os.environ):
        if key.startswith(("PLANNER_", "PROMETHEUS_", "DYN_")) or key == "POD_NAMESPACE":
            monkeypatch.delenv(key, raising=False)
