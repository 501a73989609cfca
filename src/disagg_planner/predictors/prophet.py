"""Prophet forecaster on a sliding window, refitted each interval at bounded cost.

Model (Prophet's defaults otherwise): ``y(t) = g(t) + s(t) + e``, a piecewise-linear trend
``g`` with changepoints plus any seasonality Prophet's own rules enable for the window's
time span. Point ``i`` is placed at ``2024-01-01 + i * interval_s`` (missing intervals leave a
gap in time, which Prophet handles natively). The forecast is ``yhat`` one interval past the
last point, clipped at 0.

Cost bounds: the fit uses the last ``window_size`` points only, the number of changepoints is
``window_size // 8`` (at most Prophet's default 25) instead of 25 for any window, and
uncertainty sampling is off (it dominates ``predict``); fitting is done lazily, once per new
value, when a forecast is asked for. The upper quantile comes from the empirical quantile of
the predictor's own one-step errors. Prophet runs the Stan model bundled in its wheel (nothing
is downloaded) and the cmdstanpy/prophet loggers are silenced.
"""

from __future__ import annotations

import logging
import math
import warnings
from collections import deque
from typing import Any

import numpy as np
import pandas as pd  # type: ignore[import-untyped]

from disagg_planner.predictors.base import BasePredictor, from_model, to_model

_EPOCH = pd.Timestamp("2024-01-01")


def _silence_stan_logs() -> None:
    # cmdstanpy logs two INFO lines per fit, and prophet an INFO line per disabled
    # seasonality. cmdstanpy installs its own stderr handler (at DEBUG) on first use unless
    # its logger already has one: a NullHandler prevents that. Warnings still propagate.
    cmdstanpy_logger = logging.getLogger("cmdstanpy")
    if not any(isinstance(h, logging.NullHandler) for h in cmdstanpy_logger.handlers):
        cmdstanpy_logger.addHandler(logging.NullHandler())
    for name in ("cmdstanpy", "prophet"):
        logging.getLogger(name).setLevel(logging.WARNING)


_silence_stan_logs()
from prophet import Prophet  # noqa: E402  (after the loggers are silenced)

_silence_stan_logs()  # importing prophet may reset levels


class ProphetPredictor(BasePredictor):
    """Prophet refitted on the last ``window_size`` points."""

    name = "prophet"

    def __init__(
        self,
        *,
        window_size: int = 50,
        interval_s: float = 180.0,
        log1p: bool = False,
        quantile: float | None = None,
        min_points: int = 5,
        n_changepoints: int | None = None,
        changepoint_prior_scale: float = 0.05,
    ) -> None:
        if window_size < 2:
            raise ValueError(f"prophet window_size = {window_size!r}: expected >= 2")
        if not (math.isfinite(interval_s) and interval_s > 0):
            raise ValueError(f"interval_s = {interval_s!r}: expected a positive number of s")
        super().__init__(min_points=min_points, quantile=quantile)
        self.log1p = log1p
        self.window_size = window_size
        self.interval_s = float(interval_s)
        self.n_changepoints = (
            min(25, window_size // 8) if n_changepoints is None else int(n_changepoints)
        )
        self.changepoint_prior_scale = changepoint_prior_scale
        self._step = 0  # index of the next interval
        self._points: deque[tuple[int, float]] = deque(maxlen=window_size)

    def _on_point(self, value: float) -> None:
        self._points.append((self._step, to_model(value, self.log1p)))
        self._step += 1

    def _on_missing(self) -> None:
        if self._points:
            self._step += 1

    def _model_forecast(self) -> tuple[float, float | None, str]:
        steps = np.array([s for s, _ in self._points], dtype=float)
        ys = np.array([y for _, y in self._points], dtype=float)
        last = self.last_value
        assert last is not None
        if float(ys.max()) == float(ys.min()):
            return last, None, "flat series: its constant value"
        frame = pd.DataFrame(
            {"ds": _EPOCH + pd.to_timedelta(steps * self.interval_s, unit="s"), "y": ys}
        )
        # fewer changepoints than points, or Prophet rejects the fit
        changepoints = max(0, min(self.n_changepoints, len(ys) - 2))
        model: Any = Prophet(
            n_changepoints=changepoints,
            changepoint_prior_scale=self.changepoint_prior_scale,
            uncertainty_samples=0,
        )
        try:
            with warnings.catch_warnings():
                # prophet's own pandas deprecation warnings say nothing about the forecast
                warnings.simplefilter("ignore")
                model.fit(frame)
                ds = _EPOCH + pd.Timedelta(seconds=self._step * self.interval_s)
                yhat = next_yhat(model, ds)
        except Exception as exc:  # Stan can fail on degenerate windows: keep serving
            reason = (str(exc).splitlines() or [""])[0]
            return last, None, f"prophet failed ({type(exc).__name__}: {reason}): last value"
        return from_model(yhat, self.log1p), None, f"prophet on {len(ys)} points"


def next_yhat(model: Any, ds: pd.Timestamp) -> float:
    """Prophet's ``yhat`` at ``ds`` for a fitted ``model``.

    A window shorter than two days enables no seasonality and there are no regressors, so
    ``yhat`` is the trend alone; Prophet's own ``predict_trend`` gives it without the
    seasonal-feature pass that costs about as much as the rest of ``predict``.
    """
    future = pd.DataFrame({"ds": [ds]})
    if model.seasonalities or model.extra_regressors:
        return float(model.predict(future)["yhat"].iloc[0])
    frame = model.setup_dataframe(future)
    return float(np.asarray(model.predict_trend(frame))[0])
