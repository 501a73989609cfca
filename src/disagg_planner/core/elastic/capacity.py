"""What one request costs the elastic role and what is already waiting: GPU-seconds per
request from the throughput loop's sizing functions (package doc, step 2), the backlog by the
throughput loop's rule (step 3), and the ranks a load needs."""

from __future__ import annotations

import math
from dataclasses import dataclass

from disagg_planner.core.rules import RuleValue, backlog_tokens, slo_request_seconds
from disagg_planner.core.sizing import CapacityProfile, LoadForecast, size_decode, size_prefill
from disagg_planner.core.types import TrafficObservation


@dataclass(frozen=True)
class RequestCost:
    """GPU-seconds one request needs on the elastic role, from the profile, and why not."""

    gpu_seconds: float
    feasible: bool = True
    note: str = ""


def request_gpu_seconds(
    role: str,
    profile: CapacityProfile,
    *,
    isl: float,
    osl: float,
    itl_ms: float,
    interval_s: float,
) -> RequestCost:
    """GPU-seconds per request on ``role`` with the throughput loop's sizing functions.

    Sizing a load of one request per second with one GPU per replica gives GPUs per req/s,
    i.e. GPU-seconds per request: prefill ``isl / thpt_prefill(isl)``, decode
    ``osl / thpt_decode(itl, context)``, their sum for an aggregated engine.
    """
    unit = LoadForecast(num_req=interval_s, isl=isl, osl=osl)
    parts = []
    if role in ("prefill", "agg"):
        parts.append(
            size_prefill(
                unit, profile.prefill, interval_s=interval_s, correction=1.0, gpus_per_replica=1
            )
        )
    if role in ("decode", "agg"):
        parts.append(
            size_decode(
                unit,
                profile.decode,
                interval_s=interval_s,
                itl_target_ms=itl_ms,
                correction=1.0,
                gpus_per_replica=1,
            )
        )
    bad = [p.note for p in parts if not p.feasible]
    if bad:
        return RequestCost(0.0, feasible=False, note="; ".join(bad))
    gpu_s = sum(p.demand_tokens_per_s / p.thpt_per_gpu for p in parts if p.thpt_per_gpu > 0)
    return RequestCost(gpu_s)


@dataclass(frozen=True)
class Backlog:
    """The work already waiting, as the throughput loop measures it
    (:func:`disagg_planner.core.rules.backlog_tokens`), in requests of the trend's ISL, and
    the rate that drains it within ``backlog_drain_seconds``."""

    rule: RuleValue  # prefill tokens waiting, and the rule's sentence
    requests: float
    drain_rps: float
    drain_s: float

    def words(self) -> str:
        """The backlog term for a decision's message."""
        if self.requests <= 0:
            return self.rule.reason
        return f"{self.rule.reason}, drained over {self.drain_s:.0f} s: +{self.drain_rps:.2f} req/s"


def waiting_backlog(
    traffic: TrafficObservation,
    *,
    isl: float,
    osl: float,
    ttft_ms: float,
    itl_ms: float,
    drain_s: float,
    queued_prefill_tokens: float | None,
) -> Backlog:
    """The throughput loop's backlog rule on this window, in requests of ``isl`` tokens and
    the rate that drains them within ``drain_s`` (package doc, step 3)."""
    rule = backlog_tokens(
        in_flight=traffic.in_flight,
        arrival_rate=traffic.request_rate,
        slo_request_s=slo_request_seconds(ttft_ms=ttft_ms, itl_ms=itl_ms, osl=osl),
        isl=isl,
        queued_prefill_tokens=queued_prefill_tokens,
    )
    requests = rule.value / isl if isl > 0 else 0.0
    return Backlog(rule, requests, requests / drain_s, drain_s)


def ranks_for(rate_rps: float, gpu_seconds: float, gpus_per_rank: int) -> int:
    """The DP ranks a load of ``rate_rps`` needs at ``gpu_seconds`` per request."""
    if rate_rps <= 0:
        return 0
    return math.ceil(rate_rps * gpu_seconds / gpus_per_rank - 1e-9)
