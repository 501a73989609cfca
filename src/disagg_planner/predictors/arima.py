"""ARIMA(p, d, q) forecaster (pmdarima) with periodic, bounded order re-selection.

Model: ``phi(B) (1 - B)^d y_t = c + theta(B) e_t`` with Gaussian ``e_t``. ``auto_arima``
(stepwise from ``(1, d, 1)``, non-seasonal, ``p, q <= min(3, (n - d) // 5)``, AIC) picks
``p`` and ``q`` on the first fit; later values go through the fitted model's incremental ``update``.

What differs from Dynamo's ARIMA, and why (measured on the shared Azure and Mooncake traces):

- ``d`` is the KPSS test's choice but at least 1. With ``d = 0`` the model reverts to the
  window's mean and lags every level shift of the traffic by many intervals (Dynamo's
  ``(0,0,0)`` on 5 points, and our own ``(2,0,0)`` picks, lagged a 300 -> 500 req/min ramp
  by 100+ requests); ``(p,1,q)`` contains exponential smoothing and the random walk.
- The order is not chosen once from the first 5 points. It is re-selected whenever the
  points seen have doubled (5, 10, 20, 40, 80) until the gap reaches ``reselect_every`` (48),
  then every ``reselect_every`` points, each time on the last ``window`` points only.
  Re-selection also refits, so the model's history and the cost of ``update`` stay bounded.
- The *spiky-series* rule: when the raw series selects ``(0, d, 0)`` (no dynamics), the
  log1p series is also fitted (same ``d``) and kept if its AIC, corrected to the raw scale
  by the Jacobian ``2 sum log1p(y)`` (approximately: the burn-in points are counted), is
  lower. Dynamo switches to log1p unconditionally.
- A flat window (all values equal) is answered with that value without fitting.
- A forecast above ``2 max(window) + (max - min)`` is treated as divergence and replaced by
  the last value (Dynamo once forecast 8,565 requests against an actual 331).
- A missing value is skipped (the series is treated as contiguous).
- A *level shift* (:func:`level_shift`: the last :data:`SHIFT_RUN` one-step errors all of
  one sign, each more than :data:`SHIFT_SIGMA` times the typical error before them and
  more than :data:`SHIFT_MIN_SHARE` of the value) drops the history before the shift: the
  forecast is the last value until ``min_points`` values after the shift are in, then the
  order is re-selected on those alone. An order chosen on flat data otherwise keeps pulling
  back to the old mean until the next scheduled re-selection (seen at a 60 s interval: 650
  requests forecast just after 2,405 had arrived).

Re-selection is lazy: values are buffered and the work is done by ``predict_next``, so a
warm-up that feeds hundreds of points without asking for forecasts stays cheap.
``selections`` records each re-selection (points seen, order, constant, log space, seconds).
The upper quantile is the upper end of the model's central ``2q - 1`` prediction interval.

On a short series the AIC often prefers ``(0, 1, 0)`` without a constant: the random walk,
whose forecast *is* the last value, so ARIMA then scores exactly like ``constant``.
:meth:`ArimaPredictor.random_walk_reason` says so (``planner backtest`` prints it).
"""

from __future__ import annotations

import math
import time
import warnings
from dataclasses import dataclass
from typing import Any

import numpy as np
import pmdarima as pm
from threadpoolctl import ThreadpoolController  # type: ignore[import-untyped]

from disagg_planner.predictors.base import BasePredictor, from_model, to_model

# The level-shift rule (module doc).
SHIFT_RUN = 2
SHIFT_SIGMA = 3.0
SHIFT_MIN_SHARE = 0.2


def level_shift(errors: list[float], actuals: list[float]) -> bool:
    """Whether the last :data:`SHIFT_RUN` forecast errors (``actual - forecast``) show a
    level shift: all of one sign, each above :data:`SHIFT_SIGMA` times the median absolute
    error before them and above :data:`SHIFT_MIN_SHARE` of its actual value.

    >>> level_shift([1.0, -2.0, 1.5, -1.0, 30.0, 35.0], [40, 41, 40, 39, 70, 75])
    True
    >>> level_shift([1.0, -2.0, 1.5, -1.0, 30.0, -35.0], [40, 41, 40, 39, 70, 5])
    False
    """
    if len(errors) < SHIFT_RUN + 3:
        return False
    recent, before = errors[-SHIFT_RUN:], errors[:-SHIFT_RUN]
    typical = float(np.median(np.abs(before)))
    same_sign = all(e > 0 for e in recent) or all(e < 0 for e in recent)
    return same_sign and all(
        abs(e) > SHIFT_SIGMA * typical and abs(e) > SHIFT_MIN_SHARE * max(a, 1.0)
        for e, a in zip(recent, actuals[-SHIFT_RUN:], strict=True)
    )


# ARIMA's matrices are tiny: BLAS threads only contend. On a busy 2-core host one order
# selection took 1.7 s with two OpenBLAS threads and 0.3 s with one.
_BLAS = ThreadpoolController()


@dataclass(frozen=True, slots=True)
class OrderSelection:
    """One run of ``auto_arima``: when (accepted points), what it chose (``constant``: with
    an intercept, a drift once differenced), what it cost (s)."""

    points: int
    order: tuple[int, int, int]
    log_space: bool
    seconds: float
    constant: bool = False


class ArimaPredictor(BasePredictor):
    """pmdarima ARIMA with bounded history and periodic order re-selection.

    ``window``: points the order is selected and refitted on. ``reselect_every``: the
    steady-state re-selection period (points). ``d``: fixed differencing order, or None for
    the ``unit_root_test``'s (``kpss``, ``adf`` or ``pp``) choice, at least 1.
    ``spiky_log1p``: apply the spiky-series rule (module docstring).
    """

    name = "arima"

    def __init__(
        self,
        *,
        log1p: bool = False,
        quantile: float | None = None,
        min_points: int = 5,
        window: int = 120,
        reselect_every: int = 48,
        spiky_log1p: bool = True,
        unit_root_test: str = "kpss",
        d: int | None = None,
    ) -> None:
        if window < max(min_points, 5):
            raise ValueError(f"arima window = {window!r}: expected >= max(min_points, 5)")
        if reselect_every < 1:
            raise ValueError(f"arima reselect_every = {reselect_every!r}: expected >= 1")
        if unit_root_test not in ("kpss", "adf", "pp"):
            raise ValueError(f"arima unit_root_test = {unit_root_test!r}: expected kpss, adf or pp")
        if d is not None and d not in (0, 1, 2):
            raise ValueError(f"arima d = {d!r}: expected 0, 1, 2 or None")
        super().__init__(min_points=min_points, quantile=quantile, history_size=window)
        self.log1p = log1p
        self.window = window
        self.reselect_every = reselect_every
        self.spiky_log1p = spiky_log1p
        self.unit_root_test = unit_root_test
        self.d = d
        self.selections: list[OrderSelection] = []
        self._model: Any = None
        self._log_space = log1p
        self._pending: list[float] = []
        self._points_at_selection = 0
        self.shifts: list[int] = []  # points seen at each level shift detected

    # Values are only buffered here; predict_next does the model work.
    def _on_point(self, value: float) -> None:
        if self._model is not None:
            self._pending.append(value)

    def _selection_due(self) -> bool:
        return self._model is None or self.points >= self.next_selection_at()

    def next_selection_at(self) -> int:
        """The number of accepted points at which the order is next re-selected."""
        if self._model is None:
            return max(self.points, self.min_points)
        gap = min(self.reselect_every, max(self._points_at_selection, self.min_points))
        return self._points_at_selection + gap

    def random_walk_reason(self) -> str | None:
        """Why this ARIMA forecasts the last value, when every order selected so far was
        ``(0, 1, 0)`` without a constant (the random walk ``y[t+1] = y[t]``); else None."""
        if not self.selections or any(s.order != (0, 1, 0) or s.constant for s in self.selections):
            return None
        at = ", ".join(str(s.points) for s in self.selections)
        return (
            f"every order selected (at {at} points) was ARIMA(0,1,0) without a constant, the "
            "random walk, whose forecast is the last value: no AR or MA term and no drift "
            f"lowered the AIC enough on so few points (the next selection is due at "
            f"{self.next_selection_at()} points; the series had {self.points})"
        )

    def _model_forecast(self) -> tuple[float, float | None, str]:
        if level_shift(list(self._errors), list(self._actuals)):
            # keep only the values since the shift; the errors before it are the old level's
            since = list(self._history)[-SHIFT_RUN:]
            self._history.clear()
            self._history.extend(since)
            self._errors.clear()
            self._actuals.clear()
            self._model, self._pending = None, []
            self.shifts.append(self.points)
        if len(self._history) < self.min_points:
            return (
                float(self._history[-1]),
                None,
                f"level shift at point {self.shifts[-1] if self.shifts else 0}: last value "
                f"until {self.min_points} values after it",
            )
        window = np.asarray(self._history, dtype=float)
        last = float(window[-1])
        lo, hi = float(window.min()), float(window.max())
        if hi == lo:
            if self._selection_due():
                self._model, self._pending = None, []
            return last, None, "flat series: its constant value"
        try:
            with warnings.catch_warnings(), _BLAS.limit(limits=1, user_api="blas"):
                warnings.simplefilter("ignore")
                if self._selection_due():
                    self._select(window)
                elif self._pending:
                    self._model.update(
                        [to_model(v, self._log_space) for v in self._pending], maxiter=10
                    )
                    self._pending = []
                value, upper = self._predict()
        except Exception as exc:  # any numerical failure: keep serving, retry later
            self._model, self._pending = None, []
            self._points_at_selection = self.points
            reason = (str(exc).splitlines() or [""])[0]
            return last, None, f"arima failed ({type(exc).__name__}: {reason}): last value"
        order = self._model.order
        space = "log1p" if self._log_space else "raw"
        if value > 2.0 * hi + (hi - lo):
            return last, None, f"arima{order} {space} diverged ({value:.4g}): last value"
        return value, upper, f"arima{order} {space}"

    def _predict(self) -> tuple[float, float | None]:
        if self.quantile is None:
            mean = self._model.predict(n_periods=1)
            return from_model(float(np.asarray(mean)[0]), self._log_space), None
        alpha = 2.0 * (1.0 - self.quantile)
        if alpha >= 1.0:
            # q <= 0.5 is no upper end of a central interval: the base class falls back to
            # the empirical quantile of recent errors
            mean = self._model.predict(n_periods=1)
            return from_model(float(np.asarray(mean)[0]), self._log_space), None
        mean, conf = self._model.predict(n_periods=1, return_conf_int=True, alpha=alpha)
        value = from_model(float(np.asarray(mean)[0]), self._log_space)
        upper = from_model(float(np.asarray(conf)[0][1]), self._log_space)
        return value, upper

    def _select(self, window: np.ndarray) -> None:
        started = time.perf_counter()
        y = np.log1p(window) if self.log1p else window
        model = _auto_arima(y, self.unit_root_test, self.d)
        log_space = self.log1p
        if self.spiky_log1p and not self.log1p and model.order[0] == 0 and model.order[2] == 0:
            # same d, so that the two likelihoods are of the same differenced data
            log_model = _auto_arima(np.log1p(window), self.unit_root_test, model.order[1])
            jacobian = 2.0 * float(np.sum(np.log1p(window)))
            if math.isfinite(log_model.aic()) and log_model.aic() + jacobian < model.aic():
                model, log_space = log_model, True
        self._model, self._log_space, self._pending = model, log_space, []
        self._points_at_selection = self.points
        self.selections.append(
            OrderSelection(
                points=self.points,
                order=tuple(int(o) for o in model.order),  # type: ignore[arg-type]
                log_space=log_space,
                seconds=time.perf_counter() - started,
                constant=bool(getattr(model, "with_intercept", False)),
            )
        )


def _auto_arima(y: np.ndarray, test: str, d: int | None) -> Any:
    if d is None:
        d = max(1, int(pm.arima.ndiffs(y, test=test, max_d=2)))
    # About five differenced points per ARMA coefficient: on fewer, the likelihood is flat
    # and statsmodels' optimiser can grind for tens of seconds (seen: 31 s on 5 points).
    max_pq = min(3, max(0, (len(y) - d) // 5))
    return pm.auto_arima(
        y,
        d=d,
        test=test,
        seasonal=False,
        stepwise=True,
        # the stepwise search starts at (1, d, 1) instead of (2, d, 2): same picks on load
        # series, about half the fits on short windows
        start_p=min(1, max_pq),
        start_q=min(1, max_pq),
        max_p=max_pq,
        max_q=max_pq,
        maxiter=30,
        suppress_warnings=True,
        error_action="ignore",
    )
