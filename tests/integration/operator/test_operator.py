"""``planner operator`` end to end: kopf watches PlannerPolicies on kmock, one daemon per
policy runs that DGD's loop, decisions patch the DGD, the status tells, deletion stops it."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from tests.integration.connectors.conftest import NS
from tests.integration.operator.conftest import INTERVAL_S, PEERING, OperatorCluster, eventually
from tests.kube_dynamo import DGD_PLURAL
from tests.kube_dynamo import GROUP as DGD_GROUP
from tests.kube_dynamo import VERSION as DGD_VERSION


def scaled(cluster: OperatorCluster, dgd: str) -> dict[str, int] | None:
    replicas = cluster.graph_replicas(dgd)
    return replicas if replicas != {"prefill": 1, "decode": 1} else None


async def test_a_policy_starts_a_loop_that_scales_its_dgd_and_deletion_stops_it(
    operator_cluster: OperatorCluster, start_operator: Any
) -> None:
    cluster = operator_cluster
    cluster.add_graph("graph")
    operator = await start_operator()
    await cluster.add_policy("graph-policy", {"targetRef": {"name": "graph"}, "ttft_ms": 500})

    replicas = await eventually(lambda: scaled(cluster, "graph"), what="the DGD to be scaled")
    ready = await eventually(
        lambda: (c := cluster.condition("graph-policy", "Ready")) and c["status"] == "True" and c,
        what="Ready=True",
    )
    assert ready["reason"] == "Planning"
    status = await eventually(
        lambda: (
            (s := (cluster.policy("graph-policy") or {}).get("status"))
            and "applied" in s.get("lastDecision", {})
            and s
        ),
        what="the decision in the status",
    )
    decision = status["lastDecision"]
    assert {r: n for r, n in decision["applied"].items()} == {
        r: n for r, n in replicas.items() if n != 1
    }
    assert decision["reason"] == "scale"
    assert status["reasons"]["throughput"] == "scale"
    assert status["target"] == f"{NS}/graph"
    assert status["observed"]["requestsPerSecond"] == 10.0
    assert status["predicted"]["requestsPerSecond"] == 10.0
    conditions = {c["type"]: c for c in status["conditions"]}
    assert conditions["Degraded"]["status"] == "False"
    assert conditions["Scaling"]["reason"] in ("ScaleUp", "Converging")
    assert list(operator.runner.loops) and operator.runner.claims

    # Deleting the policy stops the loop and leaves the DGD alone.
    await cluster.delete_policy("graph-policy")
    await eventually(lambda: not operator.runner.loops or None, what="the loop to stop")
    await eventually(lambda: cluster.policy("graph-policy") is None, what="finalizer release")
    before = cluster.dgd("graph")
    requests = len(cluster.dgd_requests("graph"))
    await asyncio.sleep(3 * INTERVAL_S)
    assert cluster.dgd("graph") == before
    assert len(cluster.dgd_requests("graph")) == requests  # not even read any more
    assert not operator.runner.claims


def policy_events(cluster: OperatorCluster, policy: str) -> list[dict[str, Any]]:
    return [
        e
        for e in cluster.events()
        if e["involvedObject"]["kind"] == "PlannerPolicy" and e["involvedObject"]["name"] == policy
    ]


async def planning(cluster: OperatorCluster, start_operator: Any) -> OperatorCluster:
    """A running operator planning the DGD ``graph`` through the policy ``graph-policy``."""
    cluster.add_graph("graph")
    await start_operator()
    await cluster.add_policy("graph-policy", {"targetRef": {"name": "graph"}})
    await eventually(
        lambda: (c := cluster.condition("graph-policy", "Ready")) and c["status"] == "True",
        what="Ready=True",
    )
    return cluster


async def test_adoption_writes_starting_before_the_first_tick(
    operator_cluster: OperatorCluster, start_operator: Any
) -> None:
    # Issue 19, problem 7: the status was blank for the whole first interval.
    cluster = await planning(operator_cluster, start_operator)
    first = cluster.requests("PATCH", "plannerpolicies", "status")[0].data["status"]
    conditions = {c["type"]: (c["status"], c["reason"]) for c in first["conditions"]}
    assert conditions == {
        "Ready": ("False", "Starting"),
        "Scaling": ("False", "NotPlanning"),
        "Degraded": ("Unknown", "Starting"),
    }
    assert first["target"] == f"{NS}/graph"


async def test_a_deleted_dgd_is_not_reported_stable(
    operator_cluster: OperatorCluster, start_operator: Any
) -> None:
    cluster = await planning(operator_cluster, start_operator)
    # through the API, as kubectl does: the DGD watch sees the deletion (a store edit would not)
    await asyncio.to_thread(
        cluster.api.delete_namespaced_custom_object, DGD_GROUP, DGD_VERSION, NS, DGD_PLURAL, "graph"
    )
    await eventually(
        lambda: (c := cluster.condition("graph-policy", "Ready")) and c["status"] == "False",
        what="Ready=False",
    )
    scaling = cluster.condition("graph-policy", "Scaling")
    assert scaling is not None
    assert (scaling["status"], scaling["reason"]) == ("False", "NotPlanning"), scaling
    degraded = cluster.condition("graph-policy", "Degraded")
    assert degraded is not None
    assert degraded["reason"] == "DeploymentInvalid"


async def test_one_process_plans_two_dgds(
    operator_cluster: OperatorCluster, start_operator: Any
) -> None:
    cluster = operator_cluster
    cluster.add_graph("alpha")
    cluster.add_graph("beta", prefill=1)  # alpha's start: the recommendation differs from it
    operator = await start_operator()
    await cluster.add_policy("alpha", {"targetRef": {"name": "alpha"}})
    await cluster.add_policy("beta", {"targetRef": {"name": "beta"}, "advisory": True})

    alpha = await eventually(lambda: scaled(cluster, "alpha"), what="alpha scaled")
    beta_status = await eventually(
        lambda: ((cluster.policy("beta") or {}).get("status") or {}).get("lastDecision"),
        what="beta's decision",
    )
    # beta is advisory: recommended, reported, never written
    assert beta_status["advisory"] is True and beta_status["reason"] == "advisory"
    assert beta_status["scaleTo"] == alpha  # same traffic, same recommendation
    assert cluster.graph_replicas("beta") == {"prefill": 1, "decode": 1}
    assert sorted(str(k) for k in operator.runner.loops) == [f"{NS}/alpha", f"{NS}/beta"]
    registry = operator.runner.metrics.registry
    for dgd in ("alpha", "beta"):
        # The gauges are published after the write returns, which can be a moment after the
        # DGD shows the new replicas: wait for them rather than race the loop.
        def predicted(dgd: str = dgd) -> float | None:
            return registry.get_sample_value(
                "dynamo_planner_predicted_num_decode_replicas", {"namespace": NS, "dgd": dgd}
            )

        assert (
            await eventually(predicted, what=f"{dgd}'s predicted decode gauge") == alpha["decode"]
        )


async def test_an_invalid_spec_is_a_condition_until_the_spec_is_fixed(
    operator_cluster: OperatorCluster, start_operator: Any
) -> None:
    cluster = operator_cluster
    cluster.add_graph("graph")
    await start_operator()
    await cluster.add_policy("graph-policy", {"targetRef": {"name": "graph"}, "ttft_ms": -5})

    degraded = await eventually(
        lambda: cluster.condition("graph-policy", "Degraded"), what="a Degraded condition"
    )
    assert degraded["status"] == "True" and degraded["reason"] == "InvalidSpec"
    assert "ttft_ms" in degraded["message"] and "-5" in degraded["message"]
    ready = cluster.condition("graph-policy", "Ready")
    assert ready is not None
    assert ready["status"] == "False"
    assert cluster.dgd_requests("graph") == []  # nothing is touched
    # ... and an Event says so (issue 19, problem 7), once per invalid spec
    (event,) = await eventually(
        lambda: policy_events(cluster, "graph-policy") or None, what="an InvalidSpec Event"
    )
    assert (event["type"], event["reason"]) == ("Warning", "InvalidSpec")
    assert "ttft_ms" in event["message"]

    await cluster.patch_policy("graph-policy", {"spec": {"ttft_ms": 500}})
    await eventually(lambda: scaled(cluster, "graph"), what="the fixed policy to scale")

    def not_degraded() -> bool | None:
        degraded = cluster.condition("graph-policy", "Degraded")
        assert degraded is not None
        return degraded["status"] == "False" or None

    await eventually(not_degraded, what="Degraded=False")


async def test_a_second_policy_for_the_same_dgd_is_refused(
    operator_cluster: OperatorCluster, start_operator: Any
) -> None:
    cluster = operator_cluster
    cluster.add_graph("graph")
    operator = await start_operator()
    await cluster.add_policy("first", {"targetRef": {"name": "graph"}})
    await eventually(lambda: operator.runner.loops or None, what="the first loop")
    await cluster.add_policy("second", {"targetRef": {"name": "graph"}})

    refused = await eventually(
        lambda: cluster.condition("second", "Degraded"), what="the duplicate's condition"
    )
    assert refused["reason"] == "DuplicateTarget"
    assert f"{NS}/first" in refused["message"]
    (event,) = await eventually(
        lambda: policy_events(cluster, "second") or None, what="a DuplicateTarget Event"
    )
    assert (event["type"], event["reason"]) == ("Warning", "DuplicateTarget")
    assert f"{NS}/first" in event["message"]
    assert [str(k) for k in operator.runner.loops] == [f"{NS}/first"]


async def test_with_peering_only_the_highest_priority_replica_acts(
    operator_cluster: OperatorCluster, start_operator: Any
) -> None:
    cluster = operator_cluster
    cluster.add_graph("graph")
    cluster.kmock.objects[PEERING, NS, "planner"] = {
        "apiVersion": "kopf.dev/v1",
        "kind": "KopfPeering",
        "metadata": {"name": "planner", "namespace": NS, "uid": "uid-peering"},
    }
    low = await start_operator(standalone=False, priority=10, identity="replica-low")
    high = await start_operator(standalone=False, priority=20, identity="replica-high")
    await eventually(
        lambda: (
            {"replica-low", "replica-high"}
            <= set(cluster.kmock.objects[PEERING, NS, "planner"].raw.get("status") or {})
            or None
        ),
        what="both replicas in the peering object",
    )
    await cluster.add_policy("graph-policy", {"targetRef": {"name": "graph"}})

    await eventually(lambda: scaled(cluster, "graph"), what="the DGD to be scaled")
    assert list(high.loops) and not low.loops
    await asyncio.sleep(2 * INTERVAL_S)
    assert not low.loops  # still paused

    await high.stop()  # leaves the peering object: the other replica takes over
    await eventually(lambda: low.loops or None, what="the other replica to resume")


async def test_a_held_tick_logs_hold_and_what_it_did_not_do(
    operator_cluster: OperatorCluster, start_operator: Any, caplog: Any
) -> None:
    # Issue 19, problem 7: a tick held by a manual edit logged "SCALE_DOWN ...".
    caplog.set_level(logging.INFO, logger="disagg_planner.runtime.loop")
    cluster = operator_cluster
    cluster.add_graph("graph")
    await start_operator()
    await cluster.add_policy("graph-policy", {"targetRef": {"name": "graph"}, "ttft_ms": 500})
    replicas = await eventually(
        lambda: scaled(cluster, "graph"), what="the DGD to be scaled", timeout_s=30
    )
    await eventually(
        lambda: any(" [summary] SCALE_UP | " in r.getMessage() for r in caplog.records),
        what="the scale-up's summary line",
    )
    # Someone scales prefill far up: respected for one interval, so the planner's scale-down
    # back to its own sizing is held, and the line says so.
    mark = len(caplog.records)
    edited = replicas["prefill"] + 5
    cluster.set_ready("prefill", edited, name="graph")  # converged: nothing else holds
    # through the API, as kubectl does: the DGD watch sees it (a store edit would not)
    await asyncio.to_thread(
        cluster.api.patch_namespaced_custom_object,
        DGD_GROUP,
        DGD_VERSION,
        NS,
        DGD_PLURAL,
        "graph",
        {"spec": {"services": {"prefill": {"replicas": edited}}}},
        _content_type="application/merge-patch+json",
    )

    def held_line() -> str | None:
        lines = [r.getMessage() for r in caplog.records[mark:] if "[summary]" in r.getMessage()]
        return next((line for line in lines if "SCALE_DOWN" in line), None)

    line = await eventually(held_line, what="the tick after the manual edit", timeout_s=20)
    assert "[summary] HOLD (recommended SCALE_DOWN; held: prefill manual_override) |" in line
    assert "throughput_reason=manual_override_hold" in line
