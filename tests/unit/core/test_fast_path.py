"""The throughput loop's new rules at planner level, as a table: the fast path between ticks,
the scale-down guard after a scale-up, sizing for when capacity arrives."""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import pytest

from disagg_planner.config import PlannerConfig
from disagg_planner.core.fast_check import fast_check
from disagg_planner.core.sizing import LoadForecast, fractional_need
from disagg_planner.core.throughput import ThroughputPlanner
from disagg_planner.core.types import (
    Histogram,
    MissingObservation,
    ThroughputReason,
    TrafficObservation,
)
from disagg_planner.predictors import make_predictors
from disagg_planner.profiles import Profile
from tests.unit.core.test_throughput import planner, status, traffic

# TTFT histogram bounds are seconds, as the frontend exports them
FAST_TTFT = Histogram(bounds=(0.1, 0.5, 1.0, 5.0), counts=(90.0, 10.0, 0.0, 0.0))
SLOW_TTFT = Histogram(bounds=(0.1, 0.5, 1.0, 5.0), counts=(10.0, 10.0, 20.0, 60.0))
# p99 at 0.1 s: a fifth of the 500 ms SLO (FAST_TTFT's p99 is 0.46 s, 92% of it)
CALM_TTFT = Histogram(bounds=(0.1, 0.5, 1.0, 5.0), counts=(99.5, 0.5, 0.0, 0.0))


def recent(
    rate: float, ttft: Histogram, *, in_flight: float | None = None, isl: float = 3000
) -> TrafficObservation:
    return TrafficObservation(
        end_s=75.0,
        duration_s=15.0,
        num_req=rate * 15,
        isl=isl,
        osl=300,
        itl_ms=10.0,
        ttft_histogram=ttft,
        in_flight=in_flight,
    )


@dataclass(frozen=True)
class FastRow:
    name: str
    observed: TrafficObservation | MissingObservation
    current: tuple[int, int]
    reason: ThroughputReason
    prefill: int | None  # the target's prefill replicas; None: no change
    says: str


FAST_ROWS = [
    FastRow(
        "SLO at risk: up at once by what the observed demand needs, not +1",
        recent(80.0, SLOW_TTFT),
        (1, 1),
        ThroughputReason.SCALE,
        7,
        "TTFT tail",
    ),
    FastRow(
        "SLO not at risk: nothing changes",
        recent(80.0, FAST_TTFT),
        (8, 8),
        ThroughputReason.NO_CHANGE,
        None,
        "not at risk",
    ),
    FastRow(
        "at risk but the replicas cover the demand: no change, said so",
        recent(5.0, SLOW_TTFT),
        (4, 4),
        ThroughputReason.NO_CHANGE,
        None,
        "cover",
    ),
    FastRow(
        "requests piling up: the backlog is sized for too",
        recent(10.0, FAST_TTFT, in_flight=2000.0),
        (2, 1),
        ThroughputReason.SCALE,
        4,
        "backlog",
    ),
    FastRow(
        "a backlog on one engine: at most one replica more for it (the queue stays there)",
        recent(10.0, FAST_TTFT, in_flight=2000.0),
        (1, 1),
        ThroughputReason.SCALE,
        3,
        "prefill: 3, not 4: the backlog waits on the 1 ready engine(s)",
    ),
    FastRow(
        "no traffic data: hold",
        MissingObservation("prometheus_unreachable"),
        (1, 1),
        ThroughputReason.NO_TRAFFIC_DATA,
        None,
        "holding",
    ),
]


@pytest.mark.parametrize("row", FAST_ROWS, ids=[r.name for r in FAST_ROWS])
def test_fast_path(h200_like_profile: Profile, row: FastRow) -> None:
    tp = planner(h200_like_profile)
    decision = fast_check(tp, 75.0, row.observed, status(*row.current))
    assert decision.reason == row.reason, decision.message
    assert row.says in decision.message
    if row.prefill is None:
        assert decision.replicas is None
    else:
        assert decision.replicas is not None
        assert decision.replicas["prefill"] == row.prefill, decision.message
        # never below what is there
        assert decision.replicas["decode"] >= row.current[1]


def test_the_fast_path_never_scales_down(h200_like_profile: Profile) -> None:
    tp = planner(h200_like_profile)
    decision = fast_check(tp, 75.0, recent(80.0, SLOW_TTFT), status(20, 20))
    assert decision.replicas is None


def test_time_to_ready_is_measured_from_the_planners_own_scale_up(
    h200_like_profile: Profile,
) -> None:
    tp = planner(h200_like_profile, replica_startup_seconds=300)
    # both tails over their SLOs: both roles scale up (each is measured)
    both_slow = replace(recent(80.0, SLOW_TTFT), itl_ms=40.0)
    up = fast_check(tp, 75.0, both_slow, status(1, 1))
    assert up.replicas is not None
    p, d = up.replicas["prefill"], up.replicas["decode"]
    # still starting: the configured start-up stands
    fast_check(tp, 90.0, recent(80.0, FAST_TTFT), status(p, d, ready_p=1, ready_d=1))
    assert "300 s (configured" in tp.time_to_ready("prefill").reason
    # ready at 120 s: 45 s measured, and the next decisions size with it
    fast_check(tp, 120.0, recent(80.0, FAST_TTFT), status(p, d))
    assert tp.time_to_ready("prefill").value == 45.0
    later = tp.tick(180.0, traffic(180, 4800), status(p, d))
    assert "time-to-ready 45 s (measured)" in later.message


def test_a_rising_rate_is_sized_for_when_capacity_serves(h200_like_profile: Profile) -> None:
    """A trend-following forecast: the envelope extends the trend over
    [t + time-to-ready, t + time-to-ready + interval]."""

    def decide(counts: list[float]) -> tuple[float, str]:
        tp = ThroughputPlanner(
            config=PlannerConfig(
                throughput_adjustment_interval_seconds=60,
                max_gpu_budget=-1,
                itl_ms=30,
                load_predictor="kalman",
            ),
            profile=h200_like_profile,
            predictor_factory=lambda series: make_predictors("kalman", series, kalman_min_points=3),
        )
        decision = None
        for k, n in enumerate(counts, start=1):
            decision = tp.tick(60.0 * k, traffic(60 * k, n), status(1, 1))
        assert decision is not None and decision.diagnostics.forecast is not None
        assert decision.diagnostics.sized_for is not None
        ratio = decision.diagnostics.sized_for.num_req / decision.diagnostics.forecast.num_req
        return ratio, decision.message

    rising, said = decide([600, 1200, 1800, 2400, 3000, 3600])
    assert rising > 1.2 and "upper envelope" in said
    flat, said = decide([3000] * 6)
    assert flat == pytest.approx(1.0) and "no rising trend" in said


def test_fast_windows_give_the_burst_factor(h200_like_profile: Profile) -> None:
    tp = planner(h200_like_profile, burst_quantile=0.9)
    # four 15 s windows per 60 s interval: one of them at 3x the interval's mean
    for tick in range(1, 4):
        for k, rate in enumerate((0.5, 0.5, 0.5, 2.5)):
            end = tick * 60 - 45 + 15 * k
            fast_check(tp, end, recent(rate * 10, FAST_TTFT), status(4, 4))
        decision = tp.tick(tick * 60, traffic(tick * 60, 600), status(4, 4))
    assert "burst factor 2.50" in decision.message


def test_a_rate_rising_through_its_interval_is_no_burst(h200_like_profile: Profile) -> None:
    # a 180 s interval of twelve 15 s windows rising steadily from 20 to 42 req/s (a
    # sinusoid's climb): read over the interval's mean its last windows are 1.35x, a burst
    # factor the sizing would add on top of the forecast; over the trend they are none
    tp = planner(h200_like_profile, burst_quantile=0.9, throughput_adjustment_interval_seconds=180)
    for tick in range(1, 3):
        for k in range(12):
            end = (tick - 1) * 180 + 15 * (k + 1)
            window = replace(recent(20.0 + 2.0 * k, FAST_TTFT), end_s=end)
            fast_check(tp, end, window, status(4, 4))
        mean = sum(20.0 + 2.0 * k for k in range(12)) / 12
        decision = tp.tick(
            tick * 180, replace(traffic(tick * 180, mean * 180), duration_s=180), status(4, 4)
        )
    assert "burst factor 1.00" in decision.message


def replace_duration(obs: TrafficObservation, duration_s: float) -> TrafficObservation:
    """``obs`` over ``duration_s`` (its count unchanged)."""
    return replace(obs, duration_s=duration_s)


def short_window(end_s: float, rate: float, *, ttft: Histogram = FAST_TTFT) -> TrafficObservation:
    return TrafficObservation(
        end_s=end_s,
        duration_s=15.0,
        num_req=rate * 15,
        isl=3000,
        osl=300,
        itl_ms=10.0,
        ttft_histogram=ttft,
    )


def replay_rates(
    tp: ThroughputPlanner,
    rates: list[float],
    *,
    start_s: float = 0.0,
    slow_above: float = math.inf,
    served: Histogram = FAST_TTFT,
) -> dict:
    """Drive a planner with one rate per 15 s window (fast checks), a throughput tick every
    60 s, the deployment following each tick's decision at once; the last decision's
    replicas. Windows above ``slow_above`` req/s show a TTFT tail over the SLO (the
    deployment did not serve them within it), the others ``served``'s."""
    current = {"prefill": 1, "decode": 1}
    window: list[float] = []
    decision = None
    for k, rate in enumerate(rates, start=1):
        end = start_s + 15.0 * k
        ttft = SLOW_TTFT if rate > slow_above else served
        fast_check(tp, end, short_window(end, rate, ttft=ttft), status(*current.values()))
        window.append(rate)
        if k % 4 == 0:
            decision = tp.tick(end, traffic(end, sum(window) * 15), status(*current.values()))
            window = []
            if decision.replicas is not None:
                current = dict(decision.replicas)
    assert decision is not None
    return {"replicas": current, "decision": decision}


# quiet at 4 req/s for 10 min, a 3 min burst at 60 req/s, then quiet again for 7 min
BURSTS = [4.0] * 40 + [60.0] * 12 + [4.0] * 28


def test_the_burst_memory_keeps_capacity_for_the_recent_peak(h200_like_profile: Profile) -> None:
    """A burst that rose faster than time-to-ready (and that the one engine did not serve
    within the SLO): after it, the deployment stays sized for its peak, not for the quiet
    level, and the decision says why; with the rule off (and no scale-down stabilisation in
    either) it drops to the quiet need."""
    kept = replay_rates(
        planner(h200_like_profile, scale_down_stabilization_seconds=0), BURSTS, slow_above=10
    )
    dropped = replay_rates(
        planner(h200_like_profile, scale_down_stabilization_seconds=0, burst_memory_seconds=None),
        BURSTS,
    )
    assert dropped["replicas"]["prefill"] == 1
    assert kept["replicas"]["prefill"] >= 4
    assert "burst memory: the rate rose more than 2x from 4.0 req/s" in kept["decision"].message
    assert "the burst memory's" in kept["decision"].message


def test_a_burst_served_within_the_slo_keeps_what_served_it(h200_like_profile: Profile) -> None:
    """Issue 29, served calmly: the same burst, which the one engine served with its TTFT
    tail at a fifth of the SLO: the burst memory keeps the one replica seen serving the
    peak, not the four the profile sizes it at, and the decision says so."""
    out = replay_rates(
        planner(h200_like_profile, scale_down_stabilization_seconds=0), BURSTS, served=CALM_TTFT
    )
    assert out["replicas"]["prefill"] == 1
    assert "served calmly: prefill: 1 replica(s) served 180000 tok/s" in out["decision"].message
    assert "1 carry the burst memory's peak 180000 tok/s, not the profile's" in (
        out["decision"].message
    )


def test_a_burst_served_just_inside_the_slo_is_no_proof_for_the_next(
    h200_like_profile: Profile,
) -> None:
    """The same burst served with its TTFT tail at 92% of the SLO: not the calm a cut
    needs (the scale-down margin, 80%), so the burst memory keeps the profile's replicas for
    the next burst. On a held-out on/off trace (bursts of 24-48 req/s) one engine's window at
    96% of the SLO, 30 s before that burst breached, had lowered the floor to 1, and the next,
    larger burst found one engine."""
    out = replay_rates(planner(h200_like_profile, scale_down_stabilization_seconds=0), BURSTS)
    assert out["replicas"]["prefill"] >= 4
    assert "served calmly: prefill" not in out["decision"].message
    assert "burst memory: the rate rose more than 2x from 4.0 req/s" in out["decision"].message


def test_the_burst_memory_forgets_when_bursts_stop(h200_like_profile: Profile) -> None:
    tp = planner(h200_like_profile, scale_down_stabilization_seconds=0, burst_memory_seconds=600)
    # 12 min of quiet after the burst: its last fast rise is older than the memory
    out = replay_rates(tp, BURSTS + [4.0] * 20)
    assert out["replicas"]["prefill"] == 1
    assert "no rise faster than time-to-ready" in out["decision"].message


def test_the_fast_path_sizes_arrivals_at_the_lengths_pooled_since_the_last_tick(
    h200_like_profile: Profile,
) -> None:
    """A short window of long prompts (a heavy-tailed mix, or long prompts leaving a queue
    together) is pooled with the last interval's window: the arrivals are sized at the
    pooled mean, not at the window's; a planner that has seen no interval yet has only the
    window."""
    window = recent(20.0, SLOW_TTFT, isl=30000)  # 300 requests
    seen = planner(h200_like_profile)
    seen.tick(60.0, traffic(60, 1200, isl=3000), status(2, 2))
    pooled = fast_check(seen, 75.0, window, status(2, 2))
    alone = fast_check(planner(h200_like_profile), 75.0, window, status(2, 2))
    assert pooled.replicas is not None and alone.replicas is not None
    # (1200 x 3000 + 300 x 30000) / 1500
    assert "lengths ISL 8400 / OSL 300 pooled over 1500 requests of the last 2" in pooled.message
    assert "ISL 30000" in alone.message
    assert pooled.replicas["prefill"] < alone.replicas["prefill"]


def test_the_fast_check_sizes_a_steady_rise_for_when_its_order_serves(
    h200_like_profile: Profile,
) -> None:
    """SLO at risk while the short windows rise steadily: the fast check sizes for the rate a
    line through them reaches when its order serves (time-to-ready plus one check), not the
    window's own rate; on a flat stream at the same last rate it sizes for that rate. (After
    an opening interval at the first rate: the opening ramp is no trend.)"""

    def check(rates: list[float]) -> tuple[int, str]:
        tp = planner(h200_like_profile, throughput_adjustment_interval_seconds=180)
        rates = [rates[0]] * 12 + rates
        for k, rate in enumerate(rates[:-1], start=1):
            fast_check(tp, 15.0 * k, short_window(15.0 * k, rate), status(1, 1))
        end = 15.0 * len(rates)
        window = replace(short_window(end, rates[-1]), ttft_histogram=SLOW_TTFT)
        decision = fast_check(tp, end, window, status(1, 1))
        assert decision.replicas is not None, decision.message
        return decision.replicas["prefill"], decision.message

    rising, said = check([4.0 + 2.0 * k for k in range(12)])  # +8 req/s per minute
    assert "rate rising +8.00 req/s per minute" in said, said
    flat, said_flat = check([26.0] * 12)
    assert "no significant rate trend" in said_flat, said_flat
    assert rising > flat


def test_the_stabilisation_does_not_keep_replicas_ordered_for_a_backlog(
    h200_like_profile: Profile,
) -> None:
    """Replicas ordered to drain a backlog are kept while it lasts, not for the stabilisation
    window: the need it remembers is the arrivals'."""
    tp = planner(h200_like_profile, scale_down_stabilization_seconds=600)
    # started on one prefill engine (what it finds counts as a need for the window)
    assert tp.tick(60, traffic(60, 240), status(1, 1)).replicas == {"prefill": 1, "decode": 1}
    up = tp.tick(120, traffic(120, 240, in_flight=3000.0), status(2, 1))
    assert up.replicas is not None and up.replicas["prefill"] >= 3, up.message
    assert "backlog" in up.message
    p, d = up.replicas["prefill"], up.replicas["decode"]
    # three minutes on (past time-to-ready), the backlog drained: down to the arrivals' need
    drained = tp.tick(300, traffic(300, 240, in_flight=10.0), status(p, d))
    assert drained.replicas is not None and drained.replicas["prefill"] == 1, drained.message


@pytest.mark.parametrize(("calm", "floor"), [(True, 1), (False, 2)])
def test_a_burst_floor_within_the_tolerance_of_the_replicas_running_holds_them(
    h200_like_profile: Profile, calm: bool, floor: int
) -> None:
    """The burst memory's floor for a peak whose need is within the HPA's 10% tolerance of
    the replicas running (1.05 decode engines' worth, one running) holds them while the
    role's tail is calm, as the tick's own sizing does; with the tail past the scale-down
    margin the floor rounds the need up."""
    tp = planner(h200_like_profile, scale_down_stabilization_seconds=0)
    interval = tp.config.throughput_adjustment_interval_seconds
    gpus = {"prefill": 1, "decode": 1}

    def need(rate: float) -> float:
        forecast = LoadForecast(num_req=rate * interval, isl=3000, osl=300)
        return fractional_need(tp.sizer.size(forecast, gpus)["decode"])

    peak = 1.05 * 10.0 / need(10.0)  # the decode need is linear in the rate
    rates = [1.0] * 16 + [peak] * 8 + [1.0] * 4
    replay_rates(tp, rates)
    now = 15.0 * len(rates)
    quiet = LoadForecast(num_req=1.0 * interval, isl=3000, osl=300)
    memory, floors = tp.sizer.burst_floor(now, quiet, gpus, 1.0, 120.0)
    assert memory.value == pytest.approx(peak)
    assert floors["decode"].value == 2  # ceil(1.05): the floor without the replicas running
    _, floors = tp.sizer.burst_floor(
        now,
        quiet,
        gpus,
        1.0,
        120.0,
        current={"prefill": 4, "decode": 1},
        calm={"prefill": True, "decode": calm},
    )
    assert floors["decode"].value == floor
    held = "decode: a need of 1.05 replicas is within 10% of the 1 running"
    assert (held in floors["decode"].reason) == calm, floors["decode"].reason
