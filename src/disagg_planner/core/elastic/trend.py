"""The load trend: a straight line fitted through the request rates of the recent traffic
windows (the package doc, step 1), and the history of windows it is fitted to."""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field

from disagg_planner.core.rules import fit_line
from disagg_planner.core.types import TrafficObservation


@dataclass(frozen=True)
class LoadTrend:
    """A straight-line fit of the request rate (req/s) around ``now_s``.

    ``level_rps`` is the fitted rate at ``now_s``, ``slope_rps_per_s`` its change per second;
    ``max_observed_rps`` the highest window rate in the fit; ``isl``/``osl`` request-weighted
    mean lengths in tokens (0 when no request was seen).
    """

    now_s: float
    level_rps: float
    slope_rps_per_s: float
    isl: float
    osl: float
    points: int
    max_observed_rps: float

    def rate_at(self, t_s: float) -> float:
        return max(0.0, self.level_rps + self.slope_rps_per_s * (t_s - self.now_s))

    def peak(self, t0_s: float, t1_s: float) -> float:
        """Highest forecast rate over ``[t0, t1]`` (a line peaks at an end)."""
        return max(self.rate_at(t0_s), self.rate_at(t1_s))

    def requests_above(self, t0_s: float, t1_s: float, threshold_rps: float) -> float:
        """Requests arriving in ``[t0, t1]`` while the forecast rate exceeds ``threshold_rps``."""
        if t1_s <= t0_s:
            return 0.0
        # The clipped line max(0, a + b t) is piecewise linear; above a threshold >= 0 it is
        # the line itself, which crosses the threshold at most once.
        a, b = self.level_rps, self.slope_rps_per_s
        lo, hi = t0_s, t1_s
        if b == 0:
            return (hi - lo) * a if a > threshold_rps else 0.0
        cross = self.now_s + (threshold_rps - a) / b
        if b > 0:
            lo = max(lo, cross)
        else:
            hi = min(hi, cross)
        if hi <= lo:
            return 0.0
        return (hi - lo) * (self.rate_at(lo) + self.rate_at(hi)) / 2.0


@dataclass(frozen=True)
class TrafficWindow:
    """One observed traffic window as the trend sees it (times in s, rate in req/s)."""

    mid_s: float
    end_s: float
    rate_rps: float
    num_req: float
    isl: float | None
    osl: float | None


def fit_trend(windows: Iterable[TrafficWindow], now_s: float) -> LoadTrend | None:
    """Least-squares line through the windows' rates (see the package doc); None if empty."""
    points = list(windows)
    if not points:
        return None
    n = len(points)
    line = fit_line([(w.mid_s, w.rate_rps) for w in points])
    # one window, or windows at one instant: their mean rate, flat
    slope = line.slope if line is not None else 0.0
    level = line.at(now_s) if line is not None else sum(w.rate_rps for w in points) / n
    weighted = [w for w in points if w.num_req > 0 and w.isl is not None and w.osl is not None]
    total = sum(w.num_req for w in weighted)
    isl = sum(w.num_req * (w.isl or 0.0) for w in weighted) / total if total > 0 else 0.0
    osl = sum(w.num_req * (w.osl or 0.0) for w in weighted) / total if total > 0 else 0.0
    return LoadTrend(
        now_s=now_s,
        level_rps=level,
        slope_rps_per_s=slope,
        isl=isl,
        osl=osl,
        points=n,
        max_observed_rps=max(w.rate_rps for w in points),
    )


@dataclass
class TrafficHistory:
    """The windows of the trend window, oldest first, each once."""

    windows: deque[TrafficWindow] = field(default_factory=deque)

    def add(self, obs: TrafficObservation) -> None:
        if self.windows and obs.end_s <= self.windows[-1].end_s:
            return  # the same window again (a held tick re-reads it)
        self.windows.append(
            TrafficWindow(
                mid_s=obs.end_s - obs.duration_s / 2.0,
                end_s=obs.end_s,
                rate_rps=obs.request_rate,
                num_req=obs.num_req,
                isl=obs.isl,
                osl=obs.osl,
            )
        )

    def prune(self, since_s: float) -> None:
        while self.windows and self.windows[0].mid_s < since_s:
            self.windows.popleft()
