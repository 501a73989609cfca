"""Request-trace readers (Mooncake, Azure 2023/2024, BurstGPT, Dynamo request trace v1, and
requests generated from ServeGen client descriptions) and interval bucketing; used by predictor
warm-up and backtests, and by the simulator."""

from disagg_planner.predictors.traces.bucket import (
    DEFAULT_ISL_BOUNDS,
    DEFAULT_OSL_BOUNDS,
    TraceInterval,
    bucket_trace,
)
from disagg_planner.predictors.traces.errors import TraceError
from disagg_planner.predictors.traces.formats import FORMATS
from disagg_planner.predictors.traces.reader import TraceReader, read_trace, resolve_trace_files
from disagg_planner.predictors.traces.records import TraceRequest

__all__ = [
    "DEFAULT_ISL_BOUNDS",
    "DEFAULT_OSL_BOUNDS",
    "FORMATS",
    "TraceError",
    "TraceInterval",
    "TraceReader",
    "TraceRequest",
    "bucket_trace",
    "read_trace",
    "resolve_trace_files",
]
