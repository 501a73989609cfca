"""The observation builder: what one tick read, turned into the core's :class:`Observation`.

Every shell builds its observations here, so that a replay result speaks for the live loop:
:class:`disagg_planner.runtime.loop.DeploymentLoop` runs live (FPM subscribers, Prometheus,
a Kubernetes or virtual connector) and in replay (simulated sources and connector,
:mod:`disagg_planner.replay.connector`) on this one definition of

- FPM feeding: the load models learn from every iteration an engine source received since
  the last tick (:meth:`ObservationBuilder.learn`);
- busy time: each engine's share of the last :data:`BUSY_WINDOW_S` spent in iterations, from
  the sum of its FPM ``wall_time`` (or a source's own meter of the same quantity);
- engine queues, data-parallel ranks per worker, last-seen times: from the latest FPM per
  engine, on load ticks only;
- status and traffic: passed through as read (the traffic window is the one the due tick
  names, :class:`disagg_planner.core.schedule.TrafficWindow`); on a fast check, the short
  window it names as ``recent``.

No I/O here: reading the sources is synchronous and cheap (they are fed in the background).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping
from typing import Protocol, runtime_checkable

from disagg_planner.core.load_scaling import EngineKey
from disagg_planner.core.planner import Observation
from disagg_planner.core.schedule import DueTick
from disagg_planner.core.types import DeploymentStatus, MissingObservation, TrafficObservation
from disagg_planner.report.snapshot import EngineQueues
from disagg_planner.signals.fpm import ForwardPassMetrics

# Engines' busy share is measured over this long a window: one load tick (5 s) of iterations
# is too noisy to refuse a scale-down on.
BUSY_WINDOW_S = 60.0

EnginesByRole = Mapping[str, Mapping[EngineKey, ForwardPassMetrics]]


class EngineSource(Protocol):
    """Latest ForwardPassMetrics per engine of one role (``FpmSubscriber`` in production)."""

    def start(self) -> None: ...
    def stop(self, timeout_s: float = 5.0) -> None: ...
    def snapshot(self, now_s: float | None = None) -> dict[EngineKey, ForwardPassMetrics]: ...
    def last_seen(self) -> dict[EngineKey, float]: ...
    def drain_samples(self) -> list[ForwardPassMetrics]: ...
    @property
    def dropped(self) -> dict[str, int]: ...


@runtime_checkable
class BusyMeter(Protocol):
    """An engine source that meters busy time itself: cumulative seconds each engine spent in
    iterations, the sum of every FPM ``wall_time`` it published. A source that samples the
    iterations (replay keeps one report per engine per second) cannot sum them."""

    def busy_seconds(self) -> Mapping[EngineKey, float]: ...


class IterationLearner(Protocol):
    """What learns from engine iterations (:class:`disagg_planner.core.planner.PlannerCore`)."""

    def observe_iteration(self, role: str, report: ForwardPassMetrics) -> None: ...


def dp_size(engines: Mapping[EngineKey, ForwardPassMetrics]) -> int:
    """Data-parallel ranks per worker, as the engines report them (the widest worker); 1
    when nothing reports. A worker missing ranks then shows as a worker-count mismatch."""
    ranks: dict[str, set[int]] = {}
    for worker, rank in engines:
        ranks.setdefault(worker, set()).add(rank)
    return max((len(r) for r in ranks.values()), default=1)


def engine_queues(engines: EnginesByRole) -> tuple[EngineQueues, ...]:
    """The queue gauges of every engine's latest report, sorted for stable output."""
    out = [EngineQueues.of(role, fpm) for role, per in engines.items() for fpm in per.values()]
    return tuple(sorted(out, key=lambda e: (e.role, e.worker_id, e.dp_rank)))


class ObservationBuilder:
    """Builds each tick's :class:`Observation` from a shell's engine sources (see the module).

    ``engine_sources`` maps each role the load loop plans to its FPM source; empty when the
    load loop is off.
    """

    def __init__(self, engine_sources: Mapping[str, EngineSource]) -> None:
        self.engine_sources = dict(engine_sources)
        # Read when built, not imported, so that a test can give one shell another window.
        self.busy_window_s = BUSY_WINDOW_S
        self._meters = {r: s for r, s in self.engine_sources.items() if isinstance(s, BusyMeter)}
        self._busy_total: dict[str, dict[EngineKey, float]] = {}  # summed FPM wall time
        self._busy_history: dict[str, dict[EngineKey, deque[tuple[float, float]]]] = {}

    def learn(self, core: IterationLearner) -> None:
        """Feed the load models every iteration received since the last tick (they learn
        from all of them, not only the latest), and count its wall time as busy time."""
        for role, source in self.engine_sources.items():
            totals = self._busy_total.setdefault(role, {})
            summed = role not in self._meters
            for report in source.drain_samples():
                core.observe_iteration(role, report)
                if summed:
                    key = (report.worker_id, report.dp_rank)
                    totals[key] = totals.get(key, 0.0) + report.wall_time

    def observation(
        self,
        now_s: float,
        due: DueTick,
        *,
        status: DeploymentStatus | MissingObservation,
        traffic: TrafficObservation | MissingObservation | None,
        recent: TrafficObservation | MissingObservation | None = None,
    ) -> tuple[Observation, dict[str, dict[EngineKey, ForwardPassMetrics]]]:
        """The core's observation of the tick ``due`` at ``now_s``, and the latest report
        per engine it holds (empty unless the load loop runs: for the engine-queue gauges)."""
        engines: dict[str, dict[EngineKey, ForwardPassMetrics]] = {}
        seen: dict[str, dict[EngineKey, float]] = {}
        ranks: dict[str, int] = {}
        busy: dict[str, dict[EngineKey, float]] = {}
        if due.run_load:
            for role, source in self.engine_sources.items():
                engines[role] = source.snapshot(now_s)
                seen[role] = source.last_seen()
                ranks[role] = dp_size(engines[role])
                busy[role] = self._busy_fractions(role, now_s, engines[role])
        observation = Observation(
            status=status,
            traffic=traffic,
            engines=engines or None,
            engine_last_seen_s=seen or None,
            dp_size=ranks,
            engine_busy_fraction=busy or None,
            recent=recent,
        )
        return observation, engines

    def _busy_fractions(
        self, role: str, now_s: float, engines: Mapping[EngineKey, ForwardPassMetrics]
    ) -> dict[EngineKey, float]:
        """Each live engine's share of the last ``busy_window_s`` spent in iterations: the
        busy time added since the oldest sample still inside the window, over its age."""
        meter = self._meters.get(role)
        totals = meter.busy_seconds() if meter is not None else self._busy_total.get(role, {})
        histories = self._busy_history.setdefault(role, {})
        out: dict[EngineKey, float] = {}
        for key in engines:
            history = histories.setdefault(key, deque())
            history.append((now_s, totals.get(key, 0.0)))
            while len(history) > 2 and history[1][0] <= now_s - self.busy_window_s:
                history.popleft()
            (t0, b0), (t1, b1) = history[0], history[-1]
            if t1 > t0:
                out[key] = min(1.0, max(0.0, (b1 - b0) / (t1 - t0)))
        # An engine that stopped reporting starts afresh if it returns. Per role: one role's
        # engines are not another's (pruning across roles wiped both at every tick).
        for gone in set(histories) - set(engines):
            del histories[gone]
            self._busy_total.get(role, {}).pop(gone, None)
        return out
