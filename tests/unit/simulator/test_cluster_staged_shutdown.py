"""Dynamo's staged worker shutdown in the simulator (issue 35): a removed replica goes
through router grace, its requests, its KV transfers and cleanup inside one total budget,
and its ``/metrics`` page reports the stages only after SIGTERM. The connector's own rules
(``read_shutdown`` and ``drain_end``, polled as the drain polls) read that page: the follow
ends on KV quiescence, on the worker's budget, or, for a worker without the staged shutdown
(no gauges), the page is no signal and the older drain applies."""

from __future__ import annotations

import pytest

from disagg_planner.connectors.kubernetes.drain import DrainEnd, drain_end
from disagg_planner.predictors.traces import TraceRequest
from disagg_planner.signals.shutdown import (
    NO_SHUTDOWN_METRICS,
    NOT_SHUTTING_DOWN,
    ShutdownReading,
    read_shutdown,
)
from disagg_planner.simulator.cluster import DRAIN_CANCELLED, Cluster, Replica, ReplicaState
from disagg_planner.simulator.shutdown import ENDED_BUDGET, ENDED_QUIESCENT, ShutdownSettings

SPEC = "sim:llama-3.1-8b-fp8@h200_sxm:tp1"
POLL_S = 0.5


def cluster(shutdown: ShutdownSettings | None, **kw) -> Cluster:
    return Cluster(
        engines={"prefill": SPEC, "decode": SPEC},
        replicas={"prefill": 2, "decode": 2},
        startup_delay_s=0.0,
        router="round_robin",
        worker_shutdown=shutdown,
        **kw,
    )


def remove_one(c: Cluster, role: str) -> Replica:
    c.set_replicas(role, 1)
    [gone] = [x for x in c.replicas if x.role == role and x.state is ReplicaState.DRAINING]
    return gone


def follow(c: Cluster, gone: Replica, *, budget_s: float) -> tuple[DrainEnd, float]:
    """Poll the removed worker's page as the connector's follow does (after lowering):
    which signal ends it, and when."""
    start = c.now
    while True:
        answer = read_shutdown(c.shutdown_page(gone.worker_id))
        readings = {gone.worker_id: answer} if isinstance(answer, ShutdownReading) else {}
        end = drain_end(
            [gone.worker_id],
            {},
            waited_s=c.now - start,
            timeout_s=300.0,
            shutdown=readings,
            budget_ends_s={gone.worker_id: budget_s},
            gone={gone.worker_id} if gone.state is ReplicaState.STOPPED else set(),
            lowered=True,
        )
        if end is not None:
            return end, c.now
        c.run_until(c.now + POLL_S)


def test_a_prefill_worker_is_followed_until_its_kv_transfers_are_quiescent() -> None:
    """KV transfers at 50 MB/s take seconds: the prefill worker finishes its requests, then
    waits for its decode peers to read its KV; the follow ends on its KV quiescence, before
    its cleanup ends (its GPUs held until it exits)."""
    c = cluster(ShutdownSettings(), kv_transfer_bandwidth_bps=5e7)
    c.submit([TraceRequest(0.01 * i, 8000, 50) for i in range(40)])
    c.run_until(0.8)
    before = read_shutdown(c.shutdown_page("prefill-0"))
    assert before == NOT_SHUTTING_DOWN  # the gauges, no stage: a worker that has them
    gone = remove_one(c, "prefill")
    end, at = follow(c, gone, budget_s=30.0)
    assert end is DrainEnd.KV_QUIESCENT
    trace = gone.shutdown
    assert trace is not None and trace.ended_by == ENDED_QUIESCENT
    assert ("kv_transfer", "completed") in trace.stages and trace.stages[
        ("kv_transfer", "completed")
    ] > 0  # it did wait for its KV to be read
    assert gone.state is ReplicaState.DRAINING  # cleanup: its GPUs still held
    c.run_until(trace.sigterm_s + 31.0)
    assert gone.stop_s is not None and at <= gone.stop_s <= trace.sigterm_s + 30.0
    assert all(r.ok for r in c.records)


def test_a_worker_still_busy_at_its_budget_cancels_the_rest_and_exits() -> None:
    """Decode requests of 6,000 tokens outlast a 12 s total budget: at the drain deadline
    (12 s less the 5 s cleanup reserve) the rest is cancelled, the page reports the timed-out
    stage, and the worker exits within its budget, long before the pod's 60 s grace."""
    c = cluster(ShutdownSettings(total_s=12.0))
    c.submit([TraceRequest(0.05 * i, 1000, 6000) for i in range(20)])
    c.run_until(3.0)
    gone = remove_one(c, "decode")
    sigterm = c.now
    end, at = follow(c, gone, budget_s=12.0)
    trace = gone.shutdown
    assert trace is not None and trace.ended_by == ENDED_BUDGET
    assert end is DrainEnd.SHUTDOWN_STAGE  # kv_transfer timed_out: past serving
    assert at == pytest.approx(sigterm + 7.0, abs=POLL_S)
    assert ("inflight", "timed_out") in trace.stages
    c.run_until(sigterm + 12.0)
    assert gone.stop_s == pytest.approx(sigterm + 7.0 + trace.settings.teardown_s)
    cancelled = [r for r in c.records if not r.ok]
    assert cancelled and all(r.error == DRAIN_CANCELLED for r in cancelled)


def test_without_the_staged_shutdown_the_page_is_no_signal_and_the_old_drain_applies() -> None:
    c = cluster(None)
    c.submit([TraceRequest(0.05 * i, 1000, 200) for i in range(20)])
    c.run_until(1.0)
    assert read_shutdown(c.shutdown_page("decode-0")) == NO_SHUTDOWN_METRICS
    gone = remove_one(c, "decode")
    assert read_shutdown(c.shutdown_page(gone.worker_id)) == NO_SHUTDOWN_METRICS
    c.run_to_completion()
    assert gone.shutdown is None and gone.state is ReplicaState.STOPPED
    assert all(r.ok for r in c.records)  # it drained until empty, within the 60 s grace


def test_bad_shutdown_settings_are_refused() -> None:
    from disagg_planner.simulator.errors import SimulatorInputError

    with pytest.raises(SimulatorInputError, match="total_s=0"):
        ShutdownSettings(total_s=0.0)
