"""Build a predictor by name from the planner's prediction settings.

The keyword arguments mirror ``PlannerConfig``'s ``load_predictor_*``, ``prophet_window_size``
and ``kalman_*`` fields; ``interval_s`` is the throughput interval (it places Prophet's points
in time). Heavy libraries (pmdarima, prophet) are imported only when their predictor is built.
"""

from __future__ import annotations

from functools import partial

from predictors.base import BasePredictor, LoadPredictor, check_quantile

PREDICTOR_NAMES: tuple[str, ...] = ("constant", "arima", "kalman", "prophet", "auto")
AUTO_CANDIDATES: tuple[str, ...] = ("constant", "arima", "kalman", "prophet")


def make_predictor(
    name: str,
    *,
    log1p: bool = False,
    quantile: float | None = None,
    prophet_window_size: int = 50,
    kalman_q_level: float = 1.0,
    kalman_q_trend: float = 0.1,
    kalman_r: float = 10.0,
    kalman_min_points: int = 5,
    interval_s: float = 180.0,
) -> LoadPredictor:
    """A new predictor ``name`` (one of :data:`PREDICTOR_NAMES`) for one series.

    ``log1p`` models ``log1p(value)`` (ARIMA, Kalman, Prophet; the constant predictor has
    nothing to transform). ``quantile`` (0 < q < 1) makes every forecast carry that upper
    quantile in ``Forecast.upper``. Raises ValueError naming the bad argument.
    """
    check_quantile(quantile)
    build = partial(
        _single,
        log1p=log1p,
        quantile=quantile,
        prophet_window_size=prophet_window_size,
        kalman_q_level=kalman_q_level,
        kalman_q_trend=kalman_q_trend,
        kalman_r=kalman_r,
        kalman_min_points=kalman_min_points,
        interval_s=interval_s,
    )
    if name == "auto":
        from predictors.auto import AutoPredictor

        return AutoPredictor({n: build(n) for n in AUTO_CANDIDATES}, quantile=quantile)
    return build(name)


def _single(
    name: str,
    *,
    log1p: bool,
    quantile: float | None,
    prophet_window_size: int,
    kalman_q_level: float,
    kalman_q_trend: float,
    kalman_r: float,
    kalman_min_points: int,
    interval_s: float,
) -> BasePredictor:
    if name == "constant":
        from predictors.constant import ConstantPredictor

        return ConstantPredictor(quantile=quantile)
    if name == "arima":
        from predictors.arima import ArimaPredictor

        return ArimaPredictor(log1p=log1p, quantile=quantile)
    if name == "kalman":
        from predictors.kalman import KalmanPredictor

        return KalmanPredictor(
            q_level=kalman_q_level,
            q_trend=kalman_q_trend,
            r=kalman_r,
            min_points=kalman_min_points,
            log1p=log1p,
            quantile=quantile,
        )
    if name == "prophet":
        from predictors.prophet import ProphetPredictor

        return ProphetPredictor(
            window_size=prophet_window_size, interval_s=interval_s, log1p=log1p, quantile=quantile
        )
    raise ValueError(f"predictor {name!r}: expected one of {', '.join(PREDICTOR_NAMES)}")
