"""What the throughput loop remembers between ticks, in small named holders.

- :class:`ConvergenceMemory`: its own scale actions and how long each took to be ready;
- :class:`StabilisationMemory`: the recommendations of the last stabilisation window and
  the replicas found at the first tick;
- :class:`TrafficMemory`: short-window rates and lengths (burst factor, burst memory,
  rising trend, the fast path's lengths), the prompt-length distribution, and the fast
  windows since the last tick (the tick's window when its own is missing).

The feedback rules' memory is :class:`disagg_planner.core.feedback.FeedbackMemory`.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from disagg_planner.core.rules import LengthSample, RateSample
from disagg_planner.core.types import (
    DeploymentStatus,
    Histogram,
    MissingObservation,
    TrafficObservation,
)

# Short-window (fast-check) arrival rates kept for the burst factor: an hour at 15 s.
BURST_HISTORY = 240


@dataclass
class ConvergenceMemory:
    """The last change (when, to what), scale-ups awaiting ready, measured latencies."""

    last_action_s: float | None = None
    last_target: dict[str, int] | None = None
    awaiting_ready: dict[str, float] = field(default_factory=dict)  # role -> time of the change
    scaling_latency_s: dict[str, float] = field(default_factory=dict)
    last_scale_up_s: dict[str, float] = field(default_factory=dict)

    def track(self, now_s: float, status: DeploymentStatus) -> None:
        """Measure each scale-up from decision to ready (checked on every tick, fast ones
        included, so the measurement is as fine as the fast-check period)."""
        for role, since in list(self.awaiting_ready.items()):
            if role in status.roles and status.ready(role) >= status.desired(role):
                self.scaling_latency_s[role] = now_s - since
                del self.awaiting_ready[role]

    def ready_at(self, role: str) -> float | None:
        """When ``role``'s last scale-up became ready (None while it starts, or never)."""
        if role in self.awaiting_ready or role not in self.scaling_latency_s:
            return None
        return self.last_scale_up_s[role] + self.scaling_latency_s[role]

    def note_scale(
        self, now_s: float, target: Mapping[str, int], desired: Mapping[str, int]
    ) -> None:
        """Remember a change: the convergence wait, and each scale-up's time (measured to
        ready; no scale-down of that role within one time-to-ready)."""
        self.last_action_s = now_s
        self.last_target = dict(target)
        for role, n in target.items():
            if n > desired[role]:
                self.awaiting_ready[role] = now_s
                self.last_scale_up_s[role] = now_s

    def slow_warnings(self, interval_s: float) -> list[str]:
        """A warning for each role whose last change took longer than ``interval_s`` from
        decision to ready (the planner then acts on stale capacity)."""
        return [
            f"{role} took {latency:.0f} s from decision to ready, longer than the "
            f"{interval_s:.0f} s adjustment interval"
            for role, latency in self.scaling_latency_s.items()
            if latency > interval_s
        ]

    def plan_from(
        self,
        now_s: float,
        status: DeploymentStatus,
        roles: Iterable[str],
        *,
        timeout_s: float,
        warnings: list[str],
    ) -> dict[str, int] | str:
        """The replicas of ``roles`` to plan from: the desired ones; while the last change converges
        (within ``timeout_s`` of it), what it waits for (the tick holds); the ready ones once
        it has not converged within the timeout (with a warning appended to ``warnings``)."""
        if status.converged:
            return {r: status.desired(r) for r in roles}
        if self.last_action_s is not None and now_s - self.last_action_s < timeout_s:
            pending = ", ".join(
                f"{r} {s.ready}/{s.desired} ready"
                for r, s in status.roles.items()
                if s.ready != s.desired
            )
            return f"waiting for the last change to converge ({pending})"
        # Replicas that never became ready: plan from what is actually serving
        # (Dynamo issue #14251: the planner waited forever on unschedulable pods).
        warnings.append("previous change did not converge; re-planning from ready replicas")
        return {r: status.ready(r) for r in roles}


@dataclass
class StabilisationMemory:
    """The recommendations of the last window, and the replicas the first tick found (a
    need until one stabilisation window after it, so that a planner (re)started on a running
    deployment does not cut it before it has seen a window of load: the HPA controller
    records its first sight of an HPA the same way)."""

    recommendations: deque[tuple[float, dict[str, int]]] = field(default_factory=deque)
    found: tuple[float, dict[str, int]] | None = None

    def remember(self, now_s: float, recommendation: Mapping[str, int], window_s: float) -> None:
        self.recommendations.append((now_s, dict(recommendation)))
        while self.recommendations and self.recommendations[0][0] < now_s - window_s:
            self.recommendations.popleft()

    def recent(self, role: str, since_s: float | None = None) -> int:
        """The highest need of ``role`` remembered (at or after ``since_s`` when given)."""
        return max(
            (
                r.get(role, 0)
                for t, r in self.recommendations
                if since_s is None or t >= since_s - 1e-9
            ),
            default=0,
        )


@dataclass
class TrafficMemory:
    """Short windows and lengths seen; see the module doc."""

    # Variability (squared coefficient of variation) of the prefill work per prompt, from
    # the observed ISL histogram at the profile; until one is seen, the exponential case
    # (1.0) is assumed.
    service_scv: float = 1.0
    isl_histogram: Histogram | None = None  # the last window's, for the length-mix rule
    # whether a tick has seen one (until then, the fast checks pool their windows')
    lengths_from_tick: bool = False
    # short-window rate / its interval's level (rules.burst_ratios), for the burst factor
    burst_ratios: deque[float] = field(default_factory=lambda: deque(maxlen=BURST_HISTORY))
    short_rates: list[float] = field(default_factory=list)  # fast-check rates since the tick
    # short-window rates (fast checks; the intervals' without them), for the burst memory
    rate_samples: deque[RateSample] = field(default_factory=lambda: deque(maxlen=BURST_HISTORY))
    last_lengths: tuple[float, float] | None = None  # (isl, osl) last seen
    # the last interval's window and the fast windows since, for the fast path's lengths
    length_windows: deque[LengthSample] = field(default_factory=lambda: deque(maxlen=BURST_HISTORY))
    # the fast windows since the last tick, pooled when the tick's own window is missing
    fast_windows: list[TrafficObservation] = field(default_factory=list)
    first_seen_s: float | None = None  # start of the first window with traffic
    # the decoding role's ITL ratio (observed over profiled) of each tick's window: (end, ratio)
    itl_ratios: deque[tuple[float, float]] = field(
        default_factory=lambda: deque(maxlen=BURST_HISTORY)
    )

    def see_traffic(self, obs: TrafficObservation) -> None:
        if self.first_seen_s is None and obs.num_req > 0:
            self.first_seen_s = obs.end_s - obs.duration_s

    def since_opening(self, interval_s: float) -> float | None:
        """When the opening (the first interval of traffic) ends; None before any."""
        return self.first_seen_s + interval_s if self.first_seen_s is not None else None

    def after_opening(self, samples: Iterable[RateSample], interval_s: float) -> list[RateSample]:
        """The short windows after the opening interval of traffic (the run, or the planner,
        starting: its ramp is no trend to extrapolate and no burst to remember)."""
        end = self.since_opening(interval_s)
        if end is None:
            return []
        return [s for s in samples if s.end_s - s.duration_s >= end - 1e-9]

    def opening_rule(self, now_s: float, interval_s: float) -> str:
        """The opening ramp rule's sentence while its windows are in the trend's span."""
        end = self.since_opening(interval_s)
        if end is None or now_s >= end + interval_s:
            return ""
        return (
            f"opening ramp: traffic since {self.first_seen_s:.0f} s, the windows before "
            f"{end:.0f} s are the run starting (no trend, no burst)"
        )


def pool_windows(windows: list[TrafficObservation]) -> TrafficObservation | None:
    """Consecutive short windows as one: counts and durations summed, averages weighted by
    requests, histograms summed bucket by bucket where their bounds agree, the last
    window's in-flight count; None when there is none."""
    if not windows:
        return None
    total = sum(w.num_req for w in windows)

    def mean(name: str) -> float | None:
        pairs = [(w.num_req, getattr(w, name)) for w in windows if getattr(w, name) is not None]
        weight = sum(n for n, _ in pairs)
        return sum(n * v for n, v in pairs) / weight if weight > 0 else None

    def summed(name: str) -> Histogram | None:
        hists = [getattr(w, name) for w in windows if getattr(w, name) is not None]
        if not hists or any(h.bounds != hists[0].bounds for h in hists):
            return hists[-1] if hists else None
        counts = tuple(sum(c) for c in zip(*(h.counts for h in hists), strict=True))
        return Histogram(hists[0].bounds, counts, sum(h.overflow for h in hists))

    last = windows[-1]
    return TrafficObservation(
        end_s=last.end_s,
        duration_s=sum(w.duration_s for w in windows),
        num_req=total,
        ttft_ms=mean("ttft_ms"),
        itl_ms=mean("itl_ms"),
        isl=mean("isl"),
        osl=mean("osl"),
        request_duration_s=mean("request_duration_s"),
        isl_histogram=summed("isl_histogram"),
        osl_histogram=summed("osl_histogram"),
        ttft_histogram=summed("ttft_histogram"),
        in_flight=last.in_flight,
    )


def pooled_rule(missing: MissingObservation, pooled: TrafficObservation, n: int) -> str:
    """The sentence of a tick planned from ``n`` pooled fast windows (a first tick that sees)."""
    return (
        f"first tick that sees: the interval's window is missing ({missing.reason}); "
        f"planned from the {n} fast windows since the last tick ({pooled.duration_s:.0f} s, "
        f"{pooled.num_req:.0f} requests)"
    )
