"""Constant (last value) predictor: the next interval equals the last one.

Model: ``y[t+1] = y[t]``. It never lags more than one interval and has no parameters, which
makes it the baseline every other predictor is compared with. Its upper quantile is the last
value plus the empirical quantile of its own recent one-step errors (the interval-to-interval
changes of the series).
"""

from __future__ import annotations

from disagg_planner.predictors.base import BasePredictor


class ConstantPredictor(BasePredictor):
    """Forecast the last accepted value."""

    name = "constant"

    def __init__(self, *, quantile: float | None = None) -> None:
        super().__init__(min_points=1, quantile=quantile)

    def _model_forecast(self) -> tuple[float, float | None, str]:
        last = self.last_value
        assert last is not None
        return last, None, "last value"
