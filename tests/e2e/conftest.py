"""Fixtures of the live end-to-end test: every component real and on real sockets.

``live`` starts, in order: kmock as the API server (own process) holding a disaggregated
DGD; the simulated deployment (frontend metrics over HTTP, FPM over ZMQ); the simulated
Dynamo operator following the DGD; the Debian ``prometheus`` binary scraping the frontend and
the planner's own metrics; ``planner operator`` (own process, its own kubeconfig) with a
config file as the Helm chart mounts it; and the PlannerPolicy. Everything is stopped at
teardown by the handles that started it.

Model of the scenario (numbers from the bundled 70B/TP4 profile): one prefill replica
serves ISL 4000 at ~14.5 k tokens/s (3.6 req/s), one decode replica far more than the
OSL-100 load needs. At 2 req/s both roles need one replica; at 6 req/s prefill needs two
(three while the backlog of the step drains) and decode still one.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client as k8s_client

from disagg_planner.operator.crd import GROUP, KIND, PLURAL, VERSION
from tests.e2e.harness import (
    DGD_GROUP,
    DGD_PLURAL,
    DGD_VERSION,
    DynamoOperatorSim,
    KmockProcess,
    OperatorProcess,
    SimulatedDeployment,
)

# The small stack of the restart and chaos tests (kmock, the operator, a canned Prometheus).
from tests.e2e.small_stack import stack  # noqa: F401
from tests.integration.conftest import PrometheusServer, free_port, poll

NS = "default"
DGD_NAME = "llama-disagg"
POLICY_NAME = "llama-planner"
MODEL = "meta-llama/Llama-3.3-70B-Instruct"
ENGINE = "sim:llama-3.3-70b-fp8@h200_sxm:tp4"
PROFILE = "h200_sxm/vllm/llama-3.3-70b-fp8/tp4"
GPUS_PER_REPLICA = 4
ISL, OSL = 4000, 100
BASE_RATE, STEP_RATE = 2.0, 6.0
THROUGHPUT_INTERVAL_S = 5.0
LOAD_INTERVAL_S = 1.5
STARTUP_DELAY_S = 3.0
SERVICES = {"prefill": "VllmPrefillWorker", "decode": "VllmDecodeWorker"}
OPERATOR_TOKEN = "planner-operator"
DRAIN_TIMEOUT_S = 10.0


def dgd_manifest() -> dict[str, Any]:
    """A disaggregated vLLM DGD as Dynamo's examples write it (4 GPUs per worker)."""

    def worker(sub: str, extra: list[str]) -> dict[str, Any]:
        return {
            "componentType": "worker",
            "subComponentType": sub,
            "replicas": 1,
            "resources": {"limits": {"gpu": str(GPUS_PER_REPLICA)}},
            "extraPodSpec": {
                "mainContainer": {
                    "image": "nvcr.io/nvidia/ai-dynamo/vllm-runtime:0.6.0",
                    "command": ["python3", "-m", "dynamo.vllm"],
                    "args": ["--model", MODEL, "--tensor-parallel-size", "4", *extra],
                }
            },
        }

    return {
        "apiVersion": f"{DGD_GROUP}/{DGD_VERSION}",
        "kind": "DynamoGraphDeployment",
        "metadata": {"name": DGD_NAME, "namespace": NS, "uid": "uid-dgd"},
        "spec": {
            "backendFramework": "vllm",
            "services": {
                "Frontend": {"componentType": "frontend", "replicas": 1},
                SERVICES["prefill"]: worker("prefill", ["--is-prefill-worker"]),
                SERVICES["decode"]: worker("decode", []),
            },
        },
    }


def http_status(url: str) -> int:
    try:
        with urllib.request.urlopen(url, timeout=2) as response:
            return int(response.status)
    except urllib.error.HTTPError as exc:
        return int(exc.code)
    except OSError:
        return 0


@dataclass
class Live:
    """Handles on every running piece, and the reads the test makes."""

    kmock: KmockProcess
    api: k8s_client.ApiClient
    deployment: SimulatedDeployment
    dynamo: DynamoOperatorSim
    prometheus: PrometheusServer
    operator: OperatorProcess
    metrics_port: int
    workdir: Path

    @property
    def custom(self) -> k8s_client.CustomObjectsApi:
        return k8s_client.CustomObjectsApi(self.api)

    def dgd_replicas(self) -> dict[str, int]:
        dgd: dict[str, Any] = self.custom.get_namespaced_custom_object(  # type: ignore[assignment]
            DGD_GROUP, DGD_VERSION, NS, DGD_PLURAL, DGD_NAME
        )
        services = dgd["spec"]["services"]
        return {role: int(services[name]["replicas"]) for role, name in SERVICES.items()}

    def policy(self) -> dict[str, Any]:
        obj: dict[str, Any] = self.custom.get_namespaced_custom_object(  # type: ignore[assignment]
            GROUP, VERSION, NS, PLURAL, POLICY_NAME
        )
        return obj

    def condition(self, kind: str) -> dict[str, Any]:
        for condition in (self.policy().get("status") or {}).get("conditions") or []:
            if condition.get("type") == kind:
                return dict(condition)
        return {}

    def operator_requests(self, since: int = 0) -> list[dict[str, Any]]:
        """Requests the planner operator made (its token), from the ``since``-th on."""
        return [r for r in self.kmock.requests()[since:] if r["token"] == OPERATOR_TOKEN]

    def replica_writes(self, since: int = 0) -> list[dict[str, Any]]:
        """The operator's writes of DGD replicas (merge patches of the DGD's services; a
        patch of the planner's state annotation alone is not one)."""
        return [
            r
            for r in self.operator_requests(since)
            if r["plural"] == DGD_PLURAL and r["method"] == "PATCH" and "spec" in (r["data"] or {})
        ]

    def ready(self) -> bool:
        return http_status(f"http://127.0.0.1:{self.metrics_port}/readyz") == 200

    def diagnostics(self) -> str:
        """What to read when a phase times out."""
        return (
            f"\n--- operator log (tail) ---\n{self.operator.log_tail(40)}"
            f"\n--- DGD replicas history ---\n{self.dynamo.history}"
            f"\n--- harness errors ---\n{self.deployment.errors + self.dynamo.errors}"
        )


def _policy() -> dict[str, Any]:
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": KIND,
        # kmock assigns neither; kopf keys its per-object memory by uid
        "metadata": {
            "name": POLICY_NAME,
            "namespace": NS,
            "uid": "uid-policy",
            "resourceVersion": "1",
        },
        "spec": {
            "targetRef": {"name": DGD_NAME},
            "backend": "vllm",
            "mode": "disagg",
            "ttft_ms": 2000,
            "itl_ms": 40,
            # Dynamo's sizing (profiled throughput) keeps the expected counts simple
            "ttft_attainment_target": None,
            "enable_load_scaling": True,
            "throughput_adjustment_interval_seconds": THROUGHPUT_INTERVAL_S,
            "load_adjustment_interval_seconds": LOAD_INTERVAL_S,
            # the test waits for scale-downs: no 600 s stabilisation (the default)
            "scale_down_stabilization_seconds": 0,
            # nor the burst memory: the step up is a rise faster than time-to-ready, and the
            # memory would keep its peak's prefill for 1800 s (whether the step counts as one
            # depends on where the 1 s scrapes fall, so the scale-down came or not)
            "burst_memory_seconds": None,
            "load_predictor": "constant",
            "max_gpu_budget": -1,
            "fpm_staleness_seconds": 3.0,
            "fpm_warmup_iterations": 2,
            # no FPM endpoints: the operator discovers the engines' publishers
        },
    }


@pytest.fixture
def live(tmp_path: Path) -> Iterator[Live]:
    started: list[Any] = []
    kmock = KmockProcess(tmp_path)
    api = None
    try:
        kmock.start()
        started.append(kmock)
        api = kmock.api_client(token="e2e-harness")
        custom = k8s_client.CustomObjectsApi(api)
        custom.create_namespaced_custom_object(
            DGD_GROUP, DGD_VERSION, NS, DGD_PLURAL, dgd_manifest()
        )

        deployment = SimulatedDeployment(
            engine=ENGINE,
            model=MODEL,
            dynamo_namespace=f"{NS}-{DGD_NAME}",  # Dynamo operator's convention
            isl=ISL,
            osl=OSL,
            rate=BASE_RATE,
            startup_delay_s=STARTUP_DELAY_S,
        )
        deployment.start()
        started.append(deployment)
        dynamo = DynamoOperatorSim(
            kmock.api_client(token="dynamo-operator"),
            deployment,
            namespace=NS,
            name=DGD_NAME,
            services=SERVICES,
        )
        dynamo.start()
        started.append(dynamo)
        poll(
            lambda: dynamo.spec_replicas() or None,
            timeout_s=20,
            what="the simulated Dynamo operator to read the DGD",
        )

        metrics_port = free_port()
        prometheus = PrometheusServer(
            targets=[deployment.frontend_target, f"127.0.0.1:{metrics_port}"],
            workdir=tmp_path,
            scrape_interval_s=1.0,
        )
        prometheus.start(wait_for_targets=False)
        started.append(prometheus)

        # The operator's own settings, as the chart's ConfigMap holds them (config.yaml).
        config = tmp_path / "config.yaml"
        config.write_text(
            yaml.safe_dump(
                {
                    "metric_pulling_prometheus_endpoint": prometheus.url,
                    "metric_pulling_prometheus_request_timeout_seconds": 2.0,
                    "metric_reporting_prometheus_port": metrics_port,
                    "profile": PROFILE,
                    "report_interval_hours": None,
                    "kubernetes_api_backoff_seconds": 0.2,
                    "kubernetes_drain_timeout_seconds": DRAIN_TIMEOUT_S,
                }
            )
        )
        operator = OperatorProcess(
            [
                "--log-level=INFO",
                "operator",
                f"--config={config}",
                f"--watch-namespace={NS}",
                "--standalone",
                "--status-interval=0",
            ],
            kubeconfig=kmock.kubeconfig(tmp_path / "kubeconfig.json", token=OPERATOR_TOKEN),
            log_path=tmp_path / "operator.log",
        )
        operator.start()
        started.append(operator)
        custom.create_namespaced_custom_object(GROUP, VERSION, NS, PLURAL, _policy())
        yield Live(
            kmock=kmock,
            api=api,
            deployment=deployment,
            dynamo=dynamo,
            prometheus=prometheus,
            operator=operator,
            metrics_port=metrics_port,
            workdir=tmp_path,
        )
    finally:
        for piece in reversed(started):
            try:
                piece.stop()
            except Exception as exc:  # keep stopping the rest
                print(f"stopping {type(piece).__name__} failed: {exc}")
        if api is not None:
            api.close()
        # keep the logs next to the test's tmp dir for a failed run
        (tmp_path / "requests-summary.json").write_text(
            json.dumps(sorted({(r["method"], r["path"]) for r in kmock.requests()}), indent=1)
        )


def wait_for(probe: Any, *, live: Live, timeout_s: float, what: str, every_s: float = 0.2) -> Any:
    """``poll`` with the stack's diagnostics in the error."""
    try:
        return poll(probe, timeout_s=timeout_s, what=what, interval_s=every_s)
    except TimeoutError as exc:
        raise AssertionError(f"{exc}{live.diagnostics()}") from None
