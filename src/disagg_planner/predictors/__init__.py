"""Forecasting library: load predictors (constant, ARIMA, Kalman, Prophet, automatic choice)
and the request-trace readers that feed them.

It imports nothing else of the package (an import-linter contract), so it can be tested and
reused alone.
"""

from disagg_planner.predictors.base import SERIES, Forecast, LoadPredictor
from disagg_planner.predictors.factory import (
    AUTO_CANDIDATES,
    PREDICTOR_NAMES,
    make_predictor,
    make_predictors,
)

__all__ = [
    "AUTO_CANDIDATES",
    "PREDICTOR_NAMES",
    "SERIES",
    "Forecast",
    "LoadPredictor",
    "make_predictor",
    "make_predictors",
]
