"""Throughput-based scaling: forecast the next interval's load and size replicas from a profile.

Each tick (every ``throughput_adjustment_interval_seconds``):

1. hold when the traffic observation is missing or stale (never scale on no data);
2. feed the observed request count, ISL and OSL to one predictor each;
3. update the correction factors (observed latency / the profile's latency at the observed
   load) unless ``no_correction``;
4. size each role from the forecast (Dynamo's formulas, in ``size_prefill``/``size_decode``);
5. apply the guards: min endpoints, the per-tick change cap, the GPU budget (the rule every
   loop shares, :func:`disagg_planner.core.budget.apply_gpu_budget`);
6. hold while the last change has not converged (ready != desired), until
   ``scaling_convergence_timeout_seconds`` after which it re-plans from what is ready.

Everything is a function of the arguments: no clock, no I/O.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Protocol

from disagg_planner.config.schema import PlannerConfig
from disagg_planner.core.budget import BudgetResult, apply_floors, apply_gpu_budget, cap_change
from disagg_planner.core.demand import DemandSignals, decode_requests, prefill_requests
from disagg_planner.core.rules import (
    LengthSample,
    RateSample,
    RuleValue,
    arrival_envelope,
    backlog_replica_cap,
    backlog_tokens,
    burst_factor,
    burst_memory,
    histogram_points,
    histogram_quantile,
    length_mix,
    pooled_lengths,
    rising_trend,
    scale_down_allowed,
    slo_at_risk,
    slo_request_seconds,
    time_to_ready,
    within_envelope,
)
from disagg_planner.core.types import (
    DeploymentStatus,
    Histogram,
    MissingObservation,
    ThroughputReason,
    TrafficObservation,
)
from disagg_planner.predictors.base import SERIES, Forecast, LoadPredictor
from disagg_planner.profiles.queueing import max_utilisation, pooled_servers_needed

# Short-window (fast-check) arrival rates kept for the burst factor: an hour at 15 s.
BURST_HISTORY = 240
# The TTFT quantile the fast path reads when no attainment target is configured.
DEFAULT_FAST_TTFT_QUANTILE = 0.99

# Never plan prefill below this utilisation: past it, headroom buys little and costs a lot.
MIN_UTILISATION = 0.2
# Plan decode engines at this share of their profiled throughput and sequence slots:
# arrivals and output lengths fluctuate within an interval, and a request that finds every
# slot taken waits for its first token.
DECODE_SEQ_UTILISATION = 0.8


# --- what the core needs of a profile (profiles.Profile satisfies it) ---------------------


class PrefillCurve(Protocol):
    def ttft_ms(self, isl: float) -> float: ...
    def thpt_per_gpu(self, isl: float) -> float: ...


class DecodeBestPoint(Protocol):
    @property
    def thpt_per_gpu(self) -> float: ...
    @property
    def itl_ms(self) -> float: ...
    @property
    def feasible(self) -> bool: ...


class DecodeSurface(Protocol):
    def itl_ms(self, kv_usage: float, context_length: float) -> float: ...
    def find_best_throughput_per_gpu(
        self, itl_ms: float, context_length: float
    ) -> DecodeBestPoint: ...


class CapacityProfile(Protocol):
    @property
    def prefill(self) -> PrefillCurve: ...
    @property
    def decode(self) -> DecodeSurface: ...
    @property
    def max_kv_tokens(self) -> int: ...


# --- records ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class LoadForecast:
    """The load the next interval is sized for (upper quantile when configured)."""

    num_req: float
    isl: float
    osl: float
    fallback: bool = False  # some series had too few points and repeated its last value


@dataclass(frozen=True)
class CorrectionFactors:
    """Observed / expected latency; 1.0 when not measured (no traffic, disabled)."""

    prefill: float = 1.0
    decode: float = 1.0


@dataclass(frozen=True)
class RoleSizing:
    """One role's replica need before guards, and the arithmetic behind it."""

    role: str
    replicas: int
    demand_tokens_per_s: float
    thpt_per_gpu: float
    gpus_per_replica: int
    feasible: bool = True
    note: str = ""
    utilisation: float = 1.0  # share of the profiled throughput planned for


@dataclass(frozen=True)
class ThroughputDiagnostics:
    observed: TrafficObservation | None = None
    forecast: LoadForecast | None = None
    corrections: CorrectionFactors = CorrectionFactors()
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


# --- formulas --------------------------------------------------------------------------------


def prefill_correction(obs: TrafficObservation, prefill: PrefillCurve) -> float | None:
    """Observed TTFT over the profile's TTFT at the observed ISL (None: not measurable)."""
    if obs.num_req <= 0 or obs.ttft_ms is None or obs.isl is None or obs.isl <= 0:
        return None
    expected = prefill.ttft_ms(obs.isl)
    return obs.ttft_ms / expected if expected > 0 else None


def decode_correction(
    obs: TrafficObservation, decode: DecodeSurface, *, max_kv_tokens: int, decode_replicas: int
) -> float | None:
    """Observed ITL over the profile's ITL at the observed per-engine concurrency.

    Concurrency per decode engine follows Little's law: request rate x request duration /
    engines; the KV usage it implies is ``concurrency x (isl + osl/2) / max_kv_tokens``.
    """
    if (
        obs.num_req <= 0
        or decode_replicas <= 0
        or obs.itl_ms is None
        or obs.isl is None
        or obs.osl is None
        or obs.request_duration_s is None
        or max_kv_tokens <= 0
    ):
        return None
    context = obs.isl + obs.osl / 2
    concurrency = obs.request_rate * obs.request_duration_s / decode_replicas
    kv_usage = min(1.0, concurrency * context / max_kv_tokens)
    expected = decode.itl_ms(kv_usage, context)
    return obs.itl_ms / expected if expected > 0 else None


def size_prefill(
    forecast: LoadForecast,
    prefill: PrefillCurve,
    *,
    interval_s: float,
    correction: float,
    gpus_per_replica: int,
    ttft_target_ms: float | None = None,
    attainment: float | None = None,
    service_scv: float = 1.0,
    pooled: bool = False,
    burst: float = 1.0,
    backlog_tokens_per_s: float = 0.0,
    length_mix: float = 1.0,
) -> RoleSizing:
    """``ceil(num_req x isl / interval x min(1, corr) / (thpt_per_gpu(isl) x rho) / gpus)``.

    ``length_mix`` (:func:`disagg_planner.core.rules.length_mix`) scales the work, the
    backlog's included, and the mean service time: the prompts' own lengths cost more than
    their mean at the mean's throughput.

    ``burst`` multiplies the arrival demand (sized for a short-window peak, not the mean)
    and ``backlog_tokens_per_s`` is added to it (the work already waiting). With ``pooled``
    the engines are one GI/G/c queue (the router spreads requests over them): the replicas
    are the fewest whose pooled waiting-time tail meets the target
    (:func:`disagg_planner.profiles.queueing.pooled_servers_needed`), not ``c`` separate
    GI/G/1 queues.

    With ``rho = 1`` this is Dynamo's formula: engines sized to run at their profiled
    throughput, i.e. fully busy. Given a TTFT target and an ``attainment`` share, ``rho`` is
    the utilisation at which no more than ``1 - attainment`` of requests wait longer than the
    target leaves after their own prefill (:func:`disagg_planner.profiles.queueing.max_utilisation`;
    service time per request ``isl / (thpt_per_gpu x gpus)``, its variability
    ``service_scv`` that of the prompt lengths).

    The correction only ever lowers the demand here (Dynamo's ``min(1, p_corr)``): a slow
    TTFT is a queueing symptom that more prefill replicas fix, which the raw demand already
    asks for.
    """
    demand = forecast.num_req * forecast.isl / interval_s * min(1.0, correction) * max(1.0, burst)
    demand += max(0.0, backlog_tokens_per_s)
    mix = length_mix if math.isfinite(length_mix) and length_mix > 0 else 1.0
    demand *= mix
    thpt = prefill.thpt_per_gpu(forecast.isl) if forecast.isl > 0 else 0.0
    if demand <= 0:
        return RoleSizing("prefill", 0, 0.0, thpt, gpus_per_replica, note="no prefill demand")
    if thpt <= 0:
        return RoleSizing(
            "prefill",
            0,
            demand,
            thpt,
            gpus_per_replica,
            feasible=False,
            note=f"profile gives no prefill throughput at ISL {forecast.isl:.0f}",
        )
    rho, note = 1.0, ""
    if ttft_target_ms is not None and attainment is not None:
        own_ms = prefill.ttft_ms(forecast.isl)
        service_s = mix * forecast.isl / (thpt * gpus_per_replica)
        slack_s = (ttft_target_ms - own_ms) / 1000.0
        if slack_s > 0 and pooled:
            offered = demand / (thpt * gpus_per_replica)  # engines' worth of work
            replicas = pooled_servers_needed(
                offered,
                slack_s=slack_s,
                service_s=service_s,
                quantile=attainment,
                service_scv=service_scv,
            )
            replicas = min(replicas, math.ceil(offered / MIN_UTILISATION))
            rho = offered / replicas if replicas else 1.0
            return RoleSizing(
                "prefill",
                replicas,
                demand,
                thpt,
                gpus_per_replica,
                note=f"pooled GI/G/c over {replicas} engines at {rho:.0%} utilisation for "
                f"{attainment:.0%} TTFT attainment",
                utilisation=rho,
            )
        if slack_s > 0:
            rho = max(
                max_utilisation(
                    slack_s=slack_s,
                    service_s=service_s,
                    quantile=attainment,
                    service_scv=service_scv,
                ),
                MIN_UTILISATION,
            )
            note = f"sized at {rho:.0%} utilisation for {attainment:.0%} TTFT attainment"
        else:
            note = (
                f"TTFT target {ttft_target_ms:.0f} ms is below the profiled {own_ms:.0f} ms at "
                f"ISL {forecast.isl:.0f}: sized at full utilisation"
            )
    return RoleSizing(
        "prefill",
        math.ceil(demand / (thpt * rho) / gpus_per_replica),
        demand,
        thpt,
        gpus_per_replica,
        note=note,
        utilisation=rho,
    )


def histogram_scv(histogram: Histogram) -> float | None:
    """Squared coefficient of variation (variance / mean^2) of a bucketed distribution, each
    bucket at its midpoint (the overflow at 1.5 x the last bound); None when empty.

    >>> histogram_scv(Histogram(bounds=(1024.0, 2048.0, 4096.0), counts=(0.0, 0.0, 10.0)))
    0.0
    """
    total = histogram.total
    if total <= 0 or not histogram.bounds:
        return None
    points, weights = zip(*histogram_points(histogram), strict=True)
    mean = sum(p * w for p, w in zip(points, weights, strict=True)) / total
    if mean <= 0:
        return None
    var = sum(w * (p - mean) ** 2 for p, w in zip(points, weights, strict=True)) / total
    return var / mean**2


def size_decode(
    forecast: LoadForecast,
    decode: DecodeSurface,
    *,
    interval_s: float,
    itl_target_ms: float,
    correction: float,
    gpus_per_replica: int,
    max_num_seqs: int | None = None,
    seq_utilisation: float = 1.0,
) -> RoleSizing:
    """``ceil(num_req x osl / interval / thpt / gpus)`` with ``thpt`` the best throughput per
    GPU whose ITL meets ``itl / d_corr`` at context ``isl + osl/2`` (Dynamo's formula).

    Beyond Dynamo: the correction only ever tightens the ITL (``d_corr`` below 1, engines
    faster than profiled, never licenses fewer replicas than the profile asks for); engines
    are planned at ``seq_utilisation`` of that throughput, and with ``max_num_seqs`` at most
    at what ``seq_utilisation x max_num_seqs`` concurrent requests per engine deliver at that
    ITL. A decode engine that runs full queues new requests before their first token, which
    no ITL shows and which then takes minutes to drain.
    """
    demand = forecast.num_req * forecast.osl / interval_s
    factor = max(1.0, correction)
    corrected_itl = itl_target_ms / factor
    context = forecast.isl + forecast.osl / 2
    best = decode.find_best_throughput_per_gpu(corrected_itl, max(context, 1.0))
    if demand <= 0:
        return RoleSizing(
            "decode", 0, 0.0, best.thpt_per_gpu, gpus_per_replica, note="no decode demand"
        )
    if not best.feasible or best.thpt_per_gpu <= 0:
        return RoleSizing(
            "decode",
            0,
            demand,
            0.0,
            gpus_per_replica,
            feasible=False,
            note=f"no profiled point meets ITL {corrected_itl:.1f} ms at context {context:.0f}",
        )
    thpt, note, utilisation = best.thpt_per_gpu, "", seq_utilisation
    if max_num_seqs is not None and best.itl_ms > 0:
        slots = max_num_seqs * seq_utilisation
        slot_thpt = slots * 1000.0 / best.itl_ms / gpus_per_replica
        if slot_thpt < thpt * utilisation:
            utilisation = slot_thpt / thpt
            note = f"capped by {slots:.0f} of {max_num_seqs} sequence slots per engine"
    return RoleSizing(
        "decode",
        math.ceil(demand / (thpt * utilisation) / gpus_per_replica),
        demand,
        thpt,
        gpus_per_replica,
        note=note,
        utilisation=utilisation,
    )


def size_agg(prefill: RoleSizing, decode: RoleSizing, *, gpus_per_replica: int) -> RoleSizing:
    """An aggregated engine time-shares prefill and decode, so the GPU needs add up."""
    gpus = 0.0
    for part in (prefill, decode):
        if part.demand_tokens_per_s > 0 and part.thpt_per_gpu > 0:
            gpus += part.demand_tokens_per_s / (part.thpt_per_gpu * part.utilisation)
    feasible = prefill.feasible and decode.feasible
    return RoleSizing(
        "agg",
        math.ceil(gpus / gpus_per_replica) if feasible else 0,
        prefill.demand_tokens_per_s + decode.demand_tokens_per_s,
        0.0,
        gpus_per_replica,
        feasible=feasible,
        note="; ".join(n for n in (prefill.note, decode.note) if n),
    )


# --- the state machine ------------------------------------------------------------------------


# Given the series names, one predictor per series (built together: auto's share evidence).
PredictorFactory = Callable[[Sequence[str]], Mapping[str, LoadPredictor]]


class ThroughputPlanner:
    """Holds the predictors, correction factors and convergence tracking of one deployment."""

    def __init__(
        self,
        *,
        config: PlannerConfig,
        profile: CapacityProfile,
        predictor_factory: PredictorFactory,
        decode_max_num_seqs: int | None = None,
    ) -> None:
        self.config = config
        self.profile = profile
        self.decode_max_num_seqs = decode_max_num_seqs
        # Variability of prompt lengths (squared coefficient of variation) from the observed
        # ISL histogram; until one is seen, the exponential case (1.0) is assumed.
        self.isl_scv = 1.0
        # the last window's ISL histogram, for the prompt-length mix rule
        self.isl_histogram: Histogram | None = None
        self.predictors: dict[str, LoadPredictor] = dict(predictor_factory(SERIES))
        self.corrections = CorrectionFactors()
        self._last_action_s: float | None = None
        self._last_target: dict[str, int] | None = None
        self._awaiting_ready: dict[str, float] = {}  # role -> time of the change
        self._recommendations: deque[tuple[float, dict[str, int]]] = deque()
        # the replicas the first tick found, and when: a need until one stabilisation window
        # after it, so that a planner (re)started on a running deployment does not cut it
        # before it has seen a window of load (the HPA controller records its first sight
        # of an HPA the same way)
        self._found: tuple[float, dict[str, int]] | None = None
        self.scaling_latency_s: dict[str, float] = {}
        self._last_scale_up_s: dict[str, float] = {}
        # short-window rate / its interval's mean rate, for the burst factor
        self.burst_ratios: deque[float] = deque(maxlen=BURST_HISTORY)
        self._short_rates: list[float] = []  # fast-check rates since the last tick
        # short-window rates (fast checks; the intervals' without them), for the burst memory
        self.rate_samples: deque[RateSample] = deque(maxlen=BURST_HISTORY)
        self._last_lengths: tuple[float, float] | None = None  # (isl, osl) last seen
        # the last interval's window and the fast windows since, for the fast path's lengths
        self._length_windows: deque[LengthSample] = deque(maxlen=BURST_HISTORY)
        self.demand = DemandSignals()  # KV hit rate and accept length (core/demand.py)

    # The predictors see every observed window, also those the planner holds on.
    def _observe(self, obs: TrafficObservation) -> None:
        self.predictors["num_req"].observe(obs.num_req)
        self.demand.observe(obs)
        # An idle window has no defined lengths: keep the length series where they were.
        if obs.num_req > 0 and obs.isl is not None and obs.osl is not None:
            self.predictors["isl"].observe(obs.isl)
            self.predictors["osl"].observe(obs.osl)
            self._last_lengths = (obs.isl, obs.osl)

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

    def _track_convergence(self, now_s: float, status: DeploymentStatus) -> None:
        """Measure each scale-up from decision to ready (checked on every tick, fast ones
        included, so the measurement is as fine as the fast-check period)."""
        for role, since in list(self._awaiting_ready.items()):
            if role in status.roles and status.ready(role) >= status.desired(role):
                self.scaling_latency_s[role] = now_s - since
                del self._awaiting_ready[role]

    def time_to_ready(self, role: str) -> RuleValue:
        return time_to_ready(self.scaling_latency_s.get(role), self.config.replica_startup_seconds)

    def _deployment_time_to_ready(self) -> RuleValue:
        """The slowest role's time-to-ready: one envelope sizes every role."""
        values = [self.time_to_ready(r) for r in self.config.roles]
        return max(values, key=lambda v: v.value)

    def _note_scale(
        self, now_s: float, target: Mapping[str, int], desired: Mapping[str, int]
    ) -> None:
        """Remember a change: the convergence wait, and each scale-up's time (measured to
        ready; no scale-down of that role within one time-to-ready)."""
        self._last_action_s = now_s
        self._last_target = dict(target)
        for role, n in target.items():
            if n > desired[role]:
                self._awaiting_ready[role] = now_s
                self._last_scale_up_s[role] = now_s

    def tick(
        self,
        now_s: float,
        traffic: TrafficObservation | MissingObservation,
        status: DeploymentStatus,
        queued_prefill_tokens: float | None = None,
    ) -> ThroughputDecision:
        """One throughput tick (see the module doc): each stage either decides, a hold with
        its reason, or passes what it worked out on to the next."""
        warnings = self._latency_warnings(now_s, status)
        fresh = self._fresh_traffic(now_s, traffic, warnings)
        if isinstance(fresh, ThroughputDecision):
            return fresh
        forecast = self._learn(fresh, status)
        sized_for, rules = self._size_for_arrival(fresh, forecast)
        burst = within_envelope(
            burst_factor(self.burst_ratios, self.config.burst_quantile),
            forecast_req=forecast.num_req,
            envelope_req=sized_for.num_req,
        )
        backlog = self._backlog(fresh, sized_for.isl, queued_prefill_tokens)
        mix = self._length_mix()
        rules += [burst.reason, backlog.reason, mix.reason]
        gpus = {r: status.roles[r].gpus_per_replica for r in self.config.roles}
        sizing, steady, capped = self._size_with_backlog(
            sized_for, gpus, status, burst=burst.value, backlog=backlog, length_mix=mix.value
        )
        rules += capped
        diagnostics = ThroughputDiagnostics(
            observed=fresh,
            forecast=forecast,
            corrections=self.corrections,
            sizing=sizing,
            scaling_latency_s=dict(self.scaling_latency_s),
            warnings=tuple(warnings),
            rules=tuple(rules),
            sized_for=sized_for,
        )
        infeasible = self._hold_if_infeasible(now_s, sizing, diagnostics)
        if infeasible is not None:
            return infeasible
        plan_from = self._plan_from(now_s, status, warnings, diagnostics)
        if isinstance(plan_from, ThroughputDecision):
            return plan_from
        memory, memory_floor = self._burst_memory(now_s, sized_for, gpus, mix.value)
        diagnostics = replace(diagnostics, rules=(*diagnostics.rules, memory.reason))
        stages, budget, guard_notes = self._guard(
            now_s, sizing, plan_from, gpus, memory_floor=memory_floor, steady=steady
        )
        diagnostics = replace(
            diagnostics,
            stages=stages,
            warnings=tuple(warnings),
            rules=diagnostics.rules + tuple(guard_notes),
        )
        return self._decide(now_s, status, forecast, sizing, budget, diagnostics)

    def fast_tick(
        self,
        now_s: float,
        recent: TrafficObservation | MissingObservation,
        status: DeploymentStatus,
        queued_prefill_tokens: float | None = None,
    ) -> ThroughputDecision:
        """The fast path between throughput ticks, from the frontend alone: when the recent
        window shows the SLO at risk (:func:`disagg_planner.core.rules.slo_at_risk`), scale
        up at once to what the observed demand and backlog need (within the floors and the
        GPU budget; never down). Its window's arrival rate also feeds the burst factor."""
        self._track_convergence(now_s, status)
        if isinstance(recent, MissingObservation):
            detail = f": {recent.detail}" if recent.detail else ""
            return self._hold(
                now_s,
                ThroughputReason.NO_TRAFFIC_DATA,
                f"fast check: traffic unavailable ({recent.reason}{detail}); holding",
                ThroughputDiagnostics(),
            )
        self._short_rates.append(recent.request_rate)
        self.rate_samples.append(RateSample(recent.end_s, recent.request_rate, recent.duration_s))
        quantile = self.config.ttft_attainment_target or DEFAULT_FAST_TTFT_QUANTILE
        tail_s = (
            histogram_quantile(recent.ttft_histogram, quantile)
            if recent.ttft_histogram is not None
            else None
        )
        tail_ms = tail_s * 1000.0 if tail_s is not None else recent.ttft_ms
        if recent.num_req > 0 and recent.isl is not None and recent.osl is not None:
            self._length_windows.append(LengthSample(recent.num_req, recent.isl, recent.osl))
        pooled = pooled_lengths(self._length_windows)
        if pooled is not None:
            isl, osl, lengths_reason = pooled
        else:
            isl, osl = self._last_lengths or (0.0, 0.0)
            lengths_reason = "no lengths in the recent windows: the last ones seen"
        # The waiting requests are counted at the short window's own mean prompt (those
        # reaching their first token now come out of the queue, long prompts among the
        # last); the arrivals' need at the pooled lengths.
        queued_isl = recent.isl if recent.num_req > 0 and recent.isl is not None else isl
        backlog = self._backlog(recent, queued_isl, queued_prefill_tokens)
        risk = slo_at_risk(
            ttft_tail_ms=tail_ms,
            ttft_target_ms=self.config.ttft_ms,
            itl_ms=recent.itl_ms,
            itl_target_ms=self.config.itl_ms,
            excess_in_flight=backlog.value / queued_isl if queued_isl > 0 else 0.0,
        )
        diagnostics = ThroughputDiagnostics(observed=recent, rules=(risk.reason, backlog.reason))
        if not risk.value:
            return ThroughputDecision(
                now_s, None, ThroughputReason.NO_CHANGE, f"fast check: {risk.reason}", diagnostics
            )
        interval = self.config.throughput_adjustment_interval_seconds
        trend = rising_trend(
            self.rate_samples,
            now_s=now_s,
            span_s=interval,
            reach_s=self._deployment_time_to_ready().value + recent.duration_s,
        )
        rate = max(recent.request_rate, trend.value)
        observed = LoadForecast(num_req=rate * interval, isl=isl, osl=osl)
        gpus = {r: status.roles[r].gpus_per_replica for r in self.config.roles}
        # the window is itself a short one: its rate is a burst's, no factor on top
        burst = RuleValue(1.0, "burst factor 1 (the fast check's window is a short window)")
        drain_s = self.config.backlog_drain_seconds
        mix = self._length_mix()
        sizing, steady, capped = self._size_with_backlog(
            observed, gpus, status, burst=burst.value, backlog=backlog, length_mix=mix.value
        )
        if any(not s.feasible for s in sizing.values()):
            return self._hold_if_infeasible(now_s, sizing, diagnostics) or self._hold(
                now_s, ThroughputReason.PROFILE_INFEASIBLE, "infeasible", diagnostics
            )
        cfg = self.config
        desired = {r: status.desired(r) for r in cfg.roles}
        floors = {r: cfg.min_endpoint_for(r) for r in cfg.roles}
        # up only: a fast check never removes what the throughput loop planned
        proposed = apply_floors({r: max(desired[r], sizing[r].replicas) for r in cfg.roles}, floors)
        budget = apply_gpu_budget(
            proposed,
            gpus_per_replica=gpus,
            floors=floors,
            max_gpus=cfg.max_gpu_budget,
            min_gpus=cfg.min_gpu_budget,
            order=cfg.roles,
            current=desired,
        )
        target = desired if budget.hold else budget.replicas
        target = {r: max(desired[r], n) for r, n in target.items()}
        diagnostics = replace(
            diagnostics,
            sizing=sizing,
            stages={"proposed": proposed, "budget": dict(target)},
            rules=(
                risk.reason,
                lengths_reason,
                trend.reason,
                burst.reason,
                backlog.reason,
                mix.reason,
                *capped,
            ),
        )
        explain = "fast check: " + "; ".join((risk.reason, backlog.reason))
        explain += f" (drained over {drain_s:.0f} s); " + self._explain(observed, sizing, target)
        explain += "".join(f"; {note}" for note in (lengths_reason, trend.reason, *capped) if note)
        if budget.limited_by:
            explain += f"; limited by {budget.limited_by}: {budget.message}"
        if target == desired:
            return ThroughputDecision(
                now_s,
                None,
                ThroughputReason.NO_CHANGE,
                explain + "; the current replicas cover the observed demand",
                diagnostics,
            )
        self._note_scale(now_s, target, desired)
        # remembered for the stabilisation: the need of the observed rate, not the replicas
        # ordered to drain the backlog
        self._remember(now_s, apply_floors({r: steady[r].replicas for r in cfg.roles}, floors))
        return ThroughputDecision(now_s, target, ThroughputReason.SCALE, explain, diagnostics)

    # --- the stages of a tick, in order ----------------------------------------------------

    def _latency_warnings(self, now_s: float, status: DeploymentStatus) -> list[str]:
        """Record how long the last changes took to become ready; warn about those slower
        than the interval (the planner then acts on stale capacity)."""
        interval = self.config.throughput_adjustment_interval_seconds
        self._track_convergence(now_s, status)
        return [
            f"{role} took {latency:.0f} s from decision to ready, longer than the "
            f"{interval:.0f} s adjustment interval"
            for role, latency in self.scaling_latency_s.items()
            if latency > interval
        ]

    def _fresh_traffic(
        self,
        now_s: float,
        traffic: TrafficObservation | MissingObservation,
        warnings: list[str],
    ) -> TrafficObservation | ThroughputDecision:
        """The window to plan with, or a hold: never scale on missing or stale data."""
        if isinstance(traffic, MissingObservation):
            detail = f": {traffic.detail}" if traffic.detail else ""
            return self._hold(
                now_s,
                ThroughputReason.NO_TRAFFIC_DATA,
                f"traffic unavailable ({traffic.reason}{detail}); holding replicas",
                ThroughputDiagnostics(warnings=tuple(warnings)),
            )
        if now_s - traffic.end_s > self.config.throughput_adjustment_interval_seconds:
            return self._hold(
                now_s,
                ThroughputReason.STALE_TRAFFIC_DATA,
                f"traffic window ended {now_s - traffic.end_s:.0f} s ago; holding replicas",
                ThroughputDiagnostics(observed=traffic, warnings=tuple(warnings)),
            )
        return traffic

    def _learn(self, traffic: TrafficObservation, status: DeploymentStatus) -> LoadForecast:
        """Feed the window to the predictors, corrections and ISL variability; forecast."""
        self._observe(traffic)
        if not self.config.no_correction:
            self._update_corrections(traffic, status)
        forecast = self._forecast()
        mean_rate = traffic.request_rate
        if not self._short_rates:
            self.rate_samples.append(RateSample(traffic.end_s, mean_rate, traffic.duration_s))
        if mean_rate > 0:
            self.burst_ratios.extend(r / mean_rate for r in self._short_rates)
        self._short_rates = []
        # the fast path's lengths pool this window with the short windows until the next
        self._length_windows.clear()
        if traffic.num_req > 0 and traffic.isl is not None and traffic.osl is not None:
            self._length_windows.append(LengthSample(traffic.num_req, traffic.isl, traffic.osl))
        if traffic.num_req > 0 and traffic.isl_histogram is not None:
            scv = histogram_scv(traffic.isl_histogram)
            if scv is not None:
                self.isl_scv = scv
                self.isl_histogram = traffic.isl_histogram
        return forecast

    def _size_for_arrival(
        self, traffic: TrafficObservation, forecast: LoadForecast
    ) -> tuple[LoadForecast, list[str]]:
        """The forecast raised to the upper envelope of the rate over the span in which the
        capacity ordered now will serve (:func:`disagg_planner.core.rules.arrival_envelope`)."""
        interval = self.config.throughput_adjustment_interval_seconds
        ttr = self._deployment_time_to_ready()
        envelope = arrival_envelope(
            observed_rate=traffic.request_rate,
            forecast_rate=forecast.num_req / interval,
            interval_s=interval,
            time_to_ready_s=ttr.value,
        )
        sized = replace(forecast, num_req=max(forecast.num_req, envelope.value * interval))
        return sized, [ttr.reason, envelope.reason]

    def _backlog(
        self, traffic: TrafficObservation, isl: float, queued_prefill_tokens: float | None
    ) -> RuleValue:
        osl = traffic.osl if traffic.osl is not None else (self._last_lengths or (0.0, 0.0))[1]
        return backlog_tokens(
            in_flight=traffic.in_flight,
            arrival_rate=traffic.request_rate,
            slo_request_s=slo_request_seconds(
                ttft_ms=self.config.ttft_ms, itl_ms=self.config.itl_ms, osl=osl
            ),
            isl=isl,
            queued_prefill_tokens=queued_prefill_tokens,
        )

    def _burst_memory(
        self,
        now_s: float,
        sized_for: LoadForecast,
        gpus: Mapping[str, int],
        length_mix: float,
    ) -> tuple[RuleValue, dict[str, int]]:
        """The burst memory rule (:func:`disagg_planner.core.rules.burst_memory`) and the
        replicas its remembered peak rate needs (sized as the forecast is, without the burst
        factor, which the short-window peak already is, and without a backlog); no floor
        when it remembers none or the profile cannot size it."""
        memory = burst_memory(
            self.rate_samples,
            now_s=now_s,
            time_to_ready_s=self._deployment_time_to_ready().value,
            memory_s=self.config.burst_memory_seconds,
        )
        if memory.value <= 0:
            return memory, {}
        interval = self.config.throughput_adjustment_interval_seconds
        peak = replace(sized_for, num_req=memory.value * interval)
        sizing = self._size(peak, gpus, length_mix=length_mix)
        if any(not s.feasible for s in sizing.values()):
            return memory, {}
        return memory, {r: s.replicas for r, s in sizing.items()}

    def _hold_if_infeasible(
        self, now_s: float, sizing: Mapping[str, RoleSizing], diagnostics: ThroughputDiagnostics
    ) -> ThroughputDecision | None:
        infeasible = [s for s in sizing.values() if not s.feasible]
        if not infeasible:
            return None
        return self._hold(
            now_s,
            ThroughputReason.PROFILE_INFEASIBLE,
            "; ".join(s.note for s in infeasible) + "; holding replicas",
            diagnostics,
        )

    def _plan_from(
        self,
        now_s: float,
        status: DeploymentStatus,
        warnings: list[str],
        diagnostics: ThroughputDiagnostics,
    ) -> dict[str, int] | ThroughputDecision:
        """The replicas to plan from: the desired ones; a hold while the last change
        converges; the ready ones once it has not converged within the timeout."""
        roles = self.config.roles
        current = {r: status.desired(r) for r in roles}
        if status.converged:
            return current
        since = self._last_action_s if self._last_action_s is not None else now_s
        if (
            self._last_action_s is not None
            and now_s - since < self.config.scaling_convergence_timeout_seconds
        ):
            pending = ", ".join(
                f"{r} {s.ready}/{s.desired} ready"
                for r, s in status.roles.items()
                if s.ready != s.desired
            )
            return self._hold(
                now_s,
                ThroughputReason.SCALING_IN_PROGRESS,
                f"waiting for the last change to converge ({pending})",
                diagnostics,
            )
        # Replicas that never became ready: plan from what is actually serving
        # (Dynamo issue #14251: the planner waited forever on unschedulable pods).
        warnings.append("previous change did not converge; re-planning from ready replicas")
        return {r: status.ready(r) for r in roles}

    def _guard(
        self,
        now_s: float,
        sizing: Mapping[str, RoleSizing],
        current: Mapping[str, int],
        gpus: Mapping[str, int],
        memory_floor: Mapping[str, int] | None = None,
        steady: Mapping[str, RoleSizing] | None = None,
    ) -> tuple[dict[str, dict[str, int]], BudgetResult, list[str]]:
        """The guards in order (floors, the burst memory's floor, stabilisation, change cap,
        GPU budget), each stage's replicas kept for the diagnostics, and the guards' notes."""
        cfg = self.config
        roles = cfg.roles
        floors = {r: cfg.min_endpoint_for(r) for r in roles}
        stages: dict[str, dict[str, int]] = {"proposed": {r: sizing[r].replicas for r in roles}}
        stages["floors"] = apply_floors(stages["proposed"], floors)
        kept = memory_floor or {}
        stages["burst_memory"] = {r: max(n, kept.get(r, 0)) for r, n in stages["floors"].items()}
        notes = [
            f"{r}: kept at {n}, not {stages['floors'][r]}: the burst memory's floor"
            for r, n in stages["burst_memory"].items()
            if n > stages["floors"][r]
        ]
        need = stages["burst_memory"]
        if steady is not None:
            need = {r: max(floors[r], kept.get(r, 0), steady[r].replicas) for r in stages["floors"]}
        stages["stabilised"], stabilise_notes = self._stabilise(
            now_s, stages["burst_memory"], current, need
        )
        notes += stabilise_notes
        stages["step_cap"] = cap_change(
            stages["stabilised"],
            current,
            max_step=cfg.max_throughput_scaling_replicas,
            floors=floors,
        )
        budget = apply_gpu_budget(
            stages["step_cap"],
            gpus_per_replica=gpus,
            floors=floors,
            max_gpus=cfg.max_gpu_budget,
            min_gpus=cfg.min_gpu_budget,
            order=roles,
            current=current,
        )
        stages["budget"] = budget.replicas
        return stages, budget, notes

    def _decide(
        self,
        now_s: float,
        status: DeploymentStatus,
        forecast: LoadForecast,
        sizing: Mapping[str, RoleSizing],
        budget: BudgetResult,
        diagnostics: ThroughputDiagnostics,
    ) -> ThroughputDecision:
        """The guarded target as a decision and its reason; a change is remembered for the
        convergence wait."""
        if budget.hold:
            return self._hold(
                now_s, ThroughputReason.GPU_BUDGET_GUARD_HOLD, budget.message, diagnostics
            )
        target = budget.replicas
        explain = self._explain(forecast, sizing, target)
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
        self._note_scale(now_s, target, desired)
        reason = (
            ThroughputReason.GPU_BUDGET_RECONCILE if budget.reconcile else ThroughputReason.SCALE
        )
        return ThroughputDecision(now_s, target, reason, explain, diagnostics)

    def _stabilise(
        self,
        now_s: float,
        proposed: Mapping[str, int],
        current: Mapping[str, int],
        need: Mapping[str, int] | None = None,
    ) -> tuple[dict[str, int], list[str]]:
        """Up fast, down slowly. Scale-down stabilisation (the HPA's): a role goes down only
        to the highest recommendation of the last ``scale_down_stabilization_seconds``, so a
        dip shorter than the time it takes to bring replicas back does not cost a round trip;
        and never within one time-to-ready of its last scale-up
        (:func:`disagg_planner.core.rules.scale_down_allowed`). What it remembers is
        ``need``, the recommendation without the backlog term (``proposed`` when not given):
        replicas ordered to drain a backlog are kept only while it lasts."""
        window = self.config.scale_down_stabilization_seconds
        self._remember(now_s, need if need is not None else proposed)
        if self._found is None:
            self._found = (now_s, dict(current))
        found_s, found = self._found
        found_holds = window > 0 and now_s - found_s <= window
        out: dict[str, int] = {}
        notes: list[str] = []
        for role, want in proposed.items():
            if want >= current[role]:
                out[role] = want
                continue
            allowed = scale_down_allowed(
                now_s=now_s,
                last_scale_up_s=self._last_scale_up_s.get(role),
                time_to_ready_s=self.time_to_ready(role).value,
            )
            if not allowed.value:
                out[role] = current[role]
                notes.append(f"{role}: {allowed.reason}")
                continue
            recent = max(r.get(role, 0) for _, r in self._recommendations)
            at_start = found.get(role, 0) if found_holds else 0
            out[role] = min(current[role], max(want, recent, at_start))
            if out[role] > max(want, recent):
                held = "kept at" if out[role] == current[role] else "down to"
                notes.append(
                    f"{role}: {held} {out[role]}, not {want}: the replicas found when the "
                    f"planner started ({found_s:.0f} s) count as a need for {window:.0f} s "
                    "(scale-down stabilisation)"
                )
            elif out[role] > want:
                notes.append(
                    f"{role}: down to {out[role]}, not {want}: the highest need of the last "
                    f"{window:.0f} s (scale-down stabilisation)"
                )
        return out, notes

    def _remember(self, now_s: float, recommendation: Mapping[str, int]) -> None:
        window = self.config.scale_down_stabilization_seconds
        self._recommendations.append((now_s, dict(recommendation)))
        while self._recommendations and self._recommendations[0][0] < now_s - window:
            self._recommendations.popleft()

    def _hold(
        self,
        now_s: float,
        reason: ThroughputReason,
        message: str,
        diagnostics: ThroughputDiagnostics,
    ) -> ThroughputDecision:
        return ThroughputDecision(now_s, None, reason, message, diagnostics)

    def _update_corrections(self, obs: TrafficObservation, status: DeploymentStatus) -> None:
        p_corr = prefill_correction(obs, self.profile.prefill)
        d_corr = None
        decode_role = "decode" if "decode" in status.roles else "agg"
        if decode_role in status.roles:
            d_corr = decode_correction(
                obs,
                self.profile.decode,
                max_kv_tokens=self.profile.max_kv_tokens,
                decode_replicas=status.ready(decode_role),
            )
        self.corrections = CorrectionFactors(
            prefill=p_corr if p_corr is not None else self.corrections.prefill,
            decode=d_corr if d_corr is not None else self.corrections.decode,
        )

    def _length_mix(self) -> RuleValue:
        if "prefill" not in self.config.roles and self.config.mode != "agg":
            return RuleValue(1.0, "prompt-length mix: no prefill role")
        return length_mix(
            self.isl_histogram,
            self.profile.prefill.thpt_per_gpu,
            enabled=self.config.prefill_length_mix,
        )

    def _size_with_backlog(
        self,
        forecast: LoadForecast,
        gpus: Mapping[str, int],
        status: DeploymentStatus,
        *,
        burst: float,
        backlog: RuleValue,
        length_mix: float,
    ) -> tuple[dict[str, RoleSizing], dict[str, RoleSizing], list[str]]:
        """The sizing with the backlog drained over ``backlog_drain_seconds``, each role at
        most :func:`disagg_planner.core.rules.backlog_replica_cap` above its sizing without
        the backlog; that sizing (what the stabilisation remembers: a drained backlog does
        not come back, so it is no reason to keep its replicas); the cap's sentences."""
        steady = self._size(forecast, gpus, burst=burst, length_mix=length_mix)
        if backlog.value <= 0:
            return steady, steady, []
        sizing = self._size(
            forecast,
            gpus,
            burst=burst,
            backlog_tokens_per_s=backlog.value / self.config.backlog_drain_seconds,
            length_mix=length_mix,
        )
        notes: list[str] = []
        for role, sized in sizing.items():
            if not (sized.feasible and steady[role].feasible):
                continue
            cap = backlog_replica_cap(
                role,
                with_backlog=sized.replicas,
                without_backlog=steady[role].replicas,
                holding=status.ready(role) if role in status.roles else 0,
            )
            if cap.reason:
                sizing[role] = replace(sized, replicas=int(cap.value))
                notes.append(cap.reason)
        return sizing, steady, notes

    def _size(
        self,
        forecast: LoadForecast,
        gpus: Mapping[str, int],
        *,
        burst: float = 1.0,
        backlog_tokens_per_s: float = 0.0,
        length_mix: float = 1.0,
    ) -> dict[str, RoleSizing]:
        cfg = self.config
        interval = cfg.throughput_adjustment_interval_seconds
        corr = self.corrections if not cfg.no_correction else CorrectionFactors()
        out: dict[str, RoleSizing] = {}
        engine_gpus_p = gpus.get("prefill", gpus.get("agg", 1))
        engine_gpus_d = gpus.get("decode", gpus.get("agg", 1))
        rules = self.demand.rules(cfg)  # issue 35: only uncached prompt tokens, A tokens/step
        prefill = size_prefill(
            replace(forecast, num_req=prefill_requests(forecast.num_req, rules.kv_hit)),
            self.profile.prefill,
            interval_s=interval,
            correction=corr.prefill,
            gpus_per_replica=engine_gpus_p,
            ttft_target_ms=cfg.ttft_ms,
            attainment=cfg.ttft_attainment_target,
            service_scv=self.isl_scv,
            pooled=cfg.prefill_queueing == "pooled",
            burst=burst,
            backlog_tokens_per_s=prefill_requests(backlog_tokens_per_s, rules.kv_hit),
            length_mix=length_mix,
        )
        decode = size_decode(
            replace(forecast, num_req=decode_requests(forecast.num_req, rules.accept)),
            self.profile.decode,
            interval_s=interval,
            itl_target_ms=cfg.itl_ms,
            correction=corr.decode,
            gpus_per_replica=engine_gpus_d,
            max_num_seqs=self.decode_max_num_seqs,
            seq_utilisation=DECODE_SEQ_UTILISATION,
        )
        if cfg.mode == "agg":
            out["agg"] = size_agg(prefill, decode, gpus_per_replica=gpus["agg"])
        else:
            if "prefill" in cfg.roles:
                out["prefill"] = prefill
            if "decode" in cfg.roles:
                out["decode"] = decode
        return out

    @staticmethod
    def _explain(
        forecast: LoadForecast, sizing: Mapping[str, RoleSizing], target: Mapping[str, int]
    ) -> str:
        parts = [
            f"forecast {forecast.num_req:.1f} req, ISL {forecast.isl:.0f}, OSL {forecast.osl:.0f}"
        ]
        for role, s in sizing.items():
            at = f" at {s.utilisation:.0%}" if s.utilisation < 1 else ""
            parts.append(
                f"{role}: {s.demand_tokens_per_s:.0f} tok/s / {s.thpt_per_gpu:.0f} tok/s/GPU{at} "
                f"/ {s.gpus_per_replica} GPU -> {s.replicas}, after guards {target[role]}"
            )
        return "; ".join(parts)
