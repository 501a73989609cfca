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

These are cheap estimates; the clairvoyant plans of replay start from them and then judge
by simulation, with the probes at the end of this module: :func:`fork` (an independent copy
of a cluster's state, to try several replica counts from one moment) and :func:`run_watched`
(advance a cluster while a judge reads each newly finished request and may stop the run
early, once a candidate has already missed too often to qualify).
"""

from __future__ import annotations

import copy
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from disagg_planner.profiles.queueing import max_utilisation
from disagg_planner.simulator import catalogue
from disagg_planner.simulator.cluster import Cluster
from disagg_planner.simulator.engine_model import EngineModel
from disagg_planner.simulator.engine_spec import EngineSpec
from disagg_planner.simulator.engines import engine_for
from disagg_planner.simulator.heap import FrozenHeap
from disagg_planner.simulator.request import RequestRecord


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
    model = engine_for(spec)
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


# --- simulation probes ---------------------------------------------------------------------


def meets_slo(record: RequestRecord, *, ttft_ms: float, itl_ms: float) -> bool:
    """Both targets met, as replay scores a request: a failed request misses both, a
    one-token answer has no ITL and meets the ITL target."""
    return (
        record.ok
        and record.ttft_ms is not None
        and record.ttft_ms <= ttft_ms
        and (record.itl_ms is None or record.itl_ms <= itl_ms)
    )


def rejected_on_arrival(record: RequestRecord) -> bool:
    """The request failed the moment it arrived (too long for the engine): no replica count
    serves it, so a search must not chase it."""
    return not record.ok and record.finish_s <= record.arrival_s


def fork(cluster: Cluster) -> Cluster:
    """An independent copy of ``cluster``'s state at ``cluster.now``, to run on from there.

    The engine models and specs are immutable and shared; the finished records are frozen,
    so only the list holding them is copied (deep-copying a long trace's records at every
    fork would make a window-by-window search quadratic). Requests still to arrive must have
    been submitted as a sequence: a generator cannot be copied."""
    memo: dict[int, Any] = {id(cluster.records): list(cluster.records)}
    for role in cluster.roles:
        for shared in (cluster.engine_model(role), cluster.engine_spec(role)):
            memo[id(shared)] = shared
    return copy.deepcopy(cluster, memo)


Judge = Callable[[Sequence[RequestRecord]], bool]


def run_watched(cluster: Cluster, until_s: float, judge: Judge, *, step_s: float = 5.0) -> bool:
    """Advance ``cluster`` to ``until_s`` (``math.inf``: until every submitted request has
    finished) in steps of ``step_s``, handing ``judge`` the requests finished in each step;
    stop as soon as it returns True. Returns whether it stopped early."""
    seen = len(cluster.records)
    with FrozenHeap() as heap:
        while True:
            if math.isinf(until_s):
                if cluster.idle:
                    return False
                target = cluster.now + step_s
            else:
                if cluster.now >= until_s:
                    return False
                target = min(until_s, cluster.now + step_s)
            heap.advance(cluster, target, stop_when_idle=math.isinf(until_s))
            fresh = cluster.records[seen:]
            seen = len(cluster.records)
            if fresh and judge(fresh):
                return True
