"""The whole loop over the wire: ``planner operator`` (own process) scales a DGD held by kmock
(own process) from a real Prometheus scraping a simulated frontend and from engine
ForwardPassMetrics on real ZMQ sockets, while a simulated Dynamo operator starts and stops
the workers (see conftest.py for the stack and the numbers behind the expected counts).

One scenario, phase by phase; every wait polls with a generous deadline (a busy 2-core CI
machine), nothing asserts a duration:

1. steady load: the planner observes and holds; no replica write;
2. a load step: prefill scales up through the DGD, decode is left alone;
3. the load falls: prefill scales back down to one replica; the workers that leave are the
   ones the planner marked (pod-deletion-cost), and none had a request cut by Dynamo's grace
   period;
4. Prometheus stops: the throughput loop holds (``no_traffic_data``), the policy reports
   ``Degraded`` (``TrafficMissing``), nothing is written;
5. Prometheus returns: the throughput loop reads traffic again and ``Degraded`` clears;
6. the operator process is killed (SIGKILL) and started again: it resumes from the DGD as it
   is, with no replica write.

Finally every API call the operator made is one the Helm chart's RBAC grants.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from typing import Any

import pytest

from disagg_planner.connectors.kubernetes import LEAVING_COST
from tests.e2e.conftest import (
    BASE_RATE,
    DGD_NAME,
    NS,
    STEP_RATE,
    Live,
    wait_for,
)
from tests.e2e.harness import REPO, Tick
from tests.unit.deploy.api_calls import OPERATOR_CALLS, request_call

pytestmark = pytest.mark.slow


def http_text(url: str) -> str:
    with urllib.request.urlopen(url, timeout=5) as response:
        return str(response.read().decode())


def degraded_writes(live: Live, since: int) -> list[dict[str, Any]]:
    """Degraded=True conditions in the operator's status writes after request ``since``."""
    out = []
    for request in live.operator_requests(since):
        if request["subresource"] != "status" or not request["data"]:
            continue
        for condition in (request["data"].get("status") or {}).get("conditions") or []:
            if condition["type"] == "Degraded" and condition["status"] == "True":
                out.append(condition)
    return out


def heard_workers(live: Live, role: str) -> set[str]:
    """The engines of ``role`` whose ForwardPassMetrics the operator's load loop last read
    (its per-engine gauges; a throughput-only tick publishes none, so callers poll)."""
    text = http_text(f"http://127.0.0.1:{live.metrics_port}/metrics")
    found = set()
    for line in text.splitlines():
        if line.startswith("dynamo_planner_engine_queued_prefill_tokens{") and (
            f'role="{role}"' in line
        ):
            found.add(line.split('worker_id="', 1)[1].split('"', 1)[0])
    return found


def serving_workers(live: Live, role: str) -> set[str]:
    return {w for w, (r, ready, _) in live.deployment.workers().items() if r == role and ready}


def throughput_ticks(live: Live, since: int) -> list[Tick]:
    return [t for t in live.operator.ticks(since) if t.throughput_reason is not None]


def wait_throughput_ticks(
    live: Live, since: int, n: int, *, reason: str | None = None, timeout_s: float = 60.0
) -> list[Tick]:
    """Wait for ``n`` throughput ticks logged after offset ``since`` (with ``reason``)."""

    def enough() -> list[Tick] | None:
        ticks = [
            t
            for t in throughput_ticks(live, since)
            if reason is None or t.throughput_reason == reason
        ]
        return ticks if len(ticks) >= n else None

    result: list[Tick] = wait_for(
        enough,
        live=live,
        timeout_s=timeout_s,
        what=f"{n} throughput ticks" + (f" with reason {reason}" if reason else ""),
    )
    return result


# Panels whose series exist in this scenario (a disaggregated DGD, load scaling on: no
# aggregated role, corrections off, perhaps no failure or dropped frame yet).
EXPECTED_PANELS = (
    "Prefill replicas: current vs recommended",
    "Decode replicas: current vs recommended",
    "Request rate",
    "Input sequence length",
    "Output sequence length",
    "Time to first token: observed, estimated, SLO",
    "Inter-token latency: observed, estimated, SLO",
    "Throughput loop decisions",
    "Load loop decisions",
    "GPU-hours",
    "GPUs in use",
    "Queued prefill tokens per engine",
    "In-flight decode KV tokens per engine",
)


def check_dashboard_queries(live: Live) -> None:
    """Every query of the Grafana dashboard is valid PromQL on Prometheus; the panels this
    scenario feeds return the DGD's series."""
    dashboard = json.loads((REPO / "deploy" / "grafana" / "planner-dashboard.json").read_text())
    panels = [p for p in dashboard["panels"] if p["type"] != "row"]
    assert {title for title in EXPECTED_PANELS} <= {p["title"] for p in panels}

    def run(expr: str) -> list[dict[str, Any]]:
        expr = (
            expr.replace("$namespace", NS)
            .replace("$dgd", DGD_NAME)
            .replace("$__rate_interval", "15s")
        )
        try:
            return live.prometheus.query(expr)
        except urllib.error.HTTPError as exc:  # 400: not valid PromQL
            raise AssertionError(f"{expr}: {exc.read().decode(errors='replace')}") from None

    for panel in panels:
        for target in panel["targets"]:
            run(target["expr"])  # raises on invalid PromQL
    for panel in panels:
        if panel["title"] not in EXPECTED_PANELS:
            continue
        for target in panel["targets"]:
            wait_for(
                lambda expr=target["expr"]: run(expr) or None,
                live=live,
                timeout_s=30,
                what=f"series for {panel['title']!r}: {target['expr']}",
            )


def test_operator_scales_holds_and_resumes_over_the_wire(live: Live) -> None:
    # --- 0. the operator starts and plans the DGD ------------------------------------------
    wait_for(live.ready, live=live, timeout_s=90, what="the operator's /readyz")
    wait_for(
        lambda: live.condition("Ready").get("status") == "True" or None,
        live=live,
        timeout_s=60,
        what="the policy's Ready condition",
    )

    # --- 1. steady load: observe and hold ---------------------------------------------------
    mark = live.operator.log_size()
    requests_mark = len(live.kmock.requests())
    ticks = wait_throughput_ticks(live, mark, 3, timeout_s=90)
    assert all(t.throughput_reason == "no_change" for t in ticks[-2:]), ticks
    observed = live.policy()["status"]["observed"]["requestsPerSecond"]
    assert 1.0 < observed < 3.0, f"{BASE_RATE} req/s read from Prometheus as {observed}"
    assert live.dgd_replicas() == {"prefill": 1, "decode": 1}
    assert live.replica_writes(requests_mark) == [], "steady load must not change replicas"

    # --- 2. load step: prefill scales up, decode does not ----------------------------------
    live.deployment.set_rate(STEP_RATE)
    wait_for(
        lambda: live.dgd_replicas()["prefill"] >= 2 or None,
        live=live,
        timeout_s=60,
        what="prefill to scale up after the load step",
    )
    # converged: the workers the planner asked for are serving
    wait_for(
        lambda: (
            (live.deployment.counts("prefill")[0] == live.deployment.counts("prefill")[1] >= 2)
            or None
        ),
        live=live,
        timeout_s=60,
        what="the new prefill workers to be ready",
    )
    # Discovery: the load loop follows the new workers, with no endpoint configured by hand
    # (their pods became ready and their worker metadata names their FPM publishers).
    serving = serving_workers(live, "prefill")
    assert len(serving) >= 2, serving
    wait_for(
        lambda: heard_workers(live, "prefill") == serving or None,
        live=live,
        timeout_s=30,
        what=f"the load loop to read the FPM of every serving prefill worker {sorted(serving)}",
    )
    scaled = live.dgd_replicas()
    assert scaled["decode"] == 1, f"decode must not scale for a prefill-bound step: {scaled}"
    writes = live.replica_writes(requests_mark)
    assert writes, "the scale-up is a write of the DGD"
    for write in writes:
        services = write["data"]["spec"]["services"]
        assert set(services) == {"VllmPrefillWorker"}, f"only prefill is patched: {write}"
        assert set(services["VllmPrefillWorker"]) == {"replicas"}, write
    assert live.condition("Ready").get("status") == "True"

    # --- 3. load falls: prefill scales back down -------------------------------------------
    live.deployment.set_rate(BASE_RATE)
    wait_for(
        lambda: live.dgd_replicas()["prefill"] == 1 or None,
        live=live,
        timeout_s=120,
        what="prefill to scale down after the load fell",
    )
    assert live.dgd_replicas()["decode"] == 1
    wait_for(
        lambda: (
            (
                len(serving := serving_workers(live, "prefill")) == 1
                and serving == heard_workers(live, "prefill")
            )
            or None
        ),
        live=live,
        timeout_s=30,
        what="the load loop to drop the removed prefill workers",
    )
    assert len(heard_workers(live, "prefill")) == 1
    # Graceful scale-down (issue 19, problem 6): Kubernetes removed the pods the planner
    # marked, and they had drained: no request was cut after Dynamo's grace period.
    removed = live.dynamo.removed
    assert removed, "the scale-down removed pods"
    assert all(cost == LEAVING_COST for _, cost in removed), removed
    assert live.deployment.cut == [], f"requests cut on scale-down: {live.deployment.cut}"
    # ... chosen by the load their FPM reported (read through discovery, pod by pod)
    # (the AUDIT stream repeats each decision's message; the connector's own lines name the pods)
    leaving = [
        line
        for line in live.operator.log_text().splitlines()
        if " leaves" in line and "disagg_planner.audit" not in line
    ]
    assert leaving and all(" in flight) leave" in line for line in leaving), leaving
    assert live.deployment.cluster.failed == 0
    decode_history = [n for _, role, n in live.dynamo.history if role == "decode"]
    assert decode_history == [1], f"decode never changed: {live.dynamo.history}"

    # The dashboard's queries run on the real Prometheus, over the planner's real series.
    check_dashboard_queries(live)

    # --- 4. Prometheus stops: hold and report Degraded --------------------------------------
    before_outage = live.dgd_replicas()
    requests_mark = len(live.kmock.requests())
    live.prometheus.stop()
    mark = live.operator.log_size()
    # Read from the status writes themselves (the request log): a load tick between two
    # throughput ticks rewrites the conditions, so polling the object could miss it.
    degraded = wait_for(
        lambda: degraded_writes(live, requests_mark) or None,
        live=live,
        timeout_s=30,
        what="the policy to report Degraded",
    )
    assert degraded[0]["reason"] == "TrafficMissing", degraded
    failures = [
        line
        for line in http_text(f"http://127.0.0.1:{live.metrics_port}/metrics").splitlines()
        if line.startswith("dynamo_planner_observation_failures_total{")
        and 'source="traffic"' in line
        and 'reason="prometheus_unreachable"' in line
    ]
    assert failures and float(failures[0].rsplit(" ", 1)[1]) >= 1, failures
    ticks = wait_throughput_ticks(live, mark, 2, reason="no_traffic_data", timeout_s=40)
    assert all(t.action == "HOLD" for t in ticks), ticks
    assert live.dgd_replicas() == before_outage
    assert live.replica_writes(requests_mark) == [], "nothing is written without traffic data"

    # --- 5. Prometheus returns: traffic is read again ---------------------------------------
    live.prometheus.start(wait_for_targets=False)
    mark = live.operator.log_size()
    wait_for(
        lambda: (
            [
                t
                for t in throughput_ticks(live, mark)
                if t.throughput_reason not in ("no_traffic_data",)
            ]
            or None
        ),
        live=live,
        timeout_s=60,
        what="a throughput tick with traffic after Prometheus returned",
    )
    wait_for(
        lambda: live.condition("Degraded").get("status") == "False" or None,
        live=live,
        timeout_s=30,
        what="Degraded to clear",
    )

    # --- 6. the operator is killed and restarted: it resumes without a spurious write -------
    before_restart = live.dgd_replicas()
    live.operator.kill()
    requests_mark = len(live.kmock.requests())
    live.operator.start()
    mark = live.operator.log_size()
    wait_for(live.ready, live=live, timeout_s=90, what="the restarted operator's /readyz")
    ticks = wait_throughput_ticks(live, mark, 2, timeout_s=60)
    assert all(t.action == "HOLD" for t in ticks), ticks
    assert live.dgd_replicas() == before_restart
    assert live.replica_writes(requests_mark) == [], "a restart must not write replicas"
    assert any(
        r["plural"] == "dynamographdeployments" for r in live.operator_requests(requests_mark)
    )

    # --- every call the operator made is one the chart's RBAC grants -------------------------
    calls = {request_call(r) for r in live.operator_requests()}
    calls.discard(None)  # discovery (/api, /apis/...): allowed to every authenticated client
    assert calls <= OPERATOR_CALLS, f"calls outside the documented list: {calls - OPERATOR_CALLS}"
    assert ("patch", "nvidia.com", "dynamographdeployments") in calls
    assert ("patch", "planner.autoscaling.dev", "plannerpolicies/status") in calls
