"""ARIMA follows a level shift: table rows of (series -> what the forecast does, and why)."""

from __future__ import annotations

import random

import pytest

from disagg_planner.predictors.arima import ArimaPredictor, level_shift


def run(values: list[float]) -> tuple[ArimaPredictor, list[float]]:
    predictor = ArimaPredictor()
    forecasts = []
    for v in values:
        forecasts.append(predictor.predict_next().value)
        predictor.observe(v)
    return predictor, forecasts


def noisy(level: float, n: int, sd: float, rng: random.Random) -> list[float]:
    return [level + rng.gauss(0, sd) for _ in range(n)]


@pytest.mark.slow
def test_after_a_step_up_the_forecast_follows_the_new_level() -> None:
    rng = random.Random(1)
    predictor, _ = run(noisy(650, 30, 20, rng) + noisy(2400, 3, 40, rng))
    assert predictor.shifts, "the step was not seen as a level shift"
    forecast = predictor.predict_next()
    assert forecast.value == pytest.approx(2400, rel=0.05)
    assert "level shift" in forecast.note


@pytest.mark.slow
def test_noise_is_no_level_shift() -> None:
    rng = random.Random(2)
    predictor, _ = run(noisy(650, 40, 20, rng))
    assert predictor.shifts == []


@pytest.mark.parametrize(
    ("errors", "actuals", "shift"),
    [
        ([1, -2, 1.5, -1, 30, 35], [40, 41, 40, 39, 70, 75], True),  # two big, one sign
        ([1, -2, 1.5, -1, 30, -35], [40, 41, 40, 39, 70, 5], False),  # signs differ: a spike
        ([1, -2, 1.5, -1, 3, 4], [40, 41, 40, 39, 43, 44], False),  # within the noise
        ([10, -20, 15, -10, 4, 5], [400, 410, 400, 390, 404, 405], False),  # small share
        ([30, 35], [70, 75], False),  # too few errors to know the noise
    ],
)
def test_level_shift_rule(errors: list[float], actuals: list[float], shift: bool) -> None:
    assert level_shift(errors, actuals) is shift
