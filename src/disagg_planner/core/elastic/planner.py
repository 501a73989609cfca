"""``ElasticPlanner``: the elastic-EP policy of one role, one tick at a time (the package doc
describes its model). A tick runs these stages in order, each deciding or passing on what it
worked out:

1. ``_fresh_traffic``: hold on a missing or stale window;
2. ``_trend``: fit the load trend (:mod:`.trend`);
3. ``_hold_in_flight``, ``_hold_over_budget``, ``_reconcile_to_bounds``: hold while a resize
   runs or the budget cannot hold the leader, resize into the allowed sizes (:mod:`.grid`);
4. ``_with_lengths``: the request lengths to size with;
5. ``_sizing``: one rank's capacity, the lead time, the backlog (:mod:`.capacity`);
6. ``_scale_up`` or ``_scale_down``: whether the resize is worth its pause.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from disagg_planner.config.schema import PlannerConfig
from disagg_planner.core.elastic.capacity import (
    Backlog,
    ranks_for,
    request_gpu_seconds,
    waiting_backlog,
)
from disagg_planner.core.elastic.decision import (
    ElasticDecision,
    ElasticDiagnostics,
    ElasticReason,
    Tick,
)
from disagg_planner.core.elastic.grid import DpGrid
from disagg_planner.core.elastic.timing import MeasuredResizes, mode_timing, pause_contradiction
from disagg_planner.core.elastic.trend import LoadTrend, TrafficHistory, fit_trend
from disagg_planner.core.rules import slo_request_seconds
from disagg_planner.core.sizing import CapacityProfile
from disagg_planner.core.types import MissingObservation, TrafficObservation
from disagg_planner.profiles.elastic_resize import ElasticEpMode


@dataclass(frozen=True)
class Sizing:
    """What the scale-up and scale-down stages share: the fitted load, the capacity of one
    rank, the sizes allowed, and the ranks the lead time's peak needs."""

    at: Tick
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


class ElasticPlanner:
    """The elastic-EP policy of one role (see the package doc).

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
        self.gpus_per_rank = config.elastic_ep_gpus_per_rank
        self.grid = DpGrid.of(config, role=self.role, max_dp=config.elastic_ep_max_dp)
        self._history = TrafficHistory()
        self._lengths: tuple[float, float] | None = None  # last (ISL, OSL) seen
        self.measured = MeasuredResizes()
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
        kept = self.measured.record(
            grow=grow, followers_ready_s=followers_ready_s, resize_s=resize_s, pause_s=pause_s
        )
        if not kept or pause_s is None:
            return None
        return pause_contradiction(self.timing, grow=grow, pause_s=pause_s)

    def observe_min_dp(self, minimum_dp: int) -> None:
        """The engine refused a shrink below ``minimum_dp`` (its expert-capacity floor)."""
        self.engine_min_dp = minimum_dp

    def pause_s(self, *, grow: bool) -> float:
        """How long a resize pauses serving: measured once there is a measurement, else the
        configured timing's downtime."""
        measured = self.measured.pause_s(grow=grow)
        if measured is not None:
            return measured
        return (self.timing.up if grow else self.timing.down).downtime_s

    def follower_ready_s(self) -> float:
        """The follower start-up + join part of a grow's lead time (package doc, step 3)."""
        if self.config.elastic_ep_follower_service is None:
            return 0.0
        measured = self.measured.follower_ready_s()
        if measured is not None:
            return measured
        return self.config.elastic_ep_follower_ready_seconds

    def resize_total_s(self, *, grow: bool) -> float:
        """How long a resize call takes: measured once there is a measurement, else the
        configured timing."""
        measured = self.measured.resize_s(grow=grow)
        if measured is not None:
            return measured
        return (self.timing.up if grow else self.timing.down).total_s

    def _pause_cost(self, rate_rps: float, downtime_s: float, slack_s: float) -> float:
        """Requests a pause of ``downtime_s`` costs (package doc, step 4)."""
        if self.config.elastic_ep_frontend_retries:
            return rate_rps * max(0.0, downtime_s - slack_s)
        return rate_rps * downtime_s

    # --- grid (:class:`DpGrid`) ----------------------------------------------------------

    def max_dp_within_budget(self, other_gpus: int) -> int:
        """:meth:`DpGrid.max_dp_within_budget`."""
        return self.grid.max_dp_within_budget(other_gpus)

    def min_dp_within_budget(self, other_gpus: int) -> int:
        """:meth:`DpGrid.min_dp_within_budget`."""
        return self.grid.min_dp_within_budget(other_gpus)

    def on_grid(self, ranks: int, top: int) -> int:
        """:meth:`DpGrid.on_grid`."""
        return self.grid.on_grid(ranks, top)

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
        """Decide the DP size of the elastic role's engine at ``now_s`` (see the package doc).

        ``current_dp`` is the engine's active DP size; ``resizing`` whether a resize is in
        flight; ``other_gpus`` the GPUs of the planner's other roles (for the budget);
        ``queued_prefill_tokens`` the prefill tokens waiting in the role's engines (their
        FPM), None where none reports (the backlog then comes from ``traffic.in_flight``).
        Each stage below either decides or passes what it worked out on to the next.
        """
        if current_dp < 1:
            raise ValueError(f"current_dp = {current_dp}: an elastic engine has at least 1 rank")
        at = Tick(now_s, current_dp, ElasticDiagnostics(timing=self.timing))
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
        self, at: Tick, traffic: TrafficObservation | MissingObservation
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

    def _hold_in_flight(self, at: Tick, resizing: bool) -> ElasticDecision | None:
        if not resizing:
            return None
        return at.hold(
            ElasticReason.RESIZE_IN_FLIGHT,
            f"a resize of the {self.role} engine is in flight; holding DP {at.current_dp}",
        )

    def _hold_over_budget(self, at: Tick, other_gpus: int) -> ElasticDecision | None:
        """Not even the leader's ranks and the other roles fit under ``max_gpu_budget``: a
        configuration the planner cannot satisfy, so it changes nothing."""
        cap = self.grid.budget(self.grid.max_dp, other_gpus)
        if not cap.hold:
            return None
        return at.hold(
            ElasticReason.GPU_BUDGET_GUARD_HOLD, f"{cap.message}; holding DP {at.current_dp}"
        )

    def _reconcile_to_bounds(self, at: Tick, bottom: int, top: int) -> ElasticDecision | None:
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

    def _with_lengths(self, at: Tick, trend: LoadTrend, bottom: int) -> LoadTrend | ElasticDecision:
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

    def _sizing(
        self,
        at: Tick,
        trend: LoadTrend,
        traffic: TrafficObservation,
        bottom: int,
        top: int,
        queued_prefill_tokens: float | None,
    ) -> Sizing | ElasticDecision:
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
        backlog = waiting_backlog(
            traffic,
            isl=trend.isl,
            osl=trend.osl,
            ttft_ms=self.config.ttft_ms,
            itl_ms=self.config.itl_ms,
            drain_s=self.config.backlog_drain_seconds,
            queued_prefill_tokens=queued_prefill_tokens,
        )
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
        return Sizing(
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

    def _scale_up(self, s: Sizing) -> ElasticDecision:
        """More ranks are needed within the lead time: resize if the pause costs fewer
        requests than the overload would (package doc, step 4)."""
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
        # active, could be active in turn (package doc, step 3).
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

    def _scale_down(self, s: Sizing) -> ElasticDecision:
        """Fewer ranks would do: shrink if the drop is sustained and the pause costs no
        request past the TTFT target (package doc, step 5)."""
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
    def _backlog_words(s: Sizing) -> str:
        if s.backlog.drain_rps <= 0:
            return ""
        return f" + backlog {s.backlog.drain_rps:.2f} req/s"

    def _lead_words(self, s: Sizing) -> str:
        follower = s.at.diag.follower_ready_s or 0.0
        parts = [f"followers {follower:.0f} s"] if follower else []
        parts.append(f"{self.timing.name} resize {self.resize_total_s(grow=True):.0f} s")
        return " + ".join(parts) + " + interval"

    def _ranks(self, rate_rps: float, gpu_seconds: float) -> int:
        return ranks_for(rate_rps, gpu_seconds, self.gpus_per_rank)

    def _slack_s(self, traffic: TrafficObservation) -> float:
        """How much pause a request can absorb within the TTFT target (s)."""
        observed = traffic.ttft_ms if traffic.ttft_ms is not None else 0.0
        return max(0.0, self.config.ttft_ms - observed) / 1000.0
