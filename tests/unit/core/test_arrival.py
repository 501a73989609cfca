"""The rate a throughput tick sizes for: a rise between interval means is extrapolated only
while the interval's own short windows still show it."""

from __future__ import annotations

import pytest

from disagg_planner.core.arrival import pooled_rate, tick_rate
from disagg_planner.core.rules import RateSample, RuleValue, arrival_envelope
from tests.unit.core.test_rules import windows

# On/off bursts, the tick at 900 s: the rate stepped from 4 to 25 req/s inside the previous
# interval and held through this one; the interval means rose 13.6 -> 24.7 and the forecast
# fitted to them ran on to 30 (the shape of benchmarks/scorecard.py's on/off run at 900 s).
BURST_HELD = windows((25.0, 12), start_s=720.0)
STILL_RISING = [RateSample(720.0 + 15.0 * (k + 1), 10.0 + 1.5 * k, 15.0) for k in range(12)]
INTERVAL_S, TIME_TO_READY_S = 180.0, 120.0


def sized(samples: list[RateSample], *, observed: float, forecast: float) -> RuleValue:
    return tick_rate(
        samples,
        now_s=900.0,
        observed_rate=observed,
        forecast_rate=forecast,
        interval_s=INTERVAL_S,
        time_to_ready_s=TIME_TO_READY_S,
    )


def envelope(observed: float, forecast: float) -> RuleValue:
    return arrival_envelope(
        observed_rate=observed,
        forecast_rate=forecast,
        interval_s=INTERVAL_S,
        time_to_ready_s=TIME_TO_READY_S,
    )


def test_a_rise_between_interval_means_the_windows_do_not_show_sizes_for_their_level() -> None:
    # the means alone: a trend sized one time-to-ready on, far above the 25 req/s held
    assert envelope(24.7, 30.0).value > 35.0
    rate = sized(BURST_HELD, observed=24.7, forecast=30.0)
    assert rate.value == pytest.approx(25.0)  # the windows' level, under the forecast's 30
    assert "the last short windows' level" in rate.reason
    assert "no significant rate trend" in rate.reason
    # the interval's mean is the floor where the last minute dips under it
    dipped = windows((25.0, 8), (20.0, 4), start_s=720.0)
    assert sized(dipped, observed=24.0, forecast=30.0).value == pytest.approx(24.0)


@pytest.mark.parametrize(
    ("samples", "observed", "forecast"),
    [
        # the short windows rise +6 req/s per minute: the trend is real
        (STILL_RISING, 18.0, 27.0),
        # fewer windows than a trend needs (a tick with no fast checks): nothing overrules
        (BURST_HELD[-3:], 24.7, 30.0),
        # no rise between the means: the forecast, as the envelope says
        (BURST_HELD, 30.0, 25.0),
    ],
    ids=["windows still rising", "too few windows", "no rise between the means"],
)
def test_otherwise_the_envelope_stands(
    samples: list[RateSample], observed: float, forecast: float
) -> None:
    assert sized(samples, observed=observed, forecast=forecast) == envelope(observed, forecast)


def test_pooled_rate_weighs_windows_by_their_duration() -> None:
    samples = [RateSample(10.0, 4.0, 10.0), RateSample(40.0, 10.0, 30.0), RateSample(0.0, 99.0, 0)]
    assert pooled_rate(samples, now_s=40.0, span_s=60.0) == pytest.approx((40 + 300) / 40)
    assert pooled_rate(samples, now_s=40.0, span_s=30.0) == pytest.approx(10.0)
    assert pooled_rate([], now_s=40.0, span_s=60.0) == 0.0
