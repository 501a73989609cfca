"""Fixtures for the connector tests: kmock as the Kubernetes API, a real etcd server.

kmock (0.8) gaps these fixtures cover: custom resources must be declared (plus
``load_bundled()`` for ``v1/events``); ``/scale`` has no Scale semantics, so a reaction plays
the DGDSA controller (copy the adapter's replicas into the DGD, answer a Scale object);
errors are injected by reactions that answer the given statuses once each and then fall
through to the emulator. kmock stores a PATCH body before any reaction runs, so a PATCH
answered with an error has still changed the object (a real server can do the same when
the answer is lost); tests that depend on it say so.
"""

from __future__ import annotations

import asyncio
import copy
import shutil
import subprocess
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import kmock as kmock_lib
import pytest

from disagg_planner.config.schema import PlannerConfig
from disagg_planner.connectors.kubernetes import KubernetesSettings
from disagg_planner.runtime.connector_settings import kubernetes_settings
from tests.integration.conftest import free_port
from tests.kube_dynamo import (  # noqa: F401  (re-exported to the connector tests)
    DGD,
    DGD_PLURAL,
    DGDSA,
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


def frontend() -> dict[str, Any]:
    return {"componentType": "frontend", "replicas": 1, "extraPodSpec": {"mainContainer": {}}}


@dataclass
class FakeTime:
    """A monotonic clock that only moves when the connector sleeps (or the test says so)."""

    now: float = 1000.0
    sleeps: list[float] = field(default_factory=list)

    def clock(self) -> float:
        return self.now

    async def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.now += seconds
        await asyncio.sleep(0)


class Cluster:
    """The kmock API server seeded with DGDs and adapters, plus request assertions."""

    def __init__(self, kmock: Any) -> None:
        self.kmock = kmock
        kmock.resources.load_bundled()  # v1/events and the other built-ins
        declare_dynamo_resources(
            kmock.resources, verbs={"get", "list", "watch", "create", "patch", "delete"}
        )
        scale = kmock_lib.subresource("scale")
        kmock["patch", kmock_lib.resource(GROUP, VERSION, DGDSA_PLURAL), scale] << self._scale

    def add_dgd(
        self,
        services: dict[str, dict[str, Any]],
        *,
        name: str = DGD_NAME,
        ready: dict[str, int] | None = None,
    ) -> None:
        """A DGD whose status reports ``ready`` (default: every service fully ready)."""
        ready = {n: s.get("replicas", 1) for n, s in services.items()} if ready is None else ready
        self.kmock.objects[DGD, NS, name] = {
            "apiVersion": f"{GROUP}/{VERSION}",
            "kind": "DynamoGraphDeployment",
            "metadata": {"name": name, "namespace": NS, "uid": "0b5a-uid"},
            "spec": {"backendFramework": "vllm", "services": copy.deepcopy(services)},
            "status": {
                "state": "successful",
                "conditions": [{"type": "Ready", "status": "True"}],
                "services": {
                    n: {"replicas": r, "updatedReplicas": r, "readyReplicas": r}
                    for n, r in ready.items()
                },
            },
        }

    def add_adapter(self, service: str, replicas: int, *, dgd: str = DGD_NAME) -> str:
        name = f"{dgd}-{service.lower()}"
        self.kmock.objects[DGDSA, NS, name] = {
            "apiVersion": f"{GROUP}/{VERSION}",
            "kind": "DynamoGraphDeploymentScalingAdapter",
            "metadata": {"name": name, "namespace": NS},
            "spec": {"replicas": replicas, "dgdRef": {"name": dgd, "serviceName": service}},
            "status": {"replicas": replicas, "selector": f"app={name}"},
        }
        return name

    def dgd(self, name: str = DGD_NAME) -> dict[str, Any]:
        return copy.deepcopy(self.kmock.objects[DGD, NS, name].raw)

    def adapter(self, name: str) -> dict[str, Any]:
        return copy.deepcopy(self.kmock.objects[DGDSA, NS, name].raw)

    def edit_dgd(self, changes: dict[str, Any], name: str = DGD_NAME) -> None:
        """A change made by someone other than the planner (kubectl, another controller)."""
        self.kmock.objects[DGD, NS, name].patch(changes)

    def set_ready(self, service: str, count: int, name: str = DGD_NAME) -> None:
        self.edit_dgd(
            {
                "status": {
                    "services": {
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
        version: str = VERSION,
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

        self.kmock[method, kmock_lib.resource(group, version, plural)] << react

    def _scale(self, request: Any) -> dict[str, Any]:
        """Play the DGDSA controller: the adapter's new replicas go into the DGD service."""
        adapter = self.kmock.objects[DGDSA, request.namespace, request.name].raw
        replicas = adapter["spec"]["replicas"]
        ref = adapter["spec"]["dgdRef"]
        self.kmock.objects[DGD, request.namespace, ref["name"]].patch(
            {"spec": {"services": {ref["serviceName"]: {"replicas": replicas}}}}
        )
        return {
            "apiVersion": "autoscaling/v1",
            "kind": "Scale",
            "metadata": {"name": request.name, "namespace": request.namespace},
            "spec": {"replicas": replicas},
            "status": {"replicas": adapter["status"]["replicas"]},
        }


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
