"""``PlannerCore``: both scaling loops of one deployment behind one ``tick``.

::

    Observation --> PlannerCore.tick(now, observation) --> Effects(scale_to, next_tick_at, ...)

The shell (live controller or replay) calls :meth:`PlannerCore.observe_iteration` with every
ForwardPassMetrics it receives (the load models learn from all iterations, not only at
ticks), and :meth:`PlannerCore.tick` at ``next_tick_at_s`` with the observations the tick
asks for (:meth:`PlannerCore.due`). The throughput loop runs first; when the load loop also
runs, the throughput result is a floor for it rather than a target. No I/O, no clock.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace

from disagg_planner.config.schema import PlannerConfig
from disagg_planner.core.budget import BudgetResult, apply_gpu_budget
from disagg_planner.core.demand import DemandSignals
from disagg_planner.core.fast_check import fast_check
from disagg_planner.core.feedback import mean_busy
from disagg_planner.core.load_scaling import (
    EngineKey,
    EngineLimits,
    LoadDecision,
    LoadModel,
    decide_load,
    make_load_model,
    min_load_replicas,
    resolve_engine_limits,
)
from disagg_planner.core.schedule import DueTick, TickSchedule
from disagg_planner.core.throughput import (
    CapacityProfile,
    PredictorFactory,
    ThroughputDecision,
    ThroughputPlanner,
)
from disagg_planner.core.types import (
    DeploymentStatus,
    LoadReason,
    MissingObservation,
    Role,
    ThroughputReason,
    TrafficObservation,
)
from disagg_planner.signals.fpm import ForwardPassMetrics


@dataclass(frozen=True)
class Observation:
    """What the shell gathered for one tick. ``traffic`` is needed on throughput ticks,
    ``engines`` (latest report per engine, per role) on load ticks."""

    status: DeploymentStatus | MissingObservation
    traffic: TrafficObservation | MissingObservation | None = None
    engines: Mapping[str, Mapping[EngineKey, ForwardPassMetrics]] | None = None
    engine_last_seen_s: Mapping[str, Mapping[EngineKey, float]] | None = None
    dp_size: Mapping[str, int] = field(default_factory=dict)
    # share of recent time each engine spent in iterations (sum of FPM wall_time / window)
    engine_busy_fraction: Mapping[str, Mapping[EngineKey, float]] | None = None
    # the fast check's short traffic window (fast ticks only)
    recent: TrafficObservation | MissingObservation | None = None


@dataclass(frozen=True)
class Effects:
    """What one tick decided. ``scale_to`` is None when nothing should change."""

    now_s: float
    scale_to: dict[str, int] | None
    next_tick_at_s: float
    throughput: ThroughputDecision | None = None
    load: dict[str, LoadDecision] = field(default_factory=dict)
    throughput_reason: ThroughputReason | None = None
    load_reason: LoadReason | None = None
    message: str = ""
    advisory: bool = False

    @property
    def estimated_ttft_ms(self) -> float | None:
        values = [d.max_ttft_ms for d in self.load.values() if d.max_ttft_ms is not None]
        return max(values) if values else None

    @property
    def estimated_itl_ms(self) -> float | None:
        values = [d.max_itl_ms for d in self.load.values() if d.max_itl_ms is not None]
        return max(values) if values else None


# Priority of per-role load reasons when one label must describe the tick.
_LOAD_REASON_PRIORITY = (
    LoadReason.SCALE_UP,
    LoadReason.GPU_BUDGET_GUARD_HOLD,
    LoadReason.SCALE_DOWN_CAPPED_BY_THROUGHPUT,
    LoadReason.SCALE_DOWN,
    LoadReason.RECONCILE_CLAMPED_TO_FLOOR,
    LoadReason.SCALE_DOWN_REFUSED_CONSOLIDATION,
    LoadReason.SCALING_IN_PROGRESS,
    LoadReason.WORKER_COUNT_MISMATCH,
    LoadReason.STALE_FPM_DATA,
    LoadReason.NO_FPM_DATA,
    LoadReason.INSUFFICIENT_DATA,
    LoadReason.NO_CHANGE,
)


class PlannerCore:
    def __init__(
        self,
        *,
        config: PlannerConfig,
        start_s: float,
        profile: CapacityProfile | None = None,
        predictor_factory: PredictorFactory | None = None,
        engine_limits: EngineLimits | None = None,
        decode_max_num_seqs: int | None = None,
        prefill_chunk_tokens: int | None = None,
    ) -> None:
        self.config = config
        self.throughput: ThroughputPlanner | None = None
        if config.throughput_scaling_active:
            if profile is None or predictor_factory is None:
                raise ValueError("throughput scaling needs a profile and a predictor factory")
            self.throughput = ThroughputPlanner(
                config=config,
                profile=profile,
                predictor_factory=predictor_factory,
                decode_max_num_seqs=decode_max_num_seqs,
                prefill_chunk_tokens=prefill_chunk_tokens,
            )
        # The KV hit rate and accept length both loops use (one record: the throughput
        # loop's, which observes the traffic windows; the load loop's settings alone without it).
        self.demand = self.throughput.demand if self.throughput is not None else DemandSignals()
        self.load_models: dict[str, LoadModel] = {}
        if config.load_scaling_active:
            self.load_models = {
                role: make_load_model(_as_role(role), config) for role in config.roles
            }
        self.engine_limits = resolve_engine_limits(config, engine_limits)
        self.throughput_floor: dict[str, int] = {}
        # when a fast check last ordered a scale-up (on the SLO its recent window showed at
        # risk): a pool reads it as an observed breach (core.fleet.member_urgency)
        self.fast_scale_up_s: float | None = None
        self.schedule = TickSchedule(
            start_s=start_s,
            throughput_interval_s=(
                config.throughput_adjustment_interval_seconds if self.throughput else None
            ),
            load_interval_s=config.load_adjustment_interval_seconds if self.load_models else None,
            fast_interval_s=config.fast_check_interval_seconds if self.throughput else None,
        )
        self._pending_due: DueTick | None = None

    @property
    def next_tick_at_s(self) -> float:
        return self.schedule.next_at_s

    def due(self, now_s: float) -> DueTick | None:
        """Which loops the tick at ``now_s`` runs, and on a throughput tick the traffic
        window to read (the shell gathers only what they need, and reads the window it is
        given). Advances the schedule; pass the same ``now_s`` to :meth:`tick`."""
        self._pending_due = self.schedule.pop_due(now_s)
        return self._pending_due

    def observe_iteration(self, role: str, report: ForwardPassMetrics) -> None:
        """Learn from one engine iteration (call for every FPM received)."""
        model = self.load_models.get(role)
        if model is not None:
            model.observe(report)

    def tick(self, now_s: float, observation: Observation) -> Effects:
        due = self._pending_due or self.schedule.pop_due(now_s)
        self._pending_due = None
        next_at = self.schedule.next_at_s
        if due is None:
            return Effects(now_s, None, next_at, message="no loop due")
        status = observation.status
        if isinstance(status, MissingObservation):
            detail = f": {status.detail}" if status.detail else ""
            return Effects(
                now_s,
                None,
                next_at,
                throughput_reason=ThroughputReason.NO_TRAFFIC_DATA if due.run_throughput else None,
                load_reason=LoadReason.NO_FPM_DATA if due.run_load else None,
                message=f"deployment status unavailable ({status.reason}{detail}); holding",
            )

        throughput_decision: ThroughputDecision | None = None
        queued = queued_prefill_tokens(observation)
        busy = role_busy(observation)
        if due.run_throughput and self.throughput is not None:
            traffic = observation.traffic or MissingObservation("not_collected")
            throughput_decision = self.throughput.tick(now_s, traffic, status, queued, busy)
            if throughput_decision.replicas is not None:
                self.throughput_floor = dict(throughput_decision.replicas)
        elif due.run_fast and self.throughput is not None:
            recent = observation.recent or MissingObservation("not_collected")
            throughput_decision = fast_check(self.throughput, now_s, recent, status, queued, busy)
            if throughput_decision.replicas is not None:
                self.fast_scale_up_s = now_s
                self.throughput_floor = {
                    r: max(n, self.throughput_floor.get(r, 0))
                    for r, n in throughput_decision.replicas.items()
                }

        load_decisions: dict[str, LoadDecision] = {}
        if due.run_load and self.load_models:
            load_decisions = self._decide_load(now_s, observation, status)

        return self._combine(now_s, next_at, status, throughput_decision, load_decisions)

    def _decide_load(
        self, now_s: float, observation: Observation, status: DeploymentStatus
    ) -> dict[str, LoadDecision]:
        out: dict[str, LoadDecision] = {}
        engines = observation.engines or {}
        seen = observation.engine_last_seen_s or {}
        busy = observation.engine_busy_fraction or {}
        self.demand.expire(now_s, self.config.throughput_adjustment_interval_seconds)
        rules = self.demand.rules(self.config)
        for role, model in self.load_models.items():
            role_status = status.roles[role]
            floor: int | None = None
            if self.throughput is not None:
                # Until the throughput loop has sized the role once, the load loop may add
                # replicas but not remove them: a young regression is no reason to shrink.
                floor = self.throughput_floor.get(role, role_status.desired)
            out[role] = decide_load(
                role=_as_role(role),
                now_s=now_s,
                engines=engines.get(role, {}),
                model=model,
                ready_replicas=role_status.ready,
                desired_replicas=role_status.desired,
                dp_size=observation.dp_size.get(role, 1),
                config=self.config,
                engine_limits=self.engine_limits,
                throughput_floor=floor,
                last_seen_s=seen.get(role),
                busy_fraction=busy.get(role),
                # queued prompts count their cached prefix; an iteration emits A tokens
                kv_hit_rate=rules.kv_hit.value if rules.kv_hit.value > 0 else None,
                accept_length=rules.accept.value,
            )
            if rules.acting():
                message = "; ".join([out[role].message, *rules.acting()]).lstrip("; ")
                out[role] = replace(out[role], message=message)
        return out

    def _combine(
        self,
        now_s: float,
        next_at: float,
        status: DeploymentStatus,
        throughput: ThroughputDecision | None,
        load: dict[str, LoadDecision],
    ) -> Effects:
        cfg = self.config
        current = {role: status.desired(role) for role in cfg.roles}
        target: dict[str, int] | None = None
        messages: list[str] = []
        load_reason: LoadReason | None = None
        if throughput is not None:
            messages.append(f"throughput: {throughput.reason.value}: {throughput.message}")
        if load:
            load_reason = next(
                (r for r in _LOAD_REASON_PRIORITY if any(d.reason == r for d in load.values())),
                next(iter(load.values())).reason,
            )
            proposed = {role: load[role].replicas for role in cfg.roles if role in load}
            proposed = {**current, **proposed}
            proposed, budget = self._load_budget(proposed, current, status)
            if budget.limited_by:
                load_reason = (
                    LoadReason.GPU_BUDGET_RECONCILE
                    if budget.reconcile
                    else LoadReason.GPU_BUDGET_GUARD_HOLD
                )
                messages.append(f"budget: {budget.message}")
            if proposed != current:
                target = proposed
            messages.extend(f"load {r}: {d.reason.value}: {d.message}" for r, d in load.items())
        elif (
            throughput is not None
            and throughput.replicas is not None
            and not self.load_models
            and throughput.replicas != current
        ):
            target = dict(throughput.replicas)
        return Effects(
            now_s=now_s,
            scale_to=target,
            next_tick_at_s=next_at,
            throughput=throughput,
            load=load,
            throughput_reason=throughput.reason if throughput is not None else None,
            load_reason=load_reason,
            message=" | ".join(messages),
            advisory=cfg.advisory,
        )

    def _load_budget(
        self, proposed: dict[str, int], current: dict[str, int], status: DeploymentStatus
    ) -> tuple[dict[str, int], BudgetResult]:
        """The GPU budget over the load loop's proposal: the rule the throughput loop and
        elastic EP apply, with the load loop's own floors; the current replicas when the
        budget holds."""
        cfg = self.config
        budget = apply_gpu_budget(
            proposed,
            gpus_per_replica={role: status.roles[role].gpus_per_replica for role in proposed},
            floors={role: min_load_replicas(_as_role(role), cfg) for role in proposed},
            max_gpus=cfg.max_gpu_budget,
            min_gpus=cfg.min_gpu_budget,
            order=cfg.roles,
            current=current,
        )
        return (dict(current) if budget.hold else budget.replicas), budget


def queued_prefill_tokens(
    observation: Observation, roles: Sequence[str] = ("prefill", "agg")
) -> float | None:
    """Prefill tokens waiting in the queues of ``roles``' engines (their latest FPM), when
    any of them reports; None otherwise. The throughput loop reads the prefill (or
    aggregated) engines; the elastic-EP policy its own role's."""
    engines = observation.engines or {}
    reports = [fpm for role in roles for fpm in engines.get(role, {}).values()]
    if not reports:
        return None
    return float(sum(fpm.queued_requests.sum_prefill_tokens for fpm in reports))


def role_busy(observation: Observation) -> dict[str, float] | None:
    """The mean busy fraction of each role's engines, where the shell measured them."""
    fractions = observation.engine_busy_fraction or {}
    out = {role: mean_busy(per) for role, per in fractions.items()}
    known = {role: v for role, v in out.items() if v is not None}
    return known or None


def _as_role(role: str) -> Role:
    if role not in ("prefill", "decode", "agg"):
        raise ValueError(f"unknown role {role!r}")
    return role  # type: ignore[return-value]


def forecast_rate(decision: ThroughputDecision | None) -> float | None:
    """Forecast request rate (req/s) of a throughput decision, for diagnostics."""
    if decision is None or decision.diagnostics.forecast is None:
        return None
    interval = decision.diagnostics.observed.duration_s if decision.diagnostics.observed else None
    if not interval:
        return None
    value = decision.diagnostics.forecast.num_req / interval
    return value if math.isfinite(value) else None
