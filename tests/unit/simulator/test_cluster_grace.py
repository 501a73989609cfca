"""Scale-down with a grace period: a removed replica drains for at most ``drain_grace_s``;
then it stops and the requests left on it are cancelled (failed) or migrated elsewhere."""

from __future__ import annotations

import pytest

from disagg_planner.predictors.traces import TraceRequest
from disagg_planner.simulator.cluster import (
    DEFAULT_DRAIN_GRACE_S,
    DRAIN_CANCELLED,
    Cluster,
    Replica,
    ReplicaState,
)
from disagg_planner.simulator.errors import SimulatorInputError

SPEC = "sim:llama-3.1-8b-fp8@h200_sxm:tp1"
# 40 requests of 6,000 output tokens at about 5-6 ms per token: over 30 s each
LONG = [TraceRequest(0.05 * i, 1000, 6000) for i in range(40)]


def cluster(**kw) -> Cluster:
    return Cluster(
        engines={"prefill": SPEC, "decode": SPEC},
        replicas={"prefill": 1, "decode": 2},
        startup_delay_s=0.0,
        router="round_robin",
        **kw,
    )


def drain_one_decode(c: Cluster, at_s: float) -> tuple[Replica, set[int]]:
    c.submit(LONG)
    c.run_until(at_s)
    c.set_replicas("decode", 1)
    [gone] = [x for x in c.replicas if x.state is ReplicaState.DRAINING]
    held = {req.rid for e in gone.ranks for req in [*e.running, *e.waiting]}
    assert held
    return gone, held


def test_default_grace_is_dynamos_sixty_seconds() -> None:
    assert DEFAULT_DRAIN_GRACE_S == 60.0
    assert cluster().drain_grace_s == 60.0


def test_after_the_grace_period_the_requests_left_are_cancelled() -> None:
    c = cluster(drain_grace_s=10.0)
    gone, held = drain_one_decode(c, 5.0)
    c.run_until(14.999)
    assert gone.state is ReplicaState.DRAINING
    c.run_to_completion()
    assert gone.state is ReplicaState.STOPPED and gone.stop_s == pytest.approx(15.0)
    failed = {r.request_id for r in c.records if not r.ok}
    assert failed == held
    assert all(
        r.error == DRAIN_CANCELLED and r.finish_s == pytest.approx(15.0)
        for r in c.records
        if not r.ok
    )
    assert c.summary()["cancelled_at_drain"] == len(held) == c.failed
    # every request is recorded once; the others were served in full
    assert sorted(r.request_id for r in c.records) == list(range(len(LONG)))
    assert all(r.osl == 6000 for r in c.records if r.ok)
    # the removed replica is metered until the grace period ends, not until its work would
    assert gone.gpu_seconds(c.now) == pytest.approx(15.0)


def test_without_a_grace_limit_every_in_flight_request_finishes() -> None:
    c = cluster(drain_grace_s=None)
    gone, _ = drain_one_decode(c, 5.0)
    c.run_to_completion()
    assert all(r.ok for r in c.records)
    assert gone.stop_s is not None and gone.stop_s > 15.0
    assert c.summary()["cancelled_at_drain"] == 0


def test_with_migration_the_requests_move_to_another_replica_and_finish() -> None:
    c = cluster(drain_grace_s=10.0, migrate_on_drain=True)
    gone, held = drain_one_decode(c, 5.0)
    tokens_before = {req.rid: req.generated for e in gone.ranks for req in [*e.running, *e.waiting]}
    c.run_to_completion()
    assert all(r.ok for r in c.records)
    assert c.summary()["migrated_at_drain"] == len(held)
    moved = [r for r in c.records if r.request_id in held]
    [other] = [x.worker_id for x in c.replicas if x.role == "decode" and x is not gone]
    assert {r.decode_worker for r in moved} == {other}
    # they lost their KV (recomputed where they landed) but not their output
    assert all(r.preemptions >= 1 and r.osl == 6000 for r in moved)
    assert any(n > 0 for n in tokens_before.values())
    assert gone.stop_s == pytest.approx(15.0)


def test_migration_waits_for_a_replica_when_none_is_ready() -> None:
    c = Cluster(
        engines={"prefill": SPEC, "decode": SPEC},
        replicas={"prefill": 1, "decode": 1},
        startup_delay_s=30.0,
        drain_grace_s=5.0,
        migrate_on_drain=True,
    )
    c.submit(LONG[:4])
    c.run_until(2.0)
    c.set_replicas("decode", 0)
    c.run_until(20.0)
    assert c.in_flight == 4 and c.failed == 0
    c.set_replicas("decode", 1)  # ready at 50 s
    c.run_to_completion()
    assert all(r.ok and r.finish_s > 50.0 for r in c.records)


def test_grace_period_is_validated() -> None:
    with pytest.raises(SimulatorInputError, match="drain_grace_s=-1"):
        cluster(drain_grace_s=-1.0)
