"""``PlannerPool`` on kmock with the real kubernetes client and kopf: two policies of one pool
want more than the pool holds; the high priority gets its need, the low one is refused with
its reason, neither DGD holds more than its grant, the pool's status shows each member and
the totals, and the arbiter's memory on the pool object survives the operator's restart."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

import pytest

from disagg_planner.operator.crd import GROUP, VERSION
from disagg_planner.operator.pool import POOL_KIND, POOL_PLURAL
from tests.integration.connectors.conftest import DGD_POD_LABEL, NS, PODS, SERVICE_POD_LABEL
from tests.integration.operator.conftest import INTERVAL_S, POOL, OperatorCluster, eventually
from tests.kube_dynamo import DGD_PLURAL
from tests.kube_dynamo import GROUP as DGD_GROUP
from tests.kube_dynamo import VERSION as DGD_VERSION
from tests.unit.observe.canned_prometheus import CannedPrometheus, vector_reply
from tests.unit.runtime.conftest import traffic_parts

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
    return sum(cluster.graph_replicas(dgd).values())  # one GPU per replica in these graphs


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
    await eventually(lambda: sum(cluster.graph_replicas("mine").values()) > 2, what="mine scaled")
    await asyncio.sleep(2.0)
    assert [str(k) for k in operator.runner.loops] == [f"{NS}/mine"]
    assert cluster.graph_replicas("theirs") == {"prefill": 1, "decode": 1}


SHARD = "planner.autoscaling.dev/shard"


class PoolDynamo:
    """The Dynamo operator of several DGDs, in real time, with pods in kmock (Dynamo's
    labels): a rise of a service's replicas creates its pods at once (they hold their GPUs
    from that moment, the worst case for a budget); a fall marks the extra pods terminating
    (``deletionTimestamp``), and they hold their GPUs for ``grace_s`` more before they are
    gone. The DGD's status counts the pods not terminating, as Dynamo's does, written through
    the API (the operator's watch caches see it)."""

    def __init__(self, cluster: OperatorCluster, names: tuple[str, ...], grace_s: float) -> None:
        self.cluster = cluster
        self.names = names
        self.grace_s = grace_s
        self.running: dict[tuple[str, str], list[str]] = {}  # pod names, oldest first
        self.leaving: list[tuple[float, str]] = []  # (gone at, pod name)
        self._serial = 0

    def gpus_held(self) -> int:
        """GPUs held now (one per replica in these graphs), terminating pods included."""
        return sum(len(pods) for pods in self.running.values()) + len(self.leaving)

    def _create_pod(self, name: str, service: str) -> str:
        self._serial += 1
        pod = f"{name}-{service}-{self._serial}"
        self.cluster.kmock.objects[PODS, NS, pod] = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {
                "name": pod,
                "namespace": NS,
                "labels": {DGD_POD_LABEL: name, SERVICE_POD_LABEL: service},
            },
            "status": {"phase": "Running", "conditions": [{"type": "Ready", "status": "True"}]},
        }
        return pod

    async def reconcile(self) -> None:
        now = time.monotonic()
        kmock = self.cluster.kmock
        for _gone_at, pod in [p for p in self.leaving if p[0] <= now]:
            del kmock.objects[PODS, NS, pod]
        self.leaving = [p for p in self.leaving if p[0] > now]
        for name in self.names:
            services = self.cluster.dgd(name)["spec"]["services"]
            status = {}
            for service in ("prefill", "decode"):
                wanted = int(services[service]["replicas"])
                pods = self.running.setdefault((name, service), [])
                while len(pods) > wanted:  # the newest leave first, as a ReplicaSet's do
                    pod = pods.pop()
                    kmock.objects[PODS, NS, pod].patch(
                        {"metadata": {"deletionTimestamp": "2030-01-01T00:00:00Z"}}
                    )
                    self.leaving.append((now + self.grace_s, pod))
                while len(pods) < wanted:
                    pods.append(self._create_pod(name, service))
                status[service] = {"replicas": wanted, "readyReplicas": wanted}
            if status != (self.cluster.dgd(name).get("status") or {}).get("services"):
                await asyncio.to_thread(
                    self.cluster.api.patch_namespaced_custom_object_status,
                    DGD_GROUP,
                    DGD_VERSION,
                    NS,
                    DGD_PLURAL,
                    name,
                    {"status": {"state": "successful", "services": status}},
                )


@pytest.mark.slow
async def test_the_pool_never_holds_more_than_its_ceiling_through_a_scripted_day(
    operator_cluster: OperatorCluster, start_operator: Any
) -> None:
    """Issue 30: the pool's GPUs in use, polled every 0.2 s through a day of traffic
    compressed into phases (the low priority bursts and borrows the idle floor; the high
    priority bursts and reclaims it; both burst; both calm), never exceed maxTotalGpus,
    counting the pods that start and those that terminate after a reclaim."""
    cluster = operator_cluster
    ceiling, grace_s = 6, 1.5
    prometheus = {name: CannedPrometheus() for name in ("alpha", "beta")}
    try:
        for name, replies in prometheus.items():
            cluster.add_graph(name)
            replies.reply = vector_reply(traffic_parts(LOW, INTERVAL_S))
        dynamo = PoolDynamo(cluster, ("alpha", "beta"), grace_s)
        await add_pool(cluster, "gpus", {"maxTotalGpus": ceiling, "stabilizationSeconds": 2})
        await start_operator(pool_period_s=0.5)
        for name, priority in (("alpha", 10), ("beta", 0)):
            spec = {
                "targetRef": {"name": name},
                "pool": "gpus",
                "pool_priority": priority,
                "pool_floor_gpus": 2,
                "metric_pulling_prometheus_endpoint": prometheus[name].url,
            }
            await cluster.add_policy(name, spec)
        held: list[tuple[str, int, dict[str, int]]] = []

        async def phase(
            label: str,
            alpha: float,
            beta: float,
            seconds: float,
            done: Callable[[dict[str, int]], bool] | None = None,
        ) -> None:
            """``seconds`` of traffic; with ``done``, it ends ``settle_s`` after the DGDs'
            GPUs first show the change the phase is for (the pods that change removed gone by
            then), or after ``seconds`` where that comes first."""
            for name, rate in (("alpha", alpha), ("beta", beta)):
                prometheus[name].reply = vector_reply(traffic_parts(rate, INTERVAL_S))
            deadline = time.monotonic() + seconds
            while time.monotonic() < deadline:
                await dynamo.reconcile()
                desired = {n: gpus(cluster, n) for n in ("alpha", "beta")}
                held.append((label, dynamo.gpus_held(), desired))
                if done is not None and done(desired):
                    deadline = min(deadline, time.monotonic() + settle_s)
                    done = None
                await asyncio.sleep(0.2)

        # longer than the pods' grace (1.5 s) and the pool's stabilisation (2 s), each
        settle_s = 3.0
        await phase("calm", LOW, LOW, 4)
        await phase("low priority bursts", LOW, HIGH, 10, lambda d: d["beta"] > 2)
        await phase("high priority bursts", HIGH, HIGH, 12, lambda d: d["alpha"] > 2 >= d["beta"])
        await phase(
            "low priority alone again", LOW, HIGH, 10, lambda d: d["beta"] > 2 >= d["alpha"]
        )
        await phase("calm again", LOW, LOW, 6, lambda d: max(d.values()) <= 2)
    finally:
        for replies in prometheus.values():
            replies.close()

    over = [(label, n, desired) for label, n, desired in held if n > ceiling]
    assert not over, over[:5]
    peak = {
        label: {n: max(d[n] for lbl, _, d in held if lbl == label) for n in ("alpha", "beta")}
        for label, _, _ in held
    }
    # the day did what it says: beta borrowed alpha's idle floor, alpha reclaimed it
    assert peak["low priority bursts"]["beta"] > 2, peak
    assert peak["high priority bursts"]["alpha"] > 2, peak
    final_burst = [d for label, _, d in held if label == "high priority bursts"][-1]
    assert final_burst["beta"] < peak["low priority bursts"]["beta"], (final_burst, peak)


LOW, HIGH = 1.0, 30.0
