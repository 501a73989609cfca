"""The request rate a throughput tick sizes for: the upper envelope of the rate when the
capacity ordered now serves (:func:`disagg_planner.core.rules.arrival_envelope`, a line
through the last interval's mean and the forecast), unless the interval's own short windows
say the rise is over (:func:`level_when_settled`); and the bursts above it it sizes for
(:func:`burst_factor`, from :func:`disagg_planner.core.rules.burst_ratios`;
:func:`within_envelope`). No clock, no I/O.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from disagg_planner.core.rules import (
    BURST_SMOOTHING_S,
    MIN_TREND_WINDOWS,
    RateSample,
    RuleValue,
    arrival_envelope,
    rising_trend,
)

# Fewer short windows than this say nothing about bursts: the factor stays 1.
MIN_BURST_SAMPLES = 8


def tick_rate(
    samples: Sequence[RateSample],
    *,
    now_s: float,
    observed_rate: float,
    forecast_rate: float,
    interval_s: float,
    time_to_ready_s: float,
) -> RuleValue:
    """The rate to size for: the short windows' level where they say the rise is over
    (:func:`level_when_settled`, which may be under the forecast: a forecast fitted through
    a step runs on past it), else the envelope (never below the forecast). ``samples`` are
    the short windows seen (the fast checks')."""
    envelope = arrival_envelope(
        observed_rate=observed_rate,
        forecast_rate=forecast_rate,
        interval_s=interval_s,
        time_to_ready_s=time_to_ready_s,
    )
    if envelope.value <= forecast_rate:  # no rise between the means: nothing to overrule
        return envelope
    settled = level_when_settled(
        envelope,
        forecast_rate=forecast_rate,
        level=max(observed_rate, pooled_rate(samples, now_s=now_s, span_s=BURST_SMOOTHING_S)),
        trend=rising_trend(samples, now_s=now_s, span_s=interval_s, reach_s=time_to_ready_s),
        short_windows=sum(1 for s in samples if s.end_s > now_s - interval_s),
    )
    return settled if settled is not None else envelope


def pooled_rate(samples: Sequence[RateSample], *, now_s: float, span_s: float) -> float:
    """The arrival rate over the short windows that ended in the last ``span_s``, pooled
    (weighted by their durations); 0 without any."""
    recent = [s for s in samples if s.end_s > now_s - span_s and s.duration_s > 0]
    total = sum(s.duration_s for s in recent)
    return sum(s.rate * s.duration_s for s in recent) / total if total > 0 else 0.0


def level_when_settled(
    envelope: RuleValue,
    *,
    forecast_rate: float,
    level: float,
    trend: RuleValue,
    short_windows: int,
) -> RuleValue | None:
    """The rate to size for where the interval means rise (``envelope`` above the forecast:
    :func:`arrival_envelope`) but the last interval's own short windows say the rise is
    over (``trend``: :func:`rising_trend` over them, 0: a step or burst that came inside
    the interval and holds, or a peak): ``level``, the windows' rate where they hold now
    (the last :data:`BURST_SMOOTHING_S` pooled), and no less than the interval's mean
    behind it. None where the envelope stands: no rise between the means, the windows
    still rising, or too few of them to say (under :data:`MIN_TREND_WINDOWS`).

    Two interval means that straddle a step rise by the step, and the forecast fitted to
    them runs on past it; extrapolated one time-to-ready further they size for a rate the
    windows never showed (on/off bursts: 24.7 -> 30.0 req/s between means, sized for
    36.2 req/s, inside a burst that held at 25)."""
    if envelope.value <= forecast_rate or short_windows < MIN_TREND_WINDOWS or trend.value > 0:
        return None
    return RuleValue(
        level,
        f"sized for {level:.2f} req/s, the last short windows' level: the interval means "
        f"rise to a forecast {forecast_rate:.2f} req/s, but not the windows ({trend.reason})",
    )


def burst_factor(ratios: Sequence[float], quantile: float | None) -> RuleValue:
    """The ``quantile`` of short-window arrival rates relative to their interval's level
    (:func:`disagg_planner.core.rules.burst_ratios`; at least 1); 1 when off or with fewer than
    :data:`MIN_BURST_SAMPLES` windows."""
    if quantile is None:
        return RuleValue(1.0, "burst sizing off")
    finite = sorted(r for r in ratios if math.isfinite(r) and r >= 0)
    if len(finite) < MIN_BURST_SAMPLES:
        return RuleValue(1.0, f"burst factor 1 ({len(finite)} short windows seen)")
    # the nearest-rank quantile: no interpolation between two observed bursts
    rank = min(len(finite) - 1, max(0, math.ceil(quantile * len(finite)) - 1))
    factor = max(1.0, finite[rank])
    return RuleValue(
        factor,
        f"burst factor {factor:.2f} (p{quantile * 100:g} of {len(finite)} short-window rates "
        "over their interval's level)",
    )


def within_envelope(burst: RuleValue, *, forecast_req: float, envelope_req: float) -> RuleValue:
    """The burst factor left to apply on top of the arrival envelope: the short-window peak
    is ``forecast x burst``, the envelope's rise already covers part of it (the ratios of a
    rate that rises within its interval are its trend as much as its bursts), so the rate
    sized for is the larger of the two, not their product: ``max(1, forecast x burst /
    envelope)``."""
    if envelope_req <= forecast_req or forecast_req <= 0 or burst.value <= 1.0:
        return burst
    factor = max(1.0, burst.value * forecast_req / envelope_req)
    return RuleValue(
        factor,
        f"{burst.reason}; {factor:.2f} beyond the envelope (the larger of the envelope and "
        f"the forecast's burst peak, not their product)",
    )
