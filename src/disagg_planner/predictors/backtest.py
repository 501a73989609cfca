"""One-step-ahead rolling backtest of predictors over per-interval series.

For each interval ``t`` the predictor, having observed intervals ``0..t-1``, forecasts ``t``;
then it observes ``t``. Interval 0 has no forecast. Scored: intervals ``t >= 1`` whose actual
is finite (an empty interval has no ISL/OSL to score). Metrics over the scored intervals:

- ``mape``: mean ``|f - a| / a`` in percent, over intervals with ``a > 0``;
- ``smape``: mean ``2 |f - a| / (|f| + |a|)`` in percent (0 when both are 0);
- ``rmse``: root mean squared error, in the series' unit;
- ``under_rate``: share (0..1) of intervals with ``f < a``, the ones that cost SLO;
- ``p90_step_ms``: 90th percentile of the wall time of one ``observe`` + ``predict_next``.

Forecasts made below a predictor's minimum points (the last value) are scored like any other:
that is what the planner would have used. With ``score_upper`` the forecast scored is the
configured upper quantile instead of the point forecast.

Each result also counts the scored intervals whose point forecast was the last value (what
``constant`` forecasts): a model that scores exactly like ``constant`` did so, and
:func:`last_value_explanation` says why, from the forecasts' own notes.
"""

from __future__ import annotations

import math
import time
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from disagg_planner.predictors.base import LoadPredictor
from disagg_planner.predictors.constant import ConstantPredictor
from disagg_planner.predictors.factory import make_predictors
from disagg_planner.predictors.traces import TraceInterval
from disagg_planner.predictors.warmup import SERIES, series_of

# The note of a forecast made below the predictor's minimum points (its notes count them).
BELOW_MIN_POINTS = "below its minimum points"

JSON_KEYS: tuple[str, ...] = (
    "predictor",
    "series",
    "mape",
    "smape",
    "rmse",
    "under_rate",
    "p90_step_ms",
    "intervals",
)


@dataclass(frozen=True)
class BacktestResult:
    """Scores of one predictor on one series; ``step_ms``, ``forecasts``, the finished
    ``model``, ``last_value_intervals`` (scored intervals whose point forecast equalled the
    last value, ``constant``'s forecast) and ``notes`` (each scored forecast's note, a
    forecast below the minimum points as :data:`BELOW_MIN_POINTS`) are kept for diagnostics
    (they are not part of :meth:`as_json`)."""

    predictor: str
    series: str
    mape: float | None
    smape: float | None
    rmse: float | None
    under_rate: float | None
    p90_step_ms: float | None
    intervals: int
    step_ms: tuple[float, ...] = field(repr=False, default=())
    forecasts: tuple[float, ...] = field(repr=False, default=())
    model: Any = field(repr=False, default=None, compare=False)
    last_value_intervals: int = field(repr=False, default=0)
    notes: tuple[str, ...] = field(repr=False, default=(), compare=False)

    def as_json(self) -> dict[str, Any]:
        """Exactly the public keys: predictor, series, mape, smape, rmse, under_rate,
        p90_step_ms, intervals (metrics None when nothing was scored)."""
        return {key: getattr(self, key) for key in JSON_KEYS}


def backtest_series(
    predictor: LoadPredictor,
    actuals: Sequence[float],
    *,
    name: str,
    series: str,
    score_upper: bool = False,
) -> BacktestResult:
    """Roll ``predictor`` over ``actuals`` (NaN = missing) and score it."""
    (result,) = backtest_family(
        {series: predictor}, {series: actuals}, name=name, score_upper=score_upper
    )
    return result


def backtest_family(
    predictors: Mapping[str, LoadPredictor],
    actuals: Mapping[str, Sequence[float]],
    *,
    name: str,
    score_upper: bool = False,
) -> list[BacktestResult]:
    """Roll the predictors of several series in step, as the planner does (every series
    observes interval ``t - 1`` before any forecasts ``t``), and score each.

    In step matters for ``auto``, whose series share evidence. ``actuals`` has the same keys
    as ``predictors`` and equally long sequences.
    """
    lengths = {key: len(actuals[key]) for key in predictors}
    if len(set(lengths.values())) > 1:
        raise ValueError(f"backtest series lengths {lengths}: expected equal lengths")
    n = next(iter(lengths.values()), 0)
    forecasts: dict[str, list[float]] = {key: [] for key in predictors}
    steps: dict[str, list[float]] = {key: [] for key in predictors}
    pairs: dict[str, list[tuple[float, float]]] = {key: [] for key in predictors}
    notes: dict[str, list[str]] = {key: [] for key in predictors}
    last_value: dict[str, int] = dict.fromkeys(predictors, 0)
    # what `constant` forecasts, fed alongside (outside the timing)
    shadows = {key: ConstantPredictor() for key in predictors}
    for t in range(n):
        observe_ms: dict[str, float] = {}
        for key, predictor in predictors.items():
            started = time.perf_counter()
            if t > 0:
                predictor.observe(actuals[key][t - 1])
            observe_ms[key] = (time.perf_counter() - started) * 1000.0
            if t > 0:
                shadows[key].observe(actuals[key][t - 1])
        for key, predictor in predictors.items():
            started = time.perf_counter()
            forecast = predictor.predict_next()
            elapsed_ms = observe_ms[key] + (time.perf_counter() - started) * 1000.0
            value = forecast.value
            if score_upper and forecast.upper is not None:
                value = forecast.upper
            forecasts[key].append(value)
            if t == 0:
                continue
            steps[key].append(elapsed_ms)
            actual = actuals[key][t]
            if math.isfinite(actual):
                pairs[key].append((value, float(actual)))
                notes[key].append(BELOW_MIN_POINTS if forecast.fallback else forecast.note)
                if forecast.value == shadows[key].predict_next().value:
                    last_value[key] += 1
    return [
        BacktestResult(
            predictor=name,
            series=key,
            **_scores(pairs[key]),
            p90_step_ms=float(np.percentile(steps[key], 90)) if steps[key] else None,
            intervals=len(pairs[key]),
            step_ms=tuple(steps[key]),
            forecasts=tuple(forecasts[key]),
            model=predictor,
            last_value_intervals=last_value[key],
            notes=tuple(notes[key]),
        )
        for key, predictor in predictors.items()
    ]


def last_value_explanation(result: BacktestResult) -> str | None:
    """Why ``result``'s predictor forecast the last value on every scored interval (so that
    it scores exactly like ``constant``), or None when it did not, or is ``constant``.

    The reason is the forecasts' own notes, counted, plus the model's own account where it
    has one (ARIMA's :meth:`~disagg_planner.predictors.arima.ArimaPredictor.random_walk_reason`).
    """
    if (
        result.predictor == "constant"
        or result.intervals == 0
        or result.last_value_intervals < result.intervals
    ):
        return None
    counted = Counter(result.notes)
    text = ", ".join(
        f"{count} {note}" for note, count in sorted(counted.items(), key=lambda kv: -kv[1])
    )
    text = f"the last value on all {result.intervals} intervals ({text})"
    reason = getattr(result.model, "random_walk_reason", None)
    account = reason() if callable(reason) else None
    return f"{text}; {account}" if account else text


def _scores(pairs: Sequence[tuple[float, float]]) -> dict[str, float | None]:
    if not pairs:
        return {"mape": None, "smape": None, "rmse": None, "under_rate": None}
    f = np.array([p[0] for p in pairs])
    a = np.array([p[1] for p in pairs])
    positive = a > 0
    denom = np.abs(f) + np.abs(a)
    smape_terms = np.where(denom > 0, 2.0 * np.abs(f - a) / np.where(denom > 0, denom, 1), 0.0)
    return {
        "mape": float(np.mean(np.abs(f - a)[positive] / a[positive]) * 100)
        if positive.any()
        else None,
        "smape": float(np.mean(smape_terms) * 100),
        "rmse": float(math.sqrt(np.mean((f - a) ** 2))),
        "under_rate": float(np.mean(f < a)),
    }


def run_backtest(
    intervals: Sequence[TraceInterval],
    *,
    predictors: Sequence[str],
    series: Sequence[str] = SERIES,
    settings: Mapping[str, Any] | None = None,
    drop_last_interval: bool = True,
    prepare: Callable[[Mapping[str, LoadPredictor]], object] | None = None,
) -> list[BacktestResult]:
    """Backtest each of ``predictors`` (names for ``make_predictor``) on each of ``series``.

    ``settings`` are keyword arguments of ``make_predictor`` (log1p, quantile, kalman_* ...);
    with a quantile the upper forecast is scored. The last interval is dropped by default:
    a trace's end is unknown, so it is usually partial and reads as a false drop.
    ``prepare`` is called with each fresh family of predictors before it is scored (the
    planner's warm-up from ``--load-predictor-warmup-trace``, so the backtest scores what the
    planner would run).
    """
    unknown = sorted(set(series) - set(SERIES))
    if unknown:
        raise ValueError(f"series {unknown}: expected some of {list(SERIES)}")
    kwargs = dict(settings or {})
    used = list(intervals[:-1] if drop_last_interval else intervals)
    values = series_of(used)
    results: list[BacktestResult] = []
    for name in predictors:
        # auto's series share evidence: all three run, as in the planner, whatever is reported
        family = make_predictors(name, SERIES if name == "auto" else series, **kwargs)
        if prepare is not None:
            prepare(family)
        scored = backtest_family(
            family,
            {key: values[key] for key in family},
            name=name,
            score_upper=kwargs.get("quantile") is not None,
        )
        by_series = {r.series: r for r in scored}
        results.extend(by_series[key] for key in series)
    return results
