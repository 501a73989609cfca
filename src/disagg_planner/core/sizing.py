"""Sizing: the formulas that turn a load forecast and a profile into replicas per role.

Each formula is a pure function of its arguments and returns a :class:`RoleSizing` (the
replicas and the arithmetic behind them, for the decision's reason):

- :func:`size_prefill`: ``ceil(demand / (thpt_per_gpu(isl) x rho) / gpus)`` with
  ``demand = num_req x isl / interval x corr x burst + backlog``, times the length mix;
- :func:`size_decode`: ``ceil(num_req x osl / interval / (thpt x u) / gpus)`` with ``thpt``
  the best throughput per GPU whose ITL meets the target over the correction;
- :func:`size_agg`: an aggregated engine time-shares both, so their busy times add;
- :func:`prefill_correction` / :func:`decode_correction`: observed latency over the
  profile's at the observed load;
- :func:`histogram_scv`: the variability of the prompts' prefill work, for the queueing
  headroom.

No I/O, no clock.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Protocol

from disagg_planner.core.types import (
    DeploymentStatus,
    Histogram,
    TrafficObservation,
    histogram_points,
)
from disagg_planner.profiles.prefill import LoadedPrefill, PrefillInterpolator
from disagg_planner.profiles.queueing import max_utilisation, pooled_need

# Never plan prefill below this utilisation: past it, headroom buys little and costs a lot.
MIN_UTILISATION = 0.2
# Plan decode engines at this share of their profiled throughput and sequence slots:
# arrivals and output lengths fluctuate within an interval, and a request that finds every
# slot taken waits for its first token.
DECODE_SEQ_UTILISATION = 0.8
# The lowest ITL ratio (observed over profiled) decode is sized with: engines observed twice
# as fast as profiled are planned at twice the profile's throughput, no more, whatever a
# window at light load shows (the gain of speculative decoding shrinks as the batch grows).
FASTEST_DECODE_CORRECTION = 0.5

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


@dataclass(frozen=True)
class AtLoad:
    """A profile whose prefill throughput is the engine's under load
    (:class:`disagg_planner.profiles.prefill.LoadedPrefill`); decode and KV as profiled."""

    prefill: PrefillCurve
    decode: DecodeSurface
    max_kv_tokens: int


def at_load(profile: CapacityProfile, chunk_tokens: int | None) -> CapacityProfile:
    """``profile`` sized at the prefill throughput a full chunk of ``chunk_tokens`` reaches
    (the engine's ``max_num_batched_tokens``); ``profile`` itself without a chunk budget or
    a fitted prefill curve to rebuild a chunk's cost from."""
    if chunk_tokens is None or not isinstance(profile.prefill, PrefillInterpolator):
        return profile
    loaded = LoadedPrefill(profile.prefill, chunk_tokens=chunk_tokens)
    return AtLoad(prefill=loaded, decode=profile.decode, max_kv_tokens=profile.max_kv_tokens)


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
    """The model's observed error; 1.0 when not measured (no traffic, disabled).

    ``prefill`` and ``decode`` are Dynamo's latency ratios (observed TTFT / ITL over the
    profile's at the observed load); the ITL one tightens the decode target. The capacity
    corrections are what :mod:`disagg_planner.core.feedback` learned (work per token over
    the profile's, both ways); the sizing multiplies each role's demand by its own."""

    prefill: float = 1.0
    decode: float = 1.0
    prefill_capacity: float = 1.0
    decode_capacity: float = 1.0


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
    # the replicas before rounding up where demand over planned throughput does not say it:
    # a pooled queue's planned utilisation is its answer's, offered / replicas
    need: float | None = None


def fractional_need(sizing: RoleSizing) -> float:
    """The replicas ``sizing``'s demand takes before rounding up: its ``need`` where the
    sizing states one (a pooled queue's, :func:`disagg_planner.profiles.queueing.pooled_need`),
    else ``demand / (thpt x utilisation x gpus)`` (its own replicas where that is not
    defined)."""
    if sizing.need is not None and math.isfinite(sizing.need):
        return sizing.need
    per_replica = sizing.thpt_per_gpu * sizing.utilisation * sizing.gpus_per_replica
    if per_replica <= 0 or not math.isfinite(per_replica):
        return float(sizing.replicas)
    return sizing.demand_tokens_per_s / per_replica


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


def latency_ratios(
    obs: TrafficObservation,
    profile: CapacityProfile,
    status: DeploymentStatus,
    previous: CorrectionFactors,
) -> CorrectionFactors:
    """``previous`` with Dynamo's latency ratios of ``obs`` where measurable
    (:func:`prefill_correction`, :func:`decode_correction` over the ready decode engines)."""
    p_corr = prefill_correction(obs, profile.prefill)
    d_corr = None
    decode_role = "decode" if "decode" in status.roles else "agg"
    if decode_role in status.roles:
        d_corr = decode_correction(
            obs,
            profile.decode,
            max_kv_tokens=profile.max_kv_tokens,
            decode_replicas=status.ready(decode_role),
        )
    return replace(
        previous,
        prefill=p_corr if p_corr is not None else previous.prefill,
        decode=d_corr if d_corr is not None else previous.decode,
    )


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
    engine_share: float = 1.0,
) -> RoleSizing:
    """``ceil(num_req x isl / interval x corr / (thpt_per_gpu(isl) x share x rho) / gpus)``.

    ``length_mix`` (:func:`disagg_planner.core.rules.length_mix`) scales the work, the
    backlog's included, and the mean service time: the prompts' own lengths cost more than
    their mean at the mean's throughput.

    ``burst`` multiplies the arrival demand (sized for a short-window peak, not the mean)
    and ``backlog_tokens_per_s`` is added to it (the work already waiting). With ``pooled``
    the engines are one GI/G/c queue (the router spreads requests over them): the replicas
    are the fewest whose pooled waiting-time tail meets the target
    (:func:`disagg_planner.profiles.queueing.pooled_need`, rounded up), not ``c`` separate
    GI/G/1 queues.

    With ``rho = 1`` this is Dynamo's formula: engines sized to run at their profiled
    throughput, i.e. fully busy. Given a TTFT target and an ``attainment`` share, ``rho`` is
    the utilisation at which no more than ``1 - attainment`` of requests wait longer than the
    target leaves after their own prefill (:func:`disagg_planner.profiles.queueing.max_utilisation`;
    service time per request ``isl / (thpt_per_gpu x gpus)``, its variability
    ``service_scv`` that of the prompt lengths).

    ``correction`` is the learned capacity correction
    (:func:`disagg_planner.core.feedback.learn_capacity`: work per token over the profile's),
    applied both ways, unlike Dynamo's ``min(1, p_corr)``: above 1 the engines are slower
    than profiled and every token costs ``corr`` times the profile's, in the demand and in
    the service time. ``engine_share`` is the share of each engine's time prefill has (an
    aggregated engine also decodes): the throughput per GPU is ``thpt(isl) x share``.
    """
    corr = correction if math.isfinite(correction) and correction > 0 else 1.0
    demand = forecast.num_req * forecast.isl / interval_s * corr * max(1.0, burst)
    demand += max(0.0, backlog_tokens_per_s) * corr
    mix = length_mix if math.isfinite(length_mix) and length_mix > 0 else 1.0
    demand *= mix
    thpt = prefill.thpt_per_gpu(forecast.isl) * engine_share if forecast.isl > 0 else 0.0
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
        service_s = corr * mix * forecast.isl / (thpt * gpus_per_replica)
        slack_s = (ttft_target_ms - own_ms) / 1000.0
        if slack_s > 0 and pooled:
            offered = demand / (thpt * gpus_per_replica)  # engines' worth of work
            need = pooled_need(
                offered,
                slack_s=slack_s,
                service_s=service_s,
                quantile=attainment,
                service_scv=service_scv,
            )
            need = min(need, offered / MIN_UTILISATION)
            replicas = math.ceil(need - 1e-9)
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
                need=need,
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


def histogram_scv(
    histogram: Histogram, work: Callable[[float], float] | None = None
) -> float | None:
    """Squared coefficient of variation (variance / mean^2) of a bucketed distribution, each
    bucket at its midpoint (the overflow at 1.5 x the last bound); with ``work``, of the
    work each bucket's value costs (the prefill time of a prompt of that length: the
    service time the queueing headroom needs the variability of), the overflow left out
    (past every model's context: the engine refuses those prompts); None when empty.

    >>> histogram_scv(Histogram(bounds=(1024.0, 2048.0, 4096.0), counts=(0.0, 0.0, 10.0)))
    0.0
    """
    if not histogram.bounds:
        return None
    points = histogram_points(histogram, overflow=work is None)
    if work is not None:
        points = [(work(p), w) for p, w in points if w > 0]
        if any(not math.isfinite(x) or x <= 0 for x, _w in points):
            return None
    total = sum(w for _p, w in points)
    if total <= 0:
        return None
    mean = sum(p * w for p, w in points) / total
    if mean <= 0:
        return None
    var = sum(w * (p - mean) ** 2 for p, w in points) / total
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
    capacity: float = 1.0,
    slower_iterations: bool = True,
) -> RoleSizing:
    """``ceil(num_req x osl / interval x cap / thpt / gpus)`` with ``thpt`` the best throughput per
    GPU whose ITL meets ``itl / d_corr`` at context ``isl + osl/2`` (Dynamo's formula).

    Beyond Dynamo: a ``d_corr`` below 1 (engines faster than profiled) is believed down to
    :data:`FASTEST_DECODE_CORRECTION` (the caller passes one only while the observed ITL tail
    is calm: :meth:`disagg_planner.core.observed_capacity.LearnsFromObservation.
    sizing_corrections`), and the correction divides the throughput too: an engine whose
    ITL is ``d_corr`` times the profile's at the observed load takes ``d_corr`` times the
    profile's time per iteration, so at the batch whose profiled ITL is ``itl / d_corr`` it
    emits ``thpt / d_corr`` (Dynamo's formula tightens the ITL only, which on engines twice
    as slow as profiled sizes half the decode they need). Not with ``slower_iterations``
    off: an aggregated engine's ITL over the decode profile's is also the prefill chunks
    sharing its iterations, which :func:`size_agg` charges already as prefill's share of
    the engine. Engines are planned at ``seq_utilisation`` of that throughput, and with
    ``max_num_seqs`` at most at what ``seq_utilisation x max_num_seqs`` concurrent requests
    per engine deliver at that ITL. A decode engine that runs full queues new requests before
    their first token, which no ITL shows and which then takes minutes to drain.
    ``capacity`` is the learned capacity correction
    (:func:`disagg_planner.core.feedback.learn_capacity`), both ways: each output token
    costs ``cap`` times the profile's.
    """
    cap = capacity if math.isfinite(capacity) and capacity > 0 else 1.0
    demand = forecast.num_req * forecast.osl / interval_s * cap
    factor = max(FASTEST_DECODE_CORRECTION, correction) if math.isfinite(correction) else 1.0
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
    slower = factor if slower_iterations else 1.0
    thpt, note, utilisation = best.thpt_per_gpu / slower, "", seq_utilisation
    if max_num_seqs is not None and best.itl_ms > 0:
        slots = max_num_seqs * seq_utilisation
        slot_thpt = slots * 1000.0 / (best.itl_ms * slower) / gpus_per_replica
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


def size_agg(
    prefill: RoleSizing,
    decode: RoleSizing,
    *,
    gpus_per_replica: int,
    prefill_at: Callable[[float], RoleSizing] | None = None,
    max_replicas: int = 1024,
) -> RoleSizing:
    """An aggregated engine time-shares prefill and decode, so their busy times add.

    Decode's share of ``N`` engines is ``d = D / (thpt_d x u_d x gpus) / N`` (``D`` its
    demand, ``u_d`` its planned utilisation). With ``prefill_at`` (prefill re-sized on the
    share ``1 - d`` of each engine that decode leaves it, its TTFT tail included) the answer
    is the fewest ``N`` with ``d <= 1`` whose prefill needs no more than ``N`` engines.
    Without it, the GPU needs add up: ``ceil((P / (thpt_p x u_p) + D / (thpt_d x u_d)) /
    gpus)``. (Adding the pooled prefill's need as a fraction ``P / (thpt_p x rho)`` counted
    the whole engine its queueing answer rounds up to, ``rho = offered / replicas``: one
    engine at 4% for prefill plus 4% of one for decode came to 2 engines at 1 req/s.)

    ``thpt_per_gpu`` is the blend, the mix's tokens per second one GPU serves at full use,
    and ``utilisation`` the share of the answer's GPUs that work keeps busy.
    """
    feasible = prefill.feasible and decode.feasible
    demand = prefill.demand_tokens_per_s + decode.demand_tokens_per_s
    note = "; ".join(n for n in (prefill.note, decode.note) if n)
    if not feasible:
        return RoleSizing("agg", 0, demand, 0.0, gpus_per_replica, feasible=False, note=note)
    decode_gpus = (
        decode.demand_tokens_per_s / (decode.thpt_per_gpu * decode.utilisation)
        if decode.demand_tokens_per_s > 0 and decode.thpt_per_gpu > 0
        else 0.0
    )
    if prefill_at is None or prefill.demand_tokens_per_s <= 0:
        gpus = decode_gpus
        if prefill.demand_tokens_per_s > 0 and prefill.thpt_per_gpu > 0:
            gpus += prefill.demand_tokens_per_s / (prefill.thpt_per_gpu * prefill.utilisation)
        replicas = math.ceil(gpus / gpus_per_replica - 1e-9)
    else:
        replicas = max(1, math.ceil(decode_gpus / gpus_per_replica - 1e-9))
        while replicas < max_replicas:
            share = 1.0 - decode_gpus / gpus_per_replica / replicas
            if share > 0:
                at = prefill_at(share)
                if at.feasible and at.replicas <= replicas:
                    note = "; ".join(
                        n
                        for n in (f"prefill on {share:.0%} of each engine", at.note, decode.note)
                        if n
                    )
                    break
            replicas += 1
    # GPUs' worth of profiled work at full use, and the mix's tokens per second per GPU
    work = sum(
        p.demand_tokens_per_s / p.thpt_per_gpu
        for p in (prefill, decode)
        if p.demand_tokens_per_s > 0 and p.thpt_per_gpu > 0
    )
    blended = demand / work if work > 0 else 0.0
    used = work / (replicas * gpus_per_replica) if replicas > 0 else 1.0
    return RoleSizing(
        "agg", replicas, demand, blended, gpus_per_replica, note=note, utilisation=min(1.0, used)
    )
