"""What one tick of a deployment's loop saw, decided and did: the record that the metrics,
the diagnostics recorder, the log line and the operator's status are all made from.

A :class:`Problem` is anything that made the tick less than complete: the deployment could
not be read or is malformed, the connector failed, an observation is missing, or the tick
itself raised. Its ``reason`` is bounded (usable as a metric label); ``detail`` is free text
for people.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from disagg_planner.connectors.base import Hold
from disagg_planner.core.elastic import ElasticDecision
from disagg_planner.core.planner import Effects, forecast_rate
from disagg_planner.core.types import DeploymentStatus, ThroughputReason, TrafficObservation
from disagg_planner.report.snapshot import EngineQueues, TickSnapshot

# The throughput reasons of a tick that asks the connector for a change.
_SCALING_REASONS = frozenset({ThroughputReason.SCALE, ThroughputReason.GPU_BUDGET_RECONCILE})


class ProblemKind(StrEnum):
    """What went wrong, coarsely; the operator maps each to a condition reason."""

    # The deployment is missing or has the wrong shape (DeploymentError).
    DEPLOYMENT_INVALID = "deployment_invalid"
    # The Kubernetes API / etcd refused or failed after the connector's retries.
    CONNECTOR_ERROR = "connector_error"
    # Traffic could not be observed (Prometheus down, no series ...): the planner holds.
    TRAFFIC_MISSING = "traffic_missing"
    # An input arrived incomplete (histograms without series while the request counters
    # moved): the decisions needing it hold; the loop is Degraded, still Ready.
    INPUT_INCOMPLETE = "input_incomplete"
    # An unexpected exception inside the tick (a bug); logged with its traceback.
    TICK_FAILED = "tick_failed"
    # The configuration (policy spec, profile) is invalid; fixed only by editing it.
    INVALID_SPEC = "invalid_spec"


@dataclass(frozen=True)
class Problem:
    kind: ProblemKind
    reason: str  # bounded: a MissingReason value, an error class ...
    detail: str = ""
    source: str = ""  # "status", "traffic", "scale", "validate", "tick", "spec"

    def render(self) -> str:
        where = f"{self.source}: " if self.source else ""
        # "connector_error (connector_error)" said the same thing twice
        reason = f" ({self.reason})" if self.reason != self.kind.value else ""
        detail = f": {self.detail}" if self.detail else ""
        return f"{where}{self.kind.value}{reason}{detail}"


@dataclass(frozen=True)
class TickOutcome:
    """One tick (or one failed start-up attempt, ``effects is None``) of one deployment.

    ``throughput_reason`` / ``load_reason`` are the reasons as reported: when the loop wanted
    to scale but a connector hold or advisory mode kept the replicas, the throughput reason
    says so (``manual_override_hold``, ``advisory``, ``scaling_in_progress`` while a virtual
    decision awaits its acknowledgement). ``held`` maps each role that was not changed to the
    hold's reason. ``elastic`` is the elastic-EP policy's decision of a throughput tick when
    a role is elastic (its DP target; the resize itself runs in the background).
    """

    t_s: float
    ran_throughput: bool = False
    ran_load: bool = False
    status: DeploymentStatus | None = None
    traffic: TrafficObservation | None = None
    effects: Effects | None = None
    throughput_reason: str | None = None
    load_reason: str | None = None
    scale_to: dict[str, int] | None = None
    applied: dict[str, int] = field(default_factory=dict)
    held: dict[str, str] = field(default_factory=dict)
    problems: tuple[Problem, ...] = ()
    message: str = ""
    advisory: bool = False
    snapshot: TickSnapshot | None = None
    elastic: ElasticDecision | None = None

    @property
    def observed_ok(self) -> bool:
        """The deployment was read and every input the due loops need was obtained."""
        return self.status is not None and not any(
            p.kind in (ProblemKind.TRAFFIC_MISSING, ProblemKind.DEPLOYMENT_INVALID)
            or p.source == "status"
            for p in self.problems
        )

    @property
    def predicted_rps(self) -> float | None:
        decision = self.effects.throughput if self.effects else None
        return forecast_rate(decision)

    def problem(self, *kinds: ProblemKind) -> Problem | None:
        return next((p for p in self.problems if not kinds or p.kind in kinds), None)


def decided_throughput_reason(
    effects: Effects, holds: Mapping[str, Hold]
) -> ThroughputReason | None:
    """The tick's throughput reason, as named by the rule that decided what happened: the
    throughput loop's own, unless it asked for a change and a connector hold kept the
    replicas; then the hold's (:attr:`HoldReason.throughput_reason`, of the first held role;
    a drain names none: the change goes ahead, later)."""
    decided = effects.throughput_reason
    if decided in _SCALING_REASONS and holds:
        return next(iter(holds.values())).reason.throughput_reason or decided
    return decided


def held_reasons(held: Mapping[str, Hold]) -> dict[str, str]:
    return {role: hold.reason.value for role, hold in held.items()}


def build_snapshot(
    *,
    t_s: float,
    status: DeploymentStatus | None,
    gpu_hours: float,
    effects: Effects | None,
    traffic: TrafficObservation | None,
    throughput_reason: str | None,
    load_reason: str | None,
    message: str,
    engines: tuple[EngineQueues, ...] = (),
    extra: Mapping[str, Any] | None = None,
) -> TickSnapshot:
    """A :class:`TickSnapshot` (recorder and gauges) from what one tick saw and decided.

    Observed values come from this tick's traffic window; predicted values from the
    throughput loop's forecast (rates in req/s over the window); the correction factors only
    when the throughput loop ran. A value the tick did not produce is None, so the gauges keep
    their previous value.
    """
    desired = {r: s.desired for r, s in status.roles.items()} if status else {}
    ready = {r: s.ready for r, s in status.roles.items()} if status else {}
    decision = effects.throughput if effects else None
    diagnostics = decision.diagnostics if decision else None
    forecast = diagnostics.forecast if diagnostics else None
    corrections = diagnostics.corrections if diagnostics and diagnostics.forecast else None
    extra_out: dict[str, Any] = dict(extra or {})
    if diagnostics and diagnostics.scaling_latency_s:
        extra_out["scaling_latency_s"] = dict(diagnostics.scaling_latency_s)
    return TickSnapshot(
        t_s=t_s,
        desired=desired,
        ready=ready,
        gpus_in_use=status.gpus_in_use if status else 0,
        gpu_hours=gpu_hours,
        scale_to=dict(effects.scale_to) if effects and effects.scale_to else None,
        throughput_reason=throughput_reason,
        load_reason=load_reason,
        message=message,
        observed_rps=traffic.request_rate if traffic else None,
        observed_ttft_ms=traffic.ttft_ms if traffic else None,
        observed_itl_ms=traffic.itl_ms if traffic else None,
        observed_isl=traffic.isl if traffic else None,
        observed_osl=traffic.osl if traffic else None,
        predicted_rps=forecast_rate(decision),
        predicted_isl=_finite(forecast.isl) if forecast else None,
        predicted_osl=_finite(forecast.osl) if forecast else None,
        prefill_correction=corrections.prefill if corrections else None,
        decode_correction=corrections.decode if corrections else None,
        estimated_ttft_ms=effects.estimated_ttft_ms if effects else None,
        estimated_itl_ms=effects.estimated_itl_ms if effects else None,
        engines=engines,
        extra=extra_out,
    )


def _finite(value: float) -> float | None:
    return value if math.isfinite(value) else None
