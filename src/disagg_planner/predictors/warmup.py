"""Warm-up: feed the three per-interval series of a request trace into the predictors.

Before its first live interval the planner can replay a recorded trace (its own traffic of
yesterday, say), so that ARIMA, Kalman and Prophet start with a fitted history instead of
answering with the last value for their first ``min_points`` intervals. The trace is
bucketed with the planner's throughput interval; the request count, mean ISL and mean OSL of
each interval go to the predictors keyed ``num_req``, ``isl`` and ``osl``. An empty interval
gives 0 requests and *missing* ISL/OSL. The last interval is left out unless asked for,
because a trace's last interval is usually partial and would look like a drop in traffic.
Afterwards each predictor's ``reset_idle()`` is called so that zeros of the still idle
deployment are skipped again.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from disagg_planner.predictors.base import SERIES, LoadPredictor
from disagg_planner.predictors.traces import TraceInterval, bucket_trace, read_trace

__all__ = ["SERIES", "WarmupReport", "series_of", "warm_up"]


def series_of(intervals: Sequence[TraceInterval]) -> dict[str, list[float]]:
    """The three predictor series of ``intervals``; NaN marks an empty interval's ISL/OSL."""
    return {
        "num_req": [float(iv.num_req) for iv in intervals],
        "isl": [math.nan if iv.mean_isl is None else iv.mean_isl for iv in intervals],
        "osl": [math.nan if iv.mean_osl is None else iv.mean_osl for iv in intervals],
    }


@dataclass(frozen=True, slots=True)
class WarmupReport:
    """What a warm-up fed: intervals per series, requests read, bad rows skipped, format."""

    intervals: int
    requests: int
    bad_rows: int
    trace_format: str


def warm_up(
    predictors: Mapping[str, LoadPredictor],
    trace_path: str | Path,
    *,
    interval_s: float,
    trace_format: str | None = None,
    skip_bad_rows: bool = False,
    include_last_interval: bool = False,
) -> WarmupReport:
    """Feed ``predictors`` (keys among num_req, isl, osl) from the trace at ``trace_path``.

    Raises TraceError for a missing or malformed trace, ValueError for an unknown key.
    """
    unknown = sorted(set(predictors) - set(SERIES))
    if unknown:
        raise ValueError(f"warm_up predictors {unknown}: expected keys among {list(SERIES)}")
    reader = read_trace(trace_path, trace_format=trace_format, skip_bad_rows=skip_bad_rows)
    intervals = bucket_trace(reader, interval_s=interval_s)
    if not include_last_interval:
        intervals = intervals[:-1]
    values = series_of(intervals)
    for key, predictor in predictors.items():
        for value in values[key]:
            predictor.observe(value)
        predictor.reset_idle()
    return WarmupReport(
        intervals=len(intervals),
        requests=reader.requests,
        bad_rows=reader.bad_rows,
        trace_format=reader.format,
    )
