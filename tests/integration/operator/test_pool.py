"""``PlannerPool`` on kmock with the real kubernetes client and kopf: two policies of one pool
want more than the pool holds; the high priority gets its need, the low one is refused with
its reason, neither DGD holds more than its grant, the pool's status shows each member and
the totals, and the arbiter's memory on the pool object survives the operator's restart."""

from __future__ import annotations

import asyncio
from typing import Any

from disagg_planner.operator.crd import GROUP, VERSION
from disagg_planner.operator.pool import POOL_KIND, POOL_PLURAL
from tests.integration.connectors.conftest import NS
from tests.integration.operator.conftest import POOL, OperatorCluster, eventually

MAX_TOTAL = 5


async def add_pool(cluster: OperatorCluster, name: str, spec: dict[str, Any]) -> None:
    body = {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": POOL_KIND,
        "metadata": {"name": name, "namespace": NS, "uid": f"uid-{name}", "resourceVersion": "1"},
        "spec": spec,
    }
    await asyncio.to_thread(
        cluster.api.create_namespaced_custom_object, GROUP, VERSION, NS, POOL_PLURAL, body
    )


def pool_status(cluster: OperatorCluster, name: str) -> dict[str, Any]:
    try:
        return dict(cluster.kmock.objects[POOL, NS, name].raw.get("status") or {})
    except KeyError:
        return {}


def gpus(cluster: OperatorCluster, dgd: str) -> int:
    return sum(cluster.replicas(dgd).values())  # one GPU per replica in these graphs


async def test_a_pool_grants_by_priority_and_keeps_its_memory_across_a_restart(
    operator_cluster: OperatorCluster, start_operator: Any
) -> None:
    cluster = operator_cluster
    cluster.add_graph("alpha")
    cluster.add_graph("beta")
    await add_pool(cluster, "gpus", {"maxTotalGpus": MAX_TOTAL, "stabilizationSeconds": 600})
    operator = await start_operator(pool_period_s=0.5)
    member = {"pool": "gpus", "pool_floor_gpus": 2}
    await cluster.add_policy(
        "alpha", {"targetRef": {"name": "alpha"}, **member, "pool_priority": 10}
    )
    await cluster.add_policy("beta", {"targetRef": {"name": "beta"}, **member})

    def both_arbitrated() -> dict[str, Any] | None:
        status = pool_status(cluster, "gpus")
        members = status.get("members") or {}
        alpha = members.get("alpha") or {}
        beta = members.get("beta") or {}
        # both have asked for more than the floors (the canned traffic needs it)
        if alpha.get("allocated", 0) > 2 and beta.get("requested", 0) > 2:
            return status
        return None

    status = await eventually(both_arbitrated, what="the pool's grants", timeout_s=30)
    alpha, beta = status["members"]["alpha"], status["members"]["beta"]
    # the high priority gets the one GPU above the floors; the low one is refused it
    assert alpha["allocated"] == 3 and alpha["requested"] >= 3
    assert (beta["allocated"], beta["reason"]) == (2, "higher_priority_first")
    assert alpha["borrowed"] == 1 and beta["borrowed"] == 0
    assert status["totalAllocated"] <= MAX_TOTAL and status["memberCount"] == 2
    ready = next(c for c in status["conditions"] if c["type"] == "Ready")
    assert ready["status"] == "True"
    await eventually(lambda: gpus(cluster, "alpha") == 3, what="alpha scaled to its grant")
    # beta's loop asked for more; its connector cut the write to its grant
    await asyncio.sleep(2.0)
    assert gpus(cluster, "beta") == 2
    assert gpus(cluster, "alpha") + gpus(cluster, "beta") <= MAX_TOTAL
    memory = status["arbiter"]
    assert set(memory) == {"alpha", "beta"} and memory["alpha"]["grant"] == 3

    # a restarted operator reads the arbiter's memory back from the pool object
    await operator.stop()
    written = pool_status(cluster, "gpus")["lastArbitrationTime"]
    await start_operator(pool_period_s=0.5)
    after = await eventually(
        lambda: (
            (s := pool_status(cluster, "gpus")).get("lastArbitrationTime") != written
            and len(s.get("members") or {}) == 2
            and s
        ),
        what="the restarted operator's arbitration",
        timeout_s=30,
    )
    assert after["arbiter"]["alpha"]["history"][0][0] == memory["alpha"]["history"][0][0]
    assert after["members"]["beta"]["allocated"] == 2
    assert gpus(cluster, "alpha") + gpus(cluster, "beta") <= MAX_TOTAL


async def test_a_sharded_operator_serves_only_the_policies_and_pools_of_its_shard(
    operator_cluster: OperatorCluster, start_operator: Any
) -> None:
    cluster = operator_cluster
    cluster.add_graph("mine")
    cluster.add_graph("theirs")
    for name, shard in (("mine", "a"), ("theirs", "b")):
        body = {
            "apiVersion": f"{GROUP}/{VERSION}",
            "kind": "PlannerPolicy",
            "metadata": {
                "name": name,
                "namespace": NS,
                "uid": f"uid-{name}",
                "resourceVersion": "1",
                "labels": {SHARD: shard},
            },
            "spec": {"targetRef": {"name": name}},
        }
        await asyncio.to_thread(
            cluster.api.create_namespaced_custom_object, GROUP, VERSION, NS, "plannerpolicies", body
        )
    operator = await start_operator(shard_labels={SHARD: "a"})
    await eventually(lambda: sum(cluster.replicas("mine").values()) > 2, what="mine scaled")
    await asyncio.sleep(2.0)
    assert [str(k) for k in operator.runner.loops] == [f"{NS}/mine"]
    assert cluster.replicas("theirs") == {"prefill": 1, "decode": 1}


SHARD = "planner.autoscaling.dev/shard"
