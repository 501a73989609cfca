"""The operator end to end: real kopf in the test's event loop, kmock as the API server (with
the connector tests' DGD helpers), a canned Prometheus, a real NPZ profile.

kmock 0.8 gaps that matter here (see ../shared/reference/stack-notes.md section 2): the
built-ins must be loaded (kopf waits for ``v1/events`` before it watches anything), a create
answers 200 so the client returns no body (objects are read back from kmock), ``/status``
patches merge into the whole object, there are no ``resourceVersion``s.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import kmock as kmock_lib
import pytest
from kubernetes import client as k8s_client

from disagg_planner.operator.app import OperatorOptions, PolicyRunner, run_operator
from disagg_planner.operator.crd import GROUP, KIND, PLURAL, SINGULAR, VERSION
from disagg_planner.operator.policy import OperatorDefaults
from disagg_planner.operator.pool import POOL_KIND, POOL_PLURAL, POOL_SINGULAR
from tests.integration.connectors.conftest import NS, Cluster, frontend, worker
from tests.unit.core.conftest import write_h200_like_profile
from tests.unit.observe.canned_prometheus import CannedPrometheus, vector_reply
from tests.unit.runtime.conftest import traffic_parts

T = TypeVar("T")

POLICY = f"{GROUP}/{VERSION}/{PLURAL}"
PEERING = "kopf.dev/v1/kopfpeerings"
POOL = f"{GROUP}/{VERSION}/{POOL_PLURAL}"
INTERVAL_S = 1.0


async def eventually(
    probe: Callable[[], T | None], *, what: str, timeout_s: float = 15.0, every_s: float = 0.05
) -> T:
    """Poll ``probe`` on the event loop (kmock and kopf keep running) until it answers."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = probe()
        if value is not None and value is not False:
            return value
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout_s:g} s waiting for {what}")
        await asyncio.sleep(every_s)


class OperatorCluster(Cluster):
    """kmock with DGDs, the PlannerPolicy resource and kopf's peering resource."""

    def __init__(self, kmock: Any, api: k8s_client.ApiClient) -> None:
        super().__init__(kmock)
        self.api = k8s_client.CustomObjectsApi(api)
        verbs = {"get", "list", "watch", "create", "patch", "delete"}
        kmock.resources[POLICY] = kmock_lib.ResourceInfo(
            kind=KIND,
            singular=SINGULAR,
            namespaced=True,
            verbs=verbs,
            shortnames={"plp"},
            subresources={"status"},
        )
        kmock.resources[POOL] = kmock_lib.ResourceInfo(
            kind=POOL_KIND,
            singular=POOL_SINGULAR,
            namespaced=True,
            verbs=verbs,
            shortnames={"plpool"},
            subresources={"status"},
        )
        kmock.resources[PEERING] = kmock_lib.ResourceInfo(
            kind="KopfPeering", singular="kopfpeering", namespaced=True, verbs=verbs
        )

    def add_graph(self, name: str, *, prefill: int = 1, decode: int = 1) -> None:
        self.add_dgd(
            {
                "Frontend": frontend(),
                "prefill": worker("prefill", prefill),
                "decode": worker("decode", decode),
            },
            name=name,
        )

    def graph_replicas(self, name: str) -> dict[str, int]:
        """The replicas of the prefill and decode services of the DGD ``name``."""
        services = self.dgd(name)["spec"]["services"]
        return {r: services[r]["replicas"] for r in ("prefill", "decode")}

    async def add_policy(self, name: str, spec: dict[str, Any]) -> None:
        """Create a policy through the API (edits of kmock's store emit no watch events)."""
        body = {
            "apiVersion": f"{GROUP}/{VERSION}",
            "kind": KIND,
            # kmock sets neither: kopf keys its per-object memory by uid (objects without one
            # would share one daemon) and guards finalizer patches by resourceVersion.
            "metadata": {
                "name": name,
                "namespace": NS,
                "uid": f"uid-{name}",
                "resourceVersion": "1",
            },
            "spec": spec,
        }
        await asyncio.to_thread(
            self.api.create_namespaced_custom_object, GROUP, VERSION, NS, PLURAL, body
        )

    async def patch_policy(self, name: str, patch: dict[str, Any]) -> None:
        await asyncio.to_thread(
            self.api.patch_namespaced_custom_object, GROUP, VERSION, NS, PLURAL, name, patch
        )

    async def delete_policy(self, name: str) -> None:
        await asyncio.to_thread(
            self.api.delete_namespaced_custom_object, GROUP, VERSION, NS, PLURAL, name
        )

    def policy(self, name: str) -> dict[str, Any] | None:
        try:
            obj = self.kmock.objects[POLICY, NS, name]
        except KeyError:
            return None
        # kmock keeps a deleted object (flagged) in its history
        return None if obj.deleted else dict(obj.raw)

    def condition(self, policy: str, kind: str) -> dict[str, Any] | None:
        obj = self.policy(policy) or {}
        for condition in (obj.get("status") or {}).get("conditions") or []:
            if condition["type"] == kind:
                return dict(condition)
        return None

    def dgd_requests(self, name: str) -> list[Any]:
        return [
            r
            for r in self.kmock
            if r.resource is not None
            and r.resource.plural == "dynamographdeployments"
            and r.name == name
        ]


@pytest.fixture
async def operator_cluster(kmock: Any) -> AsyncIterator[OperatorCluster]:
    configuration = k8s_client.Configuration()
    configuration.host = str(kmock.url).rstrip("/")
    api = k8s_client.ApiClient(configuration)
    yield OperatorCluster(kmock, api)
    await asyncio.to_thread(api.close)


@pytest.fixture(scope="session")
def profile_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_h200_like_profile(tmp_path_factory.mktemp("profile"))


@pytest.fixture
def prometheus() -> Iterator[CannedPrometheus]:
    api = CannedPrometheus()
    api.reply = vector_reply(traffic_parts(10.0, INTERVAL_S))
    yield api
    api.close()


@pytest.fixture
def defaults(profile_dir: Path, prometheus: CannedPrometheus) -> OperatorDefaults:
    """The operator's own settings: fast loops, the canned Prometheus, the test profile."""
    return OperatorDefaults(
        flags={
            "profile_results_dir": str(profile_dir),
            "metric_pulling_prometheus_endpoint": prometheus.url,
            "load_predictor": "constant",
            "throughput_adjustment_interval_seconds": INTERVAL_S,
            # the operator's mechanics, not the scale-down stabilisation (600 s by default)
            "scale_down_stabilization_seconds": 0,
            "max_gpu_budget": -1,
            "report_interval_hours": None,
            "kubernetes_api_max_attempts": 2,
            "kubernetes_api_backoff_seconds": 0.1,
        },
        environ={},
    )


class RunningOperator:
    """One operator process's worth of kopf, on its own event loop in a thread.

    Not in the test's loop: when kopf stops it cancels every task created after it started
    (kopf's ``run_tasks``), which there would include pytest's own fixture tasks.
    """

    def __init__(self, options: OperatorOptions, api: k8s_client.ApiClient) -> None:
        self.options = options
        self.api = api
        self.runner: PolicyRunner | None = None
        self.error: BaseException | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._main, name="operator", daemon=True)

    def _main(self) -> None:
        async def main() -> None:
            self._loop = asyncio.get_running_loop()
            self._stop = asyncio.Event()
            ready = asyncio.Event()
            runner: asyncio.Future[PolicyRunner] = self._loop.create_future()
            runner.add_done_callback(lambda f: setattr(self, "runner", f.result()))
            watch = asyncio.create_task(ready.wait())
            watch.add_done_callback(lambda _: self._ready.set())
            await run_operator(
                self.options,
                api_client=self.api,
                stop=self._stop,
                ready=ready,
                runner_ready=runner,
            )

        try:
            asyncio.run(main())
        except BaseException as exc:  # surfaced by stop()
            self.error = exc
        finally:
            self._ready.set()

    async def start(self) -> None:
        self._thread.start()
        await asyncio.to_thread(self._ready.wait, 15)
        if self.error is not None or self.runner is None:
            raise RuntimeError(f"the operator did not start: {self.error!r}")

    async def stop(self) -> None:
        if self._loop is not None and self._stop is not None and self._thread.is_alive():
            self._loop.call_soon_threadsafe(self._stop.set)
        await asyncio.to_thread(self._thread.join, 30)
        assert not self._thread.is_alive(), "the operator did not stop within 30 s"
        if self.error is not None:
            raise self.error

    @property
    def loops(self) -> dict[Any, Any]:
        assert self.runner is not None
        return self.runner.loops


@pytest.fixture
async def start_operator(
    kmock: Any, defaults: OperatorDefaults
) -> AsyncIterator[Callable[..., Any]]:
    """``await start(**options)`` -> a :class:`RunningOperator` whose watches are running."""
    started: list[RunningOperator] = []

    async def start(**overrides: Any) -> RunningOperator:
        configuration = k8s_client.Configuration()
        configuration.host = str(kmock.url).rstrip("/")
        values: dict[str, Any] = {
            "defaults": defaults,
            "namespaces": (NS,),
            "standalone": True,
            "status_min_interval_s": 0.0,
        }
        values.update(overrides)
        operator = RunningOperator(OperatorOptions(**values), k8s_client.ApiClient(configuration))
        started.append(operator)
        await operator.start()
        return operator

    try:
        yield start
    finally:
        for operator in started:
            with contextlib.suppress(Exception):
                await operator.stop()
            await asyncio.to_thread(operator.api.close)
