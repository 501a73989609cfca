"""Forecasting library: load predictors (constant, ARIMA, Kalman, Prophet, automatic choice)
and the request-trace readers that feed them.

It imports nothing from the other project packages, so it can be tested and reused alone.
"""

from predictors.base import Forecast, LoadPredictor
from predictors.factory import AUTO_CANDIDATES, PREDICTOR_NAMES, make_predictor

__all__ = ["AUTO_CANDIDATES", "PREDICTOR_NAMES", "Forecast", "LoadPredictor", "make_predictor"]
