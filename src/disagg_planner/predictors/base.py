"""The predictor interface and the behaviour every predictor shares.

One predictor instance forecasts one series (the planner keeps three: request count, mean
ISL and mean OSL per interval). Time is discrete: ``observe`` is called once per interval
with that interval's value, ``predict_next`` forecasts the next interval.

Shared rules (implemented once, in :class:`BasePredictor`):

- A non-finite or negative value is *missing data*: it is not stored and never read as zero
  (an outage must not look like idle traffic). Models that have a time axis advance it.
- Zeros are skipped until the first non-zero value, and again after :meth:`reset_idle`,
  so the idle minutes of a fresh deployment do not drag the first forecasts to zero.
- Below ``min_points`` accepted values the forecast is the last value (0 when there is none),
  with ``fallback=True``.
- Forecasts are never negative. ``predict_next`` is idempotent between two ``observe`` calls.
- With ``quantile`` set, ``Forecast.upper`` is that upper quantile of the next value: from the
  model's predictive distribution where it has one, else from the empirical quantile of the
  predictor's own recent one-step errors.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

import numpy as np

# The series the planner forecasts, one predictor each: requests per interval, mean ISL, mean OSL.
SERIES: tuple[str, ...] = ("num_req", "isl", "osl")
# One-step errors kept for residual quantiles and for scoring (``auto``).
ERROR_WINDOW = 60
# Fewest recorded errors before an empirical quantile is trusted.
MIN_ERRORS_FOR_QUANTILE = 8


@dataclass(frozen=True, slots=True)
class Forecast:
    """One forecast of the next interval's value.

    ``value`` is the point forecast (>= 0, the series' unit). ``upper`` is the requested
    upper quantile of the next value, or None when no quantile was configured. ``fallback``
    is True when the predictor had fewer than its minimum points and answered with the
    last value. ``note`` says in words how the forecast was made (for logs and diagnostics).
    """

    value: float
    upper: float | None
    fallback: bool
    note: str


@runtime_checkable
class LoadPredictor(Protocol):
    """Forecaster of one per-interval series."""

    min_points: int

    def observe(self, value: float) -> None:
        """Add the value of the interval that just ended (NaN/inf: missing)."""

    def predict_next(self) -> Forecast:
        """Forecast the next interval's value; repeated calls give the same answer."""

    def reset_idle(self) -> None:
        """Skip zeros again until the next non-zero value (call after warm-up)."""


def check_quantile(quantile: float | None) -> None:
    """Raise ValueError unless ``quantile`` is None or strictly between 0 and 1."""
    if quantile is not None and not (0.0 < quantile < 1.0 and math.isfinite(quantile)):
        raise ValueError(f"quantile = {quantile!r}: expected a number strictly between 0 and 1")


def empirical_quantile(errors: Sequence[float], quantile: float) -> float:
    """The ``quantile`` of ``errors`` (linear interpolation between order statistics)."""
    return float(np.quantile(np.asarray(errors, dtype=float), quantile))


class BasePredictor:
    """Shared state machine; subclasses implement the model hooks.

    Hooks: ``_on_point(v)`` receives each accepted value (original units); ``_on_missing()``
    is told that an interval had no usable value; ``_model_forecast()`` returns
    ``(value, upper or None, note)`` once ``min_points`` values have been accepted.
    ``_history`` holds the last ``history_size`` accepted values.
    """

    name = "base"

    def __init__(
        self, *, min_points: int, quantile: float | None = None, history_size: int = 1
    ) -> None:
        if min_points < 1:
            raise ValueError(f"min_points = {min_points!r}: expected an integer >= 1")
        check_quantile(quantile)
        self.min_points = int(min_points)
        self.quantile = quantile
        self._history: deque[float] = deque(maxlen=max(1, history_size))
        self._count = 0
        self._skip_zeros = True
        self._cached: Forecast | None = None
        self._errors: deque[float] = deque(maxlen=ERROR_WINDOW)
        self._actuals: deque[float] = deque(maxlen=ERROR_WINDOW)

    # --- public ---------------------------------------------------------------------------
    @property
    def points(self) -> int:
        """Accepted values so far (zeros skipped while idle and missing values not counted)."""
        return self._count

    @property
    def last_value(self) -> float | None:
        """The most recent accepted value, or None."""
        return self._history[-1] if self._history else None

    @property
    def recent_errors(self) -> tuple[tuple[float, float], ...]:
        """``(actual, forecast error = actual - forecast)`` for recent forecast intervals.

        Recorded whenever ``predict_next`` was called before the interval's value arrived,
        except the forecast made before any value (0, not a model's skill).
        """
        return tuple(zip(self._actuals, self._errors, strict=True))

    def observe(self, value: float) -> None:
        forecast, self._cached = self._cached, None
        try:
            v = float(value)
        except (TypeError, ValueError):
            v = math.nan
        if not math.isfinite(v) or v < 0.0:
            self._on_missing()
            return
        if v == 0.0 and self._skip_zeros:
            return
        self._skip_zeros = False
        if forecast is not None and self._history:  # a forecast made on no data is no skill
            self._actuals.append(v)
            self._errors.append(v - forecast.value)
        self._history.append(v)
        self._count += 1
        self._on_point(v)

    def predict_next(self) -> Forecast:
        if self._cached is None:
            self._cached = self._forecast()
        return self._cached

    def reset_idle(self) -> None:
        self._skip_zeros = True

    # --- internals ------------------------------------------------------------------------
    def _forecast(self) -> Forecast:
        last = self.last_value
        if self._count < self.min_points:
            value = last if last is not None else 0.0
            note = (
                "no data yet: forecast 0"
                if last is None
                else f"{self._count} of {self.min_points} points: last value"
            )
            upper = self._residual_upper(value) if self.quantile is not None else None
            return Forecast(value=value, upper=upper, fallback=True, note=note)
        value, upper, note = self._model_forecast()
        if not math.isfinite(value):
            # A model that breaks down must not take the planner with it.
            value = last if last is not None else 0.0
            upper = None
            note = f"{note}; non-finite forecast replaced by the last value"
        value = max(0.0, value)
        if self.quantile is None:
            upper = None
        elif upper is None or not math.isfinite(upper):
            upper = self._residual_upper(value)
        else:
            upper = max(0.0, upper)
        return Forecast(value=value, upper=upper, fallback=False, note=note)

    def _residual_upper(self, value: float) -> float:
        """``value`` plus the configured quantile of recent one-step errors."""
        assert self.quantile is not None
        if len(self._errors) < MIN_ERRORS_FOR_QUANTILE:
            return value
        return max(0.0, value + empirical_quantile(self._errors, self.quantile))

    def _on_point(self, value: float) -> None:
        """Model update with one accepted value (original units)."""

    def _on_missing(self) -> None:
        """An interval passed without a usable value."""

    def _model_forecast(self) -> tuple[float, float | None, str]:
        raise NotImplementedError


def to_model(value: float, log1p: bool) -> float:
    """Map a value into the space a model works in (log1p or identity)."""
    return math.log1p(value) if log1p else value


def from_model(value: float, log1p: bool) -> float:
    """Inverse of :func:`to_model`, guarded against overflow."""
    if not log1p:
        return value
    return math.expm1(min(value, 700.0))
