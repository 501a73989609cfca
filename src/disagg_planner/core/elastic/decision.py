"""What one tick of the elastic-EP policy decides: the decision, its reason and the arithmetic
behind it, and :class:`Tick`, through which every stage decides."""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from disagg_planner.core.elastic.trend import LoadTrend
from disagg_planner.profiles.elastic_resize import ElasticEpMode


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
    backlog_requests: float | None = None  # requests already waiting (package doc, step 3)
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
class Tick:
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
