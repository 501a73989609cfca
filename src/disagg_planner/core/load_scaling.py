"""Load-based scaling: one role, one tick: up by what the latency asks for, down by one.

Every ``load_adjustment_interval_seconds`` the shell hands in the latest ForwardPassMetrics
per live engine (``(worker_id, dp_rank)``), the role's wall-time model (fed separately with
every iteration, see :mod:`disagg_planner.regression.models`) and the replica counts.
:func:`decide_load` then applies, in order (each step either decides or passes on):

1. ``disabled`` when the load loop is off;
2. ``scaling_in_progress`` while the last change has not converged (desired != ready): the
   model keeps learning but no new action is taken (the pending-desired guard);
3. hold on missing data, never scale on it: ``no_fpm_data`` (no engine reports),
   ``stale_fpm_data`` (an engine fell silent), ``worker_count_mismatch`` (the engines
   reporting are not ``ready * dp_size`` ranks of ``ready`` workers), ``invalid_fpm_data``
   (NaN or negative values), ``insufficient_data`` (model not ready or an estimate missing);
4. estimate per engine TTFT (prefill, agg) and ITL (decode, agg) with
   :mod:`disagg_planner.regression.estimators`;
5. ``scale_up`` when ALL engines' estimates exceed the SLA (agg: all TTFTs or all
   ITLs), by what the least-loaded engine's latency over the SLA asks for
   (:func:`scale_up_target`, at least one replica);
6. ``scale_down`` by one when ALL estimates are below ``SLA * s`` (``s`` =
   ``load_scaling_down_sensitivity / 100``; agg: both TTFT and ITL) AND the load of N
   replicas spread over N - 1 (consolidation factor ``c = N / (N - 1)``) still fits, per
   engine (Dynamo PR #9294; this is what stops a 2 <-> 1 oscillation):

   - prefill: with ``own`` = TTFT of the request's own prompt (empty queue) and ``post`` =
     TTFT with the queue scaled by ``c``: ``post - own < s * (ttft_sla - own)``;
   - decode: ITL with the batch scaled by ``c`` below ``itl_sla * s``, the scaled KV below
     ``max_kv_tokens`` (when known) and the scaled batch within ``max_num_seqs``;
   - agg: both, with the decode load scaled in the TTFT too and queued prompts counted as
     KV; otherwise ``scale_down_refused_consolidation``;
   never below ``max(1, min_endpoint)``: load cannot tell a zero-replica role's load;
7. floors (not applied to ``disabled`` / ``scaling_in_progress``, which return the desired
   count): when the throughput loop also runs its result is a lower bound
   (``scale_down_capped_by_throughput`` when it stops a scale-down,
   ``reconcile_clamped_to_floor`` when it or the role's min endpoint lifts the result).

No I/O and no clock: ``now_s`` is only compared with the ``last_seen_s`` times passed in.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from disagg_planner.config.schema import PlannerConfig
from disagg_planner.core.types import LoadReason, Role
from disagg_planner.profiles.queueing import max_utilisation
from disagg_planner.regression.estimators import (
    EngineLimits,
    agg_itl_ms,
    agg_load,
    agg_ttft_ms,
    decode_itl_ms,
    prefill_ttft_ms,
)
from disagg_planner.regression.models import AggModel, DecodeModel, LoadModel, PrefillModel
from disagg_planner.signals.fpm import ForwardPassMetrics, invalid_value_reason

EngineKey = tuple[str, int]

__all__ = [
    "EngineEstimate",
    "EngineKey",
    "EngineLimits",
    "LoadDecision",
    "LoadModel",
    "decide_load",
    "make_load_model",
    "min_load_replicas",
    "resolve_engine_limits",
]


@dataclass(frozen=True)
class EngineEstimate:
    """Estimated latencies (ms) at one engine now; None where the role has no such latency."""

    ttft_ms: float | None = None
    itl_ms: float | None = None


@dataclass(frozen=True)
class LoadDecision:
    """What the load loop wants for one role this tick, and why."""

    role: Role
    replicas: int
    reason: LoadReason
    estimates: Mapping[EngineKey, EngineEstimate] = field(default_factory=dict)
    message: str = ""

    @property
    def max_ttft_ms(self) -> float | None:
        """Largest TTFT estimate across engines (the diagnostics value), None if none."""
        values = [e.ttft_ms for e in self.estimates.values() if e.ttft_ms is not None]
        return max(values) if values else None

    @property
    def max_itl_ms(self) -> float | None:
        values = [e.itl_ms for e in self.estimates.values() if e.itl_ms is not None]
        return max(values) if values else None


def make_load_model(role: Role, config: PlannerConfig) -> LoadModel:
    """The wall-time model a role's load loop learns, sized by the config."""
    kwargs = {
        "max_samples": config.max_num_fpm_samples,
        "bucket_count": config.fpm_sample_bucket_size,
        "min_observations": config.load_min_observations,
        "warmup_iterations": config.fpm_warmup_iterations,
    }
    if role == "prefill":
        return PrefillModel(**kwargs)
    if role == "decode":
        return DecodeModel(**kwargs)
    return AggModel(**kwargs)


def resolve_engine_limits(
    config: PlannerConfig, published: EngineLimits | None = None
) -> EngineLimits:
    """Engine limits: the config's values, else what the engines publish (Kubernetes:
    DynamoWorkerMetadata), else defaults (8192 batched tokens, 512 sequences, KV unknown)."""
    base = published or EngineLimits()
    return EngineLimits(
        max_num_batched_tokens=config.max_num_batched_tokens or base.max_num_batched_tokens,
        max_num_seqs=config.max_num_seqs or base.max_num_seqs,
        max_kv_tokens=config.max_kv_tokens or base.max_kv_tokens,
    )


# --- the decision --------------------------------------------------------------------------


@dataclass(frozen=True)
class _Proposal:
    """The load rule's answer before floors: target replicas, reason, message."""

    replicas: int
    reason: LoadReason
    message: str


def decide_load(
    *,
    role: Role,
    now_s: float,
    engines: Mapping[EngineKey, ForwardPassMetrics],
    model: LoadModel,
    ready_replicas: int,
    desired_replicas: int,
    dp_size: int,
    config: PlannerConfig,
    engine_limits: EngineLimits,
    throughput_floor: int | None,
    last_seen_s: Mapping[EngineKey, float] | None = None,
    kv_hit_rate: float | None = None,
    accept_length: float = 1.0,
    busy_fraction: Mapping[EngineKey, float] | None = None,
) -> LoadDecision:
    """Decide one role's replicas for this load tick (see the module docstring for rules).

    ``engines``: the latest report of each live engine. ``last_seen_s``: when each engine was
    last heard from, on the clock of ``now_s`` (omit when ``engines`` is already filtered for
    staleness). ``throughput_floor``: the throughput loop's replicas for this role, or None.
    ``kv_hit_rate``: prefix-cache hit rate discounting queued prompts (None: no discount).
    ``accept_length``: speculative-decoding tokens per step (1 without).
    ``busy_fraction``: share of recent wall time each engine spent in iterations (the sum of
    its FPM ``wall_time`` over a window); with it, a prefill (or agg) scale-down is refused
    when the busy time spread over one engine fewer would pass the sensitivity.
    """
    if dp_size < 1:
        raise ValueError(f"dp_size must be >= 1, got {dp_size}")
    if ready_replicas < 0 or desired_replicas < 0:
        raise ValueError(
            f"replica counts must be >= 0, got ready={ready_replicas} desired={desired_replicas}"
        )
    _check_model(role, model)
    if not config.load_scaling_active:
        return LoadDecision(
            role, desired_replicas, LoadReason.DISABLED, {}, "load-based scaling is off"
        )
    if desired_replicas != ready_replicas:
        return LoadDecision(
            role,
            desired_replicas,
            LoadReason.SCALING_IN_PROGRESS,
            {},
            f"waiting for the last change: {ready_replicas} of {desired_replicas} replicas ready",
        )
    estimates: dict[EngineKey, EngineEstimate] = {}
    proposal = _hold_on_bad_data(
        role=role,
        now_s=now_s,
        engines=engines,
        model=model,
        ready=ready_replicas,
        dp_size=dp_size,
        config=config,
        last_seen_s=last_seen_s,
    )
    if proposal is None:
        rule = _RoleRule(
            role=role,
            model=model,
            limits=engine_limits,
            kv_hit_rate=kv_hit_rate,
            accept_length=accept_length,
        )
        estimates = {key: rule.estimate(report) for key, report in engines.items()}
        proposal = _propose(
            rule=rule,
            engines=engines,
            estimates=estimates,
            ready=ready_replicas,
            config=config,
            busy_fraction=busy_fraction,
        )
    return _apply_floors(
        role=role,
        proposal=proposal,
        estimates=estimates,
        throughput_floor=throughput_floor,
        min_replicas=config.min_endpoint_for(role),
    )


def min_load_replicas(role: Role, config: PlannerConfig) -> int:
    """The fewest replicas a load scale-down leaves: load cannot see a zero-replica role's
    demand, so it never removes the last one (the throughput loop may). Also the load loop's
    floors under the GPU budget."""
    return max(1, config.min_endpoint_for(role))


def _check_model(role: Role, model: LoadModel) -> None:
    expected = {"prefill": PrefillModel, "decode": DecodeModel, "agg": AggModel}[role]
    if not isinstance(model, expected):
        raise TypeError(f"role {role!r} needs a {expected.__name__}, got {type(model).__name__}")


def _hold_on_bad_data(
    *,
    role: Role,
    now_s: float,
    engines: Mapping[EngineKey, ForwardPassMetrics],
    model: LoadModel,
    ready: int,
    dp_size: int,
    config: PlannerConfig,
    last_seen_s: Mapping[EngineKey, float] | None,
) -> _Proposal | None:
    """A hold at ``ready`` when the data cannot support a decision, else None."""
    if not engines:
        return _Proposal(ready, LoadReason.NO_FPM_DATA, f"no {role} engine reports FPM")
    if last_seen_s is not None:
        limit = config.fpm_staleness_seconds
        stale = sorted(
            key for key in engines if not now_s - last_seen_s.get(key, -math.inf) <= limit
        )
        if stale:
            return _Proposal(
                ready,
                LoadReason.STALE_FPM_DATA,
                f"{len(stale)} engine(s) silent for more than {limit:g} s, e.g. {stale[0]}",
            )
    mismatch = _worker_count_problem(engines, ready=ready, dp_size=dp_size)
    if mismatch:
        return _Proposal(ready, LoadReason.WORKER_COUNT_MISMATCH, mismatch)
    for key, report in sorted(engines.items()):
        problem = invalid_value_reason(report)
        if problem:
            return _Proposal(ready, LoadReason.INVALID_FPM_DATA, f"engine {key}: {problem}")
    if not model.ready:
        status = model.status()
        return _Proposal(
            ready,
            LoadReason.INSUFFICIENT_DATA,
            f"{role} model not ready ({status.num_observations} samples, "
            f"{status.reason}): {status.detail}",
        )
    return None


def _worker_count_problem(
    engines: Mapping[EngineKey, ForwardPassMetrics], *, ready: int, dp_size: int
) -> str | None:
    ranks: dict[str, set[int]] = {}
    for worker, rank in engines:
        ranks.setdefault(worker, set()).add(rank)
    if len(ranks) != ready:
        return f"{len(ranks)} workers report FPM but {ready} replicas are ready"
    uneven = sorted(w for w, r in ranks.items() if len(r) != dp_size)
    if uneven:
        return (
            f"worker {uneven[0]} reports {len(ranks[uneven[0]])} DP ranks, expected {dp_size} "
            f"({len(engines)} engines for {ready} x {dp_size})"
        )
    return None


def _finite(value: float | None) -> bool:
    return value is not None and math.isfinite(value)


@dataclass(frozen=True)
class _RoleRule:
    """Per-role estimates, at the current load or consolidated by a factor ``c``."""

    role: Role
    model: LoadModel
    limits: EngineLimits
    kv_hit_rate: float | None
    accept_length: float

    def ttft(
        self, report: ForwardPassMetrics, *, queue: float = 1.0, decode: float = 1.0
    ) -> float | None:
        if isinstance(self.model, PrefillModel):
            return prefill_ttft_ms(
                self.model,
                report,
                limits=self.limits,
                queue_scale=queue,
                kv_hit_rate=self.kv_hit_rate,
            )
        if isinstance(self.model, AggModel):
            return agg_ttft_ms(
                self.model,
                report,
                limits=self.limits,
                queue_scale=queue,
                decode_scale=decode,
                kv_hit_rate=self.kv_hit_rate,
            )
        return None

    def itl(self, report: ForwardPassMetrics, *, decode: float = 1.0) -> float | None:
        if isinstance(self.model, DecodeModel):
            return decode_itl_ms(
                self.model, report, decode_scale=decode, accept_length=self.accept_length
            )
        if isinstance(self.model, AggModel):
            return agg_itl_ms(
                self.model,
                report,
                limits=self.limits,
                decode_scale=decode,
                accept_length=self.accept_length,
            )
        return None

    def estimate(self, report: ForwardPassMetrics) -> EngineEstimate:
        return EngineEstimate(ttft_ms=self.ttft(report), itl_ms=self.itl(report))

    @property
    def uses_ttft(self) -> bool:
        return self.role in ("prefill", "agg")

    @property
    def uses_itl(self) -> bool:
        return self.role in ("decode", "agg")

    # --- consolidation checks: None when N - 1 engines can carry the load, else why not ---
    def prefill_refusal(
        self, report: ForwardPassMetrics, *, c: float, sla_ms: float, s: float
    ) -> str | None:
        own = self.ttft(report, queue=0.0)
        post = self.ttft(report, queue=c, decode=c)
        if not (_finite(own) and _finite(post)):
            return "TTFT re-estimate unavailable"
        assert own is not None and post is not None
        budget = s * (sla_ms - own)
        if budget <= 0.0 or post - own >= budget:
            return (
                f"TTFT after consolidation {post:.1f} ms (own prompt {own:.1f} ms) leaves "
                f"no room within {s:.2f} x the {sla_ms:g} ms SLA"
            )
        return None

    def decode_refusal(
        self, report: ForwardPassMetrics, *, c: float, sla_ms: float, s: float
    ) -> str | None:
        if isinstance(self.model, AggModel):
            load = agg_load(self.model, report)
            kv = load.decode_kv_tokens + load.queued_decode_kv_tokens + load.queued_prefill_tokens
            seqs = load.num_decode_requests + load.queued_decode_requests
        else:
            sched, queued = report.scheduled_requests, report.queued_requests
            kv = float(sched.sum_decode_kv_tokens + queued.sum_decode_kv_tokens)
            seqs = float(sched.num_decode_requests + queued.num_decode_requests)
        max_kv = self.limits.max_kv_tokens
        if max_kv is not None and kv * c >= max_kv:
            return f"KV after consolidation {kv * c:.0f} tokens >= capacity {max_kv}"
        if seqs * c + 1.0 > self.limits.max_num_seqs:
            return (
                f"batch after consolidation {seqs * c + 1.0:.0f} requests > "
                f"max_num_seqs {self.limits.max_num_seqs}"
            )
        post = self.itl(report, decode=c)
        if not _finite(post):
            return "ITL re-estimate unavailable"
        assert post is not None
        if post >= sla_ms * s:
            return f"ITL after consolidation {post:.1f} ms >= {s:.2f} x the {sla_ms:g} ms SLA"
        return None


def _propose(
    *,
    rule: _RoleRule,
    engines: Mapping[EngineKey, ForwardPassMetrics],
    estimates: Mapping[EngineKey, EngineEstimate],
    ready: int,
    config: PlannerConfig,
    busy_fraction: Mapping[EngineKey, float] | None = None,
) -> _Proposal:
    for key, est in sorted(estimates.items()):
        missing = [
            name
            for name, used, value in (
                ("TTFT", rule.uses_ttft, est.ttft_ms),
                ("ITL", rule.uses_itl, est.itl_ms),
            )
            if used and not _finite(value)
        ]
        if missing:
            return _Proposal(
                ready,
                LoadReason.INSUFFICIENT_DATA,
                f"no {'/'.join(missing)} estimate for engine {key} (averages still unknown)",
            )
    ttfts = [e.ttft_ms for e in estimates.values() if e.ttft_ms is not None]
    itls = [e.itl_ms for e in estimates.values() if e.itl_ms is not None]
    ttft_sla, itl_sla = config.ttft_ms, config.itl_ms
    s = config.load_scaling_down_sensitivity / 100.0

    # up: every engine is over the SLA (agg: on either latency)
    up = []
    if rule.uses_ttft and all(t > ttft_sla for t in ttfts):
        up.append(f"TTFT {min(ttfts):.1f}-{max(ttfts):.1f} ms > {ttft_sla:g} ms SLA")
    if rule.uses_itl and all(t > itl_sla for t in itls):
        up.append(f"ITL {min(itls):.1f}-{max(itls):.1f} ms > {itl_sla:g} ms SLA")
    if up:
        want = scale_up_target(
            ready,
            ttft_over=(min(ttfts) / ttft_sla) if rule.uses_ttft and ttfts and ttft_sla > 0 else 0,
            itl_over=(min(itls) / itl_sla) if rule.uses_itl and itls and itl_sla > 0 else 0,
        )
        return _Proposal(
            want,
            LoadReason.SCALE_UP,
            f"all {len(engines)} engines: " + "; ".join(up) + f"; {ready} -> {want} replicas "
            "(up by what the latency over the SLA asks for, down by one)",
        )

    # down: every engine is under SLA * s on every latency the role has
    summary = _summary(ttfts, itls, ttft_sla, itl_sla)
    below = (not rule.uses_ttft or all(t < ttft_sla * s for t in ttfts)) and (
        not rule.uses_itl or all(t < itl_sla * s for t in itls)
    )
    if not below or s <= 0.0:
        return _Proposal(ready, LoadReason.NO_CHANGE, summary)
    floor = min_load_replicas(rule.role, config)
    if ready - 1 < floor:
        return _Proposal(ready, LoadReason.NO_CHANGE, f"{summary}; at the minimum of {floor}")
    c = ready / (ready - 1)
    checks: list[tuple[Callable[..., str | None], float]] = []
    if rule.uses_ttft:
        checks.append((rule.prefill_refusal, ttft_sla))
    if rule.uses_itl:
        checks.append((rule.decode_refusal, itl_sla))
    for key, report in sorted(engines.items()):
        for check, sla in checks:
            refusal = check(report, c=c, sla_ms=sla, s=s)
            if refusal:
                return _Proposal(
                    ready,
                    LoadReason.SCALE_DOWN_REFUSED_CONSOLIDATION,
                    f"{summary}; {ready} -> {ready - 1} refused at engine {key}: {refusal}",
                )
    if rule.uses_ttft and busy_fraction:
        # A queue snapshot says little about how busy an engine is: at 80 % utilisation the
        # queue is usually empty, yet halving the engines overloads them. Refuse when the
        # busy time of N engines spread over N - 1 would pass the sensitivity.
        shares = [busy_fraction[k] for k in engines if k in busy_fraction]
        if shares:
            projected = sum(shares) / len(shares) * c
            owns = [rule.ttft(r, queue=0.0) for r in engines.values()]
            own = min((o for o in owns if o is not None and _finite(o)), default=0.0)
            limit = _busy_limit(own, ttft_sla, config.ttft_attainment_target, s)
            if projected > limit:
                return _Proposal(
                    ready,
                    LoadReason.SCALE_DOWN_REFUSED_CONSOLIDATION,
                    f"{summary}; {ready} -> {ready - 1} refused: engines busy "
                    f"{sum(shares) / len(shares):.0%} would be {projected:.0%} > {limit:.0%}",
                )
    return _Proposal(
        ready - 1,
        LoadReason.SCALE_DOWN,
        f"{summary}; all below {s:.2f} x SLA and {ready - 1} replicas carry the load",
    )


def scale_up_target(ready: int, *, ttft_over: float, itl_over: float) -> int:
    """Up fast: replicas in proportion to how far the least-loaded engine is over the SLA
    (its latency / the SLA; queueing delay falls at least as fast as the engines are
    added), at least one more. Scale-downs stay one replica at a time.

    >>> scale_up_target(3, ttft_over=2.5, itl_over=0.0)
    8
    >>> scale_up_target(3, ttft_over=1.01, itl_over=0.0)
    4
    """
    factor = max(ttft_over, itl_over, 1.0)
    return max(ready + 1, math.ceil(ready * factor - 1e-9))


def _busy_limit(
    own_ms: float, ttft_sla_ms: float, attainment: float | None, sensitivity: float
) -> float:
    """How busy prefill engines may be after a scale-down: the utilisation at which the
    TTFT target still holds for ``attainment`` of requests (a request's own prefill time
    ``own_ms`` taken as the service time; :func:`disagg_planner.profiles.queueing.max_utilisation`),
    and never above the sensitivity."""
    if attainment is None or own_ms <= 0 or own_ms >= ttft_sla_ms:
        return sensitivity
    rho = max_utilisation(
        slack_s=(ttft_sla_ms - own_ms) / 1000.0, service_s=own_ms / 1000.0, quantile=attainment
    )
    return min(sensitivity, rho)


def _summary(ttfts: list[float], itls: list[float], ttft_sla: float, itl_sla: float) -> str:
    parts = []
    if ttfts:
        parts.append(f"TTFT max {max(ttfts):.1f} ms / {ttft_sla:g}")
    if itls:
        parts.append(f"ITL max {max(itls):.1f} ms / {itl_sla:g}")
    return ", ".join(parts)


def _apply_floors(
    *,
    role: Role,
    proposal: _Proposal,
    estimates: Mapping[EngineKey, EngineEstimate],
    throughput_floor: int | None,
    min_replicas: int,
) -> LoadDecision:
    replicas, reason, message = proposal.replicas, proposal.reason, proposal.message
    if throughput_floor is not None and throughput_floor > replicas:
        message = f"{message}; {reason.value} lifted to the throughput floor {throughput_floor}"
        reason = (
            LoadReason.SCALE_DOWN_CAPPED_BY_THROUGHPUT
            if reason is LoadReason.SCALE_DOWN
            else LoadReason.RECONCILE_CLAMPED_TO_FLOOR
        )
        replicas = throughput_floor
    if replicas < min_replicas:
        message = f"{message}; {reason.value} lifted to the minimum of {min_replicas}"
        reason = LoadReason.RECONCILE_CLAMPED_TO_FLOOR
        replicas = min_replicas
    return LoadDecision(role, replicas, reason, dict(estimates), message)
