"""Capacity of one engine under TTFT and ITL targets, from the engine model alone.

An oracle for replay: how many requests per second one prefill engine and one decode engine
sustain at a mean ISL/OSL, so that the ideal replica count for a load is
``ceil(rate / capacity)``. Models (stated, approximate; the simulator itself is the judge):

- **Prefill**: requests are served FCFS in batches of ``k = max(1, mnbt // ISL)`` prompts
  (chunked when ``ISL > mnbt``), so one rank serves a request every ``s = t_batch / k``.
  Mean TTFT = frontend latency + own prefill time + KV transfer + M/D/1 wait
  ``rho * s / (2 (1 - rho))``; the largest ``rho = lambda * s`` keeping it within the target
  gives ``rate = dp * rho / s``. With a ``quantile``, the target must hold for that share of
  requests instead: :func:`disagg_planner.profiles.queueing.max_utilisation` gives ``rho``.
- **Decode**: the largest per-rank batch ``B`` (KV cache and ``max_num_seqs`` permitting)
  whose step time at context ``ISL + OSL/2`` meets the ITL target; by Little's law one
  engine finishes ``dp * B / (OSL * step)`` requests per second.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from disagg_planner.profiles.queueing import max_utilisation
from disagg_planner.simulator import catalogue
from disagg_planner.simulator.engine_model import EngineModel
from disagg_planner.simulator.engine_spec import EngineSpec


@dataclass(frozen=True)
class EngineCapacity:
    """Requests per second one engine (replica) sustains within the targets."""

    prefill_rps: float
    decode_rps: float
    decode_batch: int  # per data-parallel rank
    decode_itl_ms: float  # step time at that batch
    prefill_ttft_ms: float  # TTFT of a lone request (no queueing)


def prefill_capacity_rps(
    model: EngineModel,
    *,
    isl: int,
    ttft_ms: float,
    kv_transfer_s: float = 0.0,
    frontend_s: float | None = None,
    quantile: float | None = None,
) -> tuple[float, float]:
    """(requests/s one engine sustains, lone-request TTFT in ms); see the module doc. With
    ``quantile``, the target holds for that share of requests instead of on average."""
    spec = model.spec
    fe = catalogue.efficiency().ttft_overhead_s if frontend_s is None else frontend_s
    alone = model.prefill_time_s(isl)
    k = max(1, spec.max_num_batched_tokens // isl)
    s = alone
    if k > 1:
        pairs = k * isl * (isl + 1) / 2.0
        batch = model.iteration_time_s(
            k * isl, 0, 0, 0, prefill_requests=k, prefill_attention_pairs=pairs
        )
        s = batch / k
    slack = ttft_ms / 1000.0 - fe - alone - kv_transfer_s
    ttft_alone_ms = (fe + alone + kv_transfer_s) * 1000.0
    if slack <= 0:
        return 0.0, ttft_alone_ms
    if quantile is not None:
        # the share of requests meeting the target, not the mean: GI/G/1 waiting-time tail
        # (batched prefill is close to deterministic service, so its variability is 0)
        rho = max_utilisation(slack_s=slack, service_s=s, quantile=quantile, service_scv=0.0)
        return spec.dp * rho / s, ttft_alone_ms
    x = 2.0 * slack / s  # rho / (1 - rho) <= x
    rho = x / (1.0 + x)
    return spec.dp * rho / s, ttft_alone_ms


def decode_capacity_rps(
    model: EngineModel, *, isl: int, osl: int, itl_ms: float
) -> tuple[float, int, float]:
    """(requests/s one engine sustains, per-rank batch, step ms); see the module doc."""
    context = isl + osl / 2.0
    cap = model.max_decode_batch(isl + osl)
    best_b, best_step = 0, math.inf
    for b in range(1, cap + 1):
        step = model.decode_step_time_s(b, context)
        if step * 1000.0 > itl_ms:
            break
        best_b, best_step = b, step
    if best_b == 0:
        return 0.0, 0, model.decode_step_time_s(1, context) * 1000.0
    rps = model.spec.dp * best_b / (max(1, osl) * best_step)
    return rps, best_b, best_step * 1000.0


def capacity(
    spec: EngineSpec | str,
    *,
    isl: int,
    osl: int,
    ttft_ms: float,
    itl_ms: float,
    kv_transfer_bandwidth_bps: float | None = None,
    ttft_quantile: float | None = None,
) -> EngineCapacity:
    """Prefill and decode capacity of one replica of ``spec`` (disaggregated serving)."""
    model = EngineModel(spec)
    transfer = 0.0
    if kv_transfer_bandwidth_bps:
        transfer = isl * model.kv_bytes_per_token / kv_transfer_bandwidth_bps
    p_rps, ttft_alone = prefill_capacity_rps(
        model, isl=isl, ttft_ms=ttft_ms, kv_transfer_s=transfer, quantile=ttft_quantile
    )
    d_rps, batch, step_ms = decode_capacity_rps(model, isl=isl, osl=osl, itl_ms=itl_ms)
    return EngineCapacity(
        prefill_rps=p_rps,
        decode_rps=d_rps,
        decode_batch=batch,
        decode_itl_ms=step_ms,
        prefill_ttft_ms=ttft_alone,
    )


def replicas_needed(rate_rps: float, per_replica_rps: float) -> int:
    """``ceil(rate / capacity)``, at least 1 when there is load; a large sentinel when the
    target is infeasible (capacity 0)."""
    if rate_rps <= 0:
        return 0
    if per_replica_rps <= 0:
        return 1_000_000
    return max(1, math.ceil(rate_rps / per_replica_rps - 1e-9))
