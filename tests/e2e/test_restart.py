"""``planner operator`` killed with SIGKILL at each step of a scale-up and started again (a
crashed pod, or the other replica taking over): the new process reads the planner's state
back from the DGD and makes no spurious write (issue 19, problem 3: the restarted operator's
first tick patched a larger count while the last change's pods were still pending).

The stack: kmock in its own process, the operator as its own process with its own
kubeconfig, a canned Prometheus answering a constant traffic window, the test's NPZ profile.
No simulated Dynamo: the test itself reports how many workers are ready, so that a change
stays unconverged for as long as the test needs.
"""

from __future__ import annotations

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

pytestmark = pytest.mark.slow

NS, DGD_NAME, TOKEN = "default", "graph", "planner-operator"
INTERVAL_S = 2.0


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
def stack(tmp_path: Path) -> Iterator[Stack]:
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
                    "name": "graph-policy",
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


@pytest.mark.parametrize("step", ["pending", "partly_ready", "converged"])
def test_a_sigkilled_operator_resumes_without_a_spurious_write(stack: Stack, step: str) -> None:
    # The scale-up: 10 req/s needs more prefill workers than the one running.
    (first,) = stack.wait(
        lambda: stack.replica_writes() or None, what="the scale-up", timeout_s=120
    )
    target = first["data"]["spec"]["services"]["prefill"]["replicas"]
    assert target > 1, first
    if step == "partly_ready":
        stack.set_ready({"prefill": target - 1, "decode": 1})
    elif step == "converged":
        stack.set_ready({"prefill": target, "decode": 1})
    stack.operator.kill()
    writes_before = len(stack.replica_writes())
    mark_requests = len(stack.kmock.requests())
    if step != "converged":
        # A re-plan from the ready workers would now want more than the change under way.
        stack.prometheus.reply = vector_reply(traffic_parts(30.0, INTERVAL_S))

    stack.operator.start()
    mark = stack.operator.log_size()
    lines = stack.wait(
        lambda: found if len(found := stack.throughput_lines(mark)) >= 3 else None,
        what="three throughput ticks of the restarted operator",
        timeout_s=120,
    )
    assert stack.replica_writes(mark_requests) == [], "\n".join(lines)
    assert len(stack.replica_writes()) == writes_before
    assert stack.desired()["prefill"] == target
    if step == "converged":
        assert all(" [summary] HOLD | " in line for line in lines), lines
        return
    # It says why it waits: the change read back from the DGD has not converged.
    assert all("throughput_reason=scaling_in_progress" in line for line in lines), lines
    assert any("awaiting_convergence" in line for line in lines), lines

    # The workers become ready: planning resumes within two intervals and sizes for the
    # higher traffic.
    stack.set_ready({"prefill": target, "decode": 1})
    (resumed,) = stack.wait(
        lambda: stack.replica_writes(mark_requests) or None,
        what="planning to resume once the change converged",
        timeout_s=60,
    )
    assert resumed["data"]["spec"]["services"]["prefill"]["replicas"] > target
