"""What a resize's pause does to requests arriving during it (vLLM answers 503 while it
scales): rejected, or retried by the frontend after the pause; and a grow whose followers
start and join first, holding their GPUs."""

from __future__ import annotations

import pytest

from disagg_planner.predictors.traces import TraceRequest
from disagg_planner.profiles.elastic_resize import ElasticEpMode, ResizeTiming
from disagg_planner.simulator.cluster import Cluster
from disagg_planner.simulator.elastic_ep import PAUSE_REJECTED
from disagg_planner.simulator.errors import SimulatorInputError

MOE = "sim:deepseek-r1@gb200:tp1:dp8"
# a 10 s pause at the end of a 12 s grow: long enough to see arrivals in it
SLOW = ElasticEpMode(
    "slow",
    up=ResizeTiming(total_s=12.0, downtime_s=10.0),
    down=ResizeTiming(total_s=12.0, downtime_s=10.0),
    description="test timing",
)


def _run(retry_paused: bool) -> tuple[Cluster, list[TraceRequest]]:
    c = Cluster(mode="agg", engines={"agg": MOE}, replicas={"agg": 1}, retry_paused=retry_paused)
    # one arrival every 0.5 s from 1 s to 40 s
    reqs = [TraceRequest(1.0 + 0.5 * i, 800, 20) for i in range(79)]
    c.submit(reqs)
    c.run_until(5.0)
    [plan] = c.resize_dp("agg", 12, SLOW)
    assert (plan.downtime_start_s, plan.end_s) == pytest.approx((7.0, 17.0))
    c.run_to_completion(limit_s=600.0)
    return c, reqs


def _in_pause(c: Cluster) -> list:
    frontend = c.frontend_latency_s
    # dispatched (arrival + the frontend's latency) while no engine served
    return [r for r in c.records if 7.0 <= r.arrival_s + frontend < 17.0]


def test_requests_arriving_in_a_pause_are_rejected_without_retries():
    c, reqs = _run(retry_paused=False)
    hit = _in_pause(c)
    assert len(hit) == 20
    assert all(not r.ok and r.error == PAUSE_REJECTED for r in hit)
    assert c.rejected_in_pause == len(hit) == c.failed
    # the others were served, before and after the pause
    assert sum(r.ok for r in c.records) == len(reqs) - len(hit)


def test_requests_arriving_in_a_pause_are_retried_after_it_with_the_wait_in_ttft():
    c, reqs = _run(retry_paused=True)
    hit = _in_pause(c)
    assert len(hit) == 20 and c.rejected_in_pause == 0 and c.failed == 0
    for r in hit:
        assert r.ok and r.first_token_s >= 17.0
        assert r.ttft_ms >= (17.0 - r.arrival_s) * 1000.0
    assert len(c.records) == len(reqs)


def test_a_grow_waits_for_its_followers_and_meters_their_gpus_meanwhile():
    c = Cluster(mode="agg", engines={"agg": MOE}, replicas={"agg": 1})
    c.run_until(10.0)
    [plan] = c.resize_dp("agg", 12, "nixl_ep", followers_ready_s=60.0)
    assert plan.requested_s == 10.0 and plan.followers_ready_s == pytest.approx(60.0)
    assert plan.start_s == pytest.approx(70.0)
    assert plan.end_s == pytest.approx(70.0 + 92.34)
    c.run_until(100.0)
    assert len(c.engines("agg")) == 8 and c.gpus_in_use() == 12  # followers hold GPUs
    c.run_until(plan.end_s + 1.0)
    assert len(c.engines("agg")) == 12
    assert c.gpu_seconds == pytest.approx(8 * 10.0 + 12 * (c.now - 10.0))
    # a shrink has no followers to wait for
    [down] = c.resize_dp("agg", 8, "nixl_ep", followers_ready_s=60.0)
    assert down.start_s == c.now and down.followers_ready_s == 0.0
    with pytest.raises(SimulatorInputError, match="followers_ready_s=-1"):
        Cluster(mode="agg", engines={"agg": MOE}).resize_dp("agg", 12, followers_ready_s=-1)
