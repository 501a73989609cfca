"""A failed or unanswered grow (Dynamo's fail-fast worker) and the follower pods a shrink
removes (issue 32, items 3 and 4): kmock as the API server, the stand-in worker and Ray
dashboard of conftest.py, the operator task of test_two_stage.py."""

from __future__ import annotations

import json
import time
from typing import Any

import pytest

from disagg_planner.connectors.elastic_ep import (
    FollowersNotEmpty,
    GrowFailed,
    RayDashboardJoinProbe,
    ResizeBackingOff,
    ResizeOutcome,
    ResizePhase,
    ResizeRecord,
)
from disagg_planner.connectors.elastic_ep.progress import BACKOFF_ANNOTATION
from disagg_planner.connectors.kubernetes import POD_DELETION_COST
from tests.integration.connectors.conftest import DGD_NAME, NS, PODS
from tests.integration.elastic.test_two_stage import (
    Cluster,
    follower_state,
    make_controller,
    record_of,
    seed_record,
    services,
)
from tests.integration.elastic.test_two_stage import (
    cluster as cluster,
)
from tests.integration.elastic.test_two_stage import (
    operator as operator,
)

pytestmark = pytest.mark.filterwarnings("ignore:read_binary is deprecated:DeprecationWarning")

FOLLOWER = "decode-elastic"


def backoff_of(cluster: Cluster) -> dict[str, Any] | None:
    text = (cluster.dgd()["metadata"].get("annotations") or {}).get(BACKOFF_ANNOTATION)
    return json.loads(text) if text else None


def add_pod(
    cluster: Cluster, name: str, service: str, *, ip: str, created: str, restarts: int = 0
) -> None:
    cluster.kmock.objects[PODS, NS, name] = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "namespace": NS,
            "creationTimestamp": created,
            "labels": {
                "nvidia.com/dynamo-graph-deployment-name": DGD_NAME,
                "nvidia.com/dynamo-component": service,
            },
        },
        "status": {
            "phase": "Running",
            "podIP": ip,
            "hostIP": ip,
            "conditions": [{"type": "Ready", "status": "True"}],
            "containerStatuses": [
                {
                    "name": "main",
                    "restartCount": restarts,
                    "ready": True,
                    "image": "x",
                    "imageID": "x",
                }
            ],
        },
    }


def deletion_cost(cluster: Cluster, pod: str) -> str | None:
    annotations = cluster.kmock.objects[PODS, NS, pod].raw["metadata"].get("annotations") or {}
    return annotations.get(POD_DELETION_COST)


def called_grow_record() -> ResizeRecord:
    """A grow DP 16 -> 20 whose resize call a previous planner made 30 s ago, when the
    leader pods had not restarted."""
    now = time.time()
    return ResizeRecord(
        phase=ResizePhase.RESIZING,
        from_dp=16,
        to_dp=20,
        from_followers=0,
        to_followers=1,
        started_s=now - 60,
        deadline_s=now + 60,
        called_s=now - 30,
        leader_restarts=0,
    )


# --- item 4: a failed grow ----------------------------------------------------------------------


async def test_a_fail_fast_worker_restart_rolls_back_backs_off_and_is_not_refired(
    cluster, api_client, dynamo_factory, operator
):
    """Dynamo's current worker exits on a failed grow and answers nothing; it comes back at
    the old size. The followers are lowered, a back-off and an Event are recorded, and the
    same grow is not fired again (it would restart the worker again)."""
    cluster.add_dgd(services(0))
    worker = dynamo_factory(dp=16, failure="fail_fast")
    worker.join("10.0.0.2", 4.0)
    worker.fail_next = ["NIXL EP buffers could not be allocated"]
    ctl, _ = make_controller(api_client, worker, elastic_ep_grow_backoff_seconds=600.0)

    with pytest.raises(GrowFailed, match=r"back at DP 16.*fail-fast.*not re-issuing"):
        await ctl.resize(20)

    assert len(worker.scale_calls()) == 1 and worker.restarts == 1
    assert follower_state(cluster)[0] == 0 and record_of(cluster) is None
    backoff = backoff_of(cluster)
    assert backoff is not None
    assert (backoff["type"], backoff["reason"], backoff["failures"], backoff["toDp"]) == (
        "ElasticEpGrowFailed",
        "WorkerRestarted",
        1,
        20,
    )
    assert backoff["notBefore"] == pytest.approx(time.time() + 600.0, abs=30)
    assert [e["reason"] for e in cluster.events()] == ["ElasticEpGrowFailed"]

    with pytest.raises(ResizeBackingOff, match=r"not growing DP 16 -> 20 .*1 failed grow"):
        await ctl.resize(20)
    assert len(worker.scale_calls()) == 1


async def test_the_rollback_worker_variant_is_read_and_backs_off(
    cluster, api_client, dynamo_factory, operator
):
    cluster.add_dgd(services(0))
    worker = dynamo_factory(dp=16, failure="rollback")
    worker.join("10.0.0.2", 4.0)
    worker.fail_next = ["weight transfer failed"]
    ctl, _ = make_controller(api_client, worker)

    with pytest.raises(GrowFailed, match=r"rolled back and keeps its size \(DP 16\)"):
        await ctl.resize(20)
    assert follower_state(cluster)[0] == 0
    assert (backoff_of(cluster) or {}).get("failures") == 1


async def test_a_restarted_planner_does_not_refire_a_grow_whose_leader_restarted(
    cluster, api_client, dynamo_factory, operator
):
    """The record says the call was made (calledAt, the leader's restarts then); the leader
    pod restarted since: the grow failed, and the new planner rolls back instead of firing
    it again."""
    cluster.add_dgd(services(1))
    created = "2030-01-01T00:00:00Z"
    add_pod(cluster, "leader-0", "decode", ip="10.0.0.1", created=created, restarts=1)
    seed_record(cluster, called_grow_record())
    worker = dynamo_factory(dp=16)
    ctl, pool = make_controller(api_client, worker)
    pool._role_services["agg"] = "decode"  # what the first status read resolves

    with pytest.raises(GrowFailed, match=r"leader pods restarted 1 time\(s\).*not re-issuing"):
        await ctl.recover()
    assert worker.scale_calls() == []
    assert follower_state(cluster)[0] == 0 and record_of(cluster) is None
    assert (backoff_of(cluster) or {}).get("reason") == "WorkerRestarted"


async def test_a_restarted_planner_finds_the_grow_done_without_calling_again(
    cluster, api_client, dynamo_factory, operator
):
    cluster.add_dgd(services(1))
    seed_record(cluster, called_grow_record())
    worker = dynamo_factory(dp=20)
    ctl, _ = make_controller(api_client, worker)

    result = await ctl.recover()

    assert result is not None and result.outcome is ResizeOutcome.RESIZED and result.dp == 20
    assert worker.scale_calls() == [] and record_of(cluster) is None


# --- item 3: which follower pods leave ------------------------------------------------------------


async def test_a_shrink_marks_the_follower_pod_whose_node_hosts_no_rank(
    cluster, api_client, engine_factory, ray_factory, operator
):
    """Two followers (DP 24); after the shrink to 20 the engine's actors left 10.0.0.2, the
    older pod: that pod gets the lowest deletion cost before the count drops, not the newest
    one that a plain decrement would take."""
    cluster.add_dgd(services(2))
    add_pod(cluster, "flw-a", FOLLOWER, ip="10.0.0.2", created="2030-01-01T00:00:00Z")
    add_pod(cluster, "flw-b", FOLLOWER, ip="10.0.0.3", created="2030-01-01T00:05:00Z")
    engine = engine_factory(dp=24)
    ray = ray_factory(head_gpus=16.0)
    for ip in ("10.0.0.2", "10.0.0.3"):
        ray.join(ip, 4.0)
        ray.place(ip)
    engine.on_scale = lambda _dp: ray.place("10.0.0.2", alive=False)
    ctl, _ = make_controller(api_client, engine, RayDashboardJoinProbe(ray.url))

    result = await ctl.resize(20)

    assert result.dp == 20 and follower_state(cluster)[0] == 1
    assert deletion_cost(cluster, "flw-a") == str(-(2**31))
    assert deletion_cost(cluster, "flw-b") is None


async def test_followers_are_not_lowered_while_every_follower_node_hosts_ranks(
    cluster, api_client, engine_factory, ray_factory, operator
):
    cluster.add_dgd(services(2))
    add_pod(cluster, "flw-a", FOLLOWER, ip="10.0.0.2", created="2030-01-01T00:00:00Z")
    add_pod(cluster, "flw-b", FOLLOWER, ip="10.0.0.3", created="2030-01-01T00:05:00Z")
    engine = engine_factory(dp=24)
    ray = ray_factory(head_gpus=16.0)
    for ip in ("10.0.0.2", "10.0.0.3"):
        ray.join(ip, 4.0)
        ray.place(ip)
    ctl, _ = make_controller(api_client, engine, RayDashboardJoinProbe(ray.url))

    with pytest.raises(FollowersNotEmpty, match=r"1 follower pod\(s\).*should leave"):
        await ctl.resize(20)

    assert engine.dp == 20  # the engine shrank; its followers stay until shown empty
    assert follower_state(cluster)[0] == 2
    assert json.loads(record_of(cluster) or "{}")["reason"] == "RemovingFollowers"
    ray.place("10.0.0.3", alive=False)
    result = await ctl.recover()
    assert result is not None and follower_state(cluster)[0] == 1
    assert deletion_cost(cluster, "flw-b") == str(-(2**31))
