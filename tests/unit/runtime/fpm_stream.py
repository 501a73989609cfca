"""An FPM source the test feeds, standing in for the ZMQ subscriber."""

from __future__ import annotations

import math

from disagg_planner.core.load_scaling import EngineKey
from disagg_planner.signals.fpm import ForwardPassMetrics


class FpmStream:
    """Every report published is a sample for the load models; the latest per engine is the
    snapshot, without engines silent for longer than ``silent_after_s`` (the subscriber's
    staleness filter)."""

    def __init__(self, silent_after_s: float = math.inf) -> None:
        self.silent_after_s = silent_after_s
        self.samples: list[ForwardPassMetrics] = []
        self.latest: dict[EngineKey, tuple[float, ForwardPassMetrics]] = {}

    def publish(self, *reports: ForwardPassMetrics, t: float = 0.0) -> None:
        self.samples.extend(reports)
        self.latest.update({(r.worker_id, r.dp_rank): (t, r) for r in reports})

    def snapshot(self, now_s: float | None = None) -> dict[EngineKey, ForwardPassMetrics]:
        now = math.inf if now_s is None else now_s
        return {k: r for k, (t, r) in self.latest.items() if not now - t > self.silent_after_s}

    def last_seen(self) -> dict[EngineKey, float]:
        return {k: t for k, (t, _) in self.latest.items()}

    def drain_samples(self) -> list[ForwardPassMetrics]:
        samples, self.samples = self.samples, []
        return samples

    @property
    def dropped(self) -> dict[str, int]:
        return {}

    def start(self) -> None: ...
    def stop(self, timeout_s: float = 5.0) -> None: ...
