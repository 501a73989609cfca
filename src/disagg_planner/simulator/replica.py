"""One engine replica of a simulated cluster: its ranks, its state, the GPUs it holds over time.

A replica starts (the phases of :mod:`disagg_planner.simulator.startup`), serves while ready,
drains when removed (Dynamo's graceful shutdown: at most :data:`DEFAULT_DRAIN_GRACE_S`), and
stops; the GPU meter counts it from the start-up phase that holds GPUs to its stop.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

from disagg_planner.simulator import elastic_ep, startup
from disagg_planner.simulator.engine_model import EngineModel
from disagg_planner.simulator.engine_spec import EngineSpec
from disagg_planner.simulator.scheduler import EngineCore, Role
from disagg_planner.simulator.shutdown import ShutdownTrace

# Dynamo's graceful shutdown: a removed worker's pod gets 60 s before its requests are ended
DEFAULT_DRAIN_GRACE_S = 60.0
DRAIN_CANCELLED = "cancelled: its replica was removed and the drain grace period ended"


class ReplicaState(enum.StrEnum):
    STARTING = "starting"
    READY = "ready"
    DRAINING = "draining"
    STOPPED = "stopped"


@dataclass
class Replica:
    """One engine replica: ``dp`` ranks of ``tp`` GPUs each."""

    role: Role
    worker_id: str
    spec: EngineSpec
    model: EngineModel
    state: ReplicaState
    start_s: float
    ready_s: float
    ranks: list[EngineCore] = field(default_factory=list)
    stop_s: float | None = None
    # when it was asked to drain (it serves its running requests and takes no new ones), so a
    # replay's timeline can say at every instant which replicas were starting, ready, draining
    drain_s: float | None = None
    gpu_segments: list[tuple[float, int]] = field(default_factory=list)
    resizing: elastic_ep.ResizePlan | None = None
    paused: bool = False
    # the start-up it went through (None: ready at time 0)
    startup_plan: startup.StartupPlan | None = None
    # its staged shutdown once removed (Dynamo's; None: not removed, or the older drain)
    shutdown: ShutdownTrace | None = None

    def startup_phase(self, t: float) -> str | None:
        """The start-up phase at time ``t`` (None when not starting then)."""
        if self.startup_plan is None or not self.start_s <= t < self.ready_s:
            return None
        if self.stop_s is not None and t >= self.stop_s:
            return None
        phase = None
        for name, begin in self.startup_plan.phase_starts(self.start_s):
            if begin > t:
                break
            phase = name
        return phase

    def gpus_at(self, t: float) -> int:
        """GPUs held at time ``t`` (none before the start-up phase that takes them)."""
        held = 0
        for s, gpus in self.gpu_segments:
            if s > t:
                break
            held = gpus
        return held

    def gpu_seconds(self, now: float) -> float:
        end = self.stop_s if self.stop_s is not None else now
        total = 0.0
        for i, (t, gpus) in enumerate(self.gpu_segments):
            t_next = self.gpu_segments[i + 1][0] if i + 1 < len(self.gpu_segments) else end
            total += gpus * max(0.0, min(t_next, end) - t)
        return total

    @property
    def gpus(self) -> int:
        return self.gpu_segments[-1][1] if self.gpu_segments else self.spec.gpus

    def is_empty(self) -> bool:
        return all(r.is_empty for r in self.ranks)


__all__ = ["DEFAULT_DRAIN_GRACE_S", "DRAIN_CANCELLED", "Replica", "ReplicaState"]
