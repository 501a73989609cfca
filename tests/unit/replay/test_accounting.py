"""One accounting rule for every policy: GPU time from t = 0 until the policy's own last
request has finished or failed, every existing replica (starting, ready, draining) charged."""

from __future__ import annotations

import pytest

from disagg_planner.config import PlannerConfig
from disagg_planner.replay import runner
from disagg_planner.replay.policies import PolicyStep
from disagg_planner.replay.runner import ClusterSetup, run_policy
from disagg_planner.replay.session import WorkloadSpec, load_requests, prepare
from disagg_planner.simulator import engine_spec
from disagg_planner.simulator.cluster import Cluster
from tests.unit.replay.test_timeline import run_named

PROFILE = "h200_sxm/vllm/llama-3.1-8b-fp8/tp1"
ENGINE = "sim:llama-3.1-8b-fp8@h200_sxm:tp1"
# 60 s of traffic one prefill replica cannot keep up with: its backlog outlasts the old
# "last arrival + 120 s" horizon
HEAVY = "poisson:rate=60,isl=4000,osl=50,duration=60"


def _setup(prefill: int, decode: int, *, delay: float = 30.0) -> ClusterSetup:
    spec = engine_spec.parse(ENGINE)
    return ClusterSetup(
        mode="disagg",
        specs={"prefill": spec, "decode": spec},
        initial_replicas={"prefill": prefill, "decode": decode},
        startup_delay_s=delay,
        seed=0,
    )


class Scripted:
    """A policy that sets the replicas at given times (a stand-in for any policy)."""

    def __init__(self, plan: list[tuple[float, dict[str, int]]]) -> None:
        self.name = "scripted"
        self.plan = list(plan)

    def next_wakeup_s(self) -> float:
        return self.plan[0][0] if self.plan else float("inf")

    def wake(self, cluster: Cluster) -> PolicyStep:
        _, target = self.plan.pop(0)
        return PolicyStep(cluster.now, target, "scripted")


def _run(policy, setup: ClusterSetup, workload: str = HEAVY):
    requests = load_requests(WorkloadSpec(workload=workload, seed=1))
    return run_policy(policy, setup=setup, requests=requests, ttft_slo_ms=500, itl_slo_ms=30)


def test_a_backlog_is_paid_for_until_it_clears() -> None:
    result = _run(Scripted([]), _setup(1, 1))
    s = result.summary
    last_finish = max(r.finish_s for r in result.records)
    assert s.failed == 0 and s.unfinished == 0
    # the backlog clears long after the old horizon, and every second of it is metered
    assert last_finish > s.last_arrival_s + 120.0
    assert s.metered_span_s == pytest.approx(last_finish)
    assert s.duration_s == s.metered_span_s
    assert s.gpu_hours == pytest.approx(2 * last_finish / 3600.0, rel=1e-9)
    assert s.replica_hours == pytest.approx(
        {"prefill": last_finish / 3600.0, "decode": last_finish / 3600.0}
    )


@pytest.mark.slow
def test_a_policy_that_keeps_up_is_metered_to_its_own_last_finish() -> None:
    slow = _run(Scripted([]), _setup(1, 1)).summary
    fast = _run(Scripted([]), _setup(6, 1)).summary
    assert fast.metered_span_s < slow.metered_span_s
    assert fast.metered_span_s < fast.last_arrival_s + 60.0
    assert fast.gpu_hours == pytest.approx(7 * fast.metered_span_s / 3600.0, rel=1e-9)


def test_replicas_starting_and_draining_are_charged() -> None:
    # at 10 s ask for 3 prefill replicas (two start for 30 s), at 50 s drop back to 1 (two
    # drain); each second of each existing replica counts
    policy = Scripted([(10.0, {"prefill": 3, "decode": 1}), (50.0, {"prefill": 1, "decode": 1})])
    result = _run(policy, _setup(1, 1), workload="poisson:rate=2,isl=500,osl=20,duration=100")
    s = result.summary
    span = s.metered_span_s
    extra = s.replica_hours["prefill"] * 3600.0 - span
    # two replicas from 10 s until at least 50 s (they drain, they are not cut off)
    assert extra >= 2 * 40.0 - 1e-6
    assert s.gpu_hours == pytest.approx((2 * span + extra) / 3600.0, rel=1e-9)


def test_requests_never_served_count_as_failed(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(runner, "MAX_DRAIN_S", 200.0)
    # no prefill replica ever: nothing is served, the replay gives up MAX_DRAIN_S after the
    # last arrival and charges the decode replica until then
    result = _run(Scripted([]), _setup(0, 1), workload="poisson:rate=2,isl=500,osl=20,duration=30")
    s = result.summary
    assert s.completed == 0
    assert s.failed == s.requests == s.unfinished > 0
    assert s.slo_attainment.both == 0.0
    assert s.metered_span_s == pytest.approx(s.last_arrival_s + 200.0)
    assert s.gpu_hours == pytest.approx(s.metered_span_s / 3600.0, rel=1e-9)


@pytest.fixture(scope="module")
def plan():
    cfg = PlannerConfig(
        profile=PROFILE,
        max_gpu_budget=-1,
        ttft_ms=500,
        itl_ms=30,
        throughput_adjustment_interval_seconds=60,
        load_predictor="constant",
    )
    workload = WorkloadSpec(workload="step:rates=5/20,at=60,duration=180,isl=1500,osl=100", seed=2)
    return prepare(cfg, workload, startup_delay_s=30)


@pytest.mark.slow
@pytest.mark.parametrize("name", ["static:2,2", "hpa", "planner", "oracle"])
def test_every_policy_and_the_oracle_is_metered_by_the_same_rule(plan, name: str) -> None:
    result = run_named(plan, name)
    s = result.summary
    last_finish = max(r.finish_s for r in result.records)
    assert s.metered_span_s == pytest.approx(last_finish)
    assert s.gpu_hours == pytest.approx(sum(s.gpu_hours_by_role.values()), rel=1e-12)
    # GPUs per replica are 1 here: the GPU-hours are the replica-hours of every role
    assert s.gpu_hours == pytest.approx(sum(s.replica_hours.values()), rel=1e-9)
