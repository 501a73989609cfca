"""FPM publisher discovery against kmock (the API server, real ``kubernetes`` client and its
watches) with real ZMQ publishers that speak Dynamo's event plane: the load loop's engine
sources follow the workers as a DGD scales, with no endpoint configured by hand."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import pytest
import zmq
from kubernetes import client as k8s_client

from disagg_planner.observe.fpm_discovery import DiscoveredEngines, EventPlaneFpmSubscriber
from disagg_planner.signals.fpm import encode
from tests.integration.connectors.conftest import DGD_NAME, NS, k8s_config
from tests.integration.operator.conftest import eventually
from tests.kube_dynamo import DWM_PLURAL, GROUP, VERSION
from tests.unit.observe.test_fpm_discovery import event_plane_message, pod, worker_metadata
from tests.unit.regression.fpm_factory import fpm

pytestmark = pytest.mark.filterwarnings("ignore:read_binary is deprecated:DeprecationWarning")

ROLES = {"prefill-pool": "prefill", "decode-pool": "decode"}


class RelayPublisher:
    """A worker's FPM relay on Dynamo's ZMQ event plane: PUB on loopback."""

    def __init__(self, context: zmq.Context, worker: str) -> None:
        self.worker = worker
        self.sequence = 0
        self._sock = context.socket(zmq.PUB)
        self._sock.setsockopt(zmq.LINGER, 0)
        port = self._sock.bind_to_random_port("tcp://127.0.0.1")
        self.endpoint = f"tcp://127.0.0.1:{port}"

    def heartbeat(self) -> None:
        payload = encode(fpm(worker=self.worker, counter=self.sequence, wall=0.0))
        self._sock.send_multipart(event_plane_message(payload, sequence=self.sequence))
        self.sequence += 1

    def close(self) -> None:
        self._sock.close(linger=0)


class Workers:
    """Worker pods and their DynamoWorkerMetadata, created through the API (so that watches
    see them), each with a relay publisher sending heartbeats."""

    def __init__(self, api: k8s_client.ApiClient, context: zmq.Context) -> None:
        self.core = k8s_client.CoreV1Api(api)
        self.custom = k8s_client.CustomObjectsApi(api)
        self.context = context
        self.relays: dict[str, RelayPublisher] = {}

    async def start(self, name: str, service: str, *, ready: bool = True) -> RelayPublisher:
        relay = RelayPublisher(self.context, name)
        self.relays[name] = relay
        body = pod(name, service, ready=ready)
        # kmock streams an object to watches only with its namespace (a server sets it).
        body["metadata"].update(namespace=NS)
        body["metadata"]["labels"]["nvidia.com/dynamo-graph-deployment-name"] = DGD_NAME
        body.update(apiVersion="v1", kind="Pod", spec={"containers": [{"name": "main"}]})
        # The client's pydantic validate_call turns the dict into a V1Pod; its annotation
        # admits only the model.
        await asyncio.to_thread(self.core.create_namespaced_pod, NS, body)  # type: ignore[arg-type]
        metadata = worker_metadata(name, relay.endpoint)
        metadata["metadata"].update(namespace=NS)
        await asyncio.to_thread(
            self.custom.create_namespaced_custom_object, GROUP, VERSION, NS, DWM_PLURAL, metadata
        )
        return relay

    async def ready(self, name: str) -> None:
        conditions = {"status": {"conditions": [{"type": "Ready", "status": "True"}]}}
        await asyncio.to_thread(self.core.patch_namespaced_pod_status, name, NS, conditions)

    async def delete(self, name: str) -> None:
        await asyncio.to_thread(self.core.delete_namespaced_pod, name, NS)
        self.relays.pop(name).close()

    def beat(self) -> None:
        for relay in self.relays.values():
            relay.heartbeat()


@pytest.fixture
def zmq_context() -> Iterator[zmq.Context]:
    context = zmq.Context()
    yield context
    context.term()


def discovered(api_client: k8s_client.ApiClient, config: Any) -> DiscoveredEngines:
    """The engine sources of the DGD's two roles, their watches started."""
    engines = DiscoveredEngines(
        config,
        api_client=api_client,
        namespace=NS,
        dgd_name=DGD_NAME,
        service_roles=ROLES,
        # long enough that only watch events, never a re-list, can show a change
        watcher_options={"request_timeout_s": 60.0, "retry_s": 0.1},
    )
    engines.start()
    return engines


async def heard(workers: Workers, source: EventPlaneFpmSubscriber, names: set[str]) -> None:
    """Until ``source`` hears exactly the workers ``names`` (heartbeats meanwhile)."""

    def probe() -> bool:
        workers.beat()
        return {worker for worker, _ in source.snapshot()} == names

    await eventually(probe, what=f"{source.name} to hear exactly {sorted(names)}")


async def test_the_engine_sources_follow_the_workers_as_the_dgd_scales(
    cluster: Any, api_client: k8s_client.ApiClient, zmq_context: zmq.Context
) -> None:
    workers = Workers(api_client, zmq_context)
    first = await workers.start("graph-decode-0", "decode-pool")
    await workers.start("graph-frontend-0", "Frontend")  # registered, but no planner role
    engines = discovered(api_client, k8s_config())
    try:
        decode, prefill = engines.sources["decode"], engines.sources["prefill"]
        await heard(workers, decode, {"graph-decode-0"})
        assert decode.endpoints == {first.endpoint}
        assert prefill.endpoints == frozenset()

        # Scale up: a new worker counts once its pod is ready, not before.
        second = await workers.start("graph-decode-1", "decode-pool", ready=False)
        await asyncio.sleep(0.5)
        assert decode.endpoints == {first.endpoint}
        await workers.ready("graph-decode-1")
        await heard(workers, decode, {"graph-decode-0", "graph-decode-1"})
        await workers.start("graph-prefill-0", "prefill-pool")
        await heard(workers, prefill, {"graph-prefill-0"})

        # Scale down: the removed worker's engines are dropped at once.
        await workers.delete("graph-decode-0")
        await eventually(lambda: decode.endpoints == {second.endpoint}, what="decode-0 gone")
        assert {worker for worker, _ in decode.snapshot()} <= {"graph-decode-1"}
    finally:
        engines.stop()
        for relay in workers.relays.values():
            relay.close()


async def test_a_static_endpoint_list_overrides_discovery_for_its_role(
    cluster: Any, api_client: k8s_client.ApiClient, zmq_context: zmq.Context
) -> None:
    workers = Workers(api_client, zmq_context)
    await workers.start("graph-prefill-0", "prefill-pool")
    decode = await workers.start("graph-decode-0", "decode-pool")
    static = "tcp://127.0.0.1:1"
    engines = discovered(api_client, k8s_config(prefill_fpm_endpoints=[static]))
    try:
        await heard(workers, engines.sources["decode"], {"graph-decode-0"})
        assert engines.sources["decode"].endpoints == {decode.endpoint}
        assert engines.sources["prefill"].endpoints == {static}
        assert engines.watcher is not None and set(engines.watcher.service_roles) == {"decode-pool"}
    finally:
        engines.stop()
        for relay in workers.relays.values():
            relay.close()
