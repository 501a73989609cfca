"""Plain records the decision core reads and writes.

Observers (Prometheus, FPM subscriber, connectors, the simulator in replay) fill
observations; the core returns decisions with reasons. Nothing here does I/O. The reason
enums' string values double as metric label values, so they are append-only.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Literal

Role = Literal["prefill", "decode", "agg"]
ROLES: tuple[Role, ...] = ("prefill", "decode", "agg")


class ThroughputReason(StrEnum):
    """Why the throughput loop decided what it did (Dynamo's states, then ours)."""

    UNSET = "unset"
    DISABLED = "disabled"
    NO_TRAFFIC_DATA = "no_traffic_data"
    PREDICT_FAILED = "predict_failed"
    MODEL_NOT_READY = "model_not_ready"
    SET_LOWER_BOUND = "set_lower_bound"
    SCALE = "scale"
    NO_CHANGE = "no_change"
    GPU_BUDGET_GUARD_HOLD = "gpu_budget_guard_hold"
    GPU_BUDGET_RECONCILE = "gpu_budget_reconcile"
    # ours
    SCALING_IN_PROGRESS = "scaling_in_progress"
    CONVERGENCE_TIMEOUT = "convergence_timeout"
    PROFILE_INFEASIBLE = "profile_infeasible"
    STALE_TRAFFIC_DATA = "stale_traffic_data"
    MANUAL_OVERRIDE_HOLD = "manual_override_hold"
    ADVISORY = "advisory"


class LoadReason(StrEnum):
    """Why the load loop decided what it did (Dynamo's states, then ours)."""

    UNSET = "unset"
    DISABLED = "disabled"
    NO_FPM_DATA = "no_fpm_data"
    SCALING_IN_PROGRESS = "scaling_in_progress"
    WORKER_COUNT_MISMATCH = "worker_count_mismatch"
    INSUFFICIENT_DATA = "insufficient_data"
    NO_CHANGE = "no_change"
    SCALE_UP = "scale_up"
    SCALE_DOWN = "scale_down"
    SCALE_DOWN_CAPPED_BY_THROUGHPUT = "scale_down_capped_by_throughput"
    SCALE_DOWN_REFUSED_CONSOLIDATION = "scale_down_refused_consolidation"
    RECONCILE_CLAMPED_TO_FLOOR = "reconcile_clamped_to_floor"
    RECONCILE_CLAMPED_TO_CEILING = "reconcile_clamped_to_ceiling"
    GPU_BUDGET_GUARD_HOLD = "gpu_budget_guard_hold"
    GPU_BUDGET_RECONCILE = "gpu_budget_reconcile"
    # ours
    STALE_FPM_DATA = "stale_fpm_data"
    INVALID_FPM_DATA = "invalid_fpm_data"


@dataclass(frozen=True)
class Histogram:
    """Increase of a cumulative histogram over a window: counts per upper bound ``le``.

    ``bounds`` are the finite upper bounds in rising order; ``counts[i]`` is the number of
    observations in ``(bounds[i-1], bounds[i]]``; ``overflow`` counts those above the last
    bound (the ``+Inf`` bucket minus the last finite one).
    """

    bounds: tuple[float, ...]
    counts: tuple[float, ...]
    overflow: float = 0.0

    @property
    def total(self) -> float:
        return float(sum(self.counts) + self.overflow)


def histogram_points(histogram: Histogram, *, overflow: bool = True) -> list[tuple[float, float]]:
    """``(value, count)`` per bucket of a histogram, each bucket at its midpoint; the
    overflow (above the last bound) at 1.5x that bound, or left out."""
    if not histogram.bounds:
        return []
    lows = (0.0, *histogram.bounds[:-1])
    points = [
        ((lo + hi) / 2, float(w))
        for lo, hi, w in zip(lows, histogram.bounds, histogram.counts, strict=True)
    ]
    if overflow:
        points.append((histogram.bounds[-1] * 1.5, float(histogram.overflow)))
    return points


def histogram_quantile(histogram: Histogram, quantile: float) -> float | None:
    """The ``quantile`` of a bucketed distribution, linear within a bucket as Prometheus'
    ``histogram_quantile`` is (the overflow bucket answers with the last bound); None when
    empty."""
    total = histogram.total
    if total <= 0 or not histogram.bounds:
        return None
    rank = quantile * total
    seen, low = 0.0, 0.0
    for bound, count in zip(histogram.bounds, histogram.counts, strict=True):
        if count > 0 and seen + count >= rank:
            return low + (bound - low) * (rank - seen) / count
        seen += count
        low = bound
    return histogram.bounds[-1]


def histogram_share_above(histogram: Histogram, value: float) -> float:
    """The share of a bucketed distribution's observations above ``value``, linear within
    a bucket (as :func:`histogram_quantile`); the overflow counts as above only when
    ``value`` is at most the last bound (beyond it the histogram cannot say). 0 when empty."""
    total = histogram.total
    if total <= 0 or not histogram.bounds:
        return 0.0
    above, low = 0.0, 0.0
    for bound, count in zip(histogram.bounds, histogram.counts, strict=True):
        if value < bound:
            above += count * (bound - max(low, value)) / (bound - low) if bound > low else count
        low = bound
    if value <= histogram.bounds[-1]:
        above += histogram.overflow
    return min(1.0, above / total)


@dataclass(frozen=True)
class TrafficObservation:
    """Frontend traffic over the window ``[end_s - duration_s, end_s]``.

    ``num_req`` is the number of requests started in the window (0 is a valid, idle
    window). The averages are None when undefined (no request finished in the window), never
    NaN. Latencies are in milliseconds, lengths in tokens.
    """

    end_s: float
    duration_s: float
    num_req: float
    ttft_ms: float | None = None
    itl_ms: float | None = None
    isl: float | None = None
    osl: float | None = None
    request_duration_s: float | None = None
    isl_histogram: Histogram | None = None
    osl_histogram: Histogram | None = None
    # TTFT of the requests that got their first token in the window; bounds in seconds
    ttft_histogram: Histogram | None = None
    # requests started but not finished at ``end_s`` (frontend counters), when read
    in_flight: float | None = None
    # Histogram families (their _sum/_count) with no series in a window whose request
    # counters moved: the averages they give are None for want of data, not of traffic.
    missing_series: tuple[str, ...] = ()
    # the router's mean share of prompt tokens served from the prefix cache, when read
    kv_hit_rate: float | None = None
    # mean tokens per sequence per decode step (speculative decoding), when read
    accept_length: float | None = None
    # why ``accept_length`` is None (no engine counters, no drafts, a bad value), for the
    # reason of the rule that then falls back
    accept_length_missing: str | None = None

    def __post_init__(self) -> None:
        for name in (
            "kv_hit_rate",
            "accept_length",
            "num_req",
            "ttft_ms",
            "itl_ms",
            "isl",
            "osl",
            "request_duration_s",
            "in_flight",
        ):
            value = getattr(self, name)
            if value is not None and not math.isfinite(value):
                raise ValueError(f"TrafficObservation.{name} must be finite or None, got {value}")
        if self.num_req < 0:
            raise ValueError(f"TrafficObservation.num_req must be >= 0, got {self.num_req}")
        if self.duration_s <= 0:
            raise ValueError(f"TrafficObservation.duration_s must be > 0, got {self.duration_s}")

    @property
    def request_rate(self) -> float:
        return self.num_req / self.duration_s


@dataclass(frozen=True)
class MissingObservation:
    """An observation that could not be made; the planner holds and reports ``reason``."""

    reason: str
    detail: str = ""


@dataclass(frozen=True)
class RoleStatus:
    """Replicas of one role as the deployment reports them.

    ``terminating``: replicas scaled away whose pods still run (they hold their GPUs until
    gone); 0 where the connector does not see pods.
    """

    desired: int
    ready: int
    gpus_per_replica: int
    terminating: int = 0


@dataclass(frozen=True)
class DeploymentStatus:
    """Replica status per role scaled by this planner, read from the deployment."""

    roles: dict[str, RoleStatus] = field(default_factory=dict)

    def desired(self, role: str) -> int:
        return self.roles[role].desired

    def ready(self, role: str) -> int:
        return self.roles[role].ready

    @property
    def converged(self) -> bool:
        return all(s.desired == s.ready for s in self.roles.values())

    @property
    def gpus_in_use(self) -> int:
        """GPUs held now: starting replicas (desired above ready) and terminating ones count."""
        return sum(
            (max(s.desired, s.ready) + s.terminating) * s.gpus_per_replica
            for s in self.roles.values()
        )
