"""Bucket a request stream into fixed intervals: count, mean ISL/OSL and histograms.

Interval ``k`` covers arrivals in ``[k * interval_s, (k + 1) * interval_s)``. Every interval
from 0 to the one holding the last arrival is returned, empty ones included with
``num_req = 0``. The mean ISL and OSL of an empty interval are **None**: nothing was measured
(the predictors read it as missing data, not as zero-length requests). The last interval
usually covers only part of its width, because a trace does not say when it ended.

Histograms: ``n`` bounds make ``n + 1`` bins, ``(-inf, b0), [b0, b1), ..., [b_{n-1}, inf)``.
"""

from __future__ import annotations

import math
from bisect import bisect_right
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from disagg_planner.predictors.traces.records import TraceRequest

DEFAULT_ISL_BOUNDS: tuple[float, ...] = tuple(float(2**k) for k in range(8, 18))  # 256..131072
DEFAULT_OSL_BOUNDS: tuple[float, ...] = tuple(float(2**k) for k in range(5, 13))  # 32..4096


@dataclass(frozen=True, slots=True)
class TraceInterval:
    """Load of one interval: start (s since the first request), request count, mean input
    and output tokens (None when empty), and the token histograms' bin counts."""

    start_s: float
    num_req: int
    mean_isl: float | None
    mean_osl: float | None
    isl_counts: tuple[int, ...]
    osl_counts: tuple[int, ...]


def _check_bounds(bounds: Sequence[float], label: str) -> tuple[float, ...]:
    values = tuple(float(b) for b in bounds)
    for i, b in enumerate(values):
        if not math.isfinite(b) or (i and b <= values[i - 1]):
            raise ValueError(
                f"{label}[{i}] = {bounds[i]!r}: expected finite, strictly increasing bounds"
            )
    return values


def bucket_trace(
    requests: Iterable[TraceRequest],
    *,
    interval_s: float,
    isl_bounds: Sequence[float] | None = None,
    osl_bounds: Sequence[float] | None = None,
) -> list[TraceInterval]:
    """Per-interval load of ``requests`` (any order); [] when there are none.

    Bounds default to :data:`DEFAULT_ISL_BOUNDS` / :data:`DEFAULT_OSL_BOUNDS` (powers of 2).
    """
    if not (math.isfinite(interval_s) and interval_s > 0):
        raise ValueError(f"interval_s = {interval_s!r}: expected a positive number of seconds")
    isl_b = _check_bounds(DEFAULT_ISL_BOUNDS if isl_bounds is None else isl_bounds, "isl_bounds")
    osl_b = _check_bounds(DEFAULT_OSL_BOUNDS if osl_bounds is None else osl_bounds, "osl_bounds")
    counts: dict[int, int] = {}
    isl_sum: dict[int, int] = {}
    osl_sum: dict[int, int] = {}
    isl_hist: dict[int, list[int]] = {}
    osl_hist: dict[int, list[int]] = {}
    for n, req in enumerate(requests):
        if not (math.isfinite(req.arrival_s) and req.arrival_s >= 0):
            raise ValueError(f"requests[{n}].arrival_s = {req.arrival_s!r}: expected >= 0")
        k = int(req.arrival_s // interval_s)
        if k not in counts:
            counts[k] = isl_sum[k] = osl_sum[k] = 0
            isl_hist[k] = [0] * (len(isl_b) + 1)
            osl_hist[k] = [0] * (len(osl_b) + 1)
        counts[k] += 1
        isl_sum[k] += req.input_length
        osl_sum[k] += req.output_length
        isl_hist[k][bisect_right(isl_b, req.input_length)] += 1
        osl_hist[k][bisect_right(osl_b, req.output_length)] += 1
    if not counts:
        return []
    empty_isl = (0,) * (len(isl_b) + 1)
    empty_osl = (0,) * (len(osl_b) + 1)
    out: list[TraceInterval] = []
    for k in range(max(counts) + 1):
        n = counts.get(k, 0)
        out.append(
            TraceInterval(
                start_s=k * float(interval_s),
                num_req=n,
                mean_isl=isl_sum[k] / n if n else None,
                mean_osl=osl_sum[k] / n if n else None,
                isl_counts=tuple(isl_hist[k]) if n else empty_isl,
                osl_counts=tuple(osl_hist[k]) if n else empty_osl,
            )
        )
    return out
