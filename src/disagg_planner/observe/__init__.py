"""Observers: turn the outside world (Prometheus, metric snapshots) into core observations.

``PrometheusTrafficObserver`` reads the throughput loop's traffic window from Prometheus;
``traffic_from_snapshots`` computes the same observation from two cumulative metric
snapshots for replay. Both return a :class:`~disagg_planner.core.types.TrafficObservation` or a
:class:`~disagg_planner.core.types.MissingObservation` whose reason is a :class:`MissingReason`.
"""

from __future__ import annotations

from typing import Protocol

from disagg_planner.core.types import MissingObservation, TrafficObservation
from disagg_planner.observe.prometheus import PrometheusTrafficObserver
from disagg_planner.observe.window import (
    MissingReason,
    Snapshot,
    snapshot_from_samples,
    snapshot_from_text,
    traffic_from_snapshots,
)


class TrafficObserver(Protocol):
    """A source of traffic windows (Prometheus live; the simulator in replay)."""

    def observe(
        self, *, end_s: float | None = None, duration_s: float | None = None
    ) -> TrafficObservation | MissingObservation: ...


__all__ = [
    "MissingReason",
    "PrometheusTrafficObserver",
    "Snapshot",
    "TrafficObserver",
    "snapshot_from_samples",
    "snapshot_from_text",
    "traffic_from_snapshots",
]
