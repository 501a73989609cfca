"""Dynamo's staged worker shutdown, as the simulated worker goes through it and reports it.

A removed replica (SIGTERM: its pod is deleted) spends ONE total budget, from the signal, on
the stages of Dynamo's worker (its graceful-shutdown guide, in our words; the stage names and
outcomes are the ones its ``dynamo_component_shutdown_stage_seconds`` series carry):

1. ``unregister`` at once (the router sends it nothing more), then ``router_grace``
   (:attr:`ShutdownSettings.router_grace_s`, 5 s), then ``stop_admission``;
2. ``inflight``: until its requests finish, at most until the drain deadline (the total minus
   the cleanup reserve): then ``timed_out``, and what is left is cancelled (or migrated);
3. ``kv_transfer``: a prefill worker waits until no decode peer still reads its KV (at most
   :attr:`ShutdownSettings.kv_transfer_cap_s` and the drain deadline); other roles
   ``skipped``;
4. ``cleanup`` (engine teardown, :attr:`ShutdownSettings.teardown_s`, within what is left
   of the total), then ``runtime``; the process exits and its GPUs are free.

Its page then reads as :func:`disagg_planner.signals.shutdown.read_shutdown` expects: the
stage series, the in-flight count and the remaining time as snapshots at stage transitions,
and KV quiescence (1 idle, 0 busy: the simulated worker knows its transfers). Before SIGTERM
the page carries the gauges with no stage series (a worker that has the staged shutdown).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from disagg_planner.signals.shutdown import (
    DEFAULT_TOTAL_BUDGET_S,
    INFLIGHT_REQUESTS,
    KV_QUIESCENT,
    REMAINING_SECONDS,
    STAGE_SECONDS,
)
from disagg_planner.simulator.errors import SimulatorInputError

# How the serving part of a shutdown ended (replay counts them): every request finished and
# no KV left to read; the drain deadline cut it (the worker's budget); the pod's grace ended
# first (SIGKILL).
ENDED_QUIESCENT = "kv_quiescent"
ENDED_BUDGET = "worker_budget"
ENDED_KILLED = "killed"


@dataclass(frozen=True)
class ShutdownSettings:
    """The worker's shutdown settings (Dynamo's env names in the comments)."""

    total_s: float = DEFAULT_TOTAL_BUDGET_S  # DYN_WORKER_SHUTDOWN_TOTAL_TIMEOUT_SECS
    router_grace_s: float = 5.0  # DYN_WORKER_SHUTDOWN_ROUTER_GRACE_SECS
    kv_transfer_cap_s: float = 30.0  # DYN_WORKER_SHUTDOWN_KV_TRANSFER_TIMEOUT_SECS
    cleanup_reserve_s: float = 5.0  # DYN_WORKER_SHUTDOWN_CLEANUP_TIMEOUT_SECS
    teardown_s: float = 2.0  # what the simulated engine's cleanup takes (within the reserve)

    def __post_init__(self) -> None:
        for name in ("total_s", "router_grace_s", "kv_transfer_cap_s", "teardown_s"):
            value = getattr(self, name)
            if not math.isfinite(value) or value < 0:
                raise SimulatorInputError(f"worker shutdown {name}={value}: must be finite, >= 0")
        if self.total_s <= 0 or not 0 < self.cleanup_reserve_s < math.inf:
            raise SimulatorInputError(
                f"worker shutdown total_s={self.total_s}, cleanup_reserve_s="
                f"{self.cleanup_reserve_s}: both must be > 0"
            )


@dataclass
class ShutdownTrace:
    """One replica's shutdown as it happens: its stages so far and the page's snapshots."""

    settings: ShutdownSettings
    sigterm_s: float
    phase: str = "router_grace"  # the stage in progress
    stages: dict[tuple[str, str], float] = field(default_factory=dict)  # -> elapsed s
    inflight: int = 0
    kv: int = -1
    remaining_s: float = 0.0
    stage_started_s: float = 0.0
    ended_by: str | None = None

    @property
    def drain_deadline_s(self) -> float:
        """When the stages before cleanup must end: the total less the cleanup reserve."""
        s = self.settings
        return self.sigterm_s + s.total_s - min(s.cleanup_reserve_s, s.total_s)

    @property
    def end_s(self) -> float:
        return self.sigterm_s + self.settings.total_s

    def record(self, stage: str, outcome: str, now: float, *, inflight: int, kv: int) -> None:
        """A stage transition: its series, and the snapshots of the page."""
        if outcome == "started":
            self.stage_started_s = now
            self.phase = stage
        self.stages[(stage, outcome)] = 0.0 if outcome == "started" else now - self.stage_started_s
        self.inflight = inflight
        self.kv = kv
        self.remaining_s = max(0.0, self.end_s - now)


def shutdown_page(trace: ShutdownTrace | None, *, component: str, total_s: float) -> str:
    """The shutdown part of a worker's ``/metrics`` page (Prometheus text): before SIGTERM
    (``trace`` None) the gauges as registered at start, with no stage series."""
    labels = f'dynamo_namespace="dynamo",dynamo_component="{component}",dynamo_endpoint="generate"'
    lines = [f"# TYPE {STAGE_SECONDS} gauge"]
    if trace is None:
        inflight, kv, remaining = 0, -1, total_s
    else:
        inflight, kv, remaining = trace.inflight, trace.kv, trace.remaining_s
        for (stage, outcome), seconds in trace.stages.items():
            lines.append(
                f'{STAGE_SECONDS}{{{labels},stage="{stage}",reason="{outcome}"}} {seconds:.6g}'
            )
    for name, value in ((INFLIGHT_REQUESTS, inflight), (KV_QUIESCENT, kv)):
        lines += [f"# TYPE {name} gauge", f"{name}{{{labels}}} {value}"]
    lines += [
        f"# TYPE {REMAINING_SECONDS} gauge",
        f"{REMAINING_SECONDS}{{{labels}}} {remaining:.6g}",
    ]
    return "\n".join(lines) + "\n"


__all__ = [
    "ENDED_BUDGET",
    "ENDED_KILLED",
    "ENDED_QUIESCENT",
    "ShutdownSettings",
    "ShutdownTrace",
    "shutdown_page",
]
