"""Least squares with non-negative slopes recovers known laws and rejects bad windows."""

from __future__ import annotations

import numpy as np
import pytest

from disagg_planner.regression.fit import MIN_WALL_TIME_S, FitRejected, LinearFit, fit_wall_time


def _noisy(law: np.ndarray, rng: np.random.Generator, rel: float = 0.03) -> np.ndarray:
    return law * (1.0 + rng.normal(0.0, rel, size=law.shape))


def test_recovers_one_dimensional_law_from_noisy_samples() -> None:
    rng = np.random.default_rng(7)
    x = rng.uniform(64, 8192, size=(64, 1))
    y = _noisy(0.004 + 2.5e-5 * x[:, 0], rng)
    fit = fit_wall_time(x, y, feature_names=["tokens"])
    assert isinstance(fit, LinearFit)
    assert fit.slopes[0] == pytest.approx(2.5e-5, rel=0.05)
    assert fit.intercept_s == pytest.approx(0.004, abs=0.002)


def test_recovers_two_dimensional_law() -> None:
    rng = np.random.default_rng(8)
    x = np.column_stack([rng.integers(1, 256, 80), rng.uniform(1e3, 4e5, 80)])
    y = _noisy(0.008 + 1e-4 * x[:, 0] + 2e-7 * x[:, 1], rng, rel=0.02)
    fit = fit_wall_time(x, y, feature_names=["num", "kv"])
    assert isinstance(fit, LinearFit)
    assert fit.slopes[0] == pytest.approx(1e-4, rel=0.25)
    assert fit.slopes[1] == pytest.approx(2e-7, rel=0.1)


def test_negative_slope_rejects_the_fit() -> None:
    x = np.array([[100.0], [200.0], [300.0], [400.0]])
    y = np.array([0.04, 0.03, 0.02, 0.01])  # more work, faster: the window lies
    fit = fit_wall_time(x, y, feature_names=["tokens"])
    assert isinstance(fit, FitRejected)
    assert fit.reason == "negative_slope"
    assert "tokens" in fit.detail


def test_constant_feature_is_unidentified() -> None:
    x = np.full((10, 1), 8192.0)  # every iteration a full chunk
    fit = fit_wall_time(x, np.full(10, 0.2), feature_names=["tokens"])
    assert isinstance(fit, FitRejected)
    assert fit.reason == "unidentified"
    assert "tokens = 8192" in fit.detail


def test_clippable_negative_feature_is_dropped_and_rest_refitted() -> None:
    rng = np.random.default_rng(3)
    kv = rng.uniform(1e4, 4e5, 50)
    num = rng.integers(1, 200, 50).astype(float)
    y = 0.008 + 2e-7 * kv - 5e-6 * num  # a spurious negative per-request effect
    fit = fit_wall_time(
        np.column_stack([num, kv]), y, feature_names=["num", "kv"], clippable={"num"}
    )
    assert isinstance(fit, LinearFit)
    assert fit.slopes[0] == 0.0
    assert fit.slopes[1] > 0.0


def test_collinear_clippable_feature_is_dropped() -> None:
    num = np.arange(1.0, 41.0)
    kv = 1000.0 * num  # every request holds exactly 1000 tokens: the two cannot be separated
    fit = fit_wall_time(
        np.column_stack([num, kv]),
        0.008 + 2e-7 * kv,
        feature_names=["num", "kv"],
        clippable={"num"},
    )
    assert isinstance(fit, LinearFit)
    assert fit.slopes == (0.0, pytest.approx(2e-7))


def test_too_few_samples() -> None:
    fit = fit_wall_time(
        np.array([[1.0], [2.0]]), np.array([0.1, 0.2]), feature_names=["t"], min_samples=5
    )
    assert fit == FitRejected("too_few_samples", "2 samples, need 5")


def test_prediction_is_floored() -> None:
    fit = LinearFit(("t",), -0.5, (1e-6,), 10)
    assert fit.predict((1.0,)) == MIN_WALL_TIME_S
