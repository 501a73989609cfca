"""Kalman filter with a local linear trend (filterpy).

Model (one step = one interval), state ``x = [level, trend]``::

    x[t+1] = F x[t] + w,   F = [[1, 1], [0, 1]],  w ~ N(0, Q),  Q = diag(q_level, q_trend)
    z[t]   = H x[t] + v,   H = [1, 0],            v ~ N(0, R),  R = r

The state starts at ``[z0, 0]`` with covariance ``1000 I``. Each value runs predict then
update; a missing value runs predict only, so the level carries on along its trend and its
uncertainty grows. The forecast is the predicted level ``(F x)[0]``, clipped at 0 (Dynamo's
is not clipped), and no forecast is made before ``min_points`` values (Dynamo's setting is
not enforced). With ``log1p`` the filter runs on ``log1p(value)``.

Only the ratios ``q_level/r`` and ``q_trend/r`` shape the point forecast; the absolute scale of
Q and R would fix the predictive variance, which is therefore recalibrated: the variance
``S = H P H' + R`` of the next value is multiplied by the mean normalised innovation squared
(``innovation^2 / S``) of the last updates, which is 1 for a filter whose noise settings match
the data. The upper quantile is ``level + z_q sqrt(c S)`` (mapped back through ``expm1``).
"""

from __future__ import annotations

import math
from collections import deque
from statistics import NormalDist

import numpy as np
from filterpy.kalman import KalmanFilter

from disagg_planner.predictors.base import BasePredictor, from_model, to_model

_NIS_WINDOW = 30
_NIS_MIN = 5


class KalmanPredictor(BasePredictor):
    """Local-linear-trend Kalman filter forecaster."""

    name = "kalman"

    def __init__(
        self,
        *,
        q_level: float = 1.0,
        q_trend: float = 0.1,
        r: float = 10.0,
        min_points: int = 5,
        log1p: bool = False,
        quantile: float | None = None,
    ) -> None:
        for label, val in (("q_level", q_level), ("q_trend", q_trend), ("r", r)):
            if not (math.isfinite(val) and val >= 0):
                raise ValueError(f"kalman {label} = {val!r}: expected a finite number >= 0")
        super().__init__(min_points=min_points, quantile=quantile)
        self.log1p = log1p
        self._q = (max(1e-12, float(q_level)), max(1e-12, float(q_trend)))
        self._r = max(1e-9, float(r))
        self._kf: KalmanFilter | None = None
        self._nis: deque[float] = deque(maxlen=_NIS_WINDOW)

    def _new_filter(self, z: float) -> KalmanFilter:
        kf = KalmanFilter(dim_x=2, dim_z=1)
        kf.x = np.array([[z], [0.0]])
        kf.F = np.array([[1.0, 1.0], [0.0, 1.0]])
        kf.H = np.array([[1.0, 0.0]])
        kf.P = np.eye(2) * 1000.0
        kf.R = np.array([[self._r]])
        kf.Q = np.diag(self._q)
        return kf

    def _on_point(self, value: float) -> None:
        z = to_model(value, self.log1p)
        if self._kf is None:
            self._kf = self._new_filter(z)
            return
        self._kf.predict()
        self._kf.update(np.array([[z]]))
        s = float(self._kf.S[0, 0])
        if s > 0:
            self._nis.append(float(self._kf.y[0, 0]) ** 2 / s)

    def _on_missing(self) -> None:
        if self._kf is not None:
            self._kf.predict()

    def _model_forecast(self) -> tuple[float, float | None, str]:
        kf = self._kf
        assert kf is not None
        x = kf.F @ kf.x  # x' = F x
        p = kf.F @ kf.P @ kf.F.T + kf.Q  # P' = F P F' + Q
        level = float(x[0, 0])
        upper = None
        if self.quantile is not None:
            scale = float(np.mean(self._nis)) if len(self._nis) >= _NIS_MIN else 1.0
            s = float(p[0, 0]) + self._r  # S = H P' H' + R
            z_q = NormalDist().inv_cdf(self.quantile)
            upper = from_model(level + z_q * math.sqrt(max(s * scale, 0.0)), self.log1p)
        note = f"level {level:.4g}, trend {float(kf.x[1, 0]):+.4g} per interval"
        return from_model(level, self.log1p), upper, note
