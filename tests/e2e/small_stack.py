"""A small stack for the restart and chaos tests: kmock in its own process, ``planner
operator`` as its own process with its own kubeconfig, a canned Prometheus answering a
constant traffic window (or whatever fault a test sets), the test's NPZ profile. No
simulated Dynamo: the test itself reports how many workers are ready, so that a change stays
unconverged for as long as the test needs.

The ``stack`` fixture takes PlannerPolicy spec overrides by indirect parametrization.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client as k8s_client

from disagg_planner.operator.crd import GROUP, KIND, PLURAL, VERSION
from tests.e2e.harness import DGD_GROUP, DGD_PLURAL, DGD_VERSION, KmockProcess, OperatorProcess
from tests.integration.conftest import poll
from tests.integration.connectors.conftest import frontend, worker
from tests.unit.core.conftest import write_h200_like_profile
from tests.unit.observe.canned_prometheus import CannedPrometheus, vector_reply
from tests.unit.runtime.conftest import traffic_parts

NS, DGD_NAME, TOKEN = "default", "graph", "planner-operator"
POLICY_NAME = "graph-policy"
# The throughput loop's interval: every wait of the restart and chaos tests is counted in its
# ticks (the loop of tests/integration/operator runs at 1 s too).
INTERVAL_S = 1.0


@dataclass
class Stack:
    kmock: KmockProcess
    api: k8s_client.ApiClient
    prometheus: CannedPrometheus
    operator: OperatorProcess

    @property
    def custom(self) -> k8s_client.CustomObjectsApi:
        return k8s_client.CustomObjectsApi(self.api)

    def desired(self) -> dict[str, int]:
        dgd: Any = self.custom.get_namespaced_custom_object(
            DGD_GROUP, DGD_VERSION, NS, DGD_PLURAL, DGD_NAME
        )
        return {r: int(dgd["spec"]["services"][r]["replicas"]) for r in ("prefill", "decode")}

    def set_ready(self, ready: dict[str, int]) -> None:
        """What the Dynamo operator reports: ``ready`` workers per service."""
        desired = self.desired()
        services = {
            name: {
                "replicas": desired.get(name, 1),
                "updatedReplicas": desired.get(name, 1),
                "readyReplicas": ready.get(name, 1),
                "availableReplicas": ready.get(name, 1),
            }
            for name in ("Frontend", "prefill", "decode")
        }
        stable = all(s["readyReplicas"] == s["replicas"] for s in services.values())
        self.custom.patch_namespaced_custom_object_status(
            DGD_GROUP,
            DGD_VERSION,
            NS,
            DGD_PLURAL,
            DGD_NAME,
            {"status": {"state": "successful" if stable else "pending", "services": services}},
        )

    def replica_writes(self, since: int = 0) -> list[dict[str, Any]]:
        return [
            r
            for r in self.kmock.requests()[since:]
            if r["token"] == TOKEN
            and r["plural"] == DGD_PLURAL
            and r["method"] == "PATCH"
            and "spec" in (r["data"] or {})
        ]

    def desired_after_writes(self) -> list[dict[str, int]]:
        """The replicas the DGD asked for after each of the operator's replica writes (a
        merge patch names only the services it changes)."""
        desired = {"prefill": 1, "decode": 1}
        out = []
        for write in self.replica_writes():
            for name, service in write["data"]["spec"]["services"].items():
                desired[name] = int(service["replicas"])
            out.append(dict(desired))
        return out

    def policy_status(self) -> dict[str, Any]:
        policy: Any = self.custom.get_namespaced_custom_object(
            GROUP, VERSION, NS, PLURAL, POLICY_NAME
        )
        return dict(policy.get("status") or {})

    def status_conditions(self, kind: str, since: int = 0) -> list[dict[str, Any]]:
        """Every ``kind`` condition the operator wrote into the policy's status, in order,
        from request ``since`` on (read from the writes: a later tick may rewrite it)."""
        out = []
        for r in self.kmock.requests()[since:]:
            if r["token"] != TOKEN or r["subresource"] != "status" or not r["data"]:
                continue
            for condition in (r["data"].get("status") or {}).get("conditions") or []:
                if condition["type"] == kind:
                    out.append(condition)
        return out

    def restart_kmock(self, *, down_s: float) -> None:
        """The API server killed and started again on its port, ``down_s`` later, with what
        it held (a real one keeps its objects in etcd; kmock keeps them in memory, so it is
        given them back to hold from its first request on)."""
        dgd: Any = self.custom.get_namespaced_custom_object(
            DGD_GROUP, DGD_VERSION, NS, DGD_PLURAL, DGD_NAME
        )
        policy: Any = self.custom.get_namespaced_custom_object(
            GROUP, VERSION, NS, PLURAL, POLICY_NAME
        )
        port = self.kmock.port
        self.kmock.kill()
        time.sleep(down_s)
        self.kmock.start(
            port=port,
            objects=[
                (f"{DGD_GROUP}/{DGD_VERSION}/{DGD_PLURAL}", dgd),
                (f"{GROUP}/{VERSION}/{PLURAL}", policy),
            ],
        )

    def throughput_lines(self, since: int) -> list[str]:
        return [
            t.line for t in self.operator.ticks(since) if t.throughput_reason not in (None, "-")
        ]

    def wait(self, probe: Any, *, what: str, timeout_s: float = 60.0) -> Any:
        try:
            return poll(probe, timeout_s=timeout_s, what=what, interval_s=0.1)
        except TimeoutError as exc:
            tail = self.operator.log_tail(30)
            raise AssertionError(f"{exc}\n--- operator log ---\n{tail}") from None


@pytest.fixture
def stack(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Stack]:
    overrides: dict[str, Any] = dict(getattr(request, "param", None) or {})
    kmock = KmockProcess(tmp_path)
    prometheus = CannedPrometheus()
    prometheus.reply = vector_reply(traffic_parts(10.0, INTERVAL_S))
    operator: OperatorProcess | None = None
    api = None
    try:
        kmock.start()
        api = kmock.api_client(token="test")
        custom = k8s_client.CustomObjectsApi(api)
        custom.create_namespaced_custom_object(
            DGD_GROUP,
            DGD_VERSION,
            NS,
            DGD_PLURAL,
            {
                "apiVersion": f"{DGD_GROUP}/{DGD_VERSION}",
                "kind": "DynamoGraphDeployment",
                "metadata": {"name": DGD_NAME, "namespace": NS, "uid": "uid-graph"},
                "spec": {
                    "backendFramework": "vllm",
                    "services": {
                        "Frontend": frontend(),
                        "prefill": worker("prefill", 1),
                        "decode": worker("decode", 1),
                    },
                },
            },
        )
        config = tmp_path / "config.yaml"
        config.write_text(
            yaml.safe_dump(
                {
                    "metric_pulling_prometheus_endpoint": prometheus.url,
                    "profile_results_dir": str(write_h200_like_profile(tmp_path / "profile")),
                    "report_interval_hours": None,
                    "kubernetes_api_backoff_seconds": 0.2,
                    "metric_pulling_prometheus_request_timeout_seconds": 1.0,
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
            kubeconfig=kmock.kubeconfig(tmp_path / "kubeconfig.json", token=TOKEN),
            log_path=tmp_path / "operator.log",
        )
        stack = Stack(kmock, api, prometheus, operator)
        stack.set_ready({"prefill": 1, "decode": 1})
        operator.start()
        custom.create_namespaced_custom_object(
            GROUP,
            VERSION,
            NS,
            PLURAL,
            {
                "apiVersion": f"{GROUP}/{VERSION}",
                "kind": KIND,
                "metadata": {
                    "name": POLICY_NAME,
                    "namespace": NS,
                    "uid": "uid-policy",
                    "resourceVersion": "1",
                },
                "spec": {
                    "targetRef": {"name": DGD_NAME},
                    "ttft_ms": 500,
                    "load_predictor": "constant",
                    "max_gpu_budget": -1,
                    "throughput_adjustment_interval_seconds": INTERVAL_S,
                    **overrides,
                },
            },
        )
        yield stack
    finally:
        if operator is not None:
            operator.stop()
        prometheus.close()
        kmock.stop()
        if api is not None:
            api.close()
