"""Issue 19, problem 6: a scale-down used to remove whichever pod Kubernetes picked, at once.
Now the connector chooses the workers that leave (least loaded by their FPM; pods not ready
first), marks them with ``controller.kubernetes.io/pod-deletion-cost`` and lowers the count
once they drained or the drain timeout passed. SimulatedDynamo removes pods the way a
ReplicaSet does (lowest deletion cost first, then the newest), so without the mark the newest
pod would leave.

Issue 36, item 5: the drain no longer blocks the tick (the roles are held ``draining`` and
the connector lowers them when the drain ends, saying which signal ended it), and without
any per-worker load (no FPM) there is no blind wait: Dynamo's worker leaves routing on
SIGTERM and drains within its own shutdown budget."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import pytest

from disagg_planner.connectors.base import HoldReason
from disagg_planner.connectors.kubernetes import (
    DRAINING_ANNOTATION,
    LEAVING_COST,
    POD_DELETION_COST,
    KubernetesConnector,
)
from disagg_planner.connectors.kubernetes.drain import DrainEnd
from tests.integration.connectors.conftest import (
    DGD_NAME,
    DGD_PLURAL,
    NS,
    PODS,
    Cluster,
    FakeTime,
    frontend,
    k8s_settings,
    worker,
)

pytestmark = pytest.mark.filterwarnings("ignore:read_binary is deprecated:DeprecationWarning")

PREFILL = "prefill-pool"


def deploy(cluster: Cluster, time: FakeTime, prefill: int, *, ready: bool = True) -> list[str]:
    """A DGD with ``prefill`` prefill pods (oldest first) and one decode pod."""
    cluster.add_dgd(
        {"Frontend": frontend(), PREFILL: worker("prefill", prefill), "decode": worker("decode", 1)}
    )
    dynamo = cluster.simulate_dynamo(time, ready=ready)
    return [p.name for p in dynamo.pods if p.service == PREFILL]


def connector(
    api_client: Any, time: FakeTime, loads: Callable[[], dict[str, int]] | None, **config: Any
) -> KubernetesConnector:
    conn = KubernetesConnector(
        k8s_settings(**config), api_client=api_client, clock=time.clock, sleep=time.sleep
    )
    if loads is not None:
        conn.use_worker_loads(loads)
    return conn


def pod_patches(cluster: Cluster) -> list[tuple[str, dict[str, Any]]]:
    return [(r.name, r.data["metadata"]["annotations"]) for r in cluster.requests("PATCH", "pods")]


def spec_prefill(cluster: Cluster) -> int:
    return int(cluster.dgd()["spec"]["services"][PREFILL]["replicas"])


async def test_the_least_loaded_worker_is_marked_drained_and_removed(
    cluster: Cluster, api_client: Any, fake_time: FakeTime
) -> None:
    oldest, middle, newest = deploy(cluster, fake_time, 3)
    # The oldest pod is the least loaded; it still serves one request for 2 s.
    drained_at = fake_time.now + 2.0
    seen_spec: list[int] = []

    def loads() -> dict[str, int]:
        seen_spec.append(spec_prefill(cluster))
        return {oldest: 0 if fake_time.now >= drained_at else 1, middle: 5, newest: 3}

    conn = connector(api_client, fake_time, loads, kubernetes_drain_timeout_seconds=30)
    await conn.validate()
    asked_at = fake_time.now
    outcome = await conn.set_replicas({"prefill": 2, "decode": 1})
    # the tick goes on: nothing written yet, the role held while its worker drains
    assert (outcome.applied, outcome.held["prefill"].reason, fake_time.now) == (
        {},
        HoldReason.DRAINING,
        asked_at,
    )
    again = await conn.set_replicas({"prefill": 2, "decode": 1})  # the next tick, same plan
    assert again.held["prefill"].reason is HoldReason.DRAINING

    assert (await conn.drained()) is DrainEnd.IDLE
    assert spec_prefill(cluster) == 2
    # Marked before the count dropped; the count dropped only once it had drained.
    ((name, annotations),) = pod_patches(cluster)
    assert name == oldest
    assert annotations[POD_DELETION_COST] == LEAVING_COST
    assert DRAINING_ANNOTATION in annotations
    assert set(seen_spec) == {3}, "the replicas were lowered before the drain ended"
    assert fake_time.now >= drained_at
    assert cluster.dynamo is not None and cluster.dynamo.removed == [oldest]


async def test_the_drain_ends_at_its_timeout(
    cluster: Cluster, api_client: Any, fake_time: FakeTime, caplog: Any
) -> None:
    first, second = deploy(cluster, fake_time, 2)
    conn = connector(
        api_client, fake_time, lambda: {first: 4, second: 2}, kubernetes_drain_timeout_seconds=5
    )
    start = fake_time.now
    with caplog.at_level(logging.WARNING, logger="disagg_planner.connectors.kubernetes"):
        await conn.set_replicas({"prefill": 1})
        assert (await conn.drained()) is DrainEnd.TIMEOUT
    assert spec_prefill(cluster) == 1
    assert 5.0 <= fake_time.now - start < 6.0
    assert any(
        "ended by timeout" in r.getMessage()
        and "drain timeout (5 s)" in r.getMessage()
        and f"{second} 2 in flight" in r.getMessage()
        for r in caplog.records
    ), caplog.text
    assert cluster.dynamo is not None and cluster.dynamo.removed == [second]


async def test_a_known_idle_worker_leaves_before_one_of_unknown_load(
    cluster: Cluster, api_client: Any, fake_time: FakeTime
) -> None:
    first, _second = deploy(cluster, fake_time, 2)
    # No FPM from the newer pod: the older, known idle one leaves, at once.
    conn = connector(api_client, fake_time, lambda: {first: 0})
    await conn.set_replicas({"prefill": 1})
    assert fake_time.sleeps == []
    assert cluster.dynamo is not None and cluster.dynamo.removed == [first]


@pytest.mark.parametrize("timeout_s", [0.0, 30.0])
async def test_without_a_load_signal_there_is_no_blind_wait_and_the_log_says_why(
    cluster: Cluster, api_client: Any, fake_time: FakeTime, timeout_s: float, caplog: Any
) -> None:
    """Issue 36 item 5: throughput-only policies (no FPM) waited 30 s blind per scale-down."""
    pods = deploy(cluster, fake_time, 3)
    conn = connector(api_client, fake_time, None, kubernetes_drain_timeout_seconds=timeout_s)
    start = fake_time.now
    with caplog.at_level(logging.INFO, logger="disagg_planner.connectors.kubernetes"):
        outcome = await conn.set_replicas({"prefill": 2})
    ended = [r.getMessage() for r in caplog.records if "ended by" in r.getMessage()]
    assert (outcome.applied, fake_time.now - start, spec_prefill(cluster)) == (
        {"prefill": 2},
        0.0,
        2,
    )
    assert len(ended) == 1 and "ended by no_load_signal" in ended[0], ended
    # Unknown load everywhere: the first by name is marked and leaves.
    assert cluster.dynamo is not None and cluster.dynamo.removed == [pods[0]]


async def test_pods_not_ready_leave_first_without_a_drain(
    cluster: Cluster, api_client: Any, fake_time: FakeTime
) -> None:
    pods = deploy(cluster, fake_time, 3)
    starting = pods[0]
    cluster.kmock.objects[PODS, NS, starting].patch(
        {"status": {"conditions": [{"type": "Ready", "status": "False"}]}}
    )
    conn = connector(api_client, fake_time, lambda: dict.fromkeys(pods[1:], 0) | {starting: 0})
    await conn.set_replicas({"prefill": 2})
    assert [name for name, _ in pod_patches(cluster)] == [starting]
    assert fake_time.sleeps == []
    assert cluster.dynamo is not None and cluster.dynamo.removed == [starting]


async def test_a_pod_marked_earlier_that_stays_is_unmarked(
    cluster: Cluster, api_client: Any, fake_time: FakeTime
) -> None:
    stale, idle, busy = deploy(cluster, fake_time, 3)
    # Marked by a scale-down that was not written (the planner stopped during its drain).
    cluster.kmock.objects[PODS, NS, stale].patch(
        {"metadata": {"annotations": {POD_DELETION_COST: LEAVING_COST, DRAINING_ANNOTATION: "x"}}}
    )
    conn = connector(api_client, fake_time, lambda: {stale: 3, idle: 0, busy: 2})
    await conn.set_replicas({"prefill": 2})
    assert cluster.dynamo is not None
    assert cluster.dynamo.removed == [idle]
    assert POD_DELETION_COST not in cluster.dynamo.annotations(stale)
    assert DRAINING_ANNOTATION not in cluster.dynamo.annotations(stale)
    assert cluster.dynamo.annotations(idle)[POD_DELETION_COST] == LEAVING_COST


async def test_an_increase_marks_nothing(
    cluster: Cluster, api_client: Any, fake_time: FakeTime
) -> None:
    deploy(cluster, fake_time, 1)
    conn = connector(api_client, fake_time, dict)
    await conn.set_replicas({"prefill": 3})
    assert pod_patches(cluster) == []
    assert [r.name for r in cluster.requests("PATCH", DGD_PLURAL)] == [DGD_NAME]
