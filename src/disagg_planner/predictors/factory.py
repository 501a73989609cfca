"""Build a predictor by name from the planner's prediction settings.

The keyword arguments mirror ``PlannerConfig``'s ``load_predictor_*``, ``prophet_window_size``
and ``kalman_*`` fields; ``interval_s`` is the throughput interval (it places Prophet's points
in time). Heavy libraries (pmdarima, prophet) are imported only when their predictor is built.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import partial
from typing import TYPE_CHECKING, Any

from disagg_planner.predictors.base import SERIES, BasePredictor, LoadPredictor, check_quantile

if TYPE_CHECKING:
    from disagg_planner.predictors.auto import EvidencePool

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
    pool: EvidencePool | None = None,
) -> LoadPredictor:
    """A new predictor ``name`` (one of :data:`PREDICTOR_NAMES`) for one series.

    ``log1p`` models ``log1p(value)`` (ARIMA, Kalman, Prophet; the constant predictor has
    nothing to transform). ``quantile`` (0 < q < 1) makes every forecast carry that upper
    quantile in ``Forecast.upper``. ``pool`` (auto only) is the evidence shared with the
    other series' auto (see :func:`make_predictors`). Raises ValueError naming the bad
    argument.
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
        from disagg_planner.predictors.auto import AutoPredictor

        return AutoPredictor({n: build(n) for n in AUTO_CANDIDATES}, quantile=quantile, pool=pool)
    return build(name)


def make_predictors(
    name: str, series: Sequence[str] = SERIES, **settings: Any
) -> dict[str, LoadPredictor]:
    """One new predictor ``name`` per series, as the planner keeps them.

    ``settings`` are :func:`make_predictor`'s. For ``auto`` the predictors of the series share
    one evidence pool (each weighs its candidates also by their errors on the other series).
    """
    if name == "auto":
        from disagg_planner.predictors.auto import EvidencePool

        settings = {**settings, "pool": EvidencePool()}
    return {key: make_predictor(name, **settings) for key in series}


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
        from disagg_planner.predictors.constant import ConstantPredictor

        return ConstantPredictor(quantile=quantile)
    if name == "arima":
        from disagg_planner.predictors.arima import ArimaPredictor

        return ArimaPredictor(log1p=log1p, quantile=quantile)
    if name == "kalman":
        from disagg_planner.predictors.kalman import KalmanPredictor

        return KalmanPredictor(
            q_level=kalman_q_level,
            q_trend=kalman_q_trend,
            r=kalman_r,
            min_points=kalman_min_points,
            log1p=log1p,
            quantile=quantile,
        )
    if name == "prophet":
        from disagg_planner.predictors.prophet import ProphetPredictor

        return ProphetPredictor(
            window_size=prophet_window_size, interval_s=interval_s, log1p=log1p, quantile=quantile
        )
    raise ValueError(f"predictor {name!r}: expected one of {', '.join(PREDICTOR_NAMES)}")
