"""Each named decision rule as a table: situation -> value, and the reason it gives."""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import pytest

from disagg_planner.core.arrival import burst_factor, within_envelope
from disagg_planner.core.feedback import servable_quantile
from disagg_planner.core.rules import (
    LengthSample,
    RateSample,
    RuleValue,
    arrival_envelope,
    backlog_replica_cap,
    backlog_tokens,
    burst_memory,
    burst_ratios,
    length_mix,
    pooled_lengths,
    rising_trend,
    scale_down_allowed,
    slo_at_risk,
    time_to_ready,
    trend_within_peak,
)
from disagg_planner.core.sizing import histogram_scv
from disagg_planner.core.types import Histogram, histogram_quantile, histogram_share_above
from disagg_planner.profiles.queueing import (
    max_utilisation,
    pooled_need,
    pooled_offered_capacity,
    pooled_servers_needed,
    pooled_wait_tail_probability,
)


def _quarter_sine(k: int) -> float:
    """15 s window k of a rise slowing towards its peak: 12 -> 40 req/s over 180 s."""
    return 10.0 + 30.0 * math.sin(math.pi / 360.0 * (15 * k + 7.5))


def _noisy_rise(k: int) -> float:
    """15 s window k of a steady rise of 2 req/s per window with +-1 req/s of noise."""
    return 10.0 + 2 * k + (1.0 if k % 2 else -1.0)


def _numpy_line_at(rate: Callable[[int], float], windows: range, t: float) -> float:
    """numpy's least-squares line through the windows' midpoints (15 s windows), at ``t``:
    the rule's projection, computed independently of it."""
    mids = [15.0 * k + 7.5 for k in windows]
    return float(np.polyval(np.polyfit(mids, [rate(k) for k in windows], 1), t))


@dataclass(frozen=True)
class Row:
    name: str
    rule: Any
    kwargs: dict[str, Any]
    value: float
    reason: str  # a part of the reason


def falling_thpt(isl: float) -> float:
    """40k tokens/s/GPU up to 4096 tokens, then falling as 1/ISL (attention-bound)."""
    return 40_000.0 if isl <= 4096 else 40_000.0 * 4096 / isl


def windows(*spans: tuple[float, int], start_s: float = 0.0) -> list[RateSample]:
    """15 s windows: ``(rate, count)`` spans one after another from ``start_s``."""
    out: list[RateSample] = []
    end = start_s
    for rate, count in spans:
        for _ in range(count):
            end += 15.0
            out.append(RateSample(end, rate, 15.0))
    return out


# quiet at 4 req/s for 10 min, a burst at 25 for 3 min, quiet again for 10 min (ends 1380 s)
ON_OFF = windows((4.0, 40), (25.0, 12), (4.0, 40))

# 90 prompts around 2.5k, 10 around 35k (bucket midpoints), 5 past the last bound
MIXED = Histogram(bounds=(1024.0, 4096.0, 65536.0), counts=(0.0, 90.0, 10.0), overflow=5.0)

ROWS = [
    Row(
        "time-to-ready: measured wins",
        time_to_ready,
        {"measured_s": 75.0, "configured_s": 120.0},
        75.0,
        "75 s (measured)",
    ),
    Row(
        "time-to-ready: configured until measured",
        time_to_ready,
        {"measured_s": None, "configured_s": 120.0},
        120.0,
        "configured, not measured",
    ),
    Row(
        "envelope: rising rate sized for when capacity serves",
        arrival_envelope,
        {"observed_rate": 10.0, "forecast_rate": 20.0, "interval_s": 60.0, "time_to_ready_s": 30.0},
        # r(t) = 20 + (10/60)(t - 30): at t = 30 + 60 = 90 s it is 30 req/s
        30.0,
        "upper envelope",
    ),
    Row(
        "envelope: growth capped at twice the larger rate",
        arrival_envelope,
        {"observed_rate": 1.0, "forecast_rate": 10.0, "interval_s": 60.0, "time_to_ready_s": 600.0},
        20.0,
        "upper envelope",
    ),
    Row(
        "envelope: falling rate keeps the forecast",
        arrival_envelope,
        {
            "observed_rate": 30.0,
            "forecast_rate": 20.0,
            "interval_s": 60.0,
            "time_to_ready_s": 120.0,
        },
        20.0,
        "no rising trend",
    ),
    Row("burst: off", burst_factor, {"ratios": [3.0] * 20, "quantile": None}, 1.0, "off"),
    Row(
        "burst: too few windows",
        burst_factor,
        {"ratios": [3.0] * 3, "quantile": 0.9},
        1.0,
        "3 short windows",
    ),
    Row(
        "burst: upper quantile of the ratios",
        burst_factor,
        {"ratios": [1.0] * 8 + [2.0, 4.0], "quantile": 0.9},
        2.0,
        "p90 of 10",
    ),
    Row(
        "burst: never below 1",
        burst_factor,
        {"ratios": [0.5] * 10, "quantile": 0.9},
        1.0,
        "burst factor 1.00",
    ),
    Row(
        "burst envelope: a rise the envelope covers leaves no burst factor on top",
        within_envelope,
        {
            "burst": RuleValue(1.2, "burst factor 1.20"),
            "forecast_req": 100.0,
            "envelope_req": 130.0,
        },
        1.0,
        "1.00 beyond the envelope",
    ),
    Row(
        "burst envelope: the part of the burst peak above the envelope",
        within_envelope,
        {
            "burst": RuleValue(1.32, "burst factor 1.32"),
            "forecast_req": 100.0,
            "envelope_req": 110.0,
        },
        1.2,
        "1.20 beyond the envelope",
    ),
    Row(
        "burst envelope: no rise, the burst factor stands",
        within_envelope,
        {
            "burst": RuleValue(1.3, "burst factor 1.30"),
            "forecast_req": 100.0,
            "envelope_req": 100.0,
        },
        1.3,
        "burst factor 1.30",
    ),
    Row(
        "burst memory: off",
        burst_memory,
        {"samples": ON_OFF, "now_s": 1380.0, "time_to_ready_s": 120.0, "memory_s": None},
        0.0,
        "burst memory off",
    ),
    Row(
        "burst memory: a rise faster than time-to-ready keeps the peak after it ends",
        burst_memory,
        {"samples": ON_OFF, "now_s": 1380.0, "time_to_ready_s": 120.0, "memory_s": 1800.0},
        25.0,
        "rose more than 2x from 4.0 req/s within 120 s (time-to-ready), the last such rise 645 s "
        "ago: "
        "capacity kept for "
        "the peak 25.0 req/s",
    ),
    Row(
        "burst memory: forgotten once the last fast rise is older than the memory",
        burst_memory,
        {"samples": ON_OFF, "now_s": 1380.0, "time_to_ready_s": 120.0, "memory_s": 600.0},
        0.0,
        "no rise faster than time-to-ready 120 s in the last 600 s",
    ),
    Row(
        "burst memory: a rise slower than time-to-ready is the envelope's, not a burst",
        burst_memory,
        # 4 -> 25 req/s in steps of 0.35 req/s per 15 s window: 1.5x within 120 s
        {
            "samples": [RateSample(15.0 * (k + 1), 4.0 + 0.35 * k, 15.0) for k in range(61)],
            "now_s": 915.0,
            "time_to_ready_s": 120.0,
            "memory_s": 1800.0,
        },
        0.0,
        "no rise faster",
    ),
    Row(
        "burst memory: a tripling at a low rate is Poisson noise, not a burst",
        burst_memory,
        # 7.5 -> 22.5 requests in 15 s: 15 more, under 3 deviations (sqrt(30) = 5.5)
        {
            "samples": windows((0.5, 20), (1.5, 1), (0.5, 20)),
            "now_s": 615.0,
            "time_to_ready_s": 120.0,
            "memory_s": 1800.0,
        },
        0.0,
        "no rise faster",
    ),
    Row(
        "burst memory: a longer start-up makes a slower rise one it cannot follow",
        burst_memory,
        {
            "samples": [RateSample(15.0 * (k + 1), 4.0 + 0.35 * k, 15.0) for k in range(61)],
            "now_s": 915.0,
            "time_to_ready_s": 300.0,
            "memory_s": 1800.0,
        },
        # the last minute's rate: the mean of its four windows
        4.0 + 0.35 * 58.5,
        "within 300 s (time-to-ready)",
    ),
    Row(
        "backlog: FPM's queued prefill tokens first",
        backlog_tokens,
        {
            "in_flight": 500.0,
            "arrival_rate": 10.0,
            "slo_request_s": 5.0,
            "isl": 1000.0,
            "queued_prefill_tokens": 42000.0,
        },
        42000.0,
        "(FPM)",
    ),
    Row(
        "backlog: in flight beyond an SLO-meeting rate",
        backlog_tokens,
        {"in_flight": 80.0, "arrival_rate": 10.0, "slo_request_s": 5.0, "isl": 1000.0},
        30000.0,
        "backlog 30 requests",
    ),
    Row(
        "backlog: none when the in-flight count is what the rate explains",
        backlog_tokens,
        {"in_flight": 40.0, "arrival_rate": 10.0, "slo_request_s": 5.0, "isl": 1000.0},
        0.0,
        "no backlog",
    ),
    Row(
        "backlog: not measured",
        backlog_tokens,
        {"in_flight": None, "arrival_rate": 10.0, "slo_request_s": 5.0, "isl": 1000.0},
        0.0,
        "no backlog measured",
    ),
    Row(
        "backlog cap: no more replicas for a backlog than the engines it waits on",
        backlog_replica_cap,
        {"role": "prefill", "with_backlog": 21, "without_backlog": 4, "holding": 2},
        6.0,
        "prefill: 6, not 21: the backlog waits on the 2 ready engine(s)",
    ),
    Row(
        "backlog cap: within it, the backlog's replicas stand",
        backlog_replica_cap,
        {"role": "prefill", "with_backlog": 5, "without_backlog": 3, "holding": 4},
        5.0,
        "",
    ),
    Row(
        "trend: a steady rise over the short windows is extrapolated to when capacity serves",
        rising_trend,
        {
            # 12 windows of 15 s, 10 -> 21 req/s: +4 req/s per minute
            "samples": [RateSample(15.0 * (k + 1), 10.0 + k, 15.0) for k in range(12)],
            "now_s": 180.0,
            "span_s": 180.0,
            "reach_s": 60.0,
        },
        # the line through the midpoints (7.5 .. 172.5 s) at 240 s: 10 + (240 - 7.5) / 15
        10.0 + (240.0 - 7.5) / 15.0,
        "rate rising +4.00 req/s per minute",
    ),
    Row(
        "trend: at most twice the last minute's rate",
        rising_trend,
        {
            "samples": [RateSample(15.0 * (k + 1), 10.0 + k, 15.0) for k in range(12)],
            "now_s": 180.0,
            "span_s": 180.0,
            "reach_s": 3600.0,
        },
        2 * (18.0 + 19.0 + 20.0 + 21.0) / 4,
        "sized for 39.00 req/s",
    ),
    Row(
        "trend: a rise slowing towards its peak is projected at its later half's slope",
        rising_trend,
        {
            # a quarter sine, 12 -> 40 req/s over 180 s: the full line reaches 55 req/s at
            # 240 s, the line through the later six windows 47
            "samples": [RateSample(15.0 * (k + 1), _quarter_sine(k), 15.0) for k in range(12)],
            "now_s": 180.0,
            "span_s": 180.0,
            "reach_s": 60.0,
        },
        _numpy_line_at(_quarter_sine, range(6, 12), 240.0),
        "rate rising",
    ),
    Row(
        "trend: Poisson noise of a flat stream is no trend",
        rising_trend,
        {
            "samples": [
                RateSample(15.0 * (k + 1), 4.0 + (0.4 if k % 3 == 0 else -0.2) + 0.02 * k, 15.0)
                for k in range(12)
            ],
            "now_s": 180.0,
            "span_s": 180.0,
            "reach_s": 135.0,
        },
        0.0,
        "no significant rate trend",
    ),
    Row(
        "trend: a step 2 min back, level since, is no trend (the line overshoots the level)",
        rising_trend,
        {
            "samples": [
                RateSample(15.0 * (k + 1), 8.0 if k < 4 else 40.0, 15.0) for k in range(12)
            ],
            "now_s": 180.0,
            "span_s": 180.0,
            "reach_s": 135.0,
        },
        0.0,
        "the rate stepped from 8.00 to 40.00 req/s 120 s ago",
    ),
    Row(
        "trend: a step 30 s back is no trend (two levels fit better than a line)",
        rising_trend,
        {
            "samples": [
                RateSample(15.0 * (k + 1), 8.0 if k < 10 else 40.0, 15.0) for k in range(12)
            ],
            "now_s": 180.0,
            "span_s": 180.0,
            "reach_s": 135.0,
        },
        0.0,
        "the rate stepped from 8.00 to 40.00 req/s 30 s ago",
    ),
    Row(
        "trend: a noisy steady rise is still a trend, not a step",
        rising_trend,
        {
            # 10 -> 32 req/s over 12 windows with +-1 req/s of noise
            "samples": [RateSample(15.0 * (k + 1), _noisy_rise(k), 15.0) for k in range(12)],
            "now_s": 180.0,
            "span_s": 180.0,
            "reach_s": 60.0,
        },
        # the least-squares line through the midpoints, at 240 s (the noise tilts it a little)
        _numpy_line_at(_noisy_rise, range(12), 240.0),
        "rate rising",
    ),
    Row(
        "trend: no window in the last minute (stale samples) is no trend",
        rising_trend,
        {
            "samples": [RateSample(15.0 * (k + 1), 10.0 + 2 * k, 15.0) for k in range(8)],
            "now_s": 185.0,
            "span_s": 180.0,
            "reach_s": 135.0,
        },
        0.0,
        "no short window in the last minute",
    ),
    Row(
        "trend: too few short windows",
        rising_trend,
        {
            "samples": [RateSample(60.0 * (k + 1), 10.0 * (k + 1), 60.0) for k in range(3)],
            "now_s": 180.0,
            "span_s": 180.0,
            "reach_s": 135.0,
        },
        0.0,
        "no rate trend (3 short windows)",
    ),
    Row(
        "down: refused within one time-to-ready of a scale-up",
        scale_down_allowed,
        {"now_s": 200.0, "last_scale_up_s": 150.0, "time_to_ready_s": 120.0},
        0.0,
        "50 s after a scale-up",
    ),
    Row(
        "down: allowed once the scale-up had its time",
        scale_down_allowed,
        {"now_s": 300.0, "last_scale_up_s": 150.0, "time_to_ready_s": 120.0},
        1.0,
        "",
    ),
    Row(
        "risk: TTFT tail above target",
        slo_at_risk,
        {
            "ttft_tail_ms": 900.0,
            "ttft_target_ms": 500.0,
            "itl_ms": 10.0,
            "itl_target_ms": 20.0,
            "excess_in_flight": 0.0,
        },
        1.0,
        "TTFT tail 900 ms > 500 ms",
    ),
    Row(
        "risk: requests piling up",
        slo_at_risk,
        {
            "ttft_tail_ms": 100.0,
            "ttft_target_ms": 500.0,
            "itl_ms": 10.0,
            "itl_target_ms": 20.0,
            "excess_in_flight": 12.0,
        },
        1.0,
        "12 requests waiting",
    ),
    Row(
        "risk: none",
        slo_at_risk,
        {
            "ttft_tail_ms": 100.0,
            "ttft_target_ms": 500.0,
            "itl_ms": 10.0,
            "itl_target_ms": 20.0,
            "excess_in_flight": 0.0,
        },
        0.0,
        "not at risk",
    ),
    Row(
        "length mix: long prompts cost more than their mean says",
        length_mix,
        # mean 5785.6; (0.9 x 2560 / 40k + 0.1 x 34816 / thpt(34816)) / (5785.6 / thpt(5785.6));
        # the 5 prompts past 65536 are left out (the engine refuses them)
        {"histogram": MIXED, "thpt_per_gpu": falling_thpt},
        3.9032030699349987,
        "prompt-length mix 3.90 (prefill work of the observed ISLs over that of their mean 5786)",
    ),
    Row(
        "length mix: one length is its mean",
        length_mix,
        {
            "histogram": Histogram(bounds=(1024.0, 4096.0), counts=(0.0, 40.0)),
            "thpt_per_gpu": falling_thpt,
        },
        1.0,
        "prompt-length mix 1.00",
    ),
    Row(
        "length mix: off",
        length_mix,
        {"histogram": MIXED, "thpt_per_gpu": falling_thpt, "enabled": False},
        1.0,
        "prompt-length mix off (sized at the mean ISL)",
    ),
    Row(
        "length mix: no histogram yet",
        length_mix,
        {"histogram": None, "thpt_per_gpu": falling_thpt},
        1.0,
        "no ISL histogram yet",
    ),
    Row(
        "length mix: the profile has no throughput at some length",
        length_mix,
        {"histogram": MIXED, "thpt_per_gpu": lambda isl: 0.0 if isl > 30_000 else 1e4},
        1.0,
        "the profile has no throughput at some ISL",
    ),
]


@pytest.mark.parametrize("row", ROWS, ids=[r.name for r in ROWS])
def test_rule(row: Row) -> None:
    result = row.rule(**row.kwargs)
    assert result.value == pytest.approx(row.value)
    assert row.reason in result.reason


def test_histogram_quantile_interpolates_within_the_bucket() -> None:
    hist = Histogram(bounds=(0.1, 0.5, 1.0), counts=(50.0, 40.0, 10.0))
    assert histogram_quantile(hist, 0.5) == pytest.approx(0.1)
    assert histogram_quantile(hist, 0.95) == pytest.approx(0.75)
    assert histogram_quantile(Histogram(bounds=(0.1,), counts=(0.0,)), 0.5) is None


@pytest.mark.parametrize("offered", [4.0, 8.0, 16.0])
def test_pooled_engines_run_busier_than_separate_ones_for_the_same_tail(offered: float) -> None:
    slack, service = 0.4, 0.05
    pooled = pooled_servers_needed(offered, slack_s=slack, service_s=service, quantile=0.99)
    separate = offered / max_utilisation(slack_s=slack, service_s=service, quantile=0.99)
    assert offered < pooled < separate
    # one engine is exactly the GI/G/1 case
    assert pooled_servers_needed(0.3, slack_s=slack, service_s=service, quantile=0.99) == 1


@pytest.mark.parametrize("servers", [1, 2, 5, 12])
def test_pooled_capacity_is_the_most_load_those_engines_carry_at_the_tail(servers: int) -> None:
    slack, service = 0.4, 0.05
    cap = pooled_offered_capacity(servers, slack_s=slack, service_s=service, quantile=0.99)
    assert 0 < cap < servers
    tail = {
        load: pooled_wait_tail_probability(servers, load, wait_s=slack, service_s=service)
        for load in (cap * 0.999, cap * 1.001)
    }
    assert tail[cap * 0.999] <= 0.01 < tail[cap * 1.001]
    assert pooled_servers_needed(cap * 0.999, slack_s=slack, service_s=service, quantile=0.99) == (
        servers
    )
    assert pooled_offered_capacity(0, slack_s=slack, service_s=service, quantile=0.99) == 0.0


def test_the_pooled_need_grows_continuously_and_rounds_up_to_the_engines_needed() -> None:
    """A need just past a replica boundary reads as just past it, not as the engine it rounds
    up to: the HPA's tolerance can then hold a pooled prefill as it holds any other role."""
    slack, service = 0.4, 0.05
    loads = [0.05 * k for k in range(1, 200)]
    needs = [pooled_need(a, slack_s=slack, service_s=service, quantile=0.99) for a in loads]
    for load, need in zip(loads, needs, strict=True):
        engines = pooled_servers_needed(load, slack_s=slack, service_s=service, quantile=0.99)
        assert math.ceil(need - 1e-9) == engines
    assert all(b > a for a, b in itertools.pairwise(needs))
    assert max(b - a for a, b in itertools.pairwise(needs)) < 0.2  # no jump of an engine
    # at what two engines carry the need is 2; a little more is a little over 2
    two = pooled_offered_capacity(2, slack_s=slack, service_s=service, quantile=0.99)
    assert pooled_need(two, slack_s=slack, service_s=service, quantile=0.99) == pytest.approx(2.0)
    just_over = pooled_need(two * 1.01, slack_s=slack, service_s=service, quantile=0.99)
    assert 2.0 < just_over < 2.1
    assert pooled_need(0.0, slack_s=slack, service_s=service, quantile=0.99) == 0.0


def test_pooled_lengths_weigh_each_window_by_its_requests() -> None:
    pooled = pooled_lengths(
        [LengthSample(540, 3000, 300), LengthSample(60, 30000, 200), LengthSample(0, 9e9, 9e9)]
    )
    assert pooled is not None
    isl, osl, reason = pooled
    assert isl == pytest.approx((540 * 3000 + 60 * 30000) / 600)
    assert osl == pytest.approx((540 * 300 + 60 * 200) / 600)
    assert "pooled over 600 requests of the last 3 window(s)" in reason
    assert pooled_lengths([LengthSample(0, 100, 10)]) is None
    assert pooled_lengths([]) is None


@pytest.mark.parametrize(
    ("value", "share"),
    [
        (0.0, 1.0),  # every observation is above nothing
        (50.0, 0.8),  # halfway through the (0, 100] bucket of 40: 20 below
        (100.0, 0.6),  # the bucket's bound: its 40 below
        (150.0, 0.35),  # halfway through (100, 200] of 50: 25 more below
        (200.0, 0.1),  # only the overflow above the last bound
        (250.0, 0.0),  # beyond the last bound the overflow cannot say: not counted
    ],
)
def test_histogram_share_above_interpolates_within_the_bucket(value: float, share: float) -> None:
    hist = Histogram(bounds=(100.0, 200.0), counts=(40.0, 50.0), overflow=10.0)
    assert histogram_share_above(hist, value) == pytest.approx(share)


def test_histogram_share_above_an_empty_histogram_is_zero() -> None:
    assert histogram_share_above(Histogram(bounds=(1.0,), counts=(0.0,)), 0.5) == 0.0


@pytest.mark.parametrize(
    ("unservable", "quantile", "says"),
    [
        (0.0, 0.99, ""),  # every prompt can meet the SLO: the configured quantile
        (0.02, 0.99 * 0.98, "2.0% of the prompts (over 80000 tokens)"),
        (0.7, 0.5, "read at p50"),  # most prompts cannot: no lower than the median
        (float("nan"), 0.99, ""),  # no share measured: the configured quantile
    ],
)
def test_servable_quantile_reads_the_tail_among_the_prompts_that_can_meet_the_slo(
    unservable: float, quantile: float, says: str
) -> None:
    rule = servable_quantile(0.99, unservable_share=unservable, max_isl=80000)
    assert rule.value == pytest.approx(quantile)
    assert says in rule.reason and bool(rule.reason) == bool(says)


def _mean(rates: list[RateSample]) -> float:
    return sum(r.rate for r in rates) / len(rates)


# one 180 s interval of 15 s windows (12 of them), each a case of what the burst factor reads
RISE = windows(*((20.0 + 2.0 * k, 1) for k in range(12)))  # 20 -> 42 req/s, steadily
SPIKE = windows((10.0, 6), (30.0, 1), (10.0, 5))  # flat, one window at 3x
STEP = windows((10.0, 6), (30.0, 6))  # a level, then another
STEP_BURST = windows((10.0, 6), (30.0, 3), (36.0, 1), (30.0, 2))  # a burst on the new level
SHORT_RISE = windows(*((20.0 + 2.0 * k, 1) for k in range(5)))  # too few windows for a line


@pytest.mark.parametrize(
    ("name", "rates", "highest"),
    [
        # a steady rise is the forecast's and the rising trend's: over the line, no window
        # is a burst (over the mean, its last window read 1.35: a sinusoid's peak interval)
        ("a steady rise is no burst", RISE, 1.0),
        # a burst in a flat interval keeps its ratio over the mean (no significant trend)
        ("a burst over a flat rate", SPIKE, 30.0 / _mean(SPIKE)),
        # a step is a level the rate holds (two levels fit it better than a line), which the
        # tick sizes for once the windows hold it: read over its levels, not the mean
        ("a step is no burst", STEP, 1.0),
        ("a burst after a step is read over the new level", STEP_BURST, 36.0 / 31.0),
        # fewer windows than a trend is fitted over: over the mean
        ("too few windows for a trend", SHORT_RISE, 28.0 / _mean(SHORT_RISE)),
    ],
)
def test_burst_ratios_read_bursts_over_the_interval_s_trend(
    name: str, rates: list[RateSample], highest: float
) -> None:
    ratios = burst_ratios(rates, _mean(rates))
    assert len(ratios) == len(rates)
    assert max(ratios) == pytest.approx(highest, rel=1e-9), name


def test_burst_ratios_without_traffic_are_none() -> None:
    assert burst_ratios(RISE, 0.0) == []


def test_the_queueing_headroom_sees_the_variability_of_the_prefill_work_not_of_the_lengths() -> (
    None
):
    """A prompt's service time is its prefill work, ``isl / thpt(isl)``, which grows faster
    than its length where attention dominates: the work of the MIXED prompts varies more
    than their lengths do, and the prompts past the last bucket (the engine refuses them)
    take no service at all."""
    work = histogram_scv(MIXED, work=lambda isl: isl / falling_thpt(isl))
    # bucket midpoints 2560 (90) and 34816 (10): work 0.064 s and 34816^2/(40k x 4096)
    points = [(2560 / 40_000.0, 90.0), (34816.0**2 / (40_000.0 * 4096), 10.0)]
    mean = sum(x * w for x, w in points) / 100.0
    expected = sum(w * (x - mean) ** 2 for x, w in points) / 100.0 / mean**2
    lengths = histogram_scv(replace(MIXED, overflow=0.0))
    assert work == pytest.approx(expected)
    assert lengths is not None and work is not None and work > 2 * lengths
    assert histogram_scv(MIXED, work=lambda isl: 0.0) is None  # no throughput: no estimate


@pytest.mark.parametrize(
    ("rate", "value", "says"),
    [
        # under the earlier peak: the rise is expected to end there
        (40.0, 45.0, "capped at 45.00 req/s, the highest rate of the last 1800 s, which the rise"),
        # at the peak's level again (within 10 % above it): sized for the rate, not the line
        (47.0, 47.0, "capped at the rate 47.00 req/s: the highest of the last 1800 s was 45.00"),
        # more than 10 % above it: a new level, the trend stands
        (50.0, 60.0, ""),
    ],
)
def test_a_rising_trend_is_capped_at_an_earlier_peak_until_the_rate_passes_it(
    rate: float, value: float, says: str
) -> None:
    trend = RuleValue(60.0, "rate rising")
    capped = trend_within_peak(trend, rate=rate, peak=45.0, span_s=1800.0)
    assert (capped.value, says in capped.reason) == (value, True), capped.reason
    if not says:
        assert capped is trend
