"""Fixtures for the connector tests: kmock as the Kubernetes API, a real etcd server.

kmock (0.8) gaps these fixtures cover: custom resources must be declared (plus
``load_bundled()`` for ``v1/events``); ``/scale`` has no Scale semantics, so a reaction plays
the DGDSA controller (copy the adapter's replicas into the DGD, answer a Scale object);
errors are injected by reactions that answer the given statuses once each and then fall
through to the emulator. kmock stores a PATCH body before any reaction runs, so a PATCH
answered with an error has still changed the object (a real server can do the same when
the answer is lost); tests that depend on it say so.

:class:`SimulatedDynamo` (opt-in, ``cluster.simulate_dynamo``) plays the Dynamo operator with
pods, including pods that are still terminating.
"""

from __future__ import annotations

import asyncio
import copy
import shutil
import subprocess
import time
import urllib.request
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import kmock as kmock_lib
import pytest

from disagg_planner.config.schema import PlannerConfig
from disagg_planner.connectors.kubernetes import (
    POD_DELETION_COST,
    STATE_ANNOTATION,
    KubernetesSettings,
)
from disagg_planner.runtime.connector_settings import kubernetes_settings
from tests.integration.conftest import free_port
from tests.kube_dynamo import (
    BETA,
    DGD_PLURAL,
    DGDSA_PLURAL,
    GROUP,
    VERSION,
    declare_dynamo_resources,
)

NS = "default"
DGD_NAME = "graph"

REASONS = {
    403: "Forbidden",
    404: "NotFound",
    409: "Conflict",
    429: "TooManyRequests",
    500: "InternalError",
    503: "ServiceUnavailable",
}


def worker(
    sub: str | None,
    replicas: int,
    *,
    gpu_limit: str | None = "1",
    gpu_request: str | None = None,
    model: str | None = "Qwen/Qwen3-0.6B",
) -> dict[str, Any]:
    """A DGD worker service as Dynamo's examples write it."""
    service: dict[str, Any] = {"componentType": "worker", "replicas": replicas}
    if sub is not None:
        service["subComponentType"] = sub
    resources: dict[str, Any] = {}
    if gpu_limit is not None:
        resources["limits"] = {"gpu": gpu_limit}
    if gpu_request is not None:
        resources["requests"] = {"gpu": gpu_request}
    if resources:
        service["resources"] = resources
    if model is not None:
        service["extraPodSpec"] = {
            "mainContainer": {
                "image": "nvcr.io/nvidia/ai-dynamo/vllm-runtime:0.6.0",
                "command": ["python3", "-m", "dynamo.vllm"],
                "args": ["--model", model, "--is-prefill-worker"]
                if sub == "prefill"
                else ["--model", model],
            }
        }
    return service


def as_component(name: str, service: Mapping[str, Any]) -> dict[str, Any]:
    """The v1beta1 component of a v1alpha1 service (as Dynamo's conversion writes it): the
    sub-role becomes ``type``, the main container moves into ``podTemplate`` with its GPUs
    as ``nvidia.com/gpu``."""
    component: dict[str, Any] = {
        "name": name,
        "type": service.get("subComponentType") or service.get("componentType"),
    }
    if "replicas" in service:
        component["replicas"] = service["replicas"]
    main: dict[str, Any] = {"name": "main", "image": "nvcr.io/nvidia/ai-dynamo/vllm-runtime"}
    old = (service.get("extraPodSpec") or {}).get("mainContainer") or {}
    for key in ("command", "args"):
        if key in old:
            main[key] = list(old[key])
    resources = {
        kind: {"nvidia.com/gpu": section["gpu"]}
        for kind, section in (service.get("resources") or {}).items()
        if "gpu" in section
    }
    if resources:
        main["resources"] = resources
    component["podTemplate"] = {"spec": {"containers": [main]}}
    return component


def services_of(dgd: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    """A DGD's services by name, of either version (v1beta1's components by their name)."""
    spec = dgd["spec"]
    if "components" in spec:
        return {c["name"]: c for c in spec["components"]}
    return dict(spec["services"])


def frontend() -> dict[str, Any]:
    return {"componentType": "frontend", "replicas": 1, "extraPodSpec": {"mainContainer": {}}}


def replicas_patch(patch: Any) -> dict[str, Any]:
    """A recorded replicas merge patch of the DGD without the planner's state annotation
    that travels with it (checked to be there)."""
    assert STATE_ANNOTATION in patch.data["metadata"]["annotations"], patch.data
    return {k: v for k, v in patch.data.items() if k != "metadata"}


@dataclass
class FakeTime:
    """A monotonic clock that only moves when the connector sleeps (or the test says so);
    ``on_sleep`` callbacks see every new time."""

    now: float = 1000.0
    sleeps: list[float] = field(default_factory=list)
    on_sleep: list[Callable[[float], None]] = field(default_factory=list)

    def clock(self) -> float:
        return self.now

    async def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.now += seconds
        for callback in self.on_sleep:
            callback(self.now)
        await asyncio.sleep(0)


PODS = "v1/pods"
DGD_POD_LABEL = "nvidia.com/dynamo-graph-deployment-name"
SERVICE_POD_LABEL = "nvidia.com/dynamo-component"


@dataclass
class _Pod:
    name: str
    service: str
    leaves_at: float | None = None  # terminating: gone at this time


class SimulatedDynamo:
    """The Dynamo operator of one DGD, with pods in kmock (``v1/pods``, Dynamo's labels).

    On every change of the DGD's spec (a patch, an adapter's ``/scale``) it acts at once: it
    creates the missing pods of a service, which hold their GPUs from that moment (the worst
    case for a budget), and marks the extra ones terminating (``deletionTimestamp``): they hold
    their GPUs for ``grace_s`` of the fake clock before they are gone. The extra ones are those
    a ReplicaSet deletes: the lowest ``controller.kubernetes.io/pod-deletion-cost`` first, then
    the newest (with ``honours_deletion_cost`` False, only the newest: Grove's PodClique
    ignores the cost). With ``ready`` its pods carry a Ready condition (else they only run). The
    DGD's status counts non-terminated replicas, as Dynamo's does. ``snapshots`` records,
    after every change, each service's (existing, terminating) pods.
    """

    def __init__(
        self,
        cluster: Cluster,
        time: FakeTime,
        *,
        grace_s: float,
        name: str,
        ready: bool = False,
        honours_deletion_cost: bool = True,
    ) -> None:
        self.cluster = cluster
        self.honours_deletion_cost = honours_deletion_cost
        self.sigterm_at: dict[str, float] = {}  # pod name -> when it was told to terminate
        self.ready = ready
        self.removed: list[str] = []  # pod names, in the order they were told to terminate
        self.time = time
        self.grace_s = grace_s
        self.name = name
        self.pods: list[_Pod] = []
        self.snapshots: list[dict[str, tuple[int, int]]] = []
        self._serial = 0
        time.on_sleep.append(lambda _now: self.reconcile())
        self.reconcile()

    def gpus_in_use(self, gpus: Mapping[str, int]) -> list[int]:
        """Per snapshot: the GPUs held by the pods of the services in ``gpus`` (service ->
        GPUs per engine), terminating pods included."""
        return [
            sum(gpus.get(svc, 0) * (n + leaving) for svc, (n, leaving) in snap.items())
            for snap in self.snapshots
        ]

    def deletion_cost(self, pod: str) -> int:
        annotations = self.cluster.kmock.objects[PODS, NS, pod].raw["metadata"].get("annotations")
        return int((annotations or {}).get(POD_DELETION_COST, 0))

    def annotations(self, pod: str) -> dict[str, str]:
        raw = self.cluster.kmock.objects[PODS, NS, pod].raw
        return dict(raw["metadata"].get("annotations") or {})

    def reconcile(self) -> None:
        now = self.time.now
        kmock = self.cluster.kmock
        for pod in [p for p in self.pods if p.leaves_at is not None and p.leaves_at <= now]:
            self.pods.remove(pod)
            del kmock.objects[PODS, NS, pod.name]
        services = services_of(self.cluster.dgd(self.name))
        status: dict[str, dict[str, int]] = {}
        for service, spec in services.items():
            wanted = int(spec.get("replicas", 1))
            running = [p for p in self.pods if p.service == service and p.leaves_at is None]
            running.sort(
                key=lambda p: (
                    self.deletion_cost(p.name) if self.honours_deletion_cost else 0,
                    -self.pods.index(p),
                )
            )
            for pod in running[: max(0, len(running) - wanted)]:
                pod.leaves_at = now + self.grace_s
                self.sigterm_at[pod.name] = now
                self.removed.append(pod.name)
                kmock.objects[PODS, NS, pod.name].patch(
                    {"metadata": {"deletionTimestamp": "2030-01-01T00:00:00Z"}}
                )
            for _ in range(wanted - len(running)):
                self._serial += 1
                pod = _Pod(f"{self.name}-{service.lower()}-{self._serial}", service)
                self.pods.append(pod)
                kmock.objects[PODS, NS, pod.name] = {
                    "apiVersion": "v1",
                    "kind": "Pod",
                    "metadata": {
                        "name": pod.name,
                        "namespace": NS,
                        "labels": {DGD_POD_LABEL: self.name, SERVICE_POD_LABEL: service},
                    },
                    "status": {
                        "phase": "Running",
                        "conditions": [
                            {"type": "Ready", "status": "True" if self.ready else "False"}
                        ],
                    },
                }
            status[service] = {  # the missing pods were created, the extra ones leave
                "replicas": wanted,
                "updatedReplicas": wanted,
                "readyReplicas": wanted,
                "availableReplicas": wanted,
            }
        self.cluster.edit_dgd({"status": {self.cluster.status_key: status}}, self.name)
        self.snapshots.append(
            {
                svc: (
                    sum(1 for p in self.pods if p.service == svc and p.leaves_at is None),
                    sum(1 for p in self.pods if p.service == svc and p.leaves_at is not None),
                )
                for svc in services
            }
        )


class Cluster:
    """The kmock API server seeded with DGDs and adapters, plus request assertions."""

    def __init__(
        self, kmock: Any, *, version: str = VERSION, served: tuple[str, ...] | None = None
    ) -> None:
        """Objects are stored in ``version`` (v1alpha1 or v1beta1); ``served`` are the
        versions the server declares (default: ``version`` alone)."""
        self.kmock = kmock
        self.version = version
        self.beta = version == BETA
        self.status_key = "components" if self.beta else "services"
        self.dgd_key = f"{GROUP}/{version}/{DGD_PLURAL}"
        self.dgdsa_key = f"{GROUP}/{version}/{DGDSA_PLURAL}"
        kmock.resources.load_bundled()  # v1/events and the other built-ins
        declare_dynamo_resources(
            kmock.resources,
            verbs={"get", "list", "watch", "create", "patch", "delete"},
            versions=served or (version,),
        )
        scale = kmock_lib.subresource("scale")
        kmock["patch", kmock_lib.resource(GROUP, version, DGDSA_PLURAL), scale] << self._scale
        kmock["patch", kmock_lib.resource(GROUP, version, DGD_PLURAL)] << self._dgd_patched
        self.dynamo: SimulatedDynamo | None = None

    def simulate_dynamo(
        self,
        time: FakeTime,
        *,
        grace_s: float = 5.0,
        name: str = DGD_NAME,
        ready: bool = False,
        honours_deletion_cost: bool = True,
    ) -> SimulatedDynamo:
        """From now on a :class:`SimulatedDynamo` follows the DGD ``name`` (replacing one
        that followed before, whose pods are removed)."""
        for pod in self.dynamo.pods if self.dynamo is not None else ():
            del self.kmock.objects[PODS, NS, pod.name]
        self.dynamo = SimulatedDynamo(
            self,
            time,
            grace_s=grace_s,
            name=name,
            ready=ready,
            honours_deletion_cost=honours_deletion_cost,
        )
        return self.dynamo

    def forget_requests(self) -> None:
        """Drop kmock's log of the requests served so far. kmock matches each request against
        each reaction by walking that whole log, so a test making thousands of requests (a
        property test's examples) slows down quadratically without this."""
        self.kmock._requests.clear()

    def _dgd_patched(self, request: Any) -> Any:
        # kmock has stored the patch already; the operator acts, the emulator answers.
        if self.dynamo is not None and request.subresource is None:
            self.dynamo.reconcile()
        raise NotImplementedError

    def add_dgd(
        self,
        services: dict[str, dict[str, Any]],
        *,
        name: str = DGD_NAME,
        ready: dict[str, int] | None = None,
        uid: str = "0b5a-uid",
    ) -> None:
        """A DGD whose status reports ``ready`` (default: every service fully ready)."""
        ready = {n: s.get("replicas", 1) for n, s in services.items()} if ready is None else ready
        spec: dict[str, Any] = {"backendFramework": "vllm"}
        if self.beta:
            spec["components"] = [as_component(n, s) for n, s in services.items()]
        else:
            spec["services"] = copy.deepcopy(services)
        self.kmock.objects[self.dgd_key, NS, name] = {
            "apiVersion": f"{GROUP}/{self.version}",
            "kind": "DynamoGraphDeployment",
            "metadata": {"name": name, "namespace": NS, "uid": uid},
            "spec": spec,
            "status": {
                "state": "successful",
                "conditions": [{"type": "Ready", "status": "True"}],
                self.status_key: {
                    n: {"replicas": r, "updatedReplicas": r, "readyReplicas": r}
                    for n, r in ready.items()
                },
            },
        }

    def add_adapter(self, service: str, replicas: int, *, dgd: str = DGD_NAME) -> str:
        name = f"{dgd}-{service.lower()}"
        target = "componentName" if self.beta else "serviceName"
        self.kmock.objects[self.dgdsa_key, NS, name] = {
            "apiVersion": f"{GROUP}/{self.version}",
            "kind": "DynamoGraphDeploymentScalingAdapter",
            "metadata": {"name": name, "namespace": NS},
            "spec": {"replicas": replicas, "dgdRef": {"name": dgd, target: service}},
            "status": {"replicas": replicas, "selector": f"app={name}"},
        }
        return name

    def dgd(self, name: str = DGD_NAME) -> dict[str, Any]:
        return copy.deepcopy(self.kmock.objects[self.dgd_key, NS, name].raw)

    def replicas(self, service: str, name: str = DGD_NAME) -> int:
        """The replicas the DGD asks of ``service`` (either version)."""
        return int(services_of(self.dgd(name))[service].get("replicas", 1))

    def adapter(self, name: str) -> dict[str, Any]:
        return copy.deepcopy(self.kmock.objects[self.dgdsa_key, NS, name].raw)

    def edit_dgd(self, changes: dict[str, Any], name: str = DGD_NAME) -> None:
        """A change made by someone other than the planner (kubectl, another controller)."""
        self.kmock.objects[self.dgd_key, NS, name].patch(changes)

    def set_service_replicas(self, service: str, replicas: int, name: str = DGD_NAME) -> None:
        """Someone sets a service's replicas in the DGD (either version)."""
        if not self.beta:
            self.edit_dgd({"spec": {"services": {service: {"replicas": replicas}}}}, name)
            return
        components = copy.deepcopy(self.dgd(name)["spec"]["components"])
        for component in components:
            if component["name"] == service:
                component["replicas"] = replicas
        self.edit_dgd({"spec": {"components": components}}, name)

    def set_ready(self, service: str, count: int, name: str = DGD_NAME) -> None:
        self.edit_dgd(
            {
                "status": {
                    self.status_key: {
                        service: {
                            "replicas": count,
                            "updatedReplicas": count,
                            "readyReplicas": count,
                        }
                    }
                }
            },
            name,
        )

    def requests(self, method: str, plural: str, subresource: str | None = None) -> list[Any]:
        return [
            r
            for r in self.kmock
            if r.method.value == method.upper()
            and r.resource is not None
            and r.resource.plural == plural
            and r.subresource == subresource
        ]

    def events(self) -> list[dict[str, Any]]:
        return [r.data for r in self.requests("POST", "events")]

    def fail(
        self,
        method: str,
        plural: str,
        statuses: list[int],
        *,
        subresource: str | None = None,
        group: str = GROUP,
        version: str | None = None,
    ) -> None:
        """The next requests of ``method`` on ``plural`` answer ``statuses``, one each."""
        remaining = list(statuses)

        def react(request: Any) -> Any:
            if request.subresource != subresource or not remaining:
                # kmock's "matched, nothing to answer": the emulator serves the request.
                raise NotImplementedError
            status = remaining.pop(0)
            raise kmock_lib.KubernetesError(
                status=status, reason=REASONS.get(status, "Error"), message=f"injected {status}"
            )

        self.kmock[method, kmock_lib.resource(group, version or self.version, plural)] << react

    def _scale(self, request: Any) -> dict[str, Any]:
        """Play the DGDSA controller: the adapter's new replicas go into the DGD service."""
        adapter = self.kmock.objects[self.dgdsa_key, request.namespace, request.name].raw
        replicas = adapter["spec"]["replicas"]
        ref = adapter["spec"]["dgdRef"]
        self.set_service_replicas(
            ref.get("serviceName") or ref["componentName"], replicas, ref["name"]
        )
        if self.dynamo is not None:
            self.dynamo.reconcile()
        return {
            "apiVersion": "autoscaling/v1",
            "kind": "Scale",
            "metadata": {"name": request.name, "namespace": request.namespace},
            "spec": {"replicas": replicas},
            "status": {"replicas": adapter["status"]["replicas"]},
        }


async def apply_dgd_via_api(
    api_client: Any, services: dict[str, dict[str, Any]], *, name: str = DGD_NAME, uid: str
) -> None:
    """Create a DGD through the API, as kubectl does (watches see it; a store edit would
    not), from the event loop without blocking kmock."""
    from kubernetes import client as k8s_client

    await asyncio.to_thread(
        k8s_client.CustomObjectsApi(api_client).create_namespaced_custom_object,
        GROUP,
        VERSION,
        NS,
        DGD_PLURAL,
        {
            "apiVersion": f"{GROUP}/{VERSION}",
            "kind": "DynamoGraphDeployment",
            "metadata": {"name": name, "namespace": NS, "uid": uid},
            "spec": {"services": copy.deepcopy(services)},
        },
    )


@pytest.fixture
def cluster(kmock: Any) -> Cluster:
    return Cluster(kmock)


@pytest.fixture
def fake_time() -> FakeTime:
    return FakeTime()


def k8s_config(**overrides: Any) -> PlannerConfig:
    values: dict[str, Any] = {
        "dgd_name": DGD_NAME,
        "kubernetes_namespace": NS,
        "backend": "vllm",
        "kubernetes_api_backoff_seconds": 0.5,
        "scaling_check_interval_seconds": 1.0,
        "throughput_adjustment_interval_seconds": 60.0,
    }
    values.update(overrides)
    return PlannerConfig(**values)


def k8s_settings(**overrides: Any) -> KubernetesSettings:
    """The DGD connector's settings for :func:`k8s_config` with ``overrides``."""
    return kubernetes_settings(k8s_config(**overrides))


# --- etcd -------------------------------------------------------------------------------------

ETCD_BINARY = shutil.which("etcd") or "/usr/bin/etcd"


def _healthy(url: str) -> bool:
    try:
        with urllib.request.urlopen(url + "/health", timeout=1) as response:
            return b'"true"' in response.read()
    except OSError:
        return False


@pytest.fixture(scope="module")
def etcd_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A real etcd (Debian ``etcd-server``) on free loopback ports with a temporary data dir."""
    if not Path(ETCD_BINARY).is_file():
        pytest.fail(f"etcd not found at {ETCD_BINARY}: install Debian 'etcd-server' (.ci/run does)")
    workdir = tmp_path_factory.mktemp("etcd")
    client_url = f"http://127.0.0.1:{free_port()}"
    peer_url = f"http://127.0.0.1:{free_port()}"
    log = (workdir / "etcd.log").open("wb")
    process = subprocess.Popen(
        [
            ETCD_BINARY,
            "--name=test",
            f"--data-dir={workdir / 'data'}",
            f"--listen-client-urls={client_url}",
            f"--advertise-client-urls={client_url}",
            f"--listen-peer-urls={peer_url}",
            f"--initial-advertise-peer-urls={peer_url}",
            f"--initial-cluster=test={peer_url}",
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    try:
        deadline = time.monotonic() + 20
        while not _healthy(client_url):
            if process.poll() is not None or time.monotonic() > deadline:
                log.flush()
                tail = (workdir / "etcd.log").read_text(errors="replace")[-2000:]
                pytest.fail(f"etcd did not become healthy at {client_url}:\n{tail}")
            time.sleep(0.05)
        yield client_url
    finally:
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        log.close()
