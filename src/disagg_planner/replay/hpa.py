"""A Kubernetes HPA (autoscaling/v2) on a per-role utilisation signal: the baseline that
platform teams would set up without a planner.

Semantics, with the defaults of the HPA controller:

- every ``sync_period_s`` (15 s): ``desired = ceil(current x utilisation / target)``;
- no change while ``|utilisation / target - 1| <= tolerance`` (0.1);
- scale-down stabilisation: the highest recommendation of the last 300 s wins; the replicas
  found at the HPA's first sync count as its first recommendation (the controller records
  them when it first sees an HPA), so it does not scale down within 300 s of starting;
- scale-up rate: at most ``max(+100 %, +4 pods)`` per 15 s; scale-down: at most -100 % per 15 s;
- ``min_replicas`` / ``max_replicas`` bounds.

Pure: the caller passes the time and the utilisation; nothing here reads a clock.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass


@dataclass(frozen=True)
class HpaBehavior:
    target_utilisation: float = 0.7
    tolerance: float = 0.1
    sync_period_s: float = 15.0
    scale_down_stabilisation_s: float = 300.0
    scale_up_percent: float = 100.0
    scale_up_pods: int = 4
    scale_up_period_s: float = 15.0
    scale_down_percent: float = 100.0
    scale_down_period_s: float = 15.0
    min_replicas: int = 1
    max_replicas: int = 1_000_000


class HorizontalPodAutoscaler:
    """The replica recommendation of one HPA over time (one role)."""

    def __init__(self, behavior: HpaBehavior) -> None:
        self.behavior = behavior
        self._recommendations: deque[tuple[float, int]] = deque()
        self._synced = False
        self._events: deque[tuple[float, int]] = deque()  # (time, replicas after the change)

    def recommend(self, *, now_s: float, current: int, utilisation: float | None) -> int:
        """Desired replicas at ``now_s``; ``utilisation`` is mean busy fraction per replica
        (None when no replica reported: the HPA does nothing without metrics)."""
        b = self.behavior
        if not self._synced:
            # as the HPA controller's first sight of an HPA: what runs is a recommendation
            # (with no window it is outside the window at once, as the planner's is)
            self._synced = True
            if b.scale_down_stabilisation_s > 0:
                self._recommendations.append((now_s, current))
        if utilisation is None or current <= 0 or not math.isfinite(utilisation):
            return max(current, b.min_replicas)
        ratio = utilisation / b.target_utilisation
        raw = current if abs(ratio - 1.0) <= b.tolerance else math.ceil(current * ratio)
        raw = min(max(raw, b.min_replicas), b.max_replicas)

        # Scale-down stabilisation: the highest recommendation in the window wins.
        self._recommendations.append((now_s, raw))
        while self._recommendations and (
            self._recommendations[0][0] < now_s - b.scale_down_stabilisation_s
        ):
            self._recommendations.popleft()
        stabilised = raw
        if raw < current:
            stabilised = min(current, max(r for _, r in self._recommendations))

        desired = self._rate_limit(now_s, current, stabilised)
        if desired != current:
            self._events.append((now_s, desired))
        return desired

    def _rate_limit(self, now_s: float, current: int, desired: int) -> int:
        b = self.behavior
        if desired > current:
            base = self._replicas_at(now_s - b.scale_up_period_s, current, lowest=True)
            limit = max(math.floor(base * (1 + b.scale_up_percent / 100)), base + b.scale_up_pods)
            return min(desired, limit)
        if desired < current:
            base = self._replicas_at(now_s - b.scale_down_period_s, current, lowest=False)
            limit = math.ceil(base * (1 - b.scale_down_percent / 100))
            return max(desired, limit)
        return desired

    def _replicas_at(self, since_s: float, current: int, *, lowest: bool) -> int:
        """The replica count the rate period is measured from: the extreme of the counts
        the HPA itself set within the period, or the current count."""
        while self._events and self._events[0][0] < since_s - 3600:
            self._events.popleft()
        recent = [n for t, n in self._events if t >= since_s]
        if not recent:
            return current
        return min([*recent, current]) if lowest else max([*recent, current])
