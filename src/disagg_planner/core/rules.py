"""The named rules of a scaling decision, each a pure function that returns its value and
the sentence the decision's reason carries.

A throughput decision at ``t`` is sized for the load expected when the capacity it orders
can serve, not for the window just past:

- :func:`time_to_ready`: how long an ordered replica takes to serve, measured from the
  planner's own scale-ups, the configured start-up until one was measured;
- :func:`arrival_envelope`: the upper envelope of the request rate over
  ``[t + time-to-ready, t + time-to-ready + interval]``, from the trend through the window
  just observed and the forecast of the next;
- :func:`burst_factor`: the upper quantile of short-window arrival rates relative to their
  interval's level (:func:`burst_ratios`: its mean, or its trend where the rate rose or
  fell steadily through it), so that prefill is sized for the bursts inside an interval;
  :func:`within_envelope`: what of it the arrival envelope has not already covered;
- :func:`backlog_tokens`: the work already waiting, which the demand must also drain;
  :func:`backlog_replica_cap`: no more replicas for it than the engines it waits on (new
  replicas take new arrivals; a queued request does not move);
- :func:`pooled_lengths`: the fast path's prompt and output lengths, pooled over the last
  interval's window and the short windows since (one short window of a heavy-tailed mix is
  a handful of prompts);
- :func:`length_mix`: what the spread of prompt lengths adds to the prefill work of their
  mean (long prompts run at a lower throughput per GPU);
- :func:`scale_down_allowed`: up fast, down slowly: no scale-down within one time-to-ready
  of the last scale-up;
- :func:`burst_memory`: where the rate has risen faster than new capacity can follow
  (more than :data:`MAX_TREND_GROWTH` times within one time-to-ready), capacity for the
  recent peak is kept as a floor until no such rise has been seen for a while;
- :func:`slo_at_risk`: the fast path's trigger, from the frontend alone;
  :func:`rising_trend`: the rate the fast path sizes for when its short windows rise
  significantly (what it orders serves one time-to-ready later).

No I/O, no clock: every input is an argument.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from disagg_planner.core.types import Histogram, histogram_points

# A trend is extrapolated at most to this multiple of the larger of the observed and the
# forecast rate: a steep rise seen over one interval says little about three intervals on.
MAX_TREND_GROWTH = 2.0
# A rise counts as a burst only when its count of requests exceeds the quiet level's by
# this many Poisson standard deviations: at low rates a short window's count is noisy
# enough to double by chance.
BURST_RISE_SIGMAS = 3.0
# The burst memory reads arrival rates over this trailing span (short windows pooled).
BURST_SMOOTHING_S = 60.0


@dataclass(frozen=True)
class RuleValue:
    """What a rule worked out and why, in one sentence for the decision's reason."""

    value: float
    reason: str


def time_to_ready(measured_s: float | None, configured_s: float) -> RuleValue:
    """Seconds from ordering a replica to its serving: the measured scaling latency of the
    role when there is one, else the configured start-up."""
    if measured_s is not None and math.isfinite(measured_s) and measured_s >= 0:
        return RuleValue(measured_s, f"time-to-ready {measured_s:.0f} s (measured)")
    return RuleValue(configured_s, f"time-to-ready {configured_s:.0f} s (configured, not measured)")


def arrival_envelope(
    *,
    observed_rate: float,
    forecast_rate: float,
    interval_s: float,
    time_to_ready_s: float,
) -> RuleValue:
    """The highest request rate expected over ``[t + ttr, t + ttr + interval]``.

    The rate is taken as linear in time through the window just observed (centred at
    ``t - interval/2``) and the forecast of the next (centred at ``t + interval/2``); a
    linear function peaks at one end of a span, so the envelope is the larger of its values
    at the span's ends, never below the forecast (a falling trend is left to the
    stabilisation, which scales down slowly) and at most :data:`MAX_TREND_GROWTH` times the
    larger of the two rates.
    """
    forecast_rate = max(0.0, forecast_rate)
    observed_rate = max(0.0, observed_rate)
    slope = (forecast_rate - observed_rate) / interval_s  # req/s per second
    centre = interval_s / 2.0
    at_ready = forecast_rate + slope * (time_to_ready_s - centre)
    at_end = forecast_rate + slope * (time_to_ready_s + interval_s - centre)
    cap = MAX_TREND_GROWTH * max(observed_rate, forecast_rate)
    envelope = min(max(forecast_rate, at_ready, at_end), cap) if cap > 0 else 0.0
    if envelope > forecast_rate + 1e-9:
        why = (
            f"rate rising {observed_rate:.2f} -> {forecast_rate:.2f} req/s: sized for "
            f"{envelope:.2f} req/s, its upper envelope when new capacity serves "
            f"(+{time_to_ready_s:.0f} s to +{time_to_ready_s + interval_s:.0f} s)"
        )
    else:
        why = f"sized for the forecast {forecast_rate:.2f} req/s (no rising trend)"
    return RuleValue(envelope, why)


def length_mix(
    histogram: Histogram | None,
    thpt_per_gpu: Callable[[float], float],
    *,
    enabled: bool = True,
) -> RuleValue:
    """Prefill work of the observed prompt-length mix over the work of as many prompts of
    its mean length: ``E[isl / thpt(isl)] / (mean / thpt(mean))``, each bucket at its
    midpoint (:func:`histogram_points`). Throughput per GPU falls with the prompt (attention
    grows with it), so a mix with long prompts costs more than its mean says: 1.43 on the
    Mooncake conversation trace with the bundled H200 8B profile. Prompts above the last
    bucket are left out (past every model's context: the engine refuses them). 1 when off,
    with no histogram, or where the profile gives no throughput."""
    if not enabled:
        return RuleValue(1.0, "prompt-length mix off (sized at the mean ISL)")
    points = histogram_points(histogram, overflow=False) if histogram is not None else []
    total = sum(w for _p, w in points)
    if total <= 0:
        return RuleValue(1.0, "prompt-length mix 1 (no ISL histogram yet)")
    mean = sum(p * w for p, w in points) / total
    at_mean = thpt_per_gpu(mean) if mean > 0 else 0.0
    rates = [(p, w, thpt_per_gpu(p)) for p, w in points if w > 0]
    if at_mean <= 0 or any(t <= 0 or not math.isfinite(t) for _p, _w, t in rates):
        return RuleValue(1.0, "prompt-length mix 1 (the profile has no throughput at some ISL)")
    work = sum(w * p / t for p, w, t in rates) / total
    factor = work / (mean / at_mean)
    return RuleValue(
        factor,
        f"prompt-length mix {factor:.2f} (prefill work of the observed ISLs over that of "
        f"their mean {mean:.0f})",
    )


def slo_request_seconds(*, ttft_ms: float, itl_ms: float, osl: float) -> float:
    """How long a request that meets the SLO exactly lasts: its TTFT target, then ``osl``
    tokens at the ITL target."""
    return (ttft_ms + max(0.0, osl) * itl_ms) / 1000.0


def backlog_tokens(
    *,
    in_flight: float | None,
    arrival_rate: float,
    slo_request_s: float,
    isl: float,
    queued_prefill_tokens: float | None = None,
) -> RuleValue:
    """Prefill tokens already waiting. FPM's queued prefill tokens when some engine reports
    them; else the in-flight requests beyond those that would be in flight if every request
    met the SLO (Little's law: arrival rate x :func:`slo_request_seconds`; the observed
    request duration would not do, it grows with the very queue it should reveal), each
    counted at the mean ISL; 0 when neither is known."""
    if queued_prefill_tokens is not None and queued_prefill_tokens > 0:
        return RuleValue(
            queued_prefill_tokens,
            f"backlog {queued_prefill_tokens:.0f} queued prefill tokens (FPM)",
        )
    if in_flight is None or isl <= 0:
        return RuleValue(0.0, "no backlog measured")
    expected = arrival_rate * slo_request_s
    excess = max(0.0, in_flight - expected)
    if excess <= 0:
        return RuleValue(0.0, f"no backlog ({in_flight:.0f} in flight, {expected:.0f} expected)")
    return RuleValue(
        excess * isl,
        f"backlog {excess:.0f} requests ({in_flight:.0f} in flight, {expected:.0f} expected) "
        f"= {excess * isl:.0f} prefill tokens",
    )


def backlog_replica_cap(
    role: str, *, with_backlog: int, without_backlog: int, holding: int
) -> RuleValue:
    """The replicas of ``role`` a decision orders with the backlog term, at most
    ``without_backlog + holding``. The backlog waits in the queues of the ``holding`` engines
    that are serving now (the router places a request on an engine when it arrives, and it
    stays there): replicas started for it take new arrivals, which frees those engines to
    drain their queues at full speed, and no further replica drains them faster."""
    cap = without_backlog + max(0, holding)
    if with_backlog <= cap:
        return RuleValue(float(with_backlog), "")
    return RuleValue(
        float(cap),
        f"{role}: {cap}, not {with_backlog}: the backlog waits on the {holding} ready "
        f"engine(s), which new replicas relieve of arrivals; more do not drain it faster",
    )


@dataclass(frozen=True)
class LengthSample:
    """A window's request count and mean lengths."""

    requests: float
    isl: float
    osl: float


def pooled_lengths(samples: Sequence[LengthSample]) -> tuple[float, float, str] | None:
    """The request-weighted mean ISL and OSL of ``samples`` and the sentence saying so;
    None when they hold no request. A short window of a heavy-tailed prompt mix holds a few
    dozen prompts, whose mean swings several-fold with one long prompt; pooled with the last
    interval's window it follows a real change of lengths within one interval."""
    total = sum(s.requests for s in samples if s.requests > 0)
    if total <= 0:
        return None
    isl = sum(s.requests * s.isl for s in samples if s.requests > 0) / total
    osl = sum(s.requests * s.osl for s in samples if s.requests > 0) / total
    return (
        isl,
        osl,
        (
            f"lengths ISL {isl:.0f} / OSL {osl:.0f} pooled over {total:.0f} requests of the last "
            f"{len(samples)} window(s)"
        ),
    )


def scale_down_allowed(
    *, now_s: float, last_scale_up_s: float | None, time_to_ready_s: float
) -> RuleValue:
    """1 when a role may go down now, 0 within one time-to-ready of its last scale-up (the
    replicas it ordered have had no time to show what they serve)."""
    if last_scale_up_s is None or now_s - last_scale_up_s >= time_to_ready_s:
        return RuleValue(1.0, "")
    return RuleValue(
        0.0,
        f"no scale-down {now_s - last_scale_up_s:.0f} s after a scale-up (within "
        f"time-to-ready {time_to_ready_s:.0f} s)",
    )


@dataclass(frozen=True)
class RateSample:
    """The arrival rate of one short window ``[end_s - duration_s, end_s]``."""

    end_s: float
    rate: float
    duration_s: float


def burst_memory(
    samples: Sequence[RateSample],
    *,
    now_s: float,
    time_to_ready_s: float,
    memory_s: float | None,
) -> RuleValue:
    """The request rate to keep capacity for, learnt from bursts already seen: 0 (no floor)
    unless, within the last ``memory_s``, the arrival rate (over trailing
    :data:`BURST_SMOOTHING_S` spans) rose more than
    :data:`MAX_TREND_GROWTH` times above its lowest value of the preceding time-to-ready
    (a rise the arrival envelope does not extrapolate, and capacity ordered at its start
    serves only after it), by more than :data:`BURST_RISE_SIGMAS` Poisson deviations; then
    the highest short-window rate of the last ``memory_s``. A reactive policy loses the
    first such burst; this keeps the next one from finding the deployment at its quiet
    size. The floor, the highest such rate of the last ``memory_s``, is forgotten
    ``memory_s`` after the last fast rise."""
    if memory_s is None:
        return RuleValue(0.0, "burst memory off")
    recent = _smoothed(
        sorted(
            (s for s in samples if s.end_s >= now_s - memory_s and math.isfinite(s.rate)),
            key=lambda s: s.end_s,
        )
    )
    steepest: tuple[float, RateSample, float] | None = None  # (ratio, sample, quiet)
    last_rise_s: float | None = None
    for j, sample in enumerate(recent):
        before = [s.rate for s in recent[:j] if s.end_s >= sample.end_s - time_to_ready_s]
        if not before:
            continue
        quiet = max(0.0, min(before))
        peak_n = sample.rate * sample.duration_s
        quiet_n = quiet * sample.duration_s
        if (
            sample.rate > MAX_TREND_GROWTH * quiet
            and peak_n - quiet_n > BURST_RISE_SIGMAS * math.sqrt(peak_n + quiet_n)
        ):
            last_rise_s = sample.end_s
            ratio = sample.rate / quiet if quiet > 0 else math.inf
            if steepest is None or ratio > steepest[0]:
                steepest = (ratio, sample, quiet)
    if steepest is None or last_rise_s is None:
        return RuleValue(
            0.0,
            f"burst memory: no rise faster than time-to-ready {time_to_ready_s:.0f} s in the "
            f"last {memory_s:.0f} s",
        )
    _ratio, _rise, quiet = steepest
    peak = max(s.rate for s in recent)
    return RuleValue(
        peak,
        f"burst memory: the rate rose more than {MAX_TREND_GROWTH:g}x from {quiet:.1f} req/s "
        f"within {time_to_ready_s:.0f} s (time-to-ready), the last such rise "
        f"{now_s - last_rise_s:.0f} s ago: capacity kept for the peak {peak:.1f} req/s of the "
        f"last {memory_s:.0f} s",
    )


# A short-window trend is fitted over no fewer windows than this.
MIN_TREND_WINDOWS = 6
# Windows on each side of a step (a level is at least two windows, not one noisy one).
MIN_STEP_WINDOWS = 2


def rising_trend(
    samples: Sequence[RateSample], *, now_s: float, span_s: float, reach_s: float
) -> RuleValue:
    """The request rate expected ``reach_s`` from now, from a least-squares line through the
    short windows of the last ``span_s`` (their midpoints); 0 when fewer than
    :data:`MIN_TREND_WINDOWS` windows, or when the rise is not significant: its slope below
    :data:`BURST_RISE_SIGMAS` standard errors, each window's rate counted as Poisson (its
    variance ``rate / duration``), so that the noise of a quiet stream is no trend. At most
    :data:`MAX_TREND_GROWTH` times the last windows' rate (pooled over
    :data:`BURST_SMOOTHING_S`); 0 as well when those last windows lie below the line by more
    than their noise (the rise levelled off: a step, or a peak), or when two levels fit the
    windows better than the line (the rate stepped up and holds). The fast path orders
    replicas that serve one time-to-ready later, while a rising rate goes on rising."""
    recent = [s for s in samples if s.end_s > now_s - span_s and s.duration_s > 0]
    if len(recent) < MIN_TREND_WINDOWS:
        return RuleValue(0.0, f"no rate trend ({len(recent)} short windows)")
    ts = [s.end_s - s.duration_s / 2.0 for s in recent]
    line = fit_line([(t, s.rate) for t, s in zip(ts, recent, strict=True)])
    if line is None:
        return RuleValue(0.0, "no rate trend (the windows do not span time)")
    t_mean, r_mean, slope = line.mean_t, line.mean_rate, line.slope
    if slope <= BURST_RISE_SIGMAS * _slope_noise(line, ts, recent):
        return RuleValue(
            0.0,
            f"no significant rate trend over the last {len(recent)} short windows "
            f"({slope * 60:+.2f} req/s per minute)",
        )
    # A step is no trend: when two levels (split at the best window) fit the windows more
    # closely than the line, the rate jumped and stays at its new level; a line through the
    # jump runs on past that level and, extrapolated one time-to-ready, orders up to twice
    # it (the step 8 -> 40 req/s had 6 prefill replicas ordered where 3 serve 40 req/s).
    step = _step_fits_better(line, ts, recent)
    if step is not None:
        _rss, before, after, at_s = step
        return RuleValue(
            0.0,
            f"the rate stepped from {before:.2f} to {after:.2f} req/s {now_s - at_s:.0f} s ago "
            f"(two levels fit the last {len(recent)} short windows better than a line): no "
            "trend beyond the new level",
        )
    # Still rising at the end: the last minute's windows lie on the line (within their own
    # Poisson noise). After a step, or at a peak, the line runs above them: that rise is
    # over, and a line through it would only double the level reached.
    tail = [(t, s) for t, s in zip(ts, recent, strict=True) if s.end_s > now_s - BURST_SMOOTHING_S]
    span = sum(s.duration_s for _t, s in tail)
    if span <= 0:  # no window in the last minute: nothing says the rise goes on
        return RuleValue(0.0, "no rate trend (no short window in the last minute)")
    last = sum(s.rate * s.duration_s for _t, s in tail) / span
    t_tail = sum(t * s.duration_s for t, s in tail) / span
    on_line = r_mean + slope * (t_tail - t_mean)
    if last < on_line - BURST_RISE_SIGMAS * math.sqrt(max(last, 1.0 / span) / span):
        return RuleValue(
            0.0,
            f"the rise has levelled off: the last {span:.0f} s at {last:.2f} req/s, below the "
            f"line through the last {len(recent)} short windows ({on_line:.2f} req/s)",
        )
    expected = r_mean + slope * (now_s + reach_s - t_mean)
    # Slowing down: the line through the later half of the windows, when it reaches less. A
    # rise that flattens towards its peak (a sinusoid past its inflection) is projected at
    # its present slope, not at the mean slope of its steeper past; a rise that speeds up
    # keeps the whole line's, which reaches less than its own later half would.
    later = fit_line(
        [(t, s.rate) for t, s in zip(ts, recent, strict=True) if t >= ts[len(ts) // 2]],
        min_points=3,
    )
    if later is not None:
        expected = min(expected, later.at(now_s + reach_s))
    value = min(max(expected, last), MAX_TREND_GROWTH * last)
    return RuleValue(
        value,
        f"rate rising {slope * 60:+.2f} req/s per minute over the last {len(recent)} short "
        f"windows: sized for {value:.2f} req/s, {reach_s:.0f} s on (when what is ordered now "
        "serves, and the next check's order after it)",
    )


@dataclass(frozen=True)
class Line:
    """A least-squares line through (time, rate) points: their means, its slope and the
    points' spread in time (``sxx``, the sum of squared time deviations)."""

    mean_t: float
    mean_rate: float
    slope: float
    sxx: float

    def at(self, t: float) -> float:
        return self.mean_rate + self.slope * (t - self.mean_t)


def fit_line(points: Sequence[tuple[float, float]], *, min_points: int = 2) -> Line | None:
    """The least-squares line through ``points`` (time, rate); None for fewer than
    ``min_points`` points or points that do not span time. The one line fit of the trend
    rules (the fast check's rising trend, the elastic loop's load trend)."""
    if len(points) < max(2, min_points):
        return None
    mean_t = sum(t for t, _ in points) / len(points)
    mean_rate = sum(r for _, r in points) / len(points)
    sxx = sum((t - mean_t) ** 2 for t, _ in points)
    if sxx <= 0:
        return None
    slope = sum((t - mean_t) * (r - mean_rate) for t, r in points) / sxx
    return Line(mean_t, mean_rate, slope, sxx)


def _best_step(windows: Sequence[RateSample]) -> tuple[float, float, float, float] | None:
    """The two-level fit of ``windows`` (in time order) with the least squared error, split
    where it fits best with :data:`MIN_STEP_WINDOWS` or more windows on each side: (its squared
    error, the level before, the level after, when the second level began); None when too few
    windows for both levels."""
    rates = [s.rate for s in windows]
    best: tuple[float, float, float, float] | None = None
    for k in range(MIN_STEP_WINDOWS, len(rates) - MIN_STEP_WINDOWS + 1):
        head, tail = rates[:k], rates[k:]
        before, after = sum(head) / len(head), sum(tail) / len(tail)
        rss = sum((r - before) ** 2 for r in head) + sum((r - after) ** 2 for r in tail)
        if best is None or rss < best[0]:
            start = windows[k].end_s - windows[k].duration_s
            best = (rss, before, after, start)
    return best


def burst_ratios(windows: Sequence[RateSample], mean_rate: float) -> list[float]:
    """Each short window's rate over its interval's level, for the burst factor: the
    interval's ``mean_rate``, or the trend at the window where the rate rose or fell
    steadily through the interval (a least-squares line through the windows, scaled to
    ``mean_rate``, whose slope is significant against the windows' Poisson noise, as
    :func:`rising_trend` tests it; at least :data:`MIN_TREND_WINDOWS` windows), or, where
    two levels fit the windows better than that line, the level of the window's side of
    the step (scaled alike). A steady rise or fall is the forecast's and the rising trend's
    to size, and a step is a level the tick sizes for once the windows hold it
    (:func:`disagg_planner.core.arrival.tick_rate`) and the burst memory keeps when it
    recurs; a burst is what lies above them: a sinusoid's interval over its peak, or the
    windows after a step to a new level, are no burst (over the mean, the windows on the
    step's high side read as bursts on top of the level the tick already sizes for)."""
    if mean_rate <= 0:
        return []
    flat = [s.rate / mean_rate for s in windows]
    timed = [s for s in windows if s.duration_s > 0]
    if len(timed) < MIN_TREND_WINDOWS or len(timed) != len(windows):
        return flat
    ts = [s.end_s - s.duration_s / 2.0 for s in windows]
    line = fit_line([(t, s.rate) for t, s in zip(ts, windows, strict=True)])
    if line is None or line.mean_rate <= 0:
        return flat
    if abs(line.slope) <= BURST_RISE_SIGMAS * _slope_noise(line, ts, windows):
        return flat
    step = _step_fits_better(line, ts, windows)
    if step is not None:
        _, before, after, began = step
        levels = [after if s.end_s - s.duration_s >= began else before for s in windows]
        scale = mean_rate * len(windows) / sum(levels) if sum(levels) > 0 else 1.0
        return [
            s.rate / (level * scale) if level > 0 else s.rate / mean_rate
            for s, level in zip(windows, levels, strict=True)
        ]
    scale = mean_rate / line.mean_rate
    return [
        s.rate / (line.at(t) * scale) if line.at(t) > 0 else s.rate / mean_rate
        for t, s in zip(ts, windows, strict=True)
    ]


def _slope_noise(line: Line, ts: Sequence[float], windows: Sequence[RateSample]) -> float:
    """The standard error of ``line``'s slope through ``windows`` (at midpoints ``ts``),
    each window's rate counted as Poisson (its variance ``rate / duration``): the noise a
    trend's slope must stand out of."""
    var = sum(
        (t - line.mean_t) ** 2 * max(s.rate, 1.0 / s.duration_s) / s.duration_s
        for t, s in zip(ts, windows, strict=True)
    ) / (line.sxx * line.sxx)
    return math.sqrt(var)


def _step_fits_better(
    line: Line, ts: Sequence[float], windows: Sequence[RateSample]
) -> tuple[float, float, float, float] | None:
    """The best two-level fit of ``windows`` (:func:`_best_step`) when it fits them more
    closely than ``line`` does (the rate stepped and holds: no trend); None otherwise."""
    line_rss = sum((s.rate - line.at(t)) ** 2 for t, s in zip(ts, windows, strict=True))
    step = _best_step(windows)
    return step if step is not None and step[0] < line_rss else None


def _smoothed(samples: Sequence[RateSample]) -> list[RateSample]:
    """Each window widened to the trailing :data:`BURST_SMOOTHING_S` (the windows ending
    within it, pooled): a burst is a rise that lasts, not one noisy window, and the pooled
    counts make the Poisson test sharper."""
    out = []
    for j, sample in enumerate(samples):
        pooled = [s for s in samples[: j + 1] if s.end_s > sample.end_s - BURST_SMOOTHING_S]
        span = sum(s.duration_s for s in pooled)
        if span > 0:
            rate = sum(s.rate * s.duration_s for s in pooled) / span
            out.append(RateSample(sample.end_s, rate, span))
    return out


def prior_peak(samples: Sequence[RateSample], *, since_s: float, until_s: float) -> float:
    """The highest request rate of the short windows ended in ``(since_s, until_s]``, each
    pooled over :data:`BURST_SMOOTHING_S` (a peak that lasted, not one noisy window); 0
    without one."""
    kept = [s for s in samples if since_s - BURST_SMOOTHING_S < s.end_s <= until_s]
    return max(
        (s.rate for s in _smoothed(kept) if s.end_s > since_s and s.duration_s > 0), default=0.0
    )


# A rate within this share above an earlier peak is that peak's level again (short windows
# scatter about a level by as much), not a new one: the Kubernetes HPA's default tolerance.
PEAK_TOLERANCE = 0.1


def trend_within_peak(trend: RuleValue, *, rate: float, peak: float, span_s: float) -> RuleValue:
    """A rising trend's rate, with the SLO still met, no higher than the ``peak`` seen
    before in the last ``span_s`` (or the rate itself, where it has reached the peak within
    :data:`PEAK_TOLERANCE`): a rise towards a level served before is expected to end there
    (a daily or periodic load), and a line through its steepest part runs past it, ordering
    replicas that peak never needed, most of all at the top, where the line still rises
    while the load turns. A rate more than the tolerance above the peak is a new level: the
    trend is not capped."""
    if trend.value <= 0 or peak <= 0 or rate > peak * (1.0 + PEAK_TOLERANCE):
        return trend
    cap = max(peak, rate)
    if trend.value <= cap:
        return trend
    if rate < peak:
        return RuleValue(
            peak,
            f"{trend.reason}; capped at {peak:.2f} req/s, the highest rate of the last "
            f"{span_s:.0f} s, which the rise has not passed yet",
        )
    return RuleValue(
        cap,
        f"{trend.reason}; capped at the rate {rate:.2f} req/s: the highest of the last "
        f"{span_s:.0f} s was {peak:.2f}, within {PEAK_TOLERANCE:.0%} of it (that level "
        "again, not a new one)",
    )


def slo_at_risk(
    *,
    ttft_tail_ms: float | None,
    ttft_target_ms: float,
    itl_ms: float | None,
    itl_target_ms: float,
    excess_in_flight: float,
) -> RuleValue:
    """1 when the frontend's recent window shows the SLO at risk: the TTFT tail or the mean
    ITL above target, or requests piling up beyond what the arrival rate explains."""
    causes = []
    if ttft_tail_ms is not None and ttft_tail_ms > ttft_target_ms:
        causes.append(f"TTFT tail {ttft_tail_ms:.0f} ms > {ttft_target_ms:.0f} ms")
    if itl_ms is not None and itl_ms > itl_target_ms:
        causes.append(f"ITL {itl_ms:.1f} ms > {itl_target_ms:.1f} ms")
    if excess_in_flight >= 1:
        causes.append(f"{excess_in_flight:.0f} requests waiting beyond the arrival rate")
    if not causes:
        return RuleValue(0.0, "SLO not at risk")
    return RuleValue(1.0, "SLO at risk: " + ", ".join(causes))
