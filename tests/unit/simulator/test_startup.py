"""Start-up phases: medians per model from the public figures, the measured spread, seeded
draws, and how a cluster runs and meters a replica through them."""

from __future__ import annotations

import random

import pytest

from disagg_planner.simulator import startup
from disagg_planner.simulator.cluster import Cluster, ReplicaState
from disagg_planner.simulator.engine_spec import parse
from disagg_planner.simulator.errors import SimulatorInputError

SMALL = "sim:llama-3.1-8b-fp8@h200_sxm:tp1"
LARGE_TP8 = "sim:llama-3.3-70b-fp8@h200_sxm:tp8"


def medians(spec: str) -> dict[str, float]:
    return dict(startup.phase_model(parse(spec)).medians)


def test_phase_medians_follow_the_public_figures() -> None:
    small, large = medians(SMALL), medians(LARGE_TP8)
    assert list(small) == list(startup.STARTUP_PHASES)
    # vLLM: an 8B engine starts in 14.2 s (no compile) to 39.3 s (-O3)
    assert 14.2 <= small["engine_init"] <= 39.3
    # vLLM (#19824, June 2025: a release that still ran the P2P check): a 70B at TP8 takes
    # about 3.6 min to start (weights from page cache included)...
    measured = medians(LARGE_TP8 + ":version=0.9")
    assert measured["engine_init"] + 10.0 == pytest.approx(3.6 * 60, rel=0.1)
    # ...and its first request 30-60 s
    assert 30.0 <= large["first_request"] <= 60.0
    # llm-d: about 40% of a 90.65 s default cold start needs no GPU
    assert small["scheduling"] + small["image_pull"] == pytest.approx(0.4 * 90.65)
    # weights are read at the storage bandwidth: ten times the bytes, ten times the time
    assert large["weight_load"] / small["weight_load"] == pytest.approx(
        startup.model_bytes(parse(LARGE_TP8)) / startup.model_bytes(parse(SMALL))
    )
    # the whole default cold start of a small model is about llm-d's untuned 90.65 s
    assert sum(small.values()) == pytest.approx(90.65, rel=0.1)
    # a larger model takes longer in every phase that depends on it
    for phase in ("weight_load", "engine_init", "first_request"):
        assert large[phase] > small[phase]


def test_only_vllm_releases_that_run_it_pay_the_peer_to_peer_check() -> None:
    tp1 = medians("sim:llama-3.3-70b-fp8@h200_sxm:tp1:mem=0.95")
    old = medians("sim:llama-3.3-70b-fp8@h200_sxm:tp4:version=0.10.2")
    current = medians("sim:llama-3.3-70b-fp8@h200_sxm:tp4")  # vLLM 0.24.0: skipped
    first_skipping = medians("sim:llama-3.3-70b-fp8@h200_sxm:tp4:version=0.11")
    assert old["engine_init"] - tp1["engine_init"] == pytest.approx(startup.P2P_CHECK_S)
    assert current["engine_init"] == first_skipping["engine_init"] == tp1["engine_init"]
    # a single GPU has no peer to check, whatever the release
    assert medians("sim:llama-3.3-70b-fp8@h200_sxm:tp1:mem=0.95:version=0.6") == tp1
    # TensorRT-LLM has no such check
    trt = medians("sim:llama-3.3-70b-fp8@h200_sxm:tp4:backend=trtllm")
    assert trt["engine_init"] == tp1["engine_init"]


def test_spread_reproduces_the_production_load_quantiles() -> None:
    rng = random.Random(3)
    draws = sorted(startup.spread(rng.random()) for _ in range(40_000))

    def q(p: float) -> float:
        return draws[int(p * len(draws))]

    # Alibaba's 7,531 loads: p50 22.7 s, p90 42.0 s, p99 51.9 s
    assert q(0.5) * 22.7 == pytest.approx(22.7, rel=0.02)
    assert q(0.9) * 22.7 == pytest.approx(42.0, rel=0.02)
    assert q(0.99) * 22.7 == pytest.approx(51.9, rel=0.02)
    assert draws[0] >= 22.7 / 51.9 - 1e-9 and draws[-1] <= 51.9 / 22.7 + 1e-9


def test_draws_are_seeded_and_independent_of_other_randomness() -> None:
    specs = {"decode": parse(SMALL)}

    def plans(seed: int) -> list[startup.StartupPlan]:
        sampler = startup.StartupSampler({"decode": None}, specs, seed=seed)
        return [sampler.plan("decode") for _ in range(5)]

    assert plans(1) == plans(1)
    assert plans(1) != plans(2)
    totals = {p.total_s for p in plans(1)}
    assert len(totals) == 5  # every replica draws its own


def test_constant_delay_is_one_phase_holding_gpus_throughout() -> None:
    plan = startup.constant_plan(120.0)
    assert plan.phases == ((startup.CONSTANT_PHASE, 120.0),)
    assert plan.gpu_hold_offset_s == 0.0
    with pytest.raises(SimulatorInputError, match="startup delay -1"):
        startup.constant_plan(-1.0)


def test_planning_lead_is_the_constant_or_a_high_quantile_of_the_phases() -> None:
    specs = {"prefill": parse(SMALL), "decode": parse(LARGE_TP8)}
    assert startup.planning_lead_s(120.0, specs) == 120.0
    lead = startup.planning_lead_s(None, specs)
    large = startup.phase_model(specs["decode"])
    assert lead == large.quantile_total_s(startup.PLANNING_QUANTILE)  # the slower role
    assert large.median_plan().total_s < lead


def test_cluster_runs_a_new_replica_through_the_phases_and_meters_from_the_image_pull() -> None:
    c = Cluster(
        engines={"prefill": LARGE_TP8, "decode": LARGE_TP8},
        replicas={"prefill": 1, "decode": 1},
        startup_delay_s=None,
        seed=7,
    )
    c.run_until(10.0)
    c.set_replicas("decode", 2)
    [new] = [x for x in c.replicas if x.state is ReplicaState.STARTING]
    plan = new.startup_plan
    assert plan is not None
    assert [name for name, _ in plan.phases] == list(startup.STARTUP_PHASES)
    assert new.ready_s == pytest.approx(10.0 + plan.total_s)
    starts = dict(plan.phase_starts(new.start_s))
    # it is in each phase in turn, and holds no GPU while its pod is being scheduled
    for name in startup.STARTUP_PHASES:
        assert new.startup_phase(starts[name] + 1e-6) == name
    assert c.gpus_in_use() == 16
    c.run_until(starts["image_pull"] + 1.0)
    assert c.gpus_in_use() == 24
    assert new.gpu_seconds(c.now) == pytest.approx(8 * 1.0)
    c.run_until(new.ready_s - 1e-3)
    assert c.ready_replicas("decode") == 1
    c.run_until(new.ready_s)
    assert c.ready_replicas("decode") == 2 and new.startup_phase(c.now) is None
    c.run_until(new.ready_s + 100.0)
    held = c.now - starts["image_pull"]
    assert new.gpu_seconds(c.now) == pytest.approx(8 * held)
    assert c.gpu_seconds == pytest.approx(2 * 8 * c.now + 8 * held)


def test_a_cluster_draws_phased_start_ups_by_default_and_takes_a_constant_when_given() -> None:
    def ready_times(seed: int, startup_delay_s: float | None = None) -> list[float]:
        c = Cluster(
            engines={"prefill": SMALL, "decode": SMALL},
            seed=seed,
            startup_delay_s=startup_delay_s,
        )
        c.run_until(10.0)
        c.set_replicas("decode", 3)  # two replicas added later
        new = [x for x in c.replicas if x.state is ReplicaState.STARTING]
        assert len(new) == 2
        return [x.ready_s for x in new]

    first = ready_times(seed=4)
    # each replica draws its own start-up, seeded: the same seed gives the same times
    assert first[0] != first[1]
    assert ready_times(seed=4) == first
    assert ready_times(seed=5) != first
    # within the phase model's range: every phase between its p1 and p99 multiple
    median = startup.phase_model(parse(SMALL)).median_plan().total_s
    low, high = startup.spread(0.0), startup.spread(1.0)
    for ready in first:
        assert median * low - 1e-9 <= ready - 10.0 <= median * high + 1e-9
    # the constant the simulator used to default to, given explicitly
    assert ready_times(seed=4, startup_delay_s=120.0) == [130.0, 130.0]


def test_a_replica_cancelled_while_pending_costs_no_gpu_time() -> None:
    c = Cluster(engines={"prefill": SMALL, "decode": SMALL}, startup_delay_s=None, seed=1)
    c.set_replicas("prefill", 2)
    [new] = [x for x in c.replicas if x.state is ReplicaState.STARTING]
    assert new.startup_plan is not None
    c.run_until(new.startup_plan.gpu_hold_offset_s / 2)
    c.set_replicas("prefill", 1)
    c.run_until(300.0)
    assert new.state is ReplicaState.STOPPED
    assert new.gpu_seconds(c.now) == 0.0
    assert c.gpu_seconds == pytest.approx(2 * 300.0)
