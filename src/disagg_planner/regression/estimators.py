"""TTFT and ITL estimates per engine from a fitted wall-time model and the engine's load.

All estimates answer "what would a request arriving at this engine now see?", in
milliseconds, or None when the model is not ready or an input average is still unknown
(a missing estimate must never read as a small one).

Prefill TTFT (chunked-prefill simulation). The new request waits for the queued prompts and
then runs its own. With ``T = (queue_scale * queued_prefill_tokens + isl) * (1 - kv_hit_rate)``
tokens to compute and a per-iteration budget of ``B = max_num_batched_tokens``, the engine
runs ``ceil(T / B)`` iterations of at most ``B`` tokens::

    ttft_s = floor(T / B) * wall(B) + wall(T mod B)

The in-flight iteration and transfer times are not included. ``isl`` is the moving average of
fresh prefill tokens per scheduled request (prefix-cache hits already excluded), so
``kv_hit_rate`` should only discount what the queue's raw prompt counts overstate.

Decode ITL. One more request joins the running batch::

    itl_s = wall(num = s * (running + preempted) + 1,
                 kv  = s * (scheduled_kv + queued_kv) + decode_context) / accept_length

Aggregated engines interleave prefill chunks with decode steps, so one iteration is a poor
picture of their load: the agg estimators use the engine's *time-averaged* load (moving means
over its recent iterations), except when its latest report is an idle heartbeat (queues are
then known to be empty). Agg TTFT runs the chunked-prefill simulation with each chunk sharing
the iteration with the average decode batch (``wall(chunk, s * decode_kv)``; decode requests
take ``num_decode`` tokens of the budget first). Agg ITL is a decode step carrying the average
piggybacked prefill chunk, with queued prompts counted as KV they will soon hold.

``queue_scale`` / ``decode_scale`` (the *consolidation factor* ``N / (N - 1)``) re-estimate
with the load of N engines spread over N - 1, for consolidation-aware scale-down.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

from disagg_planner.regression.averages import LoadAverages
from disagg_planner.regression.models import AggModel, DecodeModel, PrefillModel, WallTimeModel
from disagg_planner.regression.protocols import IterationReport

DEFAULT_MAX_NUM_BATCHED_TOKENS = 8192
DEFAULT_MAX_NUM_SEQS = 512


@dataclass(frozen=True)
class EngineLimits:
    """Scheduler limits of one engine (Dynamo publishes them in DynamoWorkerMetadata).

    ``max_num_batched_tokens``: token budget of one iteration (tokens).
    ``max_num_seqs``: most requests in one running batch.
    ``max_kv_tokens``: KV cache capacity (``total_kv_blocks * kv_cache_block_size``,
    tokens); None when unknown, which skips the KV feasibility checks.
    """

    max_num_batched_tokens: int = DEFAULT_MAX_NUM_BATCHED_TOKENS
    max_num_seqs: int = DEFAULT_MAX_NUM_SEQS
    max_kv_tokens: int | None = None

    def __post_init__(self) -> None:
        if self.max_num_batched_tokens < 1:
            raise ValueError(
                f"EngineLimits.max_num_batched_tokens must be >= 1, "
                f"got {self.max_num_batched_tokens}"
            )
        if self.max_num_seqs < 1:
            raise ValueError(f"EngineLimits.max_num_seqs must be >= 1, got {self.max_num_seqs}")
        if self.max_kv_tokens is not None and self.max_kv_tokens < 1:
            raise ValueError(
                f"EngineLimits.max_kv_tokens must be >= 1 or None, got {self.max_kv_tokens}"
            )


def chunked_prefill_time_s(
    tokens: float, *, chunk_tokens: float, wall_time: Callable[[float], float]
) -> float:
    """Seconds to compute ``tokens`` prefill tokens in chunks of at most ``chunk_tokens``.

    >>> law = lambda tokens: 0.01 + 1e-5 * tokens  # 2 chunks of 1000, one of 500
    >>> round(chunked_prefill_time_s(2500, chunk_tokens=1000, wall_time=law), 9)
    0.055
    """
    if not (math.isfinite(tokens) and math.isfinite(chunk_tokens)) or chunk_tokens <= 0:
        raise ValueError(f"need finite tokens and chunk_tokens > 0, got {tokens}, {chunk_tokens}")
    # Whole tokens: an average like 3000.2 still needs 3001 token slots, never a 0.2 chunk.
    total = math.ceil(tokens - 1e-9)
    if total <= 0:
        return 0.0
    chunk = max(1, math.floor(chunk_tokens))
    full, rest = divmod(total, chunk)
    seconds = full * wall_time(float(chunk))
    if rest:
        seconds += wall_time(float(rest))
    return seconds


def _hit_discount(kv_hit_rate: float | None) -> float:
    if kv_hit_rate is None or not math.isfinite(kv_hit_rate):
        return 1.0  # unknown: no discount, the conservative side
    return 1.0 - min(1.0, max(0.0, kv_hit_rate))


def _check_scale(name: str, value: float) -> None:
    if not (math.isfinite(value) and value >= 0.0):
        raise ValueError(f"{name} must be a finite number >= 0, got {value}")


def _check_decode_settings(decode_scale: float, accept_length: float) -> None:
    _check_scale("decode_scale", decode_scale)
    if not (math.isfinite(accept_length) and accept_length >= 1.0):
        raise ValueError(f"accept_length must be >= 1, got {accept_length}")


def _isl(model: WallTimeModel, report: IterationReport) -> float | None:
    own = model.averages((report.worker_id, report.dp_rank)).isl
    return own if own is not None else model.averages().isl


def _decode_context(model: WallTimeModel, report: IterationReport) -> float | None:
    own = model.averages((report.worker_id, report.dp_rank)).decode_context
    return own if own is not None else model.averages().decode_context


def prefill_ttft_ms(
    model: PrefillModel,
    report: IterationReport,
    *,
    limits: EngineLimits,
    queue_scale: float = 1.0,
    kv_hit_rate: float | None = None,
) -> float | None:
    """TTFT (ms) at a disaggregated prefill engine whose latest report is ``report``."""
    _check_scale("queue_scale", queue_scale)
    isl = _isl(model, report)
    if not model.ready or isl is None:
        return None
    tokens = (queue_scale * report.queued_requests.sum_prefill_tokens + isl) * _hit_discount(
        kv_hit_rate
    )
    seconds = chunked_prefill_time_s(
        tokens, chunk_tokens=limits.max_num_batched_tokens, wall_time=model.predict_wall_time
    )
    return 1000.0 * seconds


def decode_itl_ms(
    model: DecodeModel,
    report: IterationReport,
    *,
    decode_scale: float = 1.0,
    accept_length: float = 1.0,
) -> float | None:
    """ITL (ms) at a disaggregated decode engine whose latest report is ``report``."""
    _check_decode_settings(decode_scale, accept_length)
    context = _decode_context(model, report)
    if not model.ready or context is None:
        return None
    sched, queued = report.scheduled_requests, report.queued_requests
    num = decode_scale * (sched.num_decode_requests + queued.num_decode_requests) + 1.0
    kv = decode_scale * (sched.sum_decode_kv_tokens + queued.sum_decode_kv_tokens) + context
    return (
        1000.0
        * model.predict_wall_time(num_decode_requests=num, decode_kv_tokens=kv)
        / (accept_length)
    )


def agg_load(model: AggModel, report: IterationReport) -> LoadAverages:
    """The load an agg estimate uses: the engine's time averages; its latest report itself
    when that is an idle heartbeat (queues known empty) or the engine has no history yet."""
    own = model.engine_averages((report.worker_id, report.dp_rank))
    if report.wall_time == 0.0 or own is None or own.iterations == 0:
        sched, queued = report.scheduled_requests, report.queued_requests
        return LoadAverages(
            iterations=0,
            isl=own.isl if own else None,
            decode_context=own.decode_context if own else None,
            prefill_tokens_per_iteration=float(sched.sum_prefill_tokens),
            num_decode_requests=float(sched.num_decode_requests),
            decode_kv_tokens=float(sched.sum_decode_kv_tokens),
            queued_prefill_tokens=float(queued.sum_prefill_tokens),
            queued_decode_requests=float(queued.num_decode_requests),
            queued_decode_kv_tokens=float(queued.sum_decode_kv_tokens),
        )
    return own


def agg_ttft_ms(
    model: AggModel,
    report: IterationReport,
    *,
    limits: EngineLimits,
    queue_scale: float = 1.0,
    decode_scale: float = 1.0,
    kv_hit_rate: float | None = None,
) -> float | None:
    """TTFT (ms) at an aggregated engine: chunked prefill with piggybacked decode."""
    _check_scale("queue_scale", queue_scale)
    _check_scale("decode_scale", decode_scale)
    isl = _isl(model, report)
    if not model.ready or isl is None:
        return None
    load = agg_load(model, report)
    tokens = (queue_scale * load.queued_prefill_tokens + isl) * _hit_discount(kv_hit_rate)
    decode_kv = decode_scale * load.decode_kv_tokens
    budget = limits.max_num_batched_tokens - decode_scale * load.num_decode_requests
    seconds = chunked_prefill_time_s(
        tokens,
        chunk_tokens=max(1.0, budget),
        wall_time=lambda chunk: model.predict_wall_time(
            prefill_tokens=chunk, decode_kv_tokens=decode_kv
        ),
    )
    return 1000.0 * seconds


def agg_itl_ms(
    model: AggModel,
    report: IterationReport,
    *,
    limits: EngineLimits,
    decode_scale: float = 1.0,
    accept_length: float = 1.0,
) -> float | None:
    """ITL (ms) at an aggregated engine: a decode step with the average prefill chunk."""
    _check_decode_settings(decode_scale, accept_length)
    context = _decode_context(model, report)
    if not model.ready or context is None:
        return None
    load = agg_load(model, report)
    prefill = min(
        decode_scale * load.prefill_tokens_per_iteration, float(limits.max_num_batched_tokens)
    )
    kv = (
        decode_scale
        * (load.decode_kv_tokens + load.queued_decode_kv_tokens + load.queued_prefill_tokens)
        + context
    )
    return (
        1000.0
        * model.predict_wall_time(prefill_tokens=prefill, decode_kv_tokens=kv)
        / (accept_length)
    )
