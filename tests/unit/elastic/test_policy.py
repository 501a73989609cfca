"""The elastic-EP policy on constructed traffic: capacity from the bundled DeepSeek-V3 GB200
DP16 profile, lead time per mode, the worth-it rule, scale-down rules, bounds and holds."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

import pytest

from disagg_planner.config.schema import PlannerConfig
from disagg_planner.core.elastic import (
    ElasticDecision,
    ElasticPlanner,
    ElasticReason,
    LoadTrend,
    mode_timing,
    request_gpu_seconds,
)
from disagg_planner.core.sizing import LoadForecast, size_agg, size_decode, size_prefill
from disagg_planner.core.types import MissingObservation, TrafficObservation
from disagg_planner.profiles import load_profile
from disagg_planner.profiles.registry import resolve_profile

PROFILE = load_profile(resolve_profile("gb200/vllm/deepseek-v3/tp1-dp16-ep16"))
ISL, OSL = 9000.0, 2000.0
INTERVAL = 30.0
TTFT_OBSERVED_MS = 800.0


def config(**overrides: Any) -> PlannerConfig:
    values: dict[str, Any] = {
        "mode": "agg",
        "environment": "virtual",
        "decode_engine_num_gpu": 16,
        "ttft_ms": 5000.0,
        "itl_ms": 100.0,
        "throughput_adjustment_interval_seconds": INTERVAL,
        "max_gpu_budget": -1,
        "elastic_ep": "agg",
        "elastic_ep_mode": "nixl",
        "elastic_ep_min_dp": 16,
        "elastic_ep_max_dp": 20,
        "elastic_ep_dp_step": 4,
    }
    values.update(overrides)
    return PlannerConfig(**values)


def rank_rps() -> float:
    """Requests/s one DP rank (1 GPU) serves at ISL/OSL, from the profile."""
    cost = request_gpu_seconds("agg", PROFILE, isl=ISL, osl=OSL, itl_ms=100.0, interval_s=INTERVAL)
    assert cost.feasible
    return 1.0 / cost.gpu_seconds


CAP16 = 16 * rank_rps()


def window(rate: Callable[[float], float], end_s: float) -> TrafficObservation:
    """The window ``[end - 30, end]`` of a traffic whose rate is ``rate(t)`` (piecewise
    linear within a window, so the trapezoid is exact)."""
    start = end_s - INTERVAL
    num = (rate(start) + rate(end_s)) / 2 * INTERVAL
    return TrafficObservation(
        end_s=end_s,
        duration_s=INTERVAL,
        num_req=num,
        ttft_ms=TTFT_OBSERVED_MS if num > 0 else None,
        isl=ISL if num > 0 else None,
        osl=OSL if num > 0 else None,
    )


def trend_of(decision: ElasticDecision | None) -> LoadTrend:
    assert decision is not None and decision.diagnostics.trend is not None
    return decision.diagnostics.trend


def run_until_decision(
    planner: ElasticPlanner, rate: Callable[[float], float], *, current_dp: int, end_s: float
) -> tuple[float, Any]:
    """Tick every interval until the planner resizes; returns (time, decision)."""
    t = INTERVAL
    decision = None
    while t <= end_s:
        decision = planner.tick(t, window(rate, t), current_dp=current_dp)
        if decision.target_dp is not None:
            return t, decision
        t += INTERVAL
    return math.inf, decision


# --- capacity -------------------------------------------------------------------------------


def test_rank_count_is_the_throughput_loops_agg_sizing_per_gpu():
    cost = request_gpu_seconds("agg", PROFILE, isl=ISL, osl=OSL, itl_ms=100.0, interval_s=60.0)
    for rate in (3.0, 8.0, 12.5, 16.0):
        forecast = LoadForecast(num_req=rate * 60.0, isl=ISL, osl=OSL)
        prefill = size_prefill(
            forecast, PROFILE.prefill, interval_s=60.0, correction=1.0, gpus_per_replica=1
        )
        decode = size_decode(
            forecast,
            PROFILE.decode,
            interval_s=60.0,
            itl_target_ms=100.0,
            correction=1.0,
            gpus_per_replica=1,
        )
        expected = size_agg(prefill, decode, gpus_per_replica=1).replicas
        assert math.ceil(rate * cost.gpu_seconds - 1e-9) == expected


def test_infeasible_itl_target_holds_with_the_profiles_reason():
    planner = ElasticPlanner(config=config(itl_ms=0.5), profile=PROFILE)

    decision = planner.tick(30.0, window(lambda t: 10.0, 30.0), current_dp=16)

    assert decision.target_dp is None
    assert decision.reason is ElasticReason.PROFILE_INFEASIBLE
    assert "ITL 0.5 ms" in decision.message


# --- lead time --------------------------------------------------------------------------------


@pytest.mark.parametrize("mode", ["blocking", "async", "nixl"])
def test_scale_up_is_active_before_the_load_arrives_and_not_much_earlier(mode):
    crossing = 1200.0  # the rising load exceeds 16 ranks' capacity here
    slope = 0.01  # req/s per s

    def rate(t: float) -> float:
        return CAP16 + slope * (t - crossing)

    planner = ElasticPlanner(config=config(elastic_ep_mode=mode), profile=PROFILE)
    up = planner.timing.up

    t, decision = run_until_decision(planner, rate, current_dp=16, end_s=crossing)

    assert decision.reason is ElasticReason.SCALE_UP and decision.target_dp == 20
    assert decision.diagnostics.lead_s == pytest.approx(up.total_s + INTERVAL)
    # the new ranks serve before the load needs them ...
    assert t + up.total_s <= crossing
    # ... and the resize starts no more than one interval before it must
    assert t > crossing - up.total_s - 2 * INTERVAL


def test_a_longer_resize_is_started_earlier():
    def rate(t: float) -> float:
        return CAP16 + 0.01 * (t - 1200.0)

    started = {}
    for name, timing in (("nixl", None), ("slow", "250,1,10,1")):
        planner = ElasticPlanner(
            config=config(elastic_ep_mode="nixl", elastic_ep_timing=timing), profile=PROFILE
        )
        started[name], _ = run_until_decision(planner, rate, current_dp=16, end_s=1200.0)
    # one interval apart at least: 250 s vs 92 s ahead of the same crossing
    assert started["slow"] + 4 * INTERVAL <= started["nixl"]


def test_measured_timing_replaces_the_modes_default_lead():
    cfg = config(elastic_ep_mode="nixl", elastic_ep_timing="300,2,20,1")
    timing = mode_timing(cfg)
    assert (timing.up.total_s, timing.up.downtime_s) == (300.0, 2.0)
    assert (timing.down.total_s, timing.down.downtime_s) == (20.0, 1.0)

    def rate(t: float) -> float:
        return CAP16 + 0.01 * (t - 1200.0)

    t, decision = run_until_decision(
        ElasticPlanner(config=cfg, profile=PROFILE), rate, current_dp=16, end_s=1200.0
    )
    assert decision.diagnostics.lead_s == pytest.approx(330.0)
    assert t + 300.0 <= 1200.0 < t + 330.0 + INTERVAL


# --- worth it -------------------------------------------------------------------------------


def test_blocking_resize_needs_an_overload_longer_than_its_pause():
    def rate(t: float) -> float:
        return CAP16 + 0.01 * (t - 1200.0)

    # Counting only 60 s of saved requests, a ~100 s pause never pays ...
    short = ElasticPlanner(
        config=config(elastic_ep_mode="blocking", elastic_ep_benefit_window_seconds=60.0),
        profile=PROFILE,
    )
    t, decision = run_until_decision(short, rate, current_dp=16, end_s=1800.0)
    assert t == math.inf
    assert decision.reason is ElasticReason.HOLD_NOT_WORTH_DOWNTIME
    d = decision.diagnostics
    assert d.benefit_requests is not None and d.cost_requests is not None
    assert 0 < d.benefit_requests < d.cost_requests
    # cost = every arrival in the pause: vLLM answers them 503
    up = short.timing.up
    expected = rate(1800.0 + up.preparation_s) * up.downtime_s
    assert d.cost_requests == pytest.approx(expected, rel=1e-6)

    # ... while a sustained overload (10 minutes counted) does, and so does NIXL EP's
    # sub-second pause even over 60 s.
    long = ElasticPlanner(config=config(elastic_ep_mode="blocking"), profile=PROFILE)
    assert run_until_decision(long, rate, current_dp=16, end_s=1800.0)[0] < 1200.0
    nixl = ElasticPlanner(
        config=config(elastic_ep_mode="nixl", elastic_ep_benefit_window_seconds=60.0),
        profile=PROFILE,
    )
    t, decision = run_until_decision(nixl, rate, current_dp=16, end_s=1800.0)
    # NIXL EP's 0.82 s pause still rejects the requests arriving in it
    assert t < 1200.0
    assert decision.diagnostics.cost_requests == pytest.approx(rate(t + 92.34 - 0.82) * 0.82)


def test_a_pause_rejects_its_arrivals_unless_the_frontend_retries_them():
    """Issue 20, problem 5: vLLM answers requests during the pause with 503, so a grow's
    pause costs every arrival in it; only a retrying frontend turns them into delays, which
    the TTFT slack absorbs."""

    def rate(t: float) -> float:
        return CAP16 + 0.01 * (t - 1200.0)

    costs = {}
    for retries in (False, True):
        planner = ElasticPlanner(
            config=config(elastic_ep_mode="nixl", elastic_ep_frontend_retries=retries),
            profile=PROFILE,
        )
        t, decision = run_until_decision(planner, rate, current_dp=16, end_s=1800.0)
        assert decision.target_dp is not None
        costs[retries] = (t, decision)
    t, rejected = costs[False]
    up = ElasticPlanner(config=config(elastic_ep_mode="nixl"), profile=PROFILE).timing.up
    assert rejected.diagnostics.cost_requests == pytest.approx(
        rate(t + up.preparation_s) * up.downtime_s
    )
    assert "rejected with 503" in rejected.message
    # retried: the 0.82 s pause fits in the TTFT slack (5 s target, 0.8 s observed)
    assert costs[True][1].diagnostics.cost_requests == 0.0
    assert "retried" in costs[True][1].message


def test_no_resize_for_an_overload_that_is_over_before_the_capacity_would_arrive():
    # 10% above capacity now, falling fast: below capacity long before 92 s from now.
    def rate(t: float) -> float:
        return CAP16 * 1.1 - 0.05 * (t - 300.0)

    planner = ElasticPlanner(config=config(elastic_ep_mode="nixl"), profile=PROFILE)
    for t in (240.0, 270.0):
        planner.tick(t, window(rate, t), current_dp=16)
    decision = planner.tick(300.0, window(rate, 300.0), current_dp=16)

    assert decision.target_dp is None
    assert decision.reason is ElasticReason.HOLD_NOT_WORTH_DOWNTIME
    assert decision.diagnostics.benefit_requests == 0.0


# --- scale down -----------------------------------------------------------------------------


def steady(planner: ElasticPlanner, value: float, *, current_dp: int, until_s: float) -> Any:
    decision = None
    t = INTERVAL
    while t <= until_s:
        decision = planner.tick(t, window(lambda _t: value, t), current_dp=current_dp)
        t += INTERVAL
    return decision


def test_nixl_shrinks_when_a_lower_load_is_sustained_and_the_frontend_retries():
    planner = ElasticPlanner(
        config=config(
            elastic_ep_mode="nixl",
            elastic_ep_frontend_retries=True,
            elastic_ep_shrink_abort_budget=1e9,
        ),
        profile=PROFILE,
    )

    decision = steady(planner, CAP16 * 0.5, current_dp=20, until_s=600.0)

    assert decision.reason is ElasticReason.SCALE_DOWN and decision.target_dp == 16
    # a 1.96 s pause within the TTFT slack costs nothing; the removed ranks' requests do
    d = decision.diagnostics
    assert d.aborted_requests is not None and d.aborted_requests > 0
    assert d.cost_requests == pytest.approx(d.aborted_requests)
    assert f"aborting ~{d.aborted_requests:.0f} in flight" in decision.message


@dataclass(frozen=True)
class AbortRow:
    """Issue 32, item 2: a shrink aborts what runs on the ranks it removes."""

    name: str
    budget: float
    drains: bool
    load: float  # of CAP16
    reason: ElasticReason
    target: int | None
    words: tuple[str, ...]


ABORT_ROWS = [
    AbortRow(
        "over-budget-waits-for-a-quieter-moment",
        0.0,
        False,
        0.5,
        ElasticReason.HOLD_SCALE_DOWN_ABORTS,
        None,
        ("would abort ~", "elastic_ep_shrink_abort_budget=0", "waiting for a quieter moment"),
    ),
    AbortRow(
        "within-budget-goes-ahead-and-says-what-it-aborts",
        1e6,
        False,
        0.5,
        ElasticReason.SCALE_DOWN,
        16,
        ("aborting ~",),
    ),
    AbortRow(
        "an-engine-that-drains-first-aborts-none",
        0.0,
        True,
        0.5,
        ElasticReason.SCALE_DOWN_AFTER_DRAIN,
        16,
        ("draining first", "none aborted"),
    ),
]


@pytest.mark.parametrize("row", ABORT_ROWS, ids=lambda r: r.name)
def test_a_shrink_weighs_the_requests_it_aborts(row: AbortRow):
    planner = ElasticPlanner(
        config=config(
            elastic_ep_mode="nixl",
            elastic_ep_frontend_retries=True,
            elastic_ep_shrink_abort_budget=row.budget,
            elastic_ep_engine_drains_requests=row.drains,
            ttft_ms=60_000.0,  # a drain's pause within the TTFT slack: only aborts count
            **({"elastic_ep_drain_timeout_seconds": 30} if row.drains else {}),
        ),
        profile=PROFILE,
    )

    decision = steady(planner, CAP16 * row.load, current_dp=20, until_s=1200.0)

    assert (decision.reason, decision.target_dp) == (row.reason, row.target), decision.message
    for word in row.words:
        assert word in decision.message
    aborted = decision.diagnostics.aborted_requests
    assert aborted is not None
    assert (aborted == 0) == row.drains


def test_without_retries_a_nixl_shrink_under_load_waits_for_idle_traffic():
    """Its 1.96 s pause answers the arrivals 503: ~2 s of requests would be rejected."""
    planner = ElasticPlanner(config=config(elastic_ep_mode="nixl"), profile=PROFILE)

    decision = steady(planner, CAP16 * 0.5, current_dp=20, until_s=600.0)

    assert decision.reason is ElasticReason.HOLD_SCALE_DOWN_COSTS_SLO
    d = decision.diagnostics
    assert d.aborted_requests is not None
    assert d.cost_requests == pytest.approx(CAP16 * 0.5 * 1.96 + d.aborted_requests)
    assert "rejected with 503" in decision.message
    idle = steady(planner, 0.0, current_dp=20, until_s=1500.0)
    assert idle.target_dp == 16


@pytest.mark.parametrize("mode", ["blocking", "async"])
def test_a_shrink_that_pauses_serving_waits_for_idle_traffic(mode):
    planner = ElasticPlanner(config=config(elastic_ep_mode=mode), profile=PROFILE)

    busy = steady(planner, CAP16 * 0.5, current_dp=20, until_s=600.0)
    assert busy.reason is ElasticReason.HOLD_SCALE_DOWN_COSTS_SLO and busy.target_dp is None
    assert busy.diagnostics.cost_requests > 0

    t = 630.0
    while t <= 1000.0:  # traffic stops; lengths are remembered from before
        idle = planner.tick(t, window(lambda _t: 0.0, t), current_dp=20)
        t += INTERVAL
    assert idle.reason is ElasticReason.SCALE_DOWN and idle.target_dp == 16


def test_a_recent_peak_blocks_the_shrink():
    def rate(t: float) -> float:
        return CAP16 * 1.2 if t < 240.0 else CAP16 * 0.3

    planner = ElasticPlanner(config=config(elastic_ep_mode="nixl"), profile=PROFILE)
    decision = None
    for t in range(30, 301, 30):
        decision = planner.tick(float(t), window(rate, float(t)), current_dp=20)

    assert decision is not None
    assert decision.reason is ElasticReason.HOLD_SCALE_DOWN_NOT_SUSTAINED
    assert trend_of(decision).max_observed_rps > CAP16


def test_no_traffic_ever_shrinks_to_the_leader():
    planner = ElasticPlanner(config=config(elastic_ep_mode="blocking"), profile=PROFILE)

    decision = planner.tick(30.0, window(lambda t: 0.0, 30.0), current_dp=20)

    assert decision.reason is ElasticReason.SCALE_DOWN and decision.target_dp == 16


# --- bounds, budget, holds ---------------------------------------------------------------------


def test_at_max_dp_holds_and_a_need_beyond_max_is_capped():
    planner = ElasticPlanner(config=config(), profile=PROFILE)
    decision = planner.tick(30.0, window(lambda t: CAP16 * 2, 30.0), current_dp=20)
    assert decision.reason is ElasticReason.AT_MAX_DP and decision.target_dp is None

    wide = ElasticPlanner(config=config(elastic_ep_max_dp=24), profile=PROFILE)
    decision = wide.tick(30.0, window(lambda t: CAP16 * 2, 30.0), current_dp=16)
    assert decision.reason is ElasticReason.SCALE_UP_CAPPED and decision.target_dp == 24
    assert (decision.diagnostics.ranks_needed or 0) > 24


def test_targets_are_on_the_step_grid():
    planner = ElasticPlanner(config=config(elastic_ep_max_dp=28), profile=PROFILE)
    # 17 ranks needed -> one follower of 4 ranks
    decision = planner.tick(30.0, window(lambda t: 16.5 * rank_rps(), 30.0), current_dp=16)
    assert decision.diagnostics.ranks_needed == 17
    assert decision.target_dp == 20


def test_gpu_budget_caps_the_size_and_reconciles_an_engine_above_it():
    planner = ElasticPlanner(config=config(max_gpu_budget=19), profile=PROFILE)
    assert planner.max_dp_within_budget(0) == 16  # 19 GPUs hold no full step above 16
    assert (
        ElasticPlanner(config=config(max_gpu_budget=40), profile=PROFILE).max_dp_within_budget(18)
        == 20
    )

    decision = planner.tick(30.0, window(lambda t: CAP16 * 2, 30.0), current_dp=20)
    assert decision.reason is ElasticReason.RECONCILE_TO_BOUNDS and decision.target_dp == 16


def test_holds_without_fresh_data_or_during_a_resize():
    planner = ElasticPlanner(config=config(), profile=PROFILE)

    missing = planner.tick(30.0, MissingObservation("no_series", "frontend down"), current_dp=16)
    assert missing.reason is ElasticReason.NO_TRAFFIC_DATA and "frontend down" in missing.message

    stale = planner.tick(300.0, window(lambda t: CAP16 * 2, 60.0), current_dp=16)
    assert stale.reason is ElasticReason.STALE_TRAFFIC_DATA and stale.target_dp is None

    busy = planner.tick(330.0, window(lambda t: CAP16 * 2, 330.0), current_dp=16, resizing=True)
    assert busy.reason is ElasticReason.RESIZE_IN_FLIGHT and busy.target_dp is None
    # the window seen while resizing still counts for the trend
    after = planner.tick(360.0, window(lambda t: CAP16 * 2, 360.0), current_dp=20)
    assert trend_of(after).points == 2


def test_elastic_planner_needs_an_elastic_config():
    with pytest.raises(ValueError, match="elastic_ep"):
        ElasticPlanner(
            config=PlannerConfig(mode="agg", environment="virtual", decode_engine_num_gpu=1),
            profile=PROFILE,
        )


# --- the trend --------------------------------------------------------------------------------


def test_trend_recovers_a_line_and_weights_lengths_by_requests():
    planner = ElasticPlanner(config=config(), profile=PROFILE)
    lengths = {30.0: (1000.0, 100.0), 60.0: (3000.0, 300.0), 90.0: (5000.0, 500.0)}
    decision = None
    for t, (isl, osl) in lengths.items():
        rate = 2.0 + 0.05 * (t - 15.0)  # at the window's middle
        obs = TrafficObservation(
            end_s=t, duration_s=INTERVAL, num_req=rate * INTERVAL, isl=isl, osl=osl
        )
        decision = planner.tick(t, obs, current_dp=16)
    fitted = trend_of(decision)
    assert fitted.slope_rps_per_s == pytest.approx(0.05)
    assert fitted.level_rps == pytest.approx(2.0 + 0.05 * 90.0)
    counts = {t: (2.0 + 0.05 * (t - 15.0)) * INTERVAL for t in lengths}
    total = sum(counts.values())
    assert fitted.isl == pytest.approx(sum(counts[t] * lengths[t][0] for t in lengths) / total)
    assert fitted.osl == pytest.approx(sum(counts[t] * lengths[t][1] for t in lengths) / total)


@pytest.mark.parametrize(
    ("level", "slope", "threshold"),
    [(10.0, 0.02, 11.0), (10.0, -0.02, 9.0), (10.0, 0.0, 9.0), (10.0, 0.0, 11.0), (1.0, -0.1, 0.0)],
)
def test_requests_above_matches_numeric_integration(level, slope, threshold):
    trend = LoadTrend(
        now_s=100.0,
        level_rps=level,
        slope_rps_per_s=slope,
        isl=1.0,
        osl=1.0,
        points=2,
        max_observed_rps=level,
    )
    t0, t1, n = 150.0, 400.0, 250_000
    dt = (t1 - t0) / n
    numeric = 0.0
    for i in range(n):
        r = trend.rate_at(t0 + (i + 0.5) * dt)
        if r > threshold:
            numeric += r * dt
    assert trend.requests_above(t0, t1, threshold) == pytest.approx(numeric, rel=1e-3, abs=1e-2)


# --- lead time that matches the engine ---------------------------------------------------------


def test_lead_time_adds_follower_start_up_and_join_when_followers_bring_the_gpus():
    """Issue 20, problem 3: a grow with followers waits for pods and a Ray join before the
    resize even starts; the lead time must carry that too."""
    bare = ElasticPlanner(config=config(elastic_ep_mode="nixl"), profile=PROFILE)
    two_stage = ElasticPlanner(
        config=config(
            elastic_ep_mode="nixl",
            elastic_ep_follower_service="decode-elastic",
            environment="kubernetes",
            elastic_ep_follower_ready_seconds=180.0,
        ),
        profile=PROFILE,
    )
    assert bare.follower_ready_s() == 0.0
    assert two_stage.follower_ready_s() == 180.0

    def rate(t: float) -> float:
        return CAP16 * 0.9 + 0.005 * (t - 300.0)

    t_bare, d_bare = run_until_decision(bare, rate, current_dp=16, end_s=3000.0)
    t_two, d_two = run_until_decision(two_stage, rate, current_dp=16, end_s=3000.0)
    assert d_bare.diagnostics.lead_s == pytest.approx(92.34 + INTERVAL)
    assert d_two.diagnostics.lead_s == pytest.approx(180.0 + 92.34 + INTERVAL)
    assert t_two < t_bare  # acts earlier by the follower time
    assert "followers 180 s" in d_two.message


@pytest.mark.parametrize(
    ("followers", "active_s"),
    [
        pytest.param({}, 92.34, id="gpus-already-there"),
        pytest.param(
            {
                "elastic_ep_follower_service": "agg-flw",
                "environment": "kubernetes",
                "elastic_ep_follower_ready_seconds": 120.0,
            },
            120.0 + 92.34,
            id="followers-start-and-join",
        ),
    ],
)
def test_a_grow_is_sized_until_a_second_grow_could_be_active(followers, active_s):
    """A resize in flight holds the next one, so a grow decided now is corrected no earlier
    than a second grow decided at the first tick after it is active: its size must carry the
    rise until then (one lead time plus one more grow), not only over its own lead time."""

    # Steep enough that the rise over the second grow's lead is more than one rank whatever
    # the profile's per-rank rate (at 0.01 req/s per s it was 0.9 ranks, and whether the two
    # sizes differed hung on where the peak fell between whole ranks).
    def rate(t: float) -> float:
        return max(0.0, CAP16 + 0.02 * (t - 1200.0))

    planner = ElasticPlanner(config=config(elastic_ep_max_dp=32, **followers), profile=PROFILE)
    t, decision = run_until_decision(planner, rate, current_dp=16, end_s=1200.0)

    d = decision.diagnostics
    assert decision.reason is ElasticReason.SCALE_UP
    assert d.lead_s == pytest.approx(active_s + INTERVAL)  # when to grow: unchanged
    assert d.hold_s == pytest.approx(2 * active_s + INTERVAL)
    assert d.hold_peak_rps == pytest.approx(rate(t + d.hold_s))
    g = 1.0 / rank_rps()
    assert d.ranks_needed == math.ceil(d.hold_peak_rps * g - 1e-9)
    assert d.ranks_needed > math.ceil((d.peak_rps or 0.0) * g - 1e-9)  # the lead's peak alone
    assert decision.target_dp == planner.on_grid(d.ranks_needed, 32)
    assert f"until a next grow could be active ({d.hold_s:.0f} s)" in decision.message


def test_measured_resizes_replace_the_configured_times():
    planner = ElasticPlanner(
        config=config(
            elastic_ep_mode="nixl",
            elastic_ep_follower_service="decode-elastic",
            environment="kubernetes",
        ),
        profile=PROFILE,
    )
    assert planner.follower_ready_s() == 180.0
    assert planner.resize_total_s(grow=True) == pytest.approx(92.34)
    for followers_s, resize_s in ((300.0, 40.0), (260.0, 50.0), (280.0, 45.0)):
        planner.observe_resize(grow=True, followers_ready_s=followers_s, resize_s=resize_s)
    planner.observe_resize(grow=False, followers_ready_s=None, resize_s=12.0)

    assert planner.follower_ready_s() == 280.0  # the median of what it measured
    assert planner.resize_total_s(grow=True) == 45.0
    assert planner.resize_total_s(grow=False) == 12.0


# --- the backlog ------------------------------------------------------------------------------

# What the frontend would have in flight if every request met the SLO exactly at ``rate``
# (Little's law over the TTFT target, then OSL tokens at the ITL target: 5 s + 2000 x 0.1 s).
SLO_REQUEST_S = 5.0 + OSL * 0.1
BACKLOG = 300.0  # requests waiting beyond that: +5 req/s over the 60 s drain


def backlog_window(rate: float, end_s: float, *, excess: float | None) -> TrafficObservation:
    """A steady window whose frontend counts ``excess`` requests in flight beyond what the
    rate explains (None: the frontend reports no in-flight count)."""
    base = window(lambda _t: rate, end_s)
    if excess is None:
        return base
    return replace(base, in_flight=rate * SLO_REQUEST_S + excess)


def steady_then(
    planner: ElasticPlanner,
    rate: float,
    *,
    current_dp: int,
    excess: float | None,
    queued: float | None = None,
) -> ElasticDecision:
    """Ten minutes of steady traffic with no backlog, then one tick with the given one."""
    for t in range(30, 600, 30):
        planner.tick(float(t), backlog_window(rate, float(t), excess=None), current_dp=current_dp)
    return planner.tick(
        600.0,
        backlog_window(rate, 600.0, excess=excess),
        current_dp=current_dp,
        queued_prefill_tokens=queued,
    )


@dataclass(frozen=True)
class BacklogRow:
    """Ten minutes of steady ``load`` (x CAP16) on DP ``current_dp``, then a tick whose
    frontend counts ``excess`` requests in flight beyond the rate (None: no count) or whose
    engines queue ``queued`` prefill tokens; the decision: reason, target and message words."""

    load: float
    current_dp: int
    reason: ElasticReason
    target: int | None
    words: tuple[str, ...]
    excess: float | None = None
    queued: float | None = None
    retries: bool = False


BACKLOG_TABLE = [
    pytest.param(
        BacklogRow(
            0.8, 16, ElasticReason.SCALE_UP, 20,
            ("backlog 300 requests", "+5.00 req/s", "+ backlog 5.00 req/s"), excess=BACKLOG,
        ),
        id="backlog-grows-beyond-the-rate",
    ),
    pytest.param(
        BacklogRow(
            0.8, 16, ElasticReason.SCALE_UP, 20,
            ("backlog 2700000 queued prefill tokens (FPM)",), queued=BACKLOG * ISL,
        ),
        id="fpm-queued-prefill-is-the-backlog",
    ),
    pytest.param(
        BacklogRow(0.8, 16, ElasticReason.NO_CHANGE, None, ("no backlog",), excess=0.0),
        id="no-backlog-the-rate-alone-fits",
    ),
    pytest.param(
        BacklogRow(
            0.5, 20, ElasticReason.HOLD_SCALE_DOWN_BACKLOG, None,
            ("300 requests are still waiting",), excess=BACKLOG, retries=True,
        ),
        id="no-shrink-while-a-backlog-remains",
    ),
    pytest.param(
        BacklogRow(
            0.5, 20, ElasticReason.SCALE_DOWN, 16, ("no backlog",), excess=0.0, retries=True
        ),
        id="no-backlog-the-shrink-goes-ahead",
    ),
]  # fmt: skip


@pytest.mark.parametrize("row", BACKLOG_TABLE)
def test_the_backlog_is_carried_by_the_dp_size(row: BacklogRow):
    planner = ElasticPlanner(
        config=config(elastic_ep_frontend_retries=row.retries, elastic_ep_shrink_abort_budget=1e9),
        profile=PROFILE,
    )

    decision = steady_then(
        planner, row.load * CAP16, current_dp=row.current_dp, excess=row.excess, queued=row.queued
    )

    assert (decision.reason, decision.target_dp) == (row.reason, row.target), decision.message
    for word in row.words:
        assert word in decision.message
    d = decision.diagnostics
    waiting = BACKLOG if (row.excess or row.queued) else 0.0
    assert d.backlog_requests == pytest.approx(waiting)
    assert d.backlog_rps == pytest.approx(waiting / 60.0)  # backlog_drain_seconds
    if row.reason is ElasticReason.SCALE_UP:
        # the ranks carry the rate and the backlog's drain, more than the rate alone needs
        g = 1.0 / rank_rps()
        rate = row.load * CAP16
        assert d.ranks_needed == math.ceil((rate + waiting / 60.0) * g - 1e-9)
        assert d.ranks_needed > math.ceil(rate * g - 1e-9)
        # not growing leaves the waiting requests waiting: they are what the grow saves
        assert d.benefit_requests == pytest.approx(waiting)


@pytest.mark.parametrize("load", [0.3, 0.8, 1.1])
@pytest.mark.parametrize("current_dp", [16, 20])
def test_without_a_backlog_the_decision_is_the_rate_alone(load, current_dp):
    """A frontend reporting in-flight requests the rate explains decides as one reporting
    none: the backlog term is zero, every other number the same."""
    cfg = config(elastic_ep_frontend_retries=True)
    silent = steady_then(
        ElasticPlanner(config=cfg, profile=PROFILE),
        load * CAP16,
        current_dp=current_dp,
        excess=None,
    )
    counted = steady_then(
        ElasticPlanner(config=cfg, profile=PROFILE),
        load * CAP16,
        current_dp=current_dp,
        excess=-10.0,
    )
    assert (counted.reason, counted.target_dp) == (silent.reason, silent.target_dp)
    assert counted.diagnostics.ranks_needed == silent.diagnostics.ranks_needed
    assert counted.diagnostics.benefit_requests == silent.diagnostics.benefit_requests
    assert counted.diagnostics.backlog_requests == silent.diagnostics.backlog_requests == 0.0


def test_a_decode_role_sizes_its_backlog_at_its_own_cost_per_request():
    """The waiting requests cost the elastic role what any request does (decode only for a
    decode role), not the prefill the throughput loop's prefill sizing counts."""
    cfg = config(mode="disagg", elastic_ep="decode", prefill_engine_num_gpu=1, elastic_ep_max_dp=40)
    planner = ElasticPlanner(config=cfg, profile=PROFILE)
    cost = request_gpu_seconds(
        "decode", PROFILE, isl=ISL, osl=OSL, itl_ms=100.0, interval_s=INTERVAL
    )
    rate = 14.0 / cost.gpu_seconds  # 14 ranks' worth: DP 16 carries the rate alone

    decision = steady_then(planner, rate, current_dp=16, excess=BACKLOG)

    d = decision.diagnostics
    assert d.backlog_requests == pytest.approx(BACKLOG)
    assert d.ranks_needed == math.ceil((rate + BACKLOG / 60.0) * cost.gpu_seconds - 1e-9)
    assert decision.reason is ElasticReason.SCALE_UP


def test_a_measured_pause_is_priced_and_a_contradiction_with_the_mode_is_named():
    """Issue 32, item 5: 60 s under NIXL EP means the engine does not run its all-to-all."""
    planner = ElasticPlanner(config=config(elastic_ep_mode="nixl"), profile=PROFILE)
    assert planner.pause_s(grow=True) == pytest.approx(0.82)

    warning = planner.observe_resize(grow=True, followers_ready_s=None, resize_s=95.0, pause_s=60.0)

    assert warning is not None
    assert "a grow paused serving 60.0 s, but elastic_ep_mode nixl_ep plans 0.8 s" in warning
    assert "--all2all-backend nixl_ep" in warning
    assert planner.pause_s(grow=True) == pytest.approx(60.0)
    assert (
        planner.observe_resize(grow=False, followers_ready_s=None, resize_s=3, pause_s=2.0) is None
    )


def test_the_engines_shrink_floor_bounds_the_shrink():
    """Issue 32, item 5: vLLM refused DP 16 ("minimum is 18"): the next shrink stops on the
    grid at or above it."""
    planner = ElasticPlanner(
        config=config(
            elastic_ep_mode="nixl", elastic_ep_shrink_abort_budget=1e9, elastic_ep_max_dp=24
        ),
        profile=PROFILE,
    )
    planner.observe_min_dp(18)

    decision = steady(planner, 0.0, current_dp=24, until_s=1500.0)

    assert (decision.reason, decision.target_dp) == (ElasticReason.SCALE_DOWN, 20)
