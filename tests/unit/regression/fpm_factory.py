"""Build ForwardPassMetrics for tests, and the synthetic wall-time laws they follow."""

from __future__ import annotations

from disagg_planner.signals.fpm import (
    FPM_VERSION,
    ForwardPassMetrics,
    QueuedRequestMetrics,
    ScheduledRequestMetrics,
)

# Synthetic engine laws (seconds), roughly an 8B model on one H100-class GPU.
PREFILL_A, PREFILL_B = 0.004, 2.5e-5  # + per fresh prefill token
DECODE_A, DECODE_B, DECODE_C = 0.008, 1e-4, 2e-7  # + per decode request, per KV token
AGG_A, AGG_B, AGG_C = 0.006, 2.5e-5, 2e-7  # + per prefill token, per decode KV token


def prefill_law(tokens: float) -> float:
    return PREFILL_A + PREFILL_B * tokens


def decode_law(num: float, kv: float) -> float:
    return DECODE_A + DECODE_B * num + DECODE_C * kv


def agg_law(prefill: float, kv: float) -> float:
    return AGG_A + AGG_B * prefill + AGG_C * kv


def fpm(
    *,
    worker: str = "w0",
    dp_rank: int = 0,
    counter: int = 1000,
    wall: float = 0.01,
    prefill_reqs: int = 0,
    prefill_tokens: int = 0,
    decode_reqs: int = 0,
    decode_kv: int = 0,
    queued_prefill_reqs: int = 0,
    queued_prefill_tokens: int = 0,
    queued_decode_reqs: int = 0,
    queued_decode_kv: int = 0,
) -> ForwardPassMetrics:
    """One iteration report; ``counter`` defaults past any warm-up window."""
    return ForwardPassMetrics(
        version=FPM_VERSION,
        worker_id=worker,
        dp_rank=dp_rank,
        counter_id=counter,
        wall_time=wall,
        scheduled_requests=ScheduledRequestMetrics(
            num_prefill_requests=prefill_reqs,
            sum_prefill_tokens=prefill_tokens,
            num_decode_requests=decode_reqs,
            sum_decode_kv_tokens=decode_kv,
        ),
        queued_requests=QueuedRequestMetrics(
            num_prefill_requests=queued_prefill_reqs,
            sum_prefill_tokens=queued_prefill_tokens,
            num_decode_requests=queued_decode_reqs,
            sum_decode_kv_tokens=queued_decode_kv,
        ),
    )


def heartbeat(*, worker: str = "w0", dp_rank: int = 0, counter: int = 1000) -> ForwardPassMetrics:
    """An idle heartbeat: all zeros, wall_time 0."""
    return fpm(worker=worker, dp_rank=dp_rank, counter=counter, wall=0.0)
