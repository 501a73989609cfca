"""Cluster invariants: every request served exactly once, tokens conserved, KV within capacity,
startup delay, drain, GPU-seconds, elastic-EP downtime, routing, admission and time rules."""

from __future__ import annotations

import math

import pytest

from disagg_planner.predictors.traces import TraceRequest
from disagg_planner.simulator import elastic_ep
from disagg_planner.simulator.cluster import Cluster, ReplicaState
from disagg_planner.simulator.errors import SimulatorInputError, WorkloadError
from disagg_planner.simulator.request import RequestRecord
from disagg_planner.simulator.workloads import parse_workload

SPEC = "sim:llama-3.1-8b-fp8@h200_sxm:tp1"
# A small KV cache (about 18k tokens) and 64 sequences: preemption under load.
TIGHT = "sim:llama-3.1-8b-fp8@h100_sxm:tp1:mem=0.14:seqs=64"
MOE = "sim:deepseek-r1@gb200:tp1:dp8"


def disagg(spec: str = SPEC, *, p: int = 2, d: int = 2, **kw) -> Cluster:
    return Cluster(
        engines={"prefill": spec, "decode": spec}, replicas={"prefill": p, "decode": d}, **kw
    )


def workload(
    rate: float,
    duration: float,
    *,
    isl: str = "lognormal:900:0.6",
    osl: str = "lognormal:150:0.8",
    seed: int = 1,
):
    return list(
        parse_workload(f"poisson:rate={rate},isl={isl},osl={osl},duration={duration}", seed=seed)
    )


def first_token_s(record: RequestRecord) -> float:
    """The time of the first token of a request that got one."""
    assert record.first_token_s is not None, record
    return record.first_token_s


def run_stepped(cluster: Cluster, step: float = 1.0) -> None:
    t = cluster.now
    while not cluster.idle:
        t += step
        cluster.run_until(t)


def test_every_request_served_exactly_once_and_tokens_conserved():
    reqs = workload(20, 40)
    c = disagg()
    c.submit(reqs)
    run_stepped(c, 2.5)
    ids = [r.request_id for r in c.records]
    assert sorted(ids) == list(range(len(reqs)))  # none lost, none twice
    assert all(r.ok for r in c.records)
    by_id = {r.request_id: r for r in c.records}
    for i, src in enumerate(reqs):
        rec = by_id[i]
        assert (rec.isl, rec.osl) == (src.input_length, max(1, src.output_length))
        assert rec.arrival_s == pytest.approx(src.arrival_s)
        assert rec.first_token_s is not None
        assert rec.arrival_s < rec.first_token_s <= rec.finish_s
    decode = c.engines("decode")
    prefill = c.engines("prefill")
    # Tokens: every prompt token prefilled once; every output token generated once (the
    # decode engine also recomputes the last prompt token of each request it receives).
    assert sum(e.prefill_tokens_computed for e in prefill) == sum(r.isl for r in c.records)
    assert sum(e.tokens_generated for e in decode) == sum(r.osl for r in c.records)
    assert sum(e.requests_received for e in decode) == len(reqs)
    snap = c.frontend.snapshot()
    itl = snap.histogram("dynamo_frontend_inter_token_latency_seconds")
    assert itl is not None and itl.count == sum(r.osl - 1 for r in c.records)
    # Sum of per-token gaps equals the sum of (finish - first token) over requests.
    assert itl.sum == pytest.approx(sum(r.finish_s - first_token_s(r) for r in c.records), rel=1e-9)
    assert snap.counter("dynamo_frontend_requests_total") == len(reqs)
    assert c.in_flight == 0
    assert all(e.used_blocks == 0 for e in c.engines())


@pytest.mark.parametrize("mode", ["disagg", "agg"])
def test_kv_never_above_capacity_and_preemption_conserves_tokens(mode):
    checks: list[int] = []

    def check(_fpm):
        for e in cluster.engines():
            held = sum(r.blocks for r in e.running)
            checks.append(e.used_blocks)
            assert 0 <= e.used_blocks <= e.total_blocks
            assert held == e.used_blocks
            assert len(e.running) <= e.max_seqs

    engines = {"prefill": TIGHT, "decode": TIGHT} if mode == "disagg" else {"agg": TIGHT}
    cluster = Cluster(mode=mode, engines=engines, replicas=dict.fromkeys(engines, 1), on_fpm=check)
    reqs = workload(10, 25, isl="lognormal:800:0.6", osl="lognormal:300:0.5", seed=2)
    cluster.submit(reqs)
    run_stepped(cluster, 0.7)
    assert len(checks) > 1000
    assert max(checks) > 0.9 * cluster.engines()[-1].total_blocks  # the cache did fill up
    assert sum(r.preemptions for r in cluster.records) > 0
    assert sorted(r.request_id for r in cluster.records) == list(range(len(reqs)))
    assert all(r.ok for r in cluster.records)
    itl = cluster.frontend.snapshot().histogram("dynamo_frontend_inter_token_latency_seconds")
    assert itl is not None and itl.count == sum(r.osl - 1 for r in cluster.records)
    generated = sum(e.tokens_generated for e in cluster.engines(cluster.roles[-1]))
    assert generated == sum(r.osl for r in cluster.records)


@pytest.mark.parametrize("spec", [SPEC, TIGHT])
def test_bulk_decode_equals_stepping_every_iteration(spec):
    reqs = workload(10, 20, osl="lognormal:250:0.5", seed=3)
    out = []
    for bulk in (True, False):
        c = disagg(spec, p=1, d=1, bulk_decode=bulk)
        c.submit(reqs)
        run_stepped(c, 0.9)
        out.append((sorted(c.records, key=lambda r: r.request_id), c))
    (a, ca), (b, cb) = out
    for x, y in zip(a, b, strict=True):
        assert x.first_token_s == pytest.approx(y.first_token_s, abs=1e-9)
        assert x.finish_s == pytest.approx(y.finish_s, abs=1e-9)
        assert x.preemptions == y.preemptions
    ha = ca.frontend.snapshot().histogram("dynamo_frontend_inter_token_latency_seconds")
    hb = cb.frontend.snapshot().histogram("dynamo_frontend_inter_token_latency_seconds")
    assert ha is not None and hb is not None
    assert ha.buckets == hb.buckets
    assert [e.counter_id for e in ca.engines()] == [e.counter_id for e in cb.engines()]


def test_startup_delay_and_gpu_seconds_accounting():
    c = disagg("sim:llama-3.3-70b-fp8@h200_sxm:tp4", p=2, d=1, startup_delay_s=60.0)
    assert c.gpus_per_replica("prefill") == 4
    c.run_until(100.0)
    assert c.gpu_seconds == pytest.approx(3 * 4 * 100.0)
    c.set_replicas("prefill", 3)
    assert (c.desired_replicas("prefill"), c.ready_replicas("prefill")) == (3, 2)
    assert c.replica_counts("prefill") == {"starting": 1, "ready": 2, "draining": 0}
    c.run_until(159.999)
    assert c.ready_replicas("prefill") == 2  # not before the delay
    c.run_until(160.0)
    assert c.ready_replicas("prefill") == 3
    c.run_until(200.0)
    # A starting replica is metered from the start of its startup.
    assert c.gpu_seconds == pytest.approx(4 * (100 * 3 + 100 * 4))
    c.set_replicas("prefill", 4)
    c.run_until(210.0)
    c.set_replicas("prefill", 1)  # cancel the starting one, drain two idle ready ones
    assert c.replica_counts("prefill") == {"starting": 0, "ready": 1, "draining": 0}
    c.run_until(300.0)
    expected = 4 * (300 * 2 + 210 + 110 + 10)  # decode+1 prefill all along; others stop at 210
    assert c.gpu_seconds == pytest.approx(expected)
    by_role = c.gpu_seconds_by_role()
    assert by_role["decode"] == pytest.approx(4 * 300)
    assert sum(by_role.values()) == pytest.approx(c.gpu_seconds)


def test_new_replica_gets_requests_only_once_ready():
    c = disagg(p=1, d=1, startup_delay_s=30.0)
    reqs = workload(15, 80, seed=4)
    c.submit(reqs)
    c.run_until(10.0)
    c.set_replicas("decode", 2)
    c.run_until(39.9)
    late = next(e for e in c.engines("decode") if e.worker_id == "decode-1")
    assert late.requests_received == 0
    run_stepped(c, 5.0)
    assert late.requests_received > 0
    served_late = [r for r in c.records if r.decode_worker == "decode-1"]
    assert served_late and min(first_token_s(r) for r in served_late) >= 40.0


def test_drain_finishes_in_flight_requests_and_takes_no_new_ones():
    c = disagg(p=1, d=2, startup_delay_s=0.0)
    reqs = workload(12, 60, osl="lognormal:400:0.3", seed=5)
    c.submit(reqs)
    c.run_until(30.0)
    c.set_replicas("decode", 1)
    draining = [x for x in c.replicas if x.state is ReplicaState.DRAINING]
    assert len(draining) == 1
    gone = draining[0]
    held = sum(e.num_requests for e in gone.ranks)
    received = sum(e.requests_received for e in gone.ranks)
    assert held > 0
    run_stepped(c, 2.0)
    assert sum(e.requests_received for e in gone.ranks) == received  # nothing new routed
    assert gone.state is ReplicaState.STOPPED and gone.stop_s is not None
    assert 30.0 < gone.stop_s < 60.0
    served = [r for r in c.records if r.decode_worker == gone.worker_id]
    assert len(served) == received and all(r.ok for r in served)
    assert max(r.finish_s for r in served) == pytest.approx(gone.stop_s)
    assert gone.gpu_seconds(c.now) == pytest.approx(gone.stop_s)  # 1 GPU from 0 to stop
    assert sorted(r.request_id for r in c.records) == list(range(len(reqs)))


def test_elastic_ep_blocking_downtime_and_gpu_meter():
    c = Cluster(mode="agg", engines={"agg": MOE}, replicas={"agg": 1})
    c.submit(workload(8, 200, isl="lognormal:1500:0.3", osl="lognormal:200:0.3", seed=6))
    c.run_until(20.0)
    [plan] = c.resize_dp("agg", 12, "blocking")
    assert (plan.from_dp, plan.to_dp) == (8, 12)
    assert plan.downtime_start_s == pytest.approx(20.0 + 0.10, abs=1e-6)
    assert plan.end_s == pytest.approx(20.0 + 99.72)
    assert plan.downtime_s == pytest.approx(99.62)
    c.run_until(plan.downtime_start_s + 5.0)  # the iteration in progress has finished
    before = c.frontend.snapshot()
    c.run_until(plan.end_s - 0.01)
    during = c.frontend.snapshot()
    tokens = "dynamo_frontend_inter_token_latency_seconds"
    during_itl, before_itl = during.histogram(tokens), before.histogram(tokens)
    assert during_itl is not None and before_itl is not None
    assert during_itl.count == before_itl.count  # no progress
    assert during.counter("dynamo_frontend_requests_total") == before.counter(
        "dynamo_frontend_requests_total"
    )
    assert during.counter("dynamo_frontend_requests_started_total") > before.counter(
        "dynamo_frontend_requests_started_total"
    )  # arrivals keep coming and wait
    c.run_until(plan.end_s + 5.0)
    after_itl = c.frontend.snapshot().histogram(tokens)
    assert after_itl is not None
    assert after_itl.count > during_itl.count
    assert len(c.engines("agg")) == 12 and c.gpus_in_use() == 12
    t = c.now
    assert c.gpu_seconds == pytest.approx(8 * 20.0 + 12 * (t - 20.0))  # added GPUs from 20 s
    assert c.gpus_per_replica("agg") == 12


def _shrink_under_load(drains_first: bool) -> tuple[Cluster, int, int]:
    c = Cluster(mode="agg", engines={"agg": MOE}, replicas={"agg": 1})
    c.shrink_drains_first = drains_first
    reqs = workload(10, 60, isl="lognormal:1500:0.3", osl="lognormal:400:0.3", seed=7)
    c.submit(reqs)
    c.run_until(30.0)
    [plan] = c.resize_dp("agg", 6, "nixl_ep")
    assert plan.downtime_s == pytest.approx(1.96) and plan.end_s == pytest.approx(39.32)
    c.run_until(39.0)
    held = sum(len(e.running) for e in c.engines("agg")[6:])
    assert c.gpus_in_use() == 8  # removed GPUs are released at the end
    c.run_until(40.0)
    assert len(c.engines("agg")) == 6 and c.gpus_in_use() == 6
    assert held > 0
    run_stepped(c, 5.0)
    assert sorted(r.request_id for r in c.records) == list(range(len(reqs)))
    assert c.gpu_seconds == pytest.approx(8 * 39.32 + 6 * (c.now - 39.32))
    return c, held, len(reqs)


def test_elastic_ep_scale_down_aborts_the_requests_of_removed_ranks():
    """Issue 32, item 2: vLLM pauses the removed ranks with mode="abort"."""
    c, held, _ = _shrink_under_load(drains_first=False)
    aborted = [r for r in c.records if r.error == elastic_ep.SHRINK_ABORTED]
    assert len(aborted) == held == c.aborted_at_shrink
    assert all(r.ok for r in c.records if r.error != elastic_ep.SHRINK_ABORTED)


def test_elastic_ep_scale_down_of_an_engine_that_drains_first_loses_nothing():
    c, held, _ = _shrink_under_load(drains_first=True)
    assert all(r.ok for r in c.records) and c.aborted_at_shrink == 0
    assert sum(r.preemptions for r in c.records) >= held  # finished on the other ranks


def test_elastic_ep_resize_input_errors():
    with pytest.raises(SimulatorInputError, match="dense"):
        disagg().resize_dp("decode", 2)
    with pytest.raises(SimulatorInputError, match="no room for a KV cache"):
        Cluster(mode="agg", engines={"agg": MOE}, replicas={"agg": 1}).resize_dp("agg", 2)


def test_round_robin_and_least_loaded_routing():
    rr = disagg(p=3, d=1)
    rr.submit(workload(5, 10, seed=8))
    run_stepped(rr, 5.0)
    order = [r.prefill_worker for r in sorted(rr.records, key=lambda r: r.request_id)]
    assert order[:6] == ["prefill-0", "prefill-1", "prefill-2"] * 2
    ll = disagg(p=1, d=3, router="least_loaded")
    ll.submit(workload(20, 30, osl="lognormal:300:0.3", seed=9))
    run_stepped(ll, 5.0)
    counts = [e.requests_received for e in ll.engines("decode")]
    assert min(counts) > 0.25 * sum(counts)


def test_frontend_queues_without_replicas_and_times_out():
    c = disagg(p=0, d=1, startup_delay_s=30.0, request_timeout_s=20.0)
    c.submit([TraceRequest(1.0, 500, 10), TraceRequest(15.0, 500, 10)])
    c.run_until(5.0)
    c.set_replicas("prefill", 1)  # ready at 35: the first request times out at 21
    run_stepped(c, 5.0)
    first, second = sorted(c.records, key=lambda r: r.request_id)
    assert not first.ok and first.finish_s == pytest.approx(21.0)
    assert first.error is not None and "within 20.0 s" in first.error
    assert second.ok and second.first_token_s is not None and second.first_token_s > 35.0


def test_requests_that_cannot_fit_are_rejected():
    c = disagg(TIGHT, p=1, d=1)
    c.submit([TraceRequest(0.0, 100_000, 10), TraceRequest(0.5, 100, 5)])
    run_stepped(c)
    bad, good = sorted(c.records, key=lambda r: r.request_id)
    assert not bad.ok and bad.error is not None and "max_model_len" in bad.error
    assert bad.ttft_ms is None
    assert good.ok


def test_time_and_input_rules():
    c = disagg()
    c.run_until(10.0)
    with pytest.raises(SimulatorInputError, match=r"time is already 10\.0"):
        c.run_until(5.0)
    c.submit([TraceRequest(3.0, 10, 10)])
    with pytest.raises(WorkloadError, match="before the simulation time"):
        c.run_until(20.0)
    d = disagg()
    d.submit([TraceRequest(5.0, 10, 10), TraceRequest(4.0, 10, 10)])
    with pytest.raises(WorkloadError, match="earlier than the previous request"):
        d.run_until(math.inf)
    with pytest.raises(SimulatorInputError, match="needs exactly the roles"):
        Cluster(engines={"agg": SPEC}, mode="disagg")
    with pytest.raises(SimulatorInputError, match="role 'agg'"):
        disagg().set_replicas("agg", 1)


def test_run_to_completion_stops_at_the_last_finish():
    c = disagg()
    c.submit([TraceRequest(1.0, 500, 20), TraceRequest(2.0, 800, 30)])
    c.run_to_completion(limit_s=10_000.0)
    assert c.idle and len(c.records) == 2
    assert c.now == max(r.finish_s for r in c.records) < 5.0
    gpu_s = c.gpu_seconds
    assert gpu_s == pytest.approx(4 * c.now)
    c.run_to_completion(limit_s=20_000.0)  # nothing left: the clock does not move
    assert c.gpu_seconds == gpu_s
    c.run_until(100.0)
    assert c.now == 100.0 and c.gpu_seconds == pytest.approx(400.0)
