"""Elastic expert parallelism: when to resize a wide-EP engine's data-parallel group, and to what.

A role named by ``elastic_ep`` keeps its replica count; its capacity moves by changing the
data-parallel (DP) size of its engine in place (vLLM elastic EP), in steps of
``elastic_ep_dp_step`` ranks of ``elastic_ep_gpus_per_rank`` GPUs (EP size = DP x TP) between
``elastic_ep_min_dp`` and ``elastic_ep_max_dp``. One tick (every
``throughput_adjustment_interval_seconds``) works as follows; everything is a function of the
arguments and of the traffic history the planner keeps (no clock, no I/O).

1. **Load trend.** The request rate of every observed window in the last
   ``elastic_ep_trend_window_seconds`` is fitted with a least-squares line over the windows'
   midpoints; ``rate(t) = max(0, level + slope (t - now))``. Lengths are the request-weighted
   mean ISL/OSL of the same windows. The one-step predictors of the throughput loop cannot
   see past one interval, and a resize takes longer than that.
2. **Capacity** (the throughput loop's model): ``size_prefill``/``size_decode`` (summed for an
   aggregated engine, as ``size_agg`` does) give the GPU-seconds one request needs at the trend's
   ISL/OSL and the ITL target, ``g``; one DP rank serves ``gpus_per_rank / g`` requests/s and a
   load ``r`` needs ``ceil(r g / gpus_per_rank)`` ranks, rounded up to the step grid
   ``min_dp + k * dp_step``. Per-rank throughput is taken as independent of the DP size
   (an assumption: the all-to-all grows with EP, the profile was measured at one size).
3. **Lead time.** A grow started now is active ``follower + up.total_s`` later: ``follower``
   is the follower pods' start-up plus their GPUs joining the engine's Ray cluster (only with
   ``elastic_ep_follower_service``: without it the GPUs are already there), ``up.total_s`` the
   resize itself (the mode's :class:`disagg_planner.profiles.elastic_resize.ResizeTiming`).
   Both are the median of the last resizes this planner measured (:meth:`ElasticPlanner.
   observe_resize`) once it has any, configured until then (``elastic_ep_follower_ready_seconds``,
   ``elastic_ep_timing`` or the mode's defaults). *When* to grow: a grow decided at the next
   tick would be active ``lead = follower + up.total_s + interval`` from now, so the planner
   grows now when the peak forecast over ``[now, now + lead]``, plus the backlog's drain
   rate, needs more ranks than it has. *How far*: a resize in flight holds the next one
   (``resize_in_flight``), so the grow started now is corrected no earlier than by a second
   grow decided at the first tick after it is active, which is active one
   ``follower + up.total_s`` later again: the size chosen carries the peak forecast over
   ``[now, now + lead + follower + up.total_s]`` (``hold_s``), plus the backlog's drain
   rate. Sized for its own lead time only, the first grow of a steady rise was outrun by the
   rise before the second could land, and the queue it left stayed.

   **Backlog.** The work already waiting, by the throughput loop's rule
   (:func:`disagg_planner.core.rules.backlog_tokens`, on the same observations): the
   elastic role's engines' queued prefill tokens from FPM where they report, else the
   frontend's in-flight requests beyond ``rate x`` (TTFT target + OSL x ITL target), counted
   at the trend's ISL. As there, it is drained within ``backlog_drain_seconds``: the size
   carries ``backlog / ISL / backlog_drain_seconds`` req/s on top of the forecast, each
   waiting request at the role's own GPU-seconds per request (prefill and decode for an
   aggregated engine). Without it, a queue left by an interval of under-capacity is never
   sized for, and once behind the engine stays behind.
4. **Worth it (scale-up).** Serving stops for the last ``downtime_s`` of the resize, and vLLM
   answers every request arriving meanwhile with 503: they are rejected,
   ``cost = rate(pause) * downtime``. When the frontend retries them
   (``elastic_ep_frontend_retries``) they are only delayed, and lost to the SLO only past what
   the TTFT target absorbs: ``cost = rate(pause) * max(0, downtime - slack)`` with
   ``slack = TTFT target - observed TTFT``. Without the resize, every arrival while the
   forecast load exceeds the current capacity is lost:
   ``benefit = integral of rate(t) where rate(t) > capacity(current)`` over
   ``elastic_ep_benefit_window_seconds`` after the new capacity would be active, plus the
   backlog's requests (waiting already, and not drained in time at the current size: a
   lower bound of what is lost behind them). The planner resizes only when
   ``benefit > cost``: with a blocking resize (~100 s paused) only a sustained overload
   pays; with NIXL EP (< 1 s) any overload does.
5. **Scale-down.** The smaller size must carry the larger of the peak forecast over
   ``[now, now + down.total_s + interval + follower + up.total_s]`` (long enough to grow
   back before a renewed rise arrives) and the highest rate observed in the trend window (the
   drop must be sustained). Never while a backlog remains (``hold_scale_down_backlog``):
   the smaller size would drain it slower, and its pause would stop the drain. A shrink
   whose downtime exceeds the TTFT slack while requests arrive costs SLO for no SLO gain,
   so it waits for idle traffic (blocking and async modes); a NIXL-EP shrink (~2 s) is free
   only when the frontend retries (else its 503s cost requests too).

GPU budget: the planner's one rule (:func:`disagg_planner.core.budget.apply_gpu_budget`), with
the GPUs of the planner's other roles counted: ``max_gpu_budget`` caps the size,
``min_gpu_budget`` floors it (on the grid); when not even the leader's ranks fit, the policy
holds (``gpu_budget_guard_hold``).
"""

from __future__ import annotations

import math
import statistics
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from enum import StrEnum

from disagg_planner.config.schema import PlannerConfig
from disagg_planner.config.sections.elastic_ep import parse_elastic_ep_timing
from disagg_planner.core.budget import BudgetResult, apply_gpu_budget
from disagg_planner.core.rules import RuleValue, backlog_tokens, fit_line, slo_request_seconds
from disagg_planner.core.sizing import CapacityProfile, LoadForecast, size_decode, size_prefill
from disagg_planner.core.types import MissingObservation, TrafficObservation
from disagg_planner.profiles import elastic_resize
from disagg_planner.profiles.elastic_resize import ElasticEpMode, ResizeTiming

# How many of its own resizes the planner's measured lead time looks back on.
MEASURED_RESIZES = 5


class ElasticReason(StrEnum):
    """Why the elastic policy decided what it did (values double as metric labels; append-only)."""

    UNSET = "unset"
    NO_TRAFFIC_DATA = "no_traffic_data"
    STALE_TRAFFIC_DATA = "stale_traffic_data"
    RESIZE_IN_FLIGHT = "resize_in_flight"
    PROFILE_INFEASIBLE = "profile_infeasible"
    NO_CHANGE = "no_change"
    SCALE_UP = "scale_up"
    SCALE_UP_CAPPED = "scale_up_capped"
    AT_MAX_DP = "at_max_dp"
    SCALE_DOWN = "scale_down"
    HOLD_NOT_WORTH_DOWNTIME = "hold_not_worth_downtime"
    HOLD_SCALE_DOWN_NOT_SUSTAINED = "hold_scale_down_not_sustained"
    HOLD_SCALE_DOWN_COSTS_SLO = "hold_scale_down_costs_slo"
    RECONCILE_TO_BOUNDS = "reconcile_to_bounds"
    GPU_BUDGET_GUARD_HOLD = "gpu_budget_guard_hold"
    HOLD_SCALE_DOWN_BACKLOG = "hold_scale_down_backlog"
    HOLD_SCALE_DOWN_ABORTS = "hold_scale_down_aborts"
    SCALE_DOWN_AFTER_DRAIN = "scale_down_after_drain"


def mode_timing(config: PlannerConfig) -> ElasticEpMode:
    """The resize timing the policy plans with: ``elastic_ep_timing`` when set, else the
    mode's published defaults (:data:`disagg_planner.profiles.elastic_resize.MODES`)."""
    base = elastic_resize.mode(config.elastic_ep_mode)
    if config.elastic_ep_timing is None:
        return base
    up_total, up_down, down_total, down_down = parse_elastic_ep_timing(config.elastic_ep_timing)
    return ElasticEpMode(
        base.name,
        up=ResizeTiming(total_s=up_total, downtime_s=up_down),
        down=ResizeTiming(total_s=down_total, downtime_s=down_down),
        description="measured (elastic_ep_timing)",
    )


# A measured pause this many times the configured one (and this much longer) says the engine
# does not resize the way elastic_ep_mode describes (e.g. NIXL EP's all-to-all is not on).
PAUSE_CONTRADICTION_RATIO = 5.0
PAUSE_CONTRADICTION_MARGIN_S = 1.0


def pause_contradiction(timing: ElasticEpMode, *, grow: bool, pause_s: float) -> str | None:
    """Why a measured pause contradicts the configured mode, else None."""
    planned = (timing.up if grow else timing.down).downtime_s
    if pause_s <= max(planned * PAUSE_CONTRADICTION_RATIO, planned + PAUSE_CONTRADICTION_MARGIN_S):
        return None
    hint = (
        "; is the engine started with --all2all-backend nixl_ep?"
        if timing.name.startswith("nixl")
        else ""
    )
    return (
        f"a {'grow' if grow else 'shrink'} paused serving {pause_s:.1f} s, but "
        f"elastic_ep_mode {timing.name} plans {planned:.1f} s; the policy now prices the "
        f"measured pause{hint}"
    )


# --- records ----------------------------------------------------------------------------------


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
class RequestCost:
    """GPU-seconds one request needs on the elastic role, from the profile, and why not."""

    gpu_seconds: float
    feasible: bool = True
    note: str = ""


@dataclass(frozen=True)
class ElasticDiagnostics:
    """The arithmetic behind one decision (None where that step was not reached)."""

    timing: ElasticEpMode
    trend: LoadTrend | None = None
    gpu_seconds_per_request: float | None = None
    rank_capacity_rps: float | None = None
    current_capacity_rps: float | None = None
    lead_s: float | None = None
    peak_rps: float | None = None
    ranks_needed: int | None = None
    max_dp: int | None = None
    benefit_requests: float | None = None
    cost_requests: float | None = None
    follower_ready_s: float | None = None  # the lead time's follower part (s)
    backlog_requests: float | None = None  # requests already waiting (module doc, step 3)
    backlog_rps: float | None = None  # their drain rate, added to the load the size carries
    hold_s: float | None = None  # a grow's size holds until a next grow could be active (s)
    hold_peak_rps: float | None = None  # the peak forecast over that span
    aborted_requests: float | None = None  # in flight on the ranks a shrink removes


@dataclass(frozen=True)
class ElasticDecision:
    """``target_dp`` is the DP size to resize to, or None to leave the engine as it is."""

    now_s: float
    current_dp: int
    target_dp: int | None
    reason: ElasticReason
    message: str
    diagnostics: ElasticDiagnostics


@dataclass(frozen=True)
class _Window:
    mid_s: float
    end_s: float
    rate_rps: float
    num_req: float
    isl: float | None
    osl: float | None


# --- formulas ---------------------------------------------------------------------------------


def fit_trend(windows: Iterable[_Window], now_s: float) -> LoadTrend | None:
    """Least-squares line through the windows' rates (see the module doc); None if empty."""
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


def request_gpu_seconds(
    role: str,
    profile: CapacityProfile,
    *,
    isl: float,
    osl: float,
    itl_ms: float,
    interval_s: float,
) -> RequestCost:
    """GPU-seconds per request on ``role`` with the throughput loop's sizing functions.

    Sizing a load of one request per second with one GPU per replica gives GPUs per req/s,
    i.e. GPU-seconds per request: prefill ``isl / thpt_prefill(isl)``, decode
    ``osl / thpt_decode(itl, context)``, their sum for an aggregated engine.
    """
    unit = LoadForecast(num_req=interval_s, isl=isl, osl=osl)
    parts = []
    if role in ("prefill", "agg"):
        parts.append(
            size_prefill(
                unit, profile.prefill, interval_s=interval_s, correction=1.0, gpus_per_replica=1
            )
        )
    if role in ("decode", "agg"):
        parts.append(
            size_decode(
                unit,
                profile.decode,
                interval_s=interval_s,
                itl_target_ms=itl_ms,
                correction=1.0,
                gpus_per_replica=1,
            )
        )
    bad = [p.note for p in parts if not p.feasible]
    if bad:
        return RequestCost(0.0, feasible=False, note="; ".join(bad))
    gpu_s = sum(p.demand_tokens_per_s / p.thpt_per_gpu for p in parts if p.thpt_per_gpu > 0)
    return RequestCost(gpu_s)


@dataclass(frozen=True)
class _Tick:
    """One tick's engine and the diagnostics so far; decisions are made through it."""

    now_s: float
    current_dp: int
    diag: ElasticDiagnostics

    def hold(
        self, reason: ElasticReason, message: str, diag: ElasticDiagnostics | None = None
    ) -> ElasticDecision:
        return ElasticDecision(
            self.now_s, self.current_dp, None, reason, message, self.diag if diag is None else diag
        )

    def resize(
        self,
        target_dp: int,
        reason: ElasticReason,
        message: str,
        diag: ElasticDiagnostics | None = None,
    ) -> ElasticDecision:
        return ElasticDecision(
            self.now_s,
            self.current_dp,
            target_dp,
            reason,
            message,
            self.diag if diag is None else diag,
        )


@dataclass(frozen=True)
class Backlog:
    """The work already waiting, as the throughput loop measures it
    (:func:`disagg_planner.core.rules.backlog_tokens`), in requests of the trend's ISL, and
    the rate that drains it within ``backlog_drain_seconds``."""

    rule: RuleValue  # prefill tokens waiting, and the rule's sentence
    requests: float
    drain_rps: float
    drain_s: float

    def words(self) -> str:
        """The backlog term for a decision's message."""
        if self.requests <= 0:
            return self.rule.reason
        return f"{self.rule.reason}, drained over {self.drain_s:.0f} s: +{self.drain_rps:.2f} req/s"


@dataclass(frozen=True)
class _Sizing:
    """What the scale-up and scale-down stages share: the fitted load, the capacity of one
    rank, the sizes allowed, and the ranks the lead time's peak needs."""

    at: _Tick
    trend: LoadTrend
    bottom: int  # the smallest and largest DP sizes allowed
    top: int
    gpu_seconds: float
    rank_rps: float
    slack_s: float
    lead_s: float
    peak_up: float
    need_up: int
    summary: str
    backlog: Backlog
    in_flight: float  # requests in flight now (observed, else rate x SLO request time)


# --- the policy -------------------------------------------------------------------------------


@dataclass
class _History:
    windows: deque[_Window] = field(default_factory=deque)

    def add(self, obs: TrafficObservation) -> None:
        if self.windows and obs.end_s <= self.windows[-1].end_s:
            return  # the same window again (a held tick re-reads it)
        self.windows.append(
            _Window(
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


class ElasticPlanner:
    """The elastic-EP policy of one role (see the module doc).

    ``timing`` overrides the resize timing from the config (the benchmark uses it to plan a
    full restart with the same policy).
    """

    def __init__(
        self,
        *,
        config: PlannerConfig,
        profile: CapacityProfile,
        timing: ElasticEpMode | None = None,
    ) -> None:
        if config.elastic_ep is None or config.elastic_ep_max_dp is None:
            raise ValueError("ElasticPlanner needs a config with elastic_ep and elastic_ep_max_dp")
        self.config = config
        self.role: str = config.elastic_ep
        self.profile = profile
        self.timing = timing if timing is not None else mode_timing(config)
        self.interval_s = config.throughput_adjustment_interval_seconds
        self.step = config.elastic_ep_dp_step
        self.min_dp = config.elastic_ep_min_dp
        self.max_dp = config.elastic_ep_max_dp
        self.gpus_per_rank = config.elastic_ep_gpus_per_rank
        self._history = _History()
        self._lengths: tuple[float, float] | None = None  # last (ISL, OSL) seen
        # What this planner measured of its own resizes (the last few of each).
        self._follower_ready_s: deque[float] = deque(maxlen=MEASURED_RESIZES)
        self._grow_s: deque[float] = deque(maxlen=MEASURED_RESIZES)
        self._shrink_s: deque[float] = deque(maxlen=MEASURED_RESIZES)
        self._grow_pause_s: deque[float] = deque(maxlen=MEASURED_RESIZES)
        self._shrink_pause_s: deque[float] = deque(maxlen=MEASURED_RESIZES)
        # The engine's shrink floor, once it refused a smaller size (vLLM's 400).
        self.engine_min_dp: int | None = None

    # --- what the planner measured ------------------------------------------------------

    def observe_resize(
        self,
        *,
        grow: bool,
        followers_ready_s: float | None,
        resize_s: float | None,
        pause_s: float | None = None,
    ) -> str | None:
        """Learn from one completed resize: how long its followers took to be ready and
        joined (a grow with followers), how long the resize call took, and how long the
        engine paused serving. Returns a warning when the measured pause contradicts the
        configured mode (:func:`pause_contradiction`), else None."""
        if followers_ready_s is not None and followers_ready_s >= 0:
            self._follower_ready_s.append(followers_ready_s)
        if resize_s is not None and resize_s >= 0:
            (self._grow_s if grow else self._shrink_s).append(resize_s)
        if pause_s is None or pause_s < 0:
            return None
        (self._grow_pause_s if grow else self._shrink_pause_s).append(pause_s)
        return pause_contradiction(self.timing, grow=grow, pause_s=pause_s)

    def observe_min_dp(self, minimum_dp: int) -> None:
        """The engine refused a shrink below ``minimum_dp`` (its expert-capacity floor)."""
        self.engine_min_dp = minimum_dp

    def pause_s(self, *, grow: bool) -> float:
        """How long a resize pauses serving: measured once there is a measurement, else the
        configured timing's downtime."""
        measured = self._grow_pause_s if grow else self._shrink_pause_s
        if measured:
            return statistics.median(measured)
        return (self.timing.up if grow else self.timing.down).downtime_s

    def follower_ready_s(self) -> float:
        """The follower start-up + join part of a grow's lead time (module doc, step 3)."""
        if self.config.elastic_ep_follower_service is None:
            return 0.0
        if self._follower_ready_s:
            return statistics.median(self._follower_ready_s)
        return self.config.elastic_ep_follower_ready_seconds

    def resize_total_s(self, *, grow: bool) -> float:
        """How long a resize call takes: measured once there is a measurement, else the
        configured timing."""
        measured = self._grow_s if grow else self._shrink_s
        if measured:
            return statistics.median(measured)
        return (self.timing.up if grow else self.timing.down).total_s

    def _pause_cost(self, rate_rps: float, downtime_s: float, slack_s: float) -> float:
        """Requests a pause of ``downtime_s`` costs (module doc, step 4)."""
        if self.config.elastic_ep_frontend_retries:
            return rate_rps * max(0.0, downtime_s - slack_s)
        return rate_rps * downtime_s

    # --- grid -----------------------------------------------------------------------------

    def _budget(self, dp: int, other_gpus: int) -> BudgetResult:
        """The planner's GPU-budget rule applied to DP size ``dp``: the engine is one role
        counted in steps of ``dp_step`` ranks above the leader's, whose GPUs count with the
        other roles' (the rule never removes them)."""
        return apply_gpu_budget(
            {self.role: (dp - self.min_dp) // self.step},
            gpus_per_replica={self.role: self.step * self.gpus_per_rank},
            floors={self.role: 0},
            max_gpus=self.config.max_gpu_budget,
            min_gpus=self.config.min_gpu_budget,
            order=(self.role,),
            other_gpus=other_gpus + self.min_dp * self.gpus_per_rank,
        )

    def _on_budget_grid(self, dp: int, other_gpus: int) -> int:
        """``dp`` fitted to the GPU budget, on the grid; ``dp`` itself when the budget holds."""
        fitted = self._budget(dp, other_gpus)
        return dp if fitted.hold else self.min_dp + fitted.replicas[self.role] * self.step

    def max_dp_within_budget(self, other_gpus: int) -> int:
        """``elastic_ep_max_dp``, lowered to what ``max_gpu_budget`` leaves (on the grid);
        the leader's ranks when not even they fit (they exist regardless of the budget)."""
        if self._budget(self.max_dp, other_gpus).hold:
            return self.min_dp
        return min(self.max_dp, self._on_budget_grid(self.max_dp, other_gpus))

    def min_dp_within_budget(self, other_gpus: int) -> int:
        """``elastic_ep_min_dp``, raised to what ``min_gpu_budget`` asks (on the grid), never
        above :meth:`max_dp_within_budget`."""
        return min(
            self._on_budget_grid(self.min_dp, other_gpus), self.max_dp_within_budget(other_gpus)
        )

    def on_grid(self, ranks: int, top: int) -> int:
        """The smallest grid size ``min_dp + k * step`` >= ``ranks``, within [min_dp, top]."""
        if ranks <= self.min_dp:
            return self.min_dp
        k = math.ceil((ranks - self.min_dp) / self.step)
        return min(top, self.min_dp + k * self.step)

    # --- tick -----------------------------------------------------------------------------

    def tick(
        self,
        now_s: float,
        traffic: TrafficObservation | MissingObservation,
        *,
        current_dp: int,
        resizing: bool = False,
        other_gpus: int = 0,
        queued_prefill_tokens: float | None = None,
    ) -> ElasticDecision:
        """Decide the DP size of the elastic role's engine at ``now_s`` (see the module doc).

        ``current_dp`` is the engine's active DP size; ``resizing`` whether a resize is in
        flight; ``other_gpus`` the GPUs of the planner's other roles (for the budget);
        ``queued_prefill_tokens`` the prefill tokens waiting in the role's engines (their
        FPM), None where none reports (the backlog then comes from ``traffic.in_flight``).
        Each stage below either decides or passes what it worked out on to the next.
        """
        if current_dp < 1:
            raise ValueError(f"current_dp = {current_dp}: an elastic engine has at least 1 rank")
        at = _Tick(now_s, current_dp, ElasticDiagnostics(timing=self.timing))
        fresh = self._fresh_traffic(at, traffic)
        if isinstance(fresh, ElasticDecision):
            return fresh
        trend = self._trend(now_s, fresh)
        bottom = self.min_dp_within_budget(other_gpus)
        top = self.max_dp_within_budget(other_gpus)
        if self.engine_min_dp is not None:  # the engine's own floor, on the grid
            bottom = min(top, max(bottom, self.on_grid(self.engine_min_dp, top)))
        at = replace(at, diag=ElasticDiagnostics(timing=self.timing, trend=trend, max_dp=top))
        held = (
            self._hold_in_flight(at, resizing)
            or self._hold_over_budget(at, other_gpus)
            or self._reconcile_to_bounds(at, bottom, top)
        )
        if held is not None:
            return held
        sized = self._with_lengths(at, trend, bottom)
        if isinstance(sized, ElasticDecision):
            return sized
        sizing = self._sizing(at, sized, fresh, bottom, top, queued_prefill_tokens)
        if isinstance(sizing, ElasticDecision):
            return sizing
        if sizing.need_up > current_dp:
            return self._scale_up(sizing)
        return self._scale_down(sizing)

    # --- the stages of a tick, in order ----------------------------------------------------

    def _fresh_traffic(
        self, at: _Tick, traffic: TrafficObservation | MissingObservation
    ) -> TrafficObservation | ElasticDecision:
        """The window to plan with, or a hold: never resize on missing or stale data."""
        if isinstance(traffic, MissingObservation):
            detail = f": {traffic.detail}" if traffic.detail else ""
            return at.hold(
                ElasticReason.NO_TRAFFIC_DATA,
                f"traffic unavailable ({traffic.reason}{detail}); holding DP {at.current_dp}",
            )
        if at.now_s - traffic.end_s > self.interval_s:
            return at.hold(
                ElasticReason.STALE_TRAFFIC_DATA,
                f"traffic window ended {at.now_s - traffic.end_s:.0f} s ago; holding DP "
                f"{at.current_dp}",
            )
        return traffic

    def _trend(self, now_s: float, traffic: TrafficObservation) -> LoadTrend:
        """Add the window to the history (also while a resize is in flight: it still counts
        for the trend) and fit the trend window."""
        self._history.add(traffic)
        self._history.prune(now_s - self.config.elastic_ep_trend_window_seconds)
        trend = fit_trend(self._history.windows, now_s)
        assert trend is not None  # the window just added
        return trend

    def _hold_in_flight(self, at: _Tick, resizing: bool) -> ElasticDecision | None:
        if not resizing:
            return None
        return at.hold(
            ElasticReason.RESIZE_IN_FLIGHT,
            f"a resize of the {self.role} engine is in flight; holding DP {at.current_dp}",
        )

    def _hold_over_budget(self, at: _Tick, other_gpus: int) -> ElasticDecision | None:
        """Not even the leader's ranks and the other roles fit under ``max_gpu_budget``: a
        configuration the planner cannot satisfy, so it changes nothing."""
        cap = self._budget(self.max_dp, other_gpus)
        if not cap.hold:
            return None
        return at.hold(
            ElasticReason.GPU_BUDGET_GUARD_HOLD, f"{cap.message}; holding DP {at.current_dp}"
        )

    def _reconcile_to_bounds(self, at: _Tick, bottom: int, top: int) -> ElasticDecision | None:
        current_dp = at.current_dp
        if bottom <= current_dp <= top:
            return None
        target = min(max(current_dp, bottom), top)
        return at.resize(
            target,
            ElasticReason.RECONCILE_TO_BOUNDS,
            f"DP {current_dp} is outside [{bottom}, {top}] (elastic_ep_min_dp, "
            f"elastic_ep_max_dp and the GPU budget); resizing to {target}",
        )

    def _with_lengths(
        self, at: _Tick, trend: LoadTrend, bottom: int
    ) -> LoadTrend | ElasticDecision:
        """The trend with request lengths to size with, or the decision when there are none."""
        if trend.isl > 0 and trend.osl > 0:
            self._lengths = (trend.isl, trend.osl)
            return trend
        if self._lengths is not None:
            # Idle windows have no lengths: size with the last ones seen.
            return replace(trend, isl=self._lengths[0], osl=self._lengths[1])
        if trend.max_observed_rps > 0:
            return at.hold(
                ElasticReason.NO_CHANGE,
                f"no request lengths observed yet; holding DP {at.current_dp}",
            )
        if at.current_dp > bottom:
            # Never any traffic: no load to size, and a pause costs no request.
            return at.resize(
                bottom,
                ElasticReason.SCALE_DOWN,
                f"no traffic in the trend window; DP {at.current_dp} -> {bottom}",
                replace(at.diag, cost_requests=0.0, benefit_requests=0.0),
            )
        return at.hold(ElasticReason.NO_CHANGE, f"no traffic; DP {at.current_dp}")

    def _backlog(
        self, traffic: TrafficObservation, trend: LoadTrend, queued_prefill_tokens: float | None
    ) -> Backlog:
        """The throughput loop's backlog rule on this window (module doc, step 3)."""
        rule = backlog_tokens(
            in_flight=traffic.in_flight,
            arrival_rate=traffic.request_rate,
            slo_request_s=slo_request_seconds(
                ttft_ms=self.config.ttft_ms, itl_ms=self.config.itl_ms, osl=trend.osl
            ),
            isl=trend.isl,
            queued_prefill_tokens=queued_prefill_tokens,
        )
        drain_s = self.config.backlog_drain_seconds
        requests = rule.value / trend.isl if trend.isl > 0 else 0.0
        return Backlog(rule, requests, requests / drain_s, drain_s)

    def _sizing(
        self,
        at: _Tick,
        trend: LoadTrend,
        traffic: TrafficObservation,
        bottom: int,
        top: int,
        queued_prefill_tokens: float | None,
    ) -> _Sizing | ElasticDecision:
        """Capacity per rank from the profile and the ranks the lead time's peak and the
        backlog's drain need, or a hold when the profile cannot size the load."""
        cost = request_gpu_seconds(
            self.role,
            self.profile,
            isl=trend.isl,
            osl=trend.osl,
            itl_ms=self.config.itl_ms,
            interval_s=self.interval_s,
        )
        if not cost.feasible or cost.gpu_seconds <= 0:
            return at.hold(
                ElasticReason.PROFILE_INFEASIBLE,
                f"{cost.note or 'profile gives no throughput'}; holding DP {at.current_dp}",
            )
        rank_rps = self.gpus_per_rank / cost.gpu_seconds
        follower_s = self.follower_ready_s()
        lead_s = follower_s + self.resize_total_s(grow=True) + self.interval_s
        peak_up = trend.peak(at.now_s, at.now_s + lead_s)
        backlog = self._backlog(traffic, trend, queued_prefill_tokens)
        need_up = self._ranks(peak_up + backlog.drain_rps, cost.gpu_seconds)
        diag = ElasticDiagnostics(
            timing=self.timing,
            trend=trend,
            gpu_seconds_per_request=cost.gpu_seconds,
            rank_capacity_rps=rank_rps,
            current_capacity_rps=at.current_dp * rank_rps,
            lead_s=lead_s,
            peak_rps=peak_up,
            ranks_needed=need_up,
            max_dp=top,
            follower_ready_s=follower_s,
            backlog_requests=backlog.requests,
            backlog_rps=backlog.drain_rps,
        )
        summary = (
            f"load {trend.level_rps:.2f} req/s ({trend.slope_rps_per_s * 60:+.2f}/min), "
            f"ISL {trend.isl:.0f}, OSL {trend.osl:.0f}; {backlog.words()}; "
            f"one rank {rank_rps:.3f} req/s"
        )
        return _Sizing(
            at=replace(at, diag=diag),
            trend=trend,
            bottom=bottom,
            top=top,
            gpu_seconds=cost.gpu_seconds,
            rank_rps=rank_rps,
            slack_s=self._slack_s(traffic),
            lead_s=lead_s,
            peak_up=peak_up,
            need_up=need_up,
            summary=summary,
            backlog=backlog,
            in_flight=self._in_flight(traffic, trend),
        )

    def _in_flight(self, traffic: TrafficObservation, trend: LoadTrend) -> float:
        """Requests in flight: the frontend's count, else Little's law on the SLO's request
        time (what a queue-free engine holds)."""
        if traffic.in_flight is not None:
            return max(0.0, traffic.in_flight)
        slo_s = slo_request_seconds(
            ttft_ms=self.config.ttft_ms, itl_ms=self.config.itl_ms, osl=trend.osl
        )
        return traffic.request_rate * slo_s

    def _scale_up(self, s: _Sizing) -> ElasticDecision:
        """More ranks are needed within the lead time: resize if the pause costs fewer
        requests than the overload would (module doc, step 4)."""
        at, trend = s.at, s.trend
        current_dp = at.current_dp
        if current_dp >= s.top:
            return at.hold(
                ElasticReason.AT_MAX_DP,
                f"{s.summary}; peak {s.peak_up:.2f} req/s within {s.lead_s:.0f} s"
                f"{self._backlog_words(s)} needs {s.need_up} ranks, but DP {current_dp} is "
                "the most allowed",
            )
        # A resize in flight holds the next one (resize_in_flight): the size chosen now must
        # carry the load until a second grow, decided at the first tick after this one is
        # active, could be active in turn (module doc, step 3).
        hold_s = s.lead_s + self.follower_ready_s() + self.resize_total_s(grow=True)
        peak_hold = trend.peak(at.now_s, at.now_s + hold_s)
        need = max(s.need_up, self._ranks(peak_hold + s.backlog.drain_rps, s.gpu_seconds))
        target = self.on_grid(need, s.top)
        # The resize starts once the followers have joined; its pause ends it.
        t_active = at.now_s + s.lead_s - self.interval_s
        # what not growing loses: the arrivals above the current capacity, and the
        # requests already waiting, which the current size does not drain in time
        benefit = (
            trend.requests_above(
                t_active,
                t_active + self.config.elastic_ep_benefit_window_seconds,
                current_dp * s.rank_rps,
            )
            + s.backlog.requests
        )
        up_pause_s = self.pause_s(grow=True)
        lost = self._pause_cost(trend.rate_at(t_active - up_pause_s), up_pause_s, s.slack_s)
        diag = replace(
            at.diag,
            benefit_requests=benefit,
            cost_requests=lost,
            ranks_needed=need,
            hold_s=hold_s,
            hold_peak_rps=peak_hold,
        )
        if not benefit > lost:
            return at.hold(
                ElasticReason.HOLD_NOT_WORTH_DOWNTIME,
                f"{s.summary}; DP {current_dp} -> {target} would save ~{benefit:.0f} "
                f"requests from the TTFT target but its {up_pause_s:.1f} s pause costs "
                f"~{lost:.0f} ({self._pause_word()}); holding",
                diag,
            )
        capped = need > target
        return at.resize(
            target,
            ElasticReason.SCALE_UP_CAPPED if capped else ElasticReason.SCALE_UP,
            f"{s.summary}; peak {s.peak_up:.2f} req/s within {s.lead_s:.0f} s "
            f"({self._lead_words(s)}){self._backlog_words(s)} needs {s.need_up} ranks, "
            f"and {peak_hold:.2f} req/s until a next grow could be active ({hold_s:.0f} s) "
            f"{need}; DP {current_dp} -> {target}"
            + (f" (capped at {s.top})" if capped else "")
            + f"; saves ~{benefit:.0f} requests, pause costs ~{lost:.0f} ({self._pause_word()})",
            diag,
        )

    def _scale_down(self, s: _Sizing) -> ElasticDecision:
        """Fewer ranks would do: shrink if the drop is sustained and the pause costs no
        request past the TTFT target (module doc, step 5)."""
        at, trend = s.at, s.trend
        current_dp, now_s = at.current_dp, at.now_s
        down = self.timing.down
        horizon_down = (
            self.resize_total_s(grow=False)
            + self.interval_s
            + self.follower_ready_s()
            + self.resize_total_s(grow=True)
        )
        forecast_down = trend.peak(now_s, now_s + horizon_down)
        peak_down = max(forecast_down, trend.max_observed_rps)
        need_down = self._ranks(peak_down, s.gpu_seconds)
        # A shrink stops at the smallest size the GPU budget allows.
        target = max(s.bottom, self.on_grid(need_down, s.top))
        diag = replace(at.diag, peak_rps=peak_down, ranks_needed=need_down)
        if target >= current_dp:
            forecast_fit = self.on_grid(self._ranks(forecast_down, s.gpu_seconds), s.top)
            if max(s.bottom, forecast_fit) < current_dp:
                return at.hold(
                    ElasticReason.HOLD_SCALE_DOWN_NOT_SUSTAINED,
                    f"{s.summary}; the forecast fits fewer ranks but "
                    f"{trend.max_observed_rps:.2f} req/s was seen within the trend window; "
                    f"holding DP {current_dp}",
                    diag,
                )
            return at.hold(ElasticReason.NO_CHANGE, f"{s.summary}; DP {current_dp} fits", diag)
        if s.backlog.requests > 0:
            # The backlog drains faster at the current size; a shrink would also pause it.
            return at.hold(
                ElasticReason.HOLD_SCALE_DOWN_BACKLOG,
                f"{s.summary}; DP {target} would carry the load, but "
                f"{s.backlog.requests:.0f} requests are still waiting; holding DP "
                f"{current_dp} until they have drained",
                diag,
            )
        # vLLM pauses the removed ranks with mode="abort": what runs there is failed, unless
        # the engine drains first (VLLM_ELASTIC_EP_DRAIN_REQUESTS), which then pauses
        # serving (503) while in-flight requests finish, up to the SLO's request time.
        drains = self.config.elastic_ep_engine_drains_requests
        aborted = 0.0 if drains else s.in_flight * (current_dp - target) / current_dp
        drain_s = (
            min(
                float(self.config.elastic_ep_drain_timeout_seconds),
                slo_request_seconds(
                    ttft_ms=self.config.ttft_ms, itl_ms=self.config.itl_ms, osl=trend.osl
                ),
            )
            if drains and s.in_flight > 0
            else 0.0
        )
        pause_s = self.pause_s(grow=False) + drain_s
        lost = self._pause_cost(trend.rate_at(now_s + down.preparation_s), pause_s, s.slack_s)
        diag = replace(
            diag, benefit_requests=0.0, cost_requests=lost + aborted, aborted_requests=aborted
        )
        if lost > 0:
            return at.hold(
                ElasticReason.HOLD_SCALE_DOWN_COSTS_SLO,
                f"{s.summary}; DP {target} would do, but a {self.timing.name} shrink pauses "
                f"serving {pause_s:.1f} s"
                + (f" ({drain_s:.0f} s of it draining)" if drain_s else "")
                + f" (~{lost:.0f} requests {self._pause_word()}); waiting for idle traffic",
                diag,
            )
        budget = self.config.elastic_ep_shrink_abort_budget
        if aborted > budget:
            return at.hold(
                ElasticReason.HOLD_SCALE_DOWN_ABORTS,
                f"{s.summary}; DP {target} would do, but the shrink would abort ~{aborted:.0f} "
                f"requests in flight on the {current_dp - target} removed ranks (more than "
                f"elastic_ep_shrink_abort_budget={budget:g}); waiting for a quieter moment "
                "(or run the engine with VLLM_ELASTIC_EP_DRAIN_REQUESTS=1 and "
                "elastic_ep_engine_drains_requests to drain first)",
                diag,
            )
        if drains:
            return at.resize(
                target,
                ElasticReason.SCALE_DOWN_AFTER_DRAIN,
                f"{s.summary}; peak {peak_down:.2f} req/s within {horizon_down:.0f} s fits "
                f"{target} ranks; DP {current_dp} -> {target}, the engine draining first "
                f"(~{s.in_flight:.0f} in flight finish, none aborted)",
                diag,
            )
        return at.resize(
            target,
            ElasticReason.SCALE_DOWN,
            f"{s.summary}; peak {peak_down:.2f} req/s within {horizon_down:.0f} s fits "
            f"{target} ranks; DP {current_dp} -> {target}, aborting ~{aborted:.0f} in flight on "
            "the removed ranks",
            diag,
        )

    def _pause_word(self) -> str:
        if self.config.elastic_ep_frontend_retries:
            return "retried, past the TTFT target"
        return "rejected with 503"

    @staticmethod
    def _backlog_words(s: _Sizing) -> str:
        if s.backlog.drain_rps <= 0:
            return ""
        return f" + backlog {s.backlog.drain_rps:.2f} req/s"

    def _lead_words(self, s: _Sizing) -> str:
        follower = s.at.diag.follower_ready_s or 0.0
        parts = [f"followers {follower:.0f} s"] if follower else []
        parts.append(f"{self.timing.name} resize {self.resize_total_s(grow=True):.0f} s")
        return " + ".join(parts) + " + interval"

    def _ranks(self, rate_rps: float, gpu_seconds: float) -> int:
        if rate_rps <= 0:
            return 0
        return math.ceil(rate_rps * gpu_seconds / self.gpus_per_rank - 1e-9)

    def _slack_s(self, traffic: TrafficObservation) -> float:
        """How much pause a request can absorb within the TTFT target (s)."""
        observed = traffic.ttft_ms if traffic.ttft_ms is not None else 0.0
        return max(0.0, self.config.ttft_ms - observed) / 1000.0
