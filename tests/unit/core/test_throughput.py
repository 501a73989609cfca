"""The throughput loop: Dynamo's formulas, correction factors, guards and holds.

Each row names the behaviour a user relies on; rows guarding a known Dynamo bug cite it.
"""

from __future__ import annotations

import math
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from disagg_planner.config import PlannerConfig
from disagg_planner.core.budget import gpus_of
from disagg_planner.core.sizing import (
    FASTEST_DECODE_CORRECTION,
    CorrectionFactors,
    LoadForecast,
    RoleSizing,
    size_decode,
    size_prefill,
)
from disagg_planner.core.throughput import ThroughputPlanner
from disagg_planner.core.types import (
    DeploymentStatus,
    MissingObservation,
    RoleStatus,
    ThroughputReason,
    TrafficObservation,
)
from disagg_planner.predictors import make_predictors
from disagg_planner.profiles import Profile


def planner(profile: Profile, **cfg) -> ThroughputPlanner:
    cfg.setdefault("throughput_adjustment_interval_seconds", 60)
    cfg.setdefault("max_gpu_budget", -1)
    cfg.setdefault("itl_ms", 30)
    return ThroughputPlanner(
        config=PlannerConfig(**cfg),
        profile=profile,
        predictor_factory=lambda series: make_predictors("constant", series),
    )


def status(
    p: int,
    d: int,
    *,
    ready_p: int | None = None,
    ready_d: int | None = None,
    pg: int = 1,
    dg: int = 1,
) -> DeploymentStatus:
    return DeploymentStatus(
        {
            "prefill": RoleStatus(p, p if ready_p is None else ready_p, pg),
            "decode": RoleStatus(d, d if ready_d is None else ready_d, dg),
        }
    )


def traffic(end_s: float, num_req: float, isl: float = 3000, osl: float = 300, **kw):
    if num_req == 0:
        return TrafficObservation(end_s=end_s, duration_s=60, num_req=0)
    kw.setdefault("request_duration_s", None)
    return TrafficObservation(end_s=end_s, duration_s=60, num_req=num_req, isl=isl, osl=osl, **kw)


def test_dynamo_worked_example_one_prefill_replica(h200_like_profile: Profile) -> None:
    # 10 requests in 60 s at ISL 3000, 40,000 tokens/s/GPU -> ceil(500/40000) = 1
    sizing = size_prefill(
        LoadForecast(num_req=10, isl=3000, osl=150),
        h200_like_profile.prefill,
        interval_s=60,
        correction=1.0,
        gpus_per_replica=1,
    )
    assert sizing.replicas == 1
    assert sizing.thpt_per_gpu == pytest.approx(40000, rel=0.01)


def test_prefill_formula_scales_with_demand_and_engine_size(h200_like_profile: Profile) -> None:
    forecast = LoadForecast(num_req=4800, isl=3000, osl=150)  # 240,000 tok/s
    one_gpu = size_prefill(
        forecast, h200_like_profile.prefill, interval_s=60, correction=1.0, gpus_per_replica=1
    )
    two_gpu = size_prefill(
        forecast, h200_like_profile.prefill, interval_s=60, correction=1.0, gpus_per_replica=2
    )
    assert one_gpu.replicas == math.ceil(240000 / one_gpu.thpt_per_gpu)
    assert two_gpu.replicas == math.ceil(240000 / one_gpu.thpt_per_gpu / 2)


def test_prefill_capacity_correction_works_both_ways(h200_like_profile: Profile) -> None:
    """Issue 29: the learned correction raises the demand where the engines are slower than
    profiled (Dynamo's ``min(1, p_corr)`` could only lower it) and lowers it where faster."""
    forecast = LoadForecast(num_req=4800, isl=3000, osl=150)
    base = size_prefill(
        forecast, h200_like_profile.prefill, interval_s=60, correction=1.0, gpus_per_replica=1
    )
    slow = size_prefill(
        forecast, h200_like_profile.prefill, interval_s=60, correction=3.0, gpus_per_replica=1
    )
    fast = size_prefill(
        forecast, h200_like_profile.prefill, interval_s=60, correction=0.5, gpus_per_replica=1
    )
    assert (slow.replicas, fast.replicas) == (
        math.ceil(base.demand_tokens_per_s * 3.0 / base.thpt_per_gpu),
        math.ceil(base.demand_tokens_per_s * 0.5 / base.thpt_per_gpu),
    )


def test_decode_formula_uses_best_throughput_under_corrected_itl(h200_like_profile: Profile):
    forecast = LoadForecast(num_req=6000, isl=3000, osl=300)  # 30,000 output tok/s

    def decode(correction: float, **kw: Any) -> RoleSizing:
        return size_decode(
            forecast,
            h200_like_profile.decode,
            interval_s=60,
            itl_target_ms=30,
            correction=correction,
            gpus_per_replica=1,
            **kw,
        )

    ok = decode(1.0)
    best = h200_like_profile.decode.find_best_throughput_per_gpu(30, 3150)
    assert ok.replicas == math.ceil(30000 / best.thpt_per_gpu)
    # the engines run 2x slower than profiled: the batch whose profiled ITL is 15 ms meets
    # 30 ms, and at it each engine emits half the profile's tokens per second
    slow = decode(2.0)
    tight = h200_like_profile.decode.find_best_throughput_per_gpu(15, 3150)
    assert slow.thpt_per_gpu == pytest.approx(tight.thpt_per_gpu / 2)
    assert slow.replicas == math.ceil(30000 / (tight.thpt_per_gpu / 2)) > ok.replicas
    # an aggregated engine's ITL ratio is also prefill sharing its iterations, which its
    # sizing charges as prefill's share: the ratio tightens the ITL only
    agg = decode(2.0, slower_iterations=False)
    assert agg.thpt_per_gpu == pytest.approx(tight.thpt_per_gpu)
    # engines observed faster than profiled need fewer replicas, but never fewer than at
    # half the profile's time per token, whatever one window showed
    fewer = [decode(c).replicas for c in (0.7, FASTEST_DECODE_CORRECTION, 0.3)]
    assert ok.replicas > fewer[0] > fewer[1] == fewer[2]
    assert decode(float("nan")).replicas == ok.replicas


def test_infeasible_itl_holds_with_reason(h200_like_profile: Profile) -> None:
    tp = planner(h200_like_profile, itl_ms=1.0)  # below anything profiled
    decision = tp.tick(60, traffic(60, 600), status(1, 1))
    assert decision.replicas is None
    assert decision.reason is ThroughputReason.PROFILE_INFEASIBLE
    assert "ITL" in decision.message


def test_scale_up_then_wait_for_convergence(h200_like_profile: Profile) -> None:
    tp = planner(h200_like_profile)
    first = tp.tick(60, traffic(60, 4800), status(1, 1))
    assert first.reason is ThroughputReason.SCALE
    assert first.replicas and first.replicas["prefill"] > 1
    want = first.replicas
    pending = status(want["prefill"], want["decode"], ready_p=1, ready_d=1)
    held = tp.tick(120, traffic(120, 4800), pending)
    assert held.replicas is None and held.reason is ThroughputReason.SCALING_IN_PROGRESS
    assert "ready" in held.message


def test_a_need_grown_past_what_is_starting_is_ordered_while_it_converges(
    h200_like_profile: Profile,
) -> None:
    # ordered for 4800 requests a minute, still starting; the next minute brings twice as
    # many: the tick does not wait for the first order to converge before raising prefill
    # (a rate rising through the start-up), and cuts nothing meanwhile
    tp = planner(h200_like_profile)
    first = tp.tick(60, traffic(60, 4800), status(1, 1))
    assert first.replicas is not None
    want = first.replicas
    pending = status(want["prefill"], want["decode"], ready_p=1, ready_d=1)
    grown = tp.tick(120, traffic(120, 9600), pending)
    assert grown.reason is ThroughputReason.SCALE and grown.replicas is not None
    assert grown.replicas["prefill"] > want["prefill"]
    assert all(grown.replicas[r] >= want[r] for r in want)
    # a lower need while it converges changes nothing: the hold says what it waits for
    pending = status(*grown.replicas.values(), ready_p=1, ready_d=1)
    held = tp.tick(180, traffic(180, 2400), pending)
    assert held.replicas is None and held.reason is ThroughputReason.SCALING_IN_PROGRESS
    assert "waiting for the last change to converge" in held.message


def test_convergence_timeout_replans_from_ready_replicas(h200_like_profile: Profile) -> None:
    # Dynamo issue #14251: pods that never become ready must not block the planner forever.
    tp = planner(h200_like_profile, scaling_convergence_timeout_seconds=120)
    first = tp.tick(60, traffic(60, 4800), status(1, 1))
    assert first.replicas is not None
    stuck = status(first.replicas["prefill"], first.replicas["decode"], ready_p=2, ready_d=1)
    assert tp.tick(120, traffic(120, 4800), stuck).reason is ThroughputReason.SCALING_IN_PROGRESS
    late = tp.tick(240, traffic(240, 4800), stuck)
    assert late.replicas is not None
    assert any("did not converge" in w for w in late.diagnostics.warnings)


def test_zero_traffic_scales_down_to_min_endpoints(h200_like_profile: Profile) -> None:
    # Dynamo issue #6985: an idle deployment kept its replicas because the averages were NaN.
    # Once the stabilisation window since the planner started has passed.
    tp = planner(h200_like_profile, min_endpoint=1)
    tp.tick(60, traffic(60, 0), status(6, 5))
    decision = tp.tick(720, traffic(720, 0), status(6, 5))
    assert decision.replicas == {"prefill": 1, "decode": 1}
    assert decision.reason is ThroughputReason.SCALE


def test_a_planner_started_on_a_running_deployment_keeps_it_for_one_stabilisation_window(
    h200_like_profile: Profile,
) -> None:
    """A (re)started planner has no history: the replicas it finds count as a need for one
    stabilisation window, as the HPA controller records its first sight of an HPA; a
    stabilisation of 0 still scales down at once."""
    tp = planner(h200_like_profile, scale_down_stabilization_seconds=600)
    first = tp.tick(60, traffic(60, 240), status(6, 5))
    assert first.replicas == {"prefill": 6, "decode": 5}, first.message
    assert first.reason is ThroughputReason.NO_CHANGE
    assert "the replicas found when the planner started (60 s) count as a need" in first.message
    assert tp.tick(600, traffic(600, 240), status(6, 5)).replicas == {"prefill": 6, "decode": 5}
    later = tp.tick(720, traffic(720, 240), status(6, 5))
    assert later.replicas is not None and later.replicas["prefill"] < 6, later.message
    assert "replicas found when the planner started" not in later.message

    at_once = planner(h200_like_profile, scale_down_stabilization_seconds=0)
    down = at_once.tick(60, traffic(60, 240), status(6, 5))
    assert down.replicas is not None and down.replicas["prefill"] < 6, down.message


def test_missing_traffic_holds(h200_like_profile: Profile) -> None:
    tp = planner(h200_like_profile)
    decision = tp.tick(60, MissingObservation("prometheus_unreachable", "refused"), status(6, 5))
    assert decision.replicas is None
    assert decision.reason is ThroughputReason.NO_TRAFFIC_DATA
    assert "prometheus_unreachable" in decision.message


def test_stale_traffic_holds(h200_like_profile: Profile) -> None:
    tp = planner(h200_like_profile)
    decision = tp.tick(600, traffic(60, 10), status(6, 5))
    assert decision.reason is ThroughputReason.STALE_TRAFFIC_DATA and decision.replicas is None


def test_budget_limits_and_says_so(h200_like_profile: Profile) -> None:
    tp = planner(h200_like_profile, max_gpu_budget=6, max_throughput_scaling_replicas=50)
    decision = tp.tick(60, traffic(60, 30000), status(1, 1))
    assert decision.replicas is not None
    assert gpus_of(decision.replicas, {"prefill": 1, "decode": 1}) <= 6
    assert "max_gpu_budget" in decision.message
    assert decision.diagnostics.stages["proposed"]["prefill"] > decision.replicas["prefill"]


def test_per_tick_change_is_capped(h200_like_profile: Profile) -> None:
    tp = planner(h200_like_profile, max_throughput_scaling_replicas=2)
    decision = tp.tick(60, traffic(60, 30000), status(1, 1))
    assert decision.replicas == {"prefill": 3, "decode": 3}


def test_correction_factors_from_observed_latency(h200_like_profile: Profile) -> None:
    tp = planner(h200_like_profile)
    expected_ttft = h200_like_profile.prefill.ttft_ms(3000)
    tp.tick(
        60,
        traffic(60, 600, ttft_ms=2 * expected_ttft, itl_ms=20, request_duration_s=6.0),
        status(2, 2),
    )
    assert tp.corrections.prefill == pytest.approx(2.0, rel=1e-6)
    assert tp.corrections.decode > 0


def test_no_correction_ignores_latency(h200_like_profile: Profile) -> None:
    tp = planner(h200_like_profile, no_correction=True)
    tp.tick(60, traffic(60, 600, ttft_ms=1000, itl_ms=200, request_duration_s=6.0), status(2, 2))
    assert tp.corrections == CorrectionFactors()


def test_scaling_latency_is_measured_and_warned(h200_like_profile: Profile) -> None:
    tp = planner(h200_like_profile)
    first = tp.tick(60, traffic(60, 4800), status(1, 1))
    assert first.replicas is not None
    p, d = first.replicas["prefill"], first.replicas["decode"]
    tp.tick(120, traffic(120, 4800), status(p, d, ready_p=1, ready_d=1))
    later = tp.tick(180, traffic(180, 4800), status(p, d))
    assert later.diagnostics.scaling_latency_s["prefill"] == 120
    assert any("longer than the 60 s adjustment interval" in w for w in later.diagnostics.warnings)


@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    low=st.floats(0, 20000),
    extra=st.floats(0, 20000),
    isl=st.floats(200, 12000),
    osl=st.floats(20, 1000),
    budget=st.integers(4, 64),
    min_ep=st.integers(1, 2),
)
def test_properties(h200_like_profile: Profile, low, extra, isl, osl, budget, min_ep) -> None:
    def decide(n: float) -> dict[str, int]:
        tp = planner(
            h200_like_profile,
            max_gpu_budget=budget,
            min_endpoint=min_ep,
            max_throughput_scaling_replicas=1000,
        )
        obs = traffic(60, n, isl=isl, osl=osl) if n > 0 else traffic(60, 0)
        decision = tp.tick(60, obs, status(min_ep, min_ep))
        return decision.replicas or {"prefill": min_ep, "decode": min_ep}

    small, big = decide(low), decide(low + extra)
    gpus = {"prefill": 1, "decode": 1}
    assert gpus_of(small, gpus) <= budget and gpus_of(big, gpus) <= budget  # never above budget
    assert min(small.values()) >= min_ep and min(big.values()) >= min_ep  # floors kept
    assert sum(big.values()) >= sum(small.values())  # non-decreasing in load


def test_scale_down_stabilisation_keeps_recent_peak(h200_like_profile: Profile) -> None:
    tp = planner(h200_like_profile, scale_down_stabilization_seconds=150)
    up = tp.tick(60, traffic(60, 4800), status(1, 1))
    assert up.replicas is not None
    p, d = up.replicas["prefill"], up.replicas["decode"]
    # load drops at 120 s: the peak recommended 60 s ago still stands
    dip = tp.tick(120, traffic(120, 600), status(p, d))
    assert dip.replicas == {"prefill": p, "decode": d}
    assert dip.diagnostics.stages["floors"]["prefill"] < p
    # 240 s: the peak has left the 150 s window, the scale-down goes through
    later = tp.tick(240, traffic(240, 600), status(p, d))
    assert later.replicas is not None and later.replicas["prefill"] < p
    # scale-ups are never delayed
    again = tp.tick(300, traffic(300, 9600), status(*later.replicas.values()))
    assert again.replicas is not None and again.replicas["prefill"] > later.replicas["prefill"]


def test_decode_is_capped_by_sequence_slots(h200_like_profile: Profile) -> None:
    forecast = LoadForecast(num_req=60000, isl=500, osl=300)  # many short requests
    free = size_decode(
        forecast,
        h200_like_profile.decode,
        interval_s=60,
        itl_target_ms=30,
        correction=1.0,
        gpus_per_replica=1,
    )
    capped = size_decode(
        forecast,
        h200_like_profile.decode,
        interval_s=60,
        itl_target_ms=30,
        correction=1.0,
        gpus_per_replica=1,
        max_num_seqs=32,
        seq_utilisation=0.8,
    )
    best = h200_like_profile.decode.find_best_throughput_per_gpu(30, 650)
    slot_thpt = 32 * 0.8 * 1000 / best.itl_ms
    assert capped.replicas == math.ceil(free.demand_tokens_per_s / slot_thpt) > free.replicas
    assert "sequence slots" in capped.note


def test_prompt_length_variability_sets_the_prefill_headroom(h200_like_profile: Profile) -> None:
    from disagg_planner.core.types import Histogram

    bounds = (1024.0, 2048.0, 4096.0, 8192.0)
    same = Histogram(bounds=bounds, counts=(0.0, 0.0, 600.0, 0.0))  # every prompt ~3000
    mixed = Histogram(bounds=bounds, counts=(300.0, 100.0, 100.0, 60.0), overflow=40.0)

    def prefill_utilisation(histogram: Histogram) -> float:
        tp = planner(h200_like_profile, max_throughput_scaling_replicas=100)
        obs = traffic(60, 6000, isl_histogram=histogram)
        decision = tp.tick(60, obs, status(1, 1))
        return decision.diagnostics.sizing["prefill"].utilisation

    assert prefill_utilisation(same) > prefill_utilisation(mixed)
