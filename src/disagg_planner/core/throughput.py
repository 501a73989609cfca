"""Throughput-based scaling: forecast the next interval's load, size replicas from a profile,
and let what is observed overrule the profile where they disagree.

A tick (every ``throughput_adjustment_interval_seconds``) runs these stages, in order:

1. ``_fresh_traffic``: the interval's window; when it is missing, the fast windows seen
   since the last tick pooled (a first tick that sees); a hold when neither is there or
   the window is stale (never scale on no data);
2. ``_learn``: feed the observed request count, ISL and OSL to one predictor each; the
   latency ratios (observed / the profile's at the observed load) unless
   ``no_correction``; the capacity corrections learned by the feedback rules
   (:mod:`disagg_planner.core.feedback`), decaying while the tail stays under its margin;
3. ``_size_for_arrival``: the forecast at :func:`disagg_planner.core.arrival.tick_rate`
   (the envelope of the trend, or the level the short windows hold at), with the burst
   factor, the backlog and the length mix;
4. ``_size``: each role from the forecast (:mod:`disagg_planner.core.sizing`), with its
   capacity correction; a hold when the profile cannot serve it;
5. :meth:`disagg_planner.core.memory.ConvergenceMemory.plan_from`: while the last change
   has not converged (ready != desired), until ``scaling_convergence_timeout_seconds``
   (after which it re-plans from what is ready), hold unless the need without the backlog
   has grown past what is on its way: that is raised (up only; the backlog is the starting
   replicas' to drain); then
   each role whose engines serve more than profiled (a learned correction below 1, the
   tail calm) held at its replicas where the profile asks for more
   (:func:`disagg_planner.core.feedback.faster_than_profiled`), as is each role whose
   replicas were seen serving the load sized for with room to spare
   (:mod:`disagg_planner.core.served_load`);
6. the guard chain (:func:`disagg_planner.core.guards.guard_chain`): floors, the burst
   memory's (:meth:`disagg_planner.core.sizer.Sizer.burst_floor`) and breached cuts'
   floors, scale-down stabilisation (a role whose observed tail is well under its SLO
   remembers its need for one time-to-ready only:
   :func:`disagg_planner.core.feedback.margin_window`), the observed margin a scale-down
   needs, the per-tick change cap, the GPU budget;
7. ``_decide``: the target and its reason; a scale-down is remembered as a cut.

Between ticks the fast check (:func:`disagg_planner.core.fast_check.fast_check`) scales up
at once when the SLO is at risk or observed breached. The opening interval of traffic is
the run starting: no trend is extrapolated from it and no burst remembered.

Everything is a function of the arguments: no clock, no I/O.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace

from disagg_planner.config.schema import PlannerConfig
from disagg_planner.core.arrival import burst_factor, tick_rate, within_envelope
from disagg_planner.core.demand import DemandSignals
from disagg_planner.core.feedback import (
    FeedbackMemory,
    cut_floor,
    margin_window,
    scale_down_margin,
)
from disagg_planner.core.guards import Guarded, GuardLimits, guard_chain, stabilise
from disagg_planner.core.memory import (
    ConvergenceMemory,
    StabilisationMemory,
    TrafficMemory,
    pool_windows,
    pooled_rule,
)
from disagg_planner.core.observed_capacity import (
    LearnsFromObservation,
)
from disagg_planner.core.rules import (
    LengthSample,
    RateSample,
    RuleValue,
    backlog_tokens,
    burst_ratios,
    slo_request_seconds,
    time_to_ready,
)
from disagg_planner.core.sizer import Sizer
from disagg_planner.core.sizing import (
    CapacityProfile,
    CorrectionFactors,
    LoadForecast,
    RoleSizing,
    at_load,
    histogram_scv,
)
from disagg_planner.core.types import (
    DeploymentStatus,
    Histogram,
    MissingObservation,
    ThroughputReason,
    TrafficObservation,
)
from disagg_planner.predictors.base import SERIES, Forecast, LoadPredictor


@dataclass(frozen=True)
class ThroughputDiagnostics:
    observed: TrafficObservation | None = None
    forecast: LoadForecast | None = None
    corrections: CorrectionFactors = field(default_factory=CorrectionFactors)
    sizing: dict[str, RoleSizing] = field(default_factory=dict)
    stages: dict[str, dict[str, int]] = field(default_factory=dict)  # stage -> replicas
    scaling_latency_s: dict[str, float] = field(default_factory=dict)
    warnings: tuple[str, ...] = ()
    # the named rules' sentences (time-to-ready, envelope, burst, backlog, guards)
    rules: tuple[str, ...] = ()
    sized_for: LoadForecast | None = None  # the forecast after the envelope rule


@dataclass(frozen=True)
class ThroughputDecision:
    """``replicas`` is the target per role, or None to leave the deployment as it is."""

    now_s: float
    replicas: dict[str, int] | None
    reason: ThroughputReason
    message: str
    diagnostics: ThroughputDiagnostics = ThroughputDiagnostics()


# Given the series names, one predictor per series (built together: auto's share evidence).
PredictorFactory = Callable[[Sequence[str]], Mapping[str, LoadPredictor]]


class ThroughputPlanner(LearnsFromObservation):
    """The predictors, corrections and memories of one deployment's throughput loop."""

    def __init__(
        self,
        *,
        config: PlannerConfig,
        profile: CapacityProfile,
        predictor_factory: PredictorFactory,
        decode_max_num_seqs: int | None = None,
        prefill_chunk_tokens: int | None = None,
    ) -> None:
        self.config = config
        self.profile = at_load(profile, prefill_chunk_tokens if config.prefill_batching else None)
        self.decode_max_num_seqs = decode_max_num_seqs
        self.predictors: dict[str, LoadPredictor] = dict(predictor_factory(SERIES))
        self.latency = CorrectionFactors()  # Dynamo's latency ratios (diagnostics, ITL)
        self.convergence = ConvergenceMemory()
        self.stabilisation = StabilisationMemory()
        self.traffic = TrafficMemory()
        self.feedback = FeedbackMemory()
        self.demand = DemandSignals()  # KV hit rate and accept length (core/demand.py)
        self.sizer = Sizer(
            config=config,
            profile=self.profile,
            traffic=self.traffic,
            demand=self.demand,
            corrections=lambda: self.corrections,
            learned=lambda: self.learned_corrections,
            sources=self.feedback.estimate_source,
            decode_max_num_seqs=decode_max_num_seqs,
        )

    # --- shared by the tick and the fast check ---------------------------------------------

    @property
    def corrections(self) -> CorrectionFactors:
        """What the sizing sizes with (:meth:`sizing_corrections` of
        :attr:`learned_corrections`)."""
        return self.sizing_corrections(self.learned_corrections)

    @property
    def learned_corrections(self) -> CorrectionFactors:
        """The latency ratios and the capacity corrections as the feedback learned them."""
        roles = self.config.roles
        return replace(
            self.latency,
            prefill_capacity=self.feedback.correction("prefill" if "prefill" in roles else "agg"),
            decode_capacity=self.feedback.correction("decode" if "decode" in roles else "agg"),
        )

    def time_to_ready(self, role: str) -> RuleValue:
        return time_to_ready(
            self.convergence.scaling_latency_s.get(role), self.config.replica_startup_seconds
        )

    def deployment_time_to_ready(self) -> RuleValue:
        """The slowest role's time-to-ready: one envelope sizes every role."""
        values = [self.time_to_ready(r) for r in self.config.roles]
        return max(values, key=lambda v: v.value)

    def limits(self, gpus: Mapping[str, int], *, step_cap: bool) -> GuardLimits:
        cfg = self.config
        return GuardLimits(
            roles=cfg.roles,
            floors={r: cfg.min_endpoint_for(r) for r in cfg.roles},
            gpus=gpus,
            max_gpus=cfg.max_gpu_budget,
            min_gpus=cfg.min_gpu_budget,
            max_step=cfg.max_throughput_scaling_replicas if step_cap else None,
        )

    def cut_floors(self, now_s: float) -> dict[str, RuleValue]:
        return {
            r: cut_floor(r, now_s=now_s, cut_need=self.feedback.cut_need.get(r))
            for r in self.config.roles
        }

    def remember_need(self, now_s: float, need: Mapping[str, int]) -> None:
        self.stabilisation.remember(now_s, need, self.config.scale_down_stabilization_seconds)

    def backlog(
        self, traffic: TrafficObservation, isl: float, queued_prefill_tokens: float | None
    ) -> RuleValue:
        last = self.traffic.last_lengths or (0.0, 0.0)
        osl = traffic.osl if traffic.osl is not None else last[1]
        return backlog_tokens(
            in_flight=traffic.in_flight,
            arrival_rate=traffic.request_rate,
            slo_request_s=slo_request_seconds(
                ttft_ms=self.config.ttft_ms, itl_ms=self.config.itl_ms, osl=osl
            ),
            isl=isl,
            queued_prefill_tokens=queued_prefill_tokens,
        )

    def hold(
        self, now_s: float, reason: ThroughputReason, message: str, diag: ThroughputDiagnostics
    ) -> ThroughputDecision:
        return ThroughputDecision(now_s, None, reason, message, diag)

    def hold_if_infeasible(
        self, now_s: float, sizing: Mapping[str, RoleSizing], diagnostics: ThroughputDiagnostics
    ) -> ThroughputDecision | None:
        infeasible = [s for s in sizing.values() if not s.feasible]
        if not infeasible:
            return None
        return self.hold(
            now_s,
            ThroughputReason.PROFILE_INFEASIBLE,
            "; ".join(s.note for s in infeasible) + "; holding replicas",
            diagnostics,
        )

    # --- the tick ----------------------------------------------------------------------------

    def tick(
        self,
        now_s: float,
        traffic: TrafficObservation | MissingObservation,
        status: DeploymentStatus,
        queued_prefill_tokens: float | None = None,
        busy: Mapping[str, float] | None = None,
    ) -> ThroughputDecision:
        """One throughput tick (see the module doc): each stage either decides, a hold with
        its reason, or passes what it worked out on to the next. ``busy`` is the mean busy
        fraction of each role's engines, when the shell measures it."""
        self.convergence.track(now_s, status)
        interval = self.config.throughput_adjustment_interval_seconds
        self.demand.expire(now_s, interval)
        warnings = self.convergence.slow_warnings(interval)
        pooled_from = len(self.traffic.fast_windows)
        fresh = self._fresh_traffic(now_s, traffic, warnings)
        if isinstance(fresh, ThroughputDecision):
            return fresh
        forecast, learnt = self._learn(fresh, status, busy)
        sized_for, rules = self._size_for_arrival(fresh, forecast)
        if isinstance(traffic, MissingObservation):
            rules.insert(0, pooled_rule(traffic, fresh, pooled_from))
        burst = within_envelope(
            burst_factor(self.traffic.burst_ratios, self.config.burst_quantile),
            forecast_req=forecast.num_req,
            envelope_req=sized_for.num_req,
        )
        backlog = self.backlog(fresh, sized_for.isl, queued_prefill_tokens)
        mix = self.sizer.length_mix()
        rules += [burst.reason, backlog.reason, mix.reason, *learnt]
        gpus = {r: status.roles[r].gpus_per_replica for r in self.config.roles}
        sizing, steady, capped = self.sizer.size_with_backlog(
            sized_for, gpus, status, burst=burst.value, backlog=backlog, length_mix=mix.value
        )
        rules += capped
        diagnostics = ThroughputDiagnostics(
            observed=fresh,
            forecast=forecast,
            corrections=self.corrections,
            sizing=sizing,
            scaling_latency_s=dict(self.convergence.scaling_latency_s),
            warnings=tuple(warnings),
            rules=tuple(r for r in rules if r),
            sized_for=sized_for,
        )
        infeasible = self.hold_if_infeasible(now_s, sizing, diagnostics)
        if infeasible is not None:
            return infeasible
        plan_from = self.convergence.plan_from(
            now_s,
            status,
            self.config.roles,
            timeout_s=self.config.scaling_convergence_timeout_seconds,
            warnings=warnings,
        )
        waiting = plan_from if isinstance(plan_from, str) else ""
        if isinstance(plan_from, str):
            # While the last change converges, the tick still raises a role whose need has
            # grown past what is on its way (a rate rising through the start-up); it cuts
            # nothing, and the backlog is the starting replicas' to drain, not more to order.
            plan_from = {r: status.desired(r) for r in self.config.roles}
            sizing = dict(steady)
        calm = self.calm(fresh)
        sizing, steady, held = self.sizer.held_by_observation(
            sized_for,
            gpus,
            status,
            sized=(sizing, steady),
            current=plan_from,
            calm=calm,
            burst=burst.value,
            backlog=backlog,
            length_mix=mix.value,
        )
        if not waiting:
            sizing, tolerated = self.sizer.within_tolerance(sizing, current=plan_from, calm=calm)
            sizing, served = self.held_by_served(
                sizing, current=plan_from, sized_for=sized_for, burst=burst.value
            )
            held += [*tolerated.values(), *served]
        diagnostics = replace(diagnostics, rules=(*diagnostics.rules, *held))
        memory, memory_floor = self.sizer.burst_floor(
            now_s,
            sized_for,
            gpus,
            mix.value,
            self.deployment_time_to_ready().value,
            current=plan_from,
            calm=calm,
        )
        memory_floor, served = self.served_floors(
            now_s, memory_floor, peak_rate=memory.value, sized_for=sized_for
        )
        guarded = self._guard(
            now_s, fresh, sizing, plan_from, gpus, memory_floor, steady, up_only=bool(waiting)
        )
        if waiting and guarded.budget.replicas == plan_from:
            return self.hold(now_s, ThroughputReason.SCALING_IN_PROGRESS, waiting, diagnostics)
        diagnostics = replace(
            diagnostics,
            stages=guarded.stages,
            warnings=tuple(warnings),
            rules=(*diagnostics.rules, memory.reason, *served, *guarded.notes),
        )
        return self._decide(now_s, status, forecast, sizing, guarded, diagnostics)

    def _fresh_traffic(
        self,
        now_s: float,
        traffic: TrafficObservation | MissingObservation,
        warnings: list[str],
    ) -> TrafficObservation | ThroughputDecision:
        """The window to plan with, or a hold: never scale on missing or stale data. A
        missing window is replaced by the fast windows since the last tick when they cover
        half the interval or more: the fast check already has the data."""
        interval = self.config.throughput_adjustment_interval_seconds
        pooled = pool_windows(self.traffic.fast_windows)
        self.traffic.fast_windows = []
        if isinstance(traffic, MissingObservation):
            if pooled is not None and pooled.duration_s >= interval / 2:
                traffic_or_pooled: TrafficObservation = pooled
            else:
                detail = f": {traffic.detail}" if traffic.detail else ""
                return self.hold(
                    now_s,
                    ThroughputReason.NO_TRAFFIC_DATA,
                    f"traffic unavailable ({traffic.reason}{detail}); holding replicas",
                    ThroughputDiagnostics(warnings=tuple(warnings)),
                )
        else:
            traffic_or_pooled = traffic
        if now_s - traffic_or_pooled.end_s > interval:
            return self.hold(
                now_s,
                ThroughputReason.STALE_TRAFFIC_DATA,
                f"traffic window ended {now_s - traffic_or_pooled.end_s:.0f} s ago; holding "
                "replicas",
                ThroughputDiagnostics(observed=traffic_or_pooled, warnings=tuple(warnings)),
            )
        return traffic_or_pooled

    def _learn(
        self,
        traffic: TrafficObservation,
        status: DeploymentStatus,
        busy: Mapping[str, float] | None,
    ) -> tuple[LoadForecast, list[str]]:
        """Feed the window to the predictors, corrections and ISL variability; forecast."""
        memory = self.traffic
        memory.see_traffic(traffic)
        self._observe(traffic)
        learnt: list[str] = []
        if not self.config.no_correction:
            self.see_latency(traffic, status)
            calm = self.see_calm(traffic)
            for role in self.config.roles:
                if calm[role]:
                    estimate = self.feedback.busy_estimate.get(role)
                    source = self.feedback.estimate_source.get(role, "busy fraction")
                    learnt += self.feedback.learn(
                        role, busy_estimate=estimate, calm=True, source=source
                    )
            if traffic.isl is not None:
                learnt += self.learn_from_busy(
                    status,
                    busy,
                    rate=traffic.request_rate,
                    isl=traffic.isl,
                    calm=calm,
                    window=traffic,
                )
        forecast = self._forecast()
        mean_rate = traffic.request_rate
        if not memory.short_rates:
            memory.rate_samples.append(RateSample(traffic.end_s, mean_rate, traffic.duration_s))
        if mean_rate > 0:
            # the fast checks' windows since the last tick: the last of the rate samples
            n = len(memory.short_rates)
            since = list(memory.rate_samples)[-n:] if n else []
            memory.burst_ratios.extend(burst_ratios(since, mean_rate))
        memory.short_rates = []
        # the fast path's lengths pool this window with the short windows until the next
        memory.length_windows.clear()
        if traffic.num_req > 0 and traffic.isl is not None and traffic.osl is not None:
            memory.length_windows.append(LengthSample(traffic.num_req, traffic.isl, traffic.osl))
        if traffic.num_req > 0 and traffic.isl_histogram is not None:
            self.traffic.lengths_from_tick = self.see_lengths(traffic.isl_histogram)
        return forecast, learnt

    def see_lengths(self, histogram: Histogram) -> bool:
        """The prompt-length mix's histogram and the variability of the prefill work per
        prompt at the profile (:func:`disagg_planner.core.sizing.histogram_scv`; of the
        lengths where the profile gives no throughput) from an observed ISL histogram;
        whether it held any."""
        thpt = self.profile.prefill.thpt_per_gpu
        scv = histogram_scv(
            histogram, work=lambda isl: isl / thpt(isl) if thpt(isl) > 0 else math.nan
        )
        scv = scv if scv is not None else histogram_scv(histogram)
        if scv is None:
            return False
        self.traffic.service_scv = scv
        self.traffic.isl_histogram = histogram
        return True

    # The predictors see every observed window, also those the planner holds on.
    def _observe(self, obs: TrafficObservation) -> None:
        self.predictors["num_req"].observe(obs.num_req)
        self.demand.observe(obs)
        # An idle window has no defined lengths: keep the length series where they were.
        if obs.num_req > 0 and obs.isl is not None and obs.osl is not None:
            self.predictors["isl"].observe(obs.isl)
            self.predictors["osl"].observe(obs.osl)
            self.traffic.last_lengths = (obs.isl, obs.osl)

    def _forecast(self) -> LoadForecast:
        parts: dict[str, Forecast] = {s: p.predict_next() for s, p in self.predictors.items()}

        def pick(f: Forecast) -> float:
            value = (
                f.upper
                if (self.config.load_predictor_quantile and f.upper is not None)
                else (f.value)
            )
            return max(0.0, value) if math.isfinite(value) else 0.0

        return LoadForecast(
            num_req=pick(parts["num_req"]),
            isl=pick(parts["isl"]),
            osl=pick(parts["osl"]),
            fallback=any(f.fallback for f in parts.values()),
        )

    def _size_for_arrival(
        self, traffic: TrafficObservation, forecast: LoadForecast
    ) -> tuple[LoadForecast, list[str]]:
        """The forecast at the rate :func:`disagg_planner.core.arrival.tick_rate` sizes for."""
        interval = self.config.throughput_adjustment_interval_seconds
        ttr = self.deployment_time_to_ready()
        rate = tick_rate(
            self.traffic.rate_samples,
            now_s=traffic.end_s,
            observed_rate=traffic.request_rate,
            forecast_rate=forecast.num_req / interval,
            interval_s=interval,
            time_to_ready_s=ttr.value,
        )
        return replace(forecast, num_req=rate.value * interval), [ttr.reason, rate.reason]

    def _stabilise(
        self,
        now_s: float,
        proposed: Mapping[str, int],
        current: Mapping[str, int],
        need: Mapping[str, int],
        windows: Mapping[str, RuleValue] | None = None,
    ) -> tuple[dict[str, int], list[str]]:
        """Remember ``need``, then :func:`disagg_planner.core.guards.stabilise` (``windows``:
        the roles whose observed margin shortens their window)."""
        self.remember_need(now_s, need)
        return stabilise(
            proposed,
            current,
            now_s=now_s,
            memory=self.stabilisation,
            window_s=self.config.scale_down_stabilization_seconds,
            last_scale_up_s=self.convergence.last_scale_up_s,
            time_to_ready_s=lambda role: self.time_to_ready(role).value,
            windows=windows,
        )

    def _guard(
        self,
        now_s: float,
        observed: TrafficObservation,
        sizing: Mapping[str, RoleSizing],
        current: Mapping[str, int],
        gpus: Mapping[str, int],
        memory_floor: Mapping[str, RuleValue],
        steady: Mapping[str, RoleSizing],
        *,
        up_only: bool = False,
    ) -> Guarded:
        """The guard chain (:func:`disagg_planner.core.guards.guard_chain`) with the tick's
        floors, its stabilisation and the observed margin a scale-down needs (``up_only``:
        nothing goes down, while a change converges)."""
        roles = self.config.roles
        cuts = self.cut_floors(now_s)
        floors = {r: self.config.min_endpoint_for(r) for r in roles}
        # what the stabilisation remembers: the need without the backlog term
        need = {
            r: max(
                floors[r],
                int(memory_floor[r].value) if r in memory_floor else 0,
                int(cuts[r].value),
                steady[r].replicas,
            )
            for r in roles
        }
        tails = self.tails(observed)
        margin = {r: scale_down_margin(r, ratio=tails.ratio(r)) for r in roles}
        window = self.config.scale_down_stabilization_seconds
        windows = {
            r: margin_window(
                r,
                ratio=tails.ratio(r),
                window_s=window,
                time_to_ready_s=self.time_to_ready(r).value,
            )
            for r in roles
        }
        return guard_chain(
            {r: sizing[r].replicas for r in roles},
            current=current,
            limits=self.limits(gpus, step_cap=True),
            kept={"burst_memory": memory_floor, "cut_need": cuts},
            stabilise=lambda proposed, cur: self._stabilise(now_s, proposed, cur, need, windows),
            margin=margin,
            up_only=up_only,
        )

    def _decide(
        self,
        now_s: float,
        status: DeploymentStatus,
        forecast: LoadForecast,
        sizing: Mapping[str, RoleSizing],
        guarded: Guarded,
        diagnostics: ThroughputDiagnostics,
    ) -> ThroughputDecision:
        """The guarded target as a decision and its reason; a change is remembered for the
        convergence wait, a scale-down as a cut (:func:`disagg_planner.core.feedback.cut_floor`)."""
        budget = guarded.budget
        if budget.hold:
            return self.hold(
                now_s, ThroughputReason.GPU_BUDGET_GUARD_HOLD, budget.message, diagnostics
            )
        target = budget.replicas
        explain = self.sizer.explain(forecast, sizing, target)
        explain += "".join(f"; {r}" for r in self.demand.rules(self.config).acting())
        if diagnostics.rules:
            explain += "; " + "; ".join(r for r in diagnostics.rules if r)
        if budget.limited_by:
            explain += f"; limited by {budget.limited_by}: {budget.message}"
        desired = {r: status.desired(r) for r in self.config.roles}
        if target == desired:
            reason = ThroughputReason.NO_CHANGE
            if budget.limited_by:
                reason = ThroughputReason.GPU_BUDGET_GUARD_HOLD
            return ThroughputDecision(now_s, target, reason, explain, diagnostics)
        self.convergence.note_scale(now_s, target, desired)
        for role, n in target.items():
            if n < desired[role]:
                self.feedback.cut[role] = (now_s, desired[role])
        reason = (
            ThroughputReason.GPU_BUDGET_RECONCILE if budget.reconcile else ThroughputReason.SCALE
        )
        return ThroughputDecision(now_s, target, reason, explain, diagnostics)
