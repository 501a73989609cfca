"""Fixtures for the reconcile-loop tests: a clock that jumps, kmock as the Kubernetes API
with the real connector, a canned Prometheus with the real observer, a real NPZ profile."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any

import pytest
from kubernetes import client as k8s_client

from disagg_planner.config.schema import PlannerConfig
from disagg_planner.connectors.kubernetes import KubernetesConnector
from disagg_planner.observe.prometheus import PrometheusTrafficObserver
from disagg_planner.profiles import Profile
from disagg_planner.runtime.connector_settings import kubernetes_settings
from disagg_planner.runtime.loop import DeploymentLoop, DeploymentRef
from disagg_planner.runtime.metrics import HealthState, PlannerMetrics
from tests.integration.connectors.conftest import DGD_NAME, NS, Cluster, frontend, worker
from tests.unit.observe.canned_prometheus import CannedPrometheus, vector_reply
from tests.unit.runtime import conftest as unit_runtime
from tests.unit.runtime.conftest import START_S, loop_config, traffic_parts

profile = unit_runtime.profile  # the real NPZ profile fixture the unit tests use


class JumpClock:
    """Unix-like seconds that move only when the loop sleeps: a tick interval takes no time.

    Every sleep still yields to the event loop (kmock and the threads serving HTTP run).
    """

    def __init__(self, start_s: float = START_S) -> None:
        self.now_s = start_s
        self.sleeps: list[float] = []

    def now(self) -> float:
        return self.now_s

    async def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.now_s += max(0.0, seconds)
        await asyncio.sleep(0)

    async def sleep_until(self, at_s: float, stop: asyncio.Event) -> bool:
        if stop.is_set():
            return True
        self.sleeps.append(at_s - self.now_s)
        self.now_s = max(self.now_s, at_s)
        await asyncio.sleep(0.005)  # let the test (or kmock) act between ticks
        return stop.is_set()


@pytest.fixture
def prometheus() -> Iterator[CannedPrometheus]:
    api = CannedPrometheus()
    api.reply = vector_reply(traffic_parts(10.0, 60.0))
    yield api
    api.close()


@pytest.fixture
def cluster(kmock: Any) -> Cluster:
    cluster = Cluster(kmock)
    cluster.add_dgd(
        {
            "Frontend": frontend(),
            "prefill": worker("prefill", 1),
            "decode": worker("decode", 1),
        }
    )
    return cluster


class Harness:
    """A loop wired to kmock and the canned Prometheus, driven tick by tick."""

    def __init__(
        self,
        config: PlannerConfig,
        *,
        api_client: k8s_client.ApiClient,
        prometheus: CannedPrometheus,
        profile: Profile,
        **loop_kwargs: Any,
    ) -> None:
        self.clock = JumpClock()
        self.metrics = PlannerMetrics()
        self.health = HealthState()
        self.outcomes: list[Any] = []
        self.stop = asyncio.Event()
        connector = KubernetesConnector(
            kubernetes_settings(config),
            api_client=api_client,
            clock=self.clock.now,
            sleep=self.clock.sleep,
        )
        endpoint = prometheus.url
        observer_config = config.model_copy(update={"metric_pulling_prometheus_endpoint": endpoint})

        async def record(outcome: Any) -> None:
            self.outcomes.append(outcome)

        kwargs: dict[str, Any] = {
            "traffic_factory": lambda model: PrometheusTrafficObserver(
                observer_config, model_name=model
            ),
            "on_outcome": record,
        }
        kwargs.update(loop_kwargs)
        self.loop = DeploymentLoop(
            config,
            connector=connector,
            ref=DeploymentRef(NS, DGD_NAME),
            clock=self.clock,
            profile=profile if config.throughput_scaling_active else None,
            metrics=self.metrics,
            health=self.health,
            **kwargs,
        )

    async def start(self) -> None:
        assert await self.loop.start(self.stop)

    async def next_tick(self) -> Any:
        """Jump to the next scheduled tick (or the backoff's end) and run it."""
        assert self.loop.core is not None
        wake = max(self.loop.core.next_tick_at_s, self.loop._not_before_s)
        self.clock.now_s = max(self.clock.now_s, wake)
        return await self.loop.tick()

    def sample(self, name: str, **labels: str) -> float | None:
        value = self.metrics.registry.get_sample_value(
            name, {"namespace": NS, "dgd": DGD_NAME, **labels}
        )
        return value


@pytest.fixture
async def harness_factory(
    api_client: k8s_client.ApiClient, prometheus: CannedPrometheus, profile: Profile
) -> AsyncIterator[Callable[..., Harness]]:
    """Makes harnesses; at teardown closes every loop they made (its FPM sources and
    discovery threads, observer and connector) before kmock and the client go away, so no
    thread goes on retrying a stopped server. Closing a loop that ``run()`` closed is a
    no-op."""
    made: list[Harness] = []

    def make(config: PlannerConfig | None = None, **loop_kwargs: Any) -> Harness:
        harness = Harness(
            config or loop_config(),
            api_client=api_client,
            prometheus=prometheus,
            profile=profile,
            **loop_kwargs,
        )
        made.append(harness)
        return harness

    yield make
    for harness in made:
        await harness.loop.close()


def spec_replicas(cluster: Cluster) -> dict[str, int]:
    services = cluster.dgd()["spec"]["services"]
    return {"prefill": services["prefill"]["replicas"], "decode": services["decode"]["replicas"]}
