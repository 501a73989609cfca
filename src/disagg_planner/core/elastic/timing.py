"""How long a resize takes and how long it pauses serving: the configured timing of the mode
(:func:`mode_timing`), what the planner measured of its own resizes
(:class:`MeasuredResizes`, package doc step 3), and the warning when a measured pause
contradicts the mode (:func:`pause_contradiction`)."""

from __future__ import annotations

import statistics
from collections import deque
from dataclasses import dataclass, field

from disagg_planner.config.schema import PlannerConfig
from disagg_planner.config.sections.elastic_ep import parse_elastic_ep_timing
from disagg_planner.profiles import elastic_resize
from disagg_planner.profiles.elastic_resize import ElasticEpMode, ResizeTiming

# How many of its own resizes the planner's measured lead time looks back on.
MEASURED_RESIZES = 5


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


def _measured() -> deque[float]:
    return deque(maxlen=MEASURED_RESIZES)


@dataclass
class MeasuredResizes:
    """What the planner measured of its own resizes, the last :data:`MEASURED_RESIZES` of
    each kind; each answer is the median, None before the first measurement."""

    follower_ready: deque[float] = field(default_factory=_measured)
    grow: deque[float] = field(default_factory=_measured)
    shrink: deque[float] = field(default_factory=_measured)
    grow_pause: deque[float] = field(default_factory=_measured)
    shrink_pause: deque[float] = field(default_factory=_measured)

    def record(
        self,
        *,
        grow: bool,
        followers_ready_s: float | None,
        resize_s: float | None,
        pause_s: float | None,
    ) -> bool:
        """Keep one resize's durations (a negative or missing one is not measured); whether
        its pause was kept."""
        if followers_ready_s is not None and followers_ready_s >= 0:
            self.follower_ready.append(followers_ready_s)
        if resize_s is not None and resize_s >= 0:
            (self.grow if grow else self.shrink).append(resize_s)
        if pause_s is None or pause_s < 0:
            return False
        (self.grow_pause if grow else self.shrink_pause).append(pause_s)
        return True

    def follower_ready_s(self) -> float | None:
        return _median(self.follower_ready)

    def resize_s(self, *, grow: bool) -> float | None:
        return _median(self.grow if grow else self.shrink)

    def pause_s(self, *, grow: bool) -> float | None:
        return _median(self.grow_pause if grow else self.shrink_pause)


def _median(values: deque[float]) -> float | None:
    return statistics.median(values) if values else None
