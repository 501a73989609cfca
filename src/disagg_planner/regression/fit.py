"""Least-squares fit of iteration wall time with non-negative slopes.

Model: ``wall_time = intercept + sum_i slope_i * x_i`` (seconds; ``x_i`` in tokens or
requests). More work never makes an iteration faster, so a negative slope means the window
does not identify the law (noise, a narrow range, a confounder) and the fit is *rejected*
rather than used to extrapolate. A feature marked *clippable* is a refinement the law can do
without (decode's request count next to its KV tokens): if its slope comes out negative, or
it cannot be told apart from the other features, it is dropped (slope 0) and the rest is
refitted.

Columns are standardised before solving (token counts reach 1e6, request counts 1e2) so
the rank test and the solution do not depend on units.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

MIN_WALL_TIME_S = 1e-6
"""Predictions are floored here: an iteration never takes zero or negative time."""


@dataclass(frozen=True)
class LinearFit:
    """``wall_time_s = intercept_s + sum(slopes[i] * x[i])``; dropped features have slope 0."""

    feature_names: tuple[str, ...]
    intercept_s: float
    slopes: tuple[float, ...]
    num_samples: int

    def predict(self, x: Sequence[float]) -> float:
        """Wall time (s) for one feature vector, floored at :data:`MIN_WALL_TIME_S`."""
        if len(x) != len(self.slopes):
            raise ValueError(f"expected {len(self.slopes)} features, got {len(x)}")
        value = self.intercept_s + sum(s * float(v) for s, v in zip(self.slopes, x, strict=True))
        return max(MIN_WALL_TIME_S, value)


@dataclass(frozen=True)
class FitRejected:
    """Why there is no usable fit; ``reason`` is a bounded label, ``detail`` for humans."""

    reason: str  # "too_few_samples" | "unidentified" | "collinear" | "negative_slope"
    detail: str


def fit_wall_time(
    features: npt.NDArray[np.float64],
    wall_times: npt.NDArray[np.float64],
    *,
    feature_names: Sequence[str],
    clippable: Collection[str] = (),
    min_samples: int = 2,
) -> LinearFit | FitRejected:
    """Fit ``wall_times`` (shape ``(n,)``, s) on ``features`` (shape ``(n, k)``).

    >>> x = np.array([[100.0], [200.0], [400.0]])
    >>> fit = fit_wall_time(x, 0.002 + 1e-5 * x[:, 0], feature_names=["tokens"])
    >>> round(fit.intercept_s, 6), round(fit.slopes[0], 8)
    (0.002, 1e-05)
    """
    n, k = features.shape
    if len(feature_names) != k:
        raise ValueError(f"{k} feature columns but {len(feature_names)} names")
    if wall_times.shape != (n,):
        raise ValueError(f"wall_times must have shape ({n},), got {wall_times.shape}")
    if n < max(min_samples, 2):
        return FitRejected("too_few_samples", f"{n} samples, need {max(min_samples, 2)}")
    active = list(range(k))
    while True:
        outcome = _fit_active(features, wall_times, active, feature_names, clippable)
        if isinstance(outcome, int):  # a clippable feature to drop, then refit
            active.remove(outcome)
            continue
        if isinstance(outcome, FitRejected):
            return outcome
        slopes = [0.0] * k
        for j, slope in zip(active, outcome[1], strict=True):
            slopes[j] = slope
        return LinearFit(tuple(feature_names), outcome[0], tuple(slopes), n)


def _fit_active(
    features: npt.NDArray[np.float64],
    wall_times: npt.NDArray[np.float64],
    active: list[int],
    names: Sequence[str],
    clippable: Collection[str],
) -> tuple[float, list[float]] | FitRejected | int:
    """One solve on the ``active`` columns: (intercept, slopes), a rejection, or the index
    of a clippable column to drop."""
    n = features.shape[0]
    cols = features[:, active]
    mean = cols.mean(axis=0)
    spread = cols.max(axis=0) - cols.min(axis=0)
    for pos, j in enumerate(active):
        scale = max(1.0, float(np.abs(cols[:, pos]).max()))
        if spread[pos] <= 1e-12 * scale:
            if names[j] in clippable:
                return j
            return FitRejected(
                "unidentified",
                f"all {n} samples have {names[j]} = {float(cols[0, pos]):g}; its slope "
                "cannot be estimated until the load varies",
            )
    std = cols.std(axis=0)
    design = np.column_stack([np.ones(n), (cols - mean) / std])
    coef, _, rank, _ = np.linalg.lstsq(design, wall_times, rcond=None)
    if rank < design.shape[1]:
        for j in active:
            if names[j] in clippable:
                return j
        return FitRejected(
            "collinear",
            f"features {[names[j] for j in active]} are collinear in {n} samples",
        )
    slopes = [float(c) for c in coef[1:] / std]
    intercept = float(coef[0]) - sum(s * float(m) for s, m in zip(slopes, mean, strict=True))
    for j, slope in zip(active, slopes, strict=True):
        if slope < 0.0:
            if names[j] in clippable:
                return j
            return FitRejected(
                "negative_slope",
                f"slope of {names[j]} is {slope:.3g} s per unit (< 0) in {n} samples",
            )
    if not (math.isfinite(intercept) and all(math.isfinite(s) for s in slopes)):
        return FitRejected("collinear", f"non-finite coefficients from {n} samples")
    return intercept, slopes
