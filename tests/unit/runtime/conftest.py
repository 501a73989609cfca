"""Builders the reconcile-loop tests share (a config, a window's traffic) and a real NPZ
profile. The loop's tests against servers (kmock, etcd, a canned Prometheus over HTTP) are in
tests/integration/runtime."""

from __future__ import annotations

from typing import Any

import pytest

from disagg_planner.config.schema import PlannerConfig
from disagg_planner.profiles import Profile, load_profile
from tests.integration.connectors.conftest import DGD_NAME, NS
from tests.unit.core.conftest import write_h200_like_profile

START_S = 1_700_000_000.0  # the loops' clock at start: Unix-like seconds, a fixed instant


def traffic_parts(rate_per_s: float, interval_s: float) -> dict[str, float]:
    """Increases over one window of ``rate_per_s`` requests with ISL 3000, OSL 150."""
    n = rate_per_s * interval_s
    return {
        "requests_started": n,
        "requests_finished": n,
        "ttft_sum": 0.08 * n,
        "ttft_count": n,
        "itl_sum": 0.02 * 149 * n,
        "itl_count": 149 * n,
        "isl_sum": 3000 * n,
        "isl_count": n,
        "osl_sum": 150 * n,
        "osl_count": n,
        "request_duration_sum": 3.0 * n,
        "request_duration_count": n,
    }


@pytest.fixture(scope="session")
def profile(tmp_path_factory: pytest.TempPathFactory) -> Profile:
    return load_profile(write_h200_like_profile(tmp_path_factory.mktemp("profile")))


def loop_config(**overrides: Any) -> PlannerConfig:
    values: dict[str, Any] = {
        "dgd_name": DGD_NAME,
        "kubernetes_namespace": NS,
        "load_predictor": "constant",
        "throughput_adjustment_interval_seconds": 60.0,
        "max_gpu_budget": -1,
        "kubernetes_api_max_attempts": 2,
        "kubernetes_api_backoff_seconds": 0.1,
        "report_interval_hours": None,
        # these tests drive throughput ticks one by one; the fast path has its own tests
        "fast_check_interval_seconds": None,
    }
    values.update(overrides)
    return PlannerConfig(**values)
