"""Capacity sizing from a distribution of request lengths instead of their mean.

Dynamo sizes prefill and decode from the mean ISL and OSL of the last interval (its known
limitation 3). The cost of a request is not linear in its length, so a mix of short and very
long requests needs more GPUs than requests of the mean length would. The functions here take
the length histograms the frontend exports (Prometheus ``le`` buckets, already differenced to
per-bucket counts) and integrate the cost over them.

Prefill model. A request of ISL ``l`` keeps a prefill GPU busy for ``l / T_p(l)`` seconds,
where ``T_p(l)`` is the profiled prefill throughput (tokens/s/GPU) at that ISL. Over an
interval of ``Δ`` seconds the GPUs needed are::

    G_p = (1/Δ) Σ_requests l / T_p(l)                 (distribution-aware)
    G_p = (N l̄ / Δ) / T_p(l̄)                          (Dynamo, from the mean l̄)

Decode model. A request of ISL ``l`` and OSL ``o`` generates ``o`` tokens at a context that
grows from ``l`` to ``l + o``; as in Dynamo its mean context ``c = l + o/2`` stands for the
whole request. At the ITL target each token costs ``1 / T_d(c)`` GPU-seconds, where ``T_d(c)``
is the best throughput per GPU meeting the ITL target at context ``c``
(:meth:`DecodeInterpolator.find_best_throughput_per_gpu`)::

    G_d = (1/Δ) Σ_requests o / T_d(l + o/2)           (distribution-aware)
    G_d = (N ō / Δ) / T_d(l̄ + ō/2)                    (Dynamo, from the means)

Costs add because a GPU time-shares its batch between requests (a linear-mixing
approximation). Where no operating point meets the ITL target at some context, ``T_d`` is the
throughput at the lowest-ITL point (the closest the engine gets) and the share of such
requests is reported as ``infeasible_share``.

Histograms. Bucket ``i`` holds the lengths in ``(bounds[i-1], bounds[i]]`` (the first starts at
0). Without more information lengths inside a bucket are taken as uniform, as Prometheus'
``histogram_quantile`` does. Prometheus also exports the histogram's ``_sum``; given as
``isl_sum``/``osl_sum`` (total tokens of the counted requests) it fixes the shape inside the
buckets: the density in every finite bucket is taken as ``∝ exp(β t)`` over the bucket's
relative position ``t`` in 0-1, with the one ``β`` that makes the histogram's mean equal
``sum / count`` (``β < 0`` puts mass towards each bucket's lower end, as with the usual
right-skewed length distributions and exponential bucket bounds). With an overflow bucket the
sum instead gives the overflow requests' mean length. The cost is integrated over each bucket
at ``samples_per_bucket`` quantile midpoints. The overflow bucket (bound ``+inf``) has no width:
its requests count at their mean length when the sum is known, else at its lower bound (an
underestimate); their share is reported as ``overflow_share``. Prometheus exports ISL and OSL
as separate histograms, so decode sizing treats them as independent.

GPU counts are fractional, per GPU; divide by the GPUs per engine and round up for replicas.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from disagg_planner.profiles.decode import DecodeInterpolator
from disagg_planner.profiles.prefill import PrefillInterpolator
from disagg_planner.profiles.storage import FloatArray

__all__ = [
    "SizingEstimate",
    "decode_gpus_for_distribution",
    "decode_gpus_for_mean",
    "decode_sizing_for_distribution",
    "histogram_mean",
    "prefill_gpus_for_distribution",
    "prefill_gpus_for_mean",
    "prefill_sizing_for_distribution",
]

DEFAULT_SAMPLES_PER_BUCKET = 8


@dataclass(frozen=True)
class SizingEstimate:
    """GPUs one role needs for an interval's requests, with what that rests on.

    ``gpus``: fractional GPUs. ``requests``: requests in the interval. ``demand_tokens_per_s``:
    input tokens/s (prefill) or output tokens/s (decode). ``effective_thpt_per_gpu``: demand
    divided by ``gpus``, the per-GPU throughput the mix actually gets. The shares are
    fractions of requests: outside the profiled range (``clamped_share``), ITL target not
    met (``infeasible_share``, decode only), in the ``+inf`` bucket (``overflow_share``).
    """

    gpus: float
    requests: float
    demand_tokens_per_s: float
    effective_thpt_per_gpu: float
    clamped_share: float = 0.0
    infeasible_share: float = 0.0
    overflow_share: float = 0.0


@dataclass(frozen=True, eq=False)
class _Samples:
    lengths: FloatArray  # representative lengths, tokens
    weights: FloatArray  # fraction of requests each stands for (sums to 1 unless empty)
    overflow: FloatArray  # True where the sample is the +inf bucket's lower bound
    total: float  # requests in the histogram
    mean_length: float  # tokens; exact when the histogram's sum is known


def _samples(
    bounds: Sequence[float],
    counts: Sequence[float],
    *,
    name: str,
    per_bucket: int,
    total_tokens: float | None = None,
) -> _Samples:
    b = np.asarray(bounds, dtype=np.float64)
    n = np.asarray(counts, dtype=np.float64)
    if b.ndim != 1 or n.ndim != 1 or b.size != n.size or b.size == 0:
        raise ValueError(
            f"{name}_bounds and {name}_counts must be equally long, non-empty sequences "
            f"(got {b.size} bounds and {n.size} counts)"
        )
    if per_bucket < 1:
        raise ValueError(f"samples_per_bucket must be at least 1, got {per_bucket}")
    for i, bound in enumerate(b.tolist()):
        if math.isnan(bound) or bound <= 0 or (math.isinf(bound) and i != b.size - 1):
            raise ValueError(
                f"{name}_bounds[{i}] = {bound!r}: bucket bounds must be positive, with +inf "
                "allowed only last"
            )
        if i and bound <= b[i - 1]:
            raise ValueError(
                f"{name}_bounds[{i}] = {bound!r}: must be greater than {name}_bounds[{i - 1}] "
                f"= {float(b[i - 1])!r}"
            )
    for i, count in enumerate(n.tolist()):
        if not math.isfinite(count) or count < 0:
            raise ValueError(f"{name}_counts[{i}] = {count!r}: must be a count >= 0")
    if np.isinf(b[-1]) and b.size == 1:
        raise ValueError(f"{name}_bounds has only the +inf bucket; lengths cannot be estimated")
    if total_tokens is not None and not (math.isfinite(total_tokens) and total_tokens >= 0):
        raise ValueError(f"{name}_sum must be a token count >= 0, got {total_tokens!r}")
    total = float(n.sum())
    finite = np.isfinite(b)
    lows = np.concatenate([[0.0], b[:-1]])
    lo, width, n_fin = lows[finite], b[finite] - lows[finite], n[finite]
    n_over = float(n[~finite].sum())
    over_length = float(lows[-1]) if n_over else 0.0
    beta = 0.0
    if total_tokens is not None and total > 0:
        if n_over:
            # The finite buckets at their uniform means; the rest of the sum is the overflow's.
            rest = total_tokens - float(np.dot(n_fin, lo + width / 2))
            over_length = max(over_length, rest / n_over)
        elif n_fin.sum() > 0:
            beta = _fit_shape(lo, width, n_fin, total_tokens / total)
    quantiles = (np.arange(per_bucket) + 0.5) / per_bucket
    fin_lengths = (lo[:, None] + width[:, None] * _position(quantiles, beta)).ravel()
    fin_weights = np.repeat(n_fin / per_bucket, per_bucket)
    over = np.array([over_length]) if not finite[-1] else np.empty(0)
    lengths = np.concatenate([fin_lengths, over])
    weights = np.concatenate([fin_weights, n[~finite]])
    overflow = np.concatenate([np.zeros(fin_lengths.size), np.ones(over.size)])
    if total > 0:
        weights = weights / total
    if total_tokens is not None and total > 0:
        mean_length = float(total_tokens) / total
    else:
        mean_length = float(np.dot(lengths, weights)) if total > 0 else 0.0
    return _Samples(
        lengths=lengths, weights=weights, overflow=overflow, total=total, mean_length=mean_length
    )


_BETA_LIMIT = 50.0


def _mean_position(beta: float) -> float:
    """Mean of ``t`` in 0-1 under the density ``∝ exp(beta t)``."""
    if abs(beta) < 1e-9:
        return 0.5
    return 1.0 / -math.expm1(-beta) - 1.0 / beta


def _position(u: FloatArray, beta: float) -> FloatArray:
    """Quantile ``u`` of the density ``∝ exp(beta t)`` on 0-1 (its inverse CDF)."""
    if abs(beta) < 1e-9:
        return u
    return np.log1p(u * math.expm1(beta)) / beta


def _fit_shape(lo: FloatArray, width: FloatArray, n: FloatArray, mean: float) -> float:
    """The ``beta`` whose within-bucket shape gives the histogram the observed ``mean``
    (bisection: the mean rises with ``beta``); clipped where the mean is out of reach."""

    def excess(beta: float) -> float:
        return float(np.dot(n, lo + width * _mean_position(beta)) / n.sum()) - mean

    low, high = -_BETA_LIMIT, _BETA_LIMIT
    if excess(low) >= 0:
        return low
    if excess(high) <= 0:
        return high
    for _ in range(60):
        mid = (low + high) / 2
        if excess(mid) < 0:
            low = mid
        else:
            high = mid
    return (low + high) / 2


def histogram_mean(bounds: Sequence[float], counts: Sequence[float]) -> float:
    """Mean length of a bucketed histogram without its ``_sum`` (uniform inside a bucket, the
    ``+inf`` bucket at its lower bound); 0 when empty. With the sum, the mean is
    ``sum / count``."""
    return _samples(bounds, counts, name="histogram", per_bucket=1).mean_length


def _check_positive(value: float, name: str) -> float:
    if not (math.isfinite(value) and value > 0):
        raise ValueError(f"{name} must be a positive number, got {value!r}")
    return float(value)


def _request_count(total: float, num_requests: float | None) -> float:
    if num_requests is None:
        return total
    if not (math.isfinite(num_requests) and num_requests >= 0):
        raise ValueError(f"num_requests must be a count >= 0, got {num_requests!r}")
    return float(num_requests)


def _estimate(*, gpus: float, requests: float, demand: float, **shares: float) -> SizingEstimate:
    return SizingEstimate(
        gpus=gpus,
        requests=requests,
        demand_tokens_per_s=demand,
        effective_thpt_per_gpu=demand / gpus if gpus > 0 else 0.0,
        **shares,
    )


# --- prefill --------------------------------------------------------------------------------


def prefill_sizing_for_distribution(
    prefill: PrefillInterpolator,
    *,
    isl_bounds: Sequence[float],
    isl_counts: Sequence[float],
    interval_s: float,
    num_requests: float | None = None,
    isl_sum: float | None = None,
    samples_per_bucket: int = DEFAULT_SAMPLES_PER_BUCKET,
) -> SizingEstimate:
    """Prefill GPUs for an ISL histogram over ``interval_s`` seconds (module docstring).

    ``num_requests`` rescales the histogram's shape to a forecast request count; by default
    the histogram's own count is used. ``isl_sum`` is the histogram's ``_sum`` (total input
    tokens of the counted requests); it sharpens the estimate (module docstring).
    """
    interval = _check_positive(interval_s, "interval_s")
    s = _samples(
        isl_bounds, isl_counts, name="isl", per_bucket=samples_per_bucket, total_tokens=isl_sum
    )
    n = _request_count(s.total, num_requests)
    if s.total == 0 or n == 0:
        return _estimate(gpus=0.0, requests=n, demand=0.0)
    gpu_seconds_per_request = float(
        np.dot(s.weights, s.lengths / prefill.thpt_per_gpu_many(s.lengths))
    )
    lo, hi = prefill.isl_range
    clamped = (s.lengths < lo) | (s.lengths > hi)
    return _estimate(
        gpus=n * gpu_seconds_per_request / interval,
        requests=n,
        demand=n * s.mean_length / interval,
        clamped_share=float(s.weights[clamped].sum()),
        overflow_share=float(s.weights[s.overflow > 0].sum()),
    )


def prefill_gpus_for_distribution(
    prefill: PrefillInterpolator,
    *,
    isl_bounds: Sequence[float],
    isl_counts: Sequence[float],
    interval_s: float,
    num_requests: float | None = None,
    isl_sum: float | None = None,
    samples_per_bucket: int = DEFAULT_SAMPLES_PER_BUCKET,
) -> float:
    """Fractional prefill GPUs; :func:`prefill_sizing_for_distribution` without the details."""
    return prefill_sizing_for_distribution(
        prefill,
        isl_bounds=isl_bounds,
        isl_counts=isl_counts,
        interval_s=interval_s,
        num_requests=num_requests,
        isl_sum=isl_sum,
        samples_per_bucket=samples_per_bucket,
    ).gpus


def prefill_gpus_for_mean(
    prefill: PrefillInterpolator, *, mean_isl: float, num_requests: float, interval_s: float
) -> float:
    """Dynamo's prefill sizing: ``num_requests * mean_isl / interval_s / T_p(mean_isl)``."""
    interval = _check_positive(interval_s, "interval_s")
    n = _request_count(0.0, num_requests)
    if n == 0:
        return 0.0
    isl = _check_positive(mean_isl, "mean_isl")
    return n * isl / interval / prefill.thpt_per_gpu(isl)


# --- decode ---------------------------------------------------------------------------------


def decode_sizing_for_distribution(
    decode: DecodeInterpolator,
    *,
    isl_bounds: Sequence[float],
    isl_counts: Sequence[float],
    osl_bounds: Sequence[float],
    osl_counts: Sequence[float],
    itl_ms: float,
    interval_s: float,
    num_requests: float | None = None,
    isl_sum: float | None = None,
    osl_sum: float | None = None,
    samples_per_bucket: int = DEFAULT_SAMPLES_PER_BUCKET,
) -> SizingEstimate:
    """Decode GPUs for ISL and OSL histograms at an ITL target (ms) (module docstring).

    The request count is ``num_requests`` when given, else the OSL histogram's count (OSL is
    recorded when a request finishes, i.e. when its decode work is done). ``isl_sum`` and
    ``osl_sum`` are the histograms' ``_sum`` values (total tokens), optional.
    """
    interval = _check_positive(interval_s, "interval_s")
    target = _check_positive(itl_ms, "itl_ms")
    si = _samples(
        isl_bounds, isl_counts, name="isl", per_bucket=samples_per_bucket, total_tokens=isl_sum
    )
    so = _samples(
        osl_bounds, osl_counts, name="osl", per_bucket=samples_per_bucket, total_tokens=osl_sum
    )
    n = _request_count(so.total, num_requests)
    if si.total == 0 or so.total == 0 or n == 0:
        return _estimate(gpus=0.0, requests=n, demand=0.0)
    # Pairs (ISL sample, OSL sample) with the product weight: the marginals are independent.
    context = si.lengths[:, None] + so.lengths[None, :] / 2
    weight = si.weights[:, None] * so.weights[None, :]
    best = decode.find_best_many(target, context)
    thpt = np.where(best.feasible, best.thpt_per_gpu, best.lowest_itl_thpt_per_gpu)
    gpu_seconds_per_request = float(np.sum(weight * so.lengths[None, :] / thpt))
    overflow = (si.overflow[:, None] > 0) | (so.overflow[None, :] > 0)
    return _estimate(
        gpus=n * gpu_seconds_per_request / interval,
        requests=n,
        demand=n * so.mean_length / interval,
        clamped_share=float(weight[best.clamped].sum()),
        infeasible_share=float(weight[~best.feasible].sum()),
        overflow_share=float(weight[overflow].sum()),
    )


def decode_gpus_for_distribution(
    decode: DecodeInterpolator,
    *,
    isl_bounds: Sequence[float],
    isl_counts: Sequence[float],
    osl_bounds: Sequence[float],
    osl_counts: Sequence[float],
    itl_ms: float,
    interval_s: float,
    num_requests: float | None = None,
    isl_sum: float | None = None,
    osl_sum: float | None = None,
    samples_per_bucket: int = DEFAULT_SAMPLES_PER_BUCKET,
) -> float:
    """Fractional decode GPUs; :func:`decode_sizing_for_distribution` without the details."""
    return decode_sizing_for_distribution(
        decode,
        isl_bounds=isl_bounds,
        isl_counts=isl_counts,
        osl_bounds=osl_bounds,
        osl_counts=osl_counts,
        itl_ms=itl_ms,
        interval_s=interval_s,
        num_requests=num_requests,
        isl_sum=isl_sum,
        osl_sum=osl_sum,
        samples_per_bucket=samples_per_bucket,
    ).gpus


def decode_gpus_for_mean(
    decode: DecodeInterpolator,
    *,
    mean_isl: float,
    mean_osl: float,
    num_requests: float,
    itl_ms: float,
    interval_s: float,
) -> float:
    """Dynamo's decode sizing: ``num_requests * mean_osl / interval_s / T_d(isl + osl/2)``.

    Where the ITL target is infeasible this uses the lowest-ITL throughput, as the
    distribution-aware version does (Dynamo silently uses grid column 0).
    """
    interval = _check_positive(interval_s, "interval_s")
    target = _check_positive(itl_ms, "itl_ms")
    n = _request_count(0.0, num_requests)
    if n == 0:
        return 0.0
    osl = _check_positive(mean_osl, "mean_osl")
    isl = _check_positive(mean_isl, "mean_isl")
    best = decode.find_best_many(target, np.array([isl + osl / 2]))
    thpt = best.thpt_per_gpu[0] if best.feasible[0] else best.lowest_itl_thpt_per_gpu[0]
    return n * osl / interval / float(thpt)
