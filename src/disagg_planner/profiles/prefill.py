"""Prefill capacity as a function of input sequence length (ISL).

Model: the profile samples, at a set of ISLs, the time to first token of one request on one
prefill engine (``ttft_ms``, ms) and the prefill throughput that gives per GPU
(``thpt_per_gpu``, input tokens/s/GPU). Between samples each curve is a not-a-knot cubic
spline through the samples, as Dynamo's ``interp1d(kind="cubic")``, when there are at least 4
samples, else piecewise linear. Should a cubic dip to zero or below anywhere in the profiled
range (wild data overshooting), that curve falls back to piecewise linear, which stays between
neighbouring samples. Outside the profiled range the ISL is clamped to the nearest end and the
result says so (``clamped``), because extrapolating a spline is not trustworthy.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import numpy as np
import numpy.typing as npt
from scipy.interpolate import PPoly, make_interp_spline

from disagg_planner.profiles.storage import FloatArray, PrefillData, prefill_data

__all__ = ["PrefillInterpolator", "PrefillPoint"]

CurveKind = Literal["cubic", "linear"]

_MIN_CUBIC_POINTS = 4


@dataclass(frozen=True)
class PrefillPoint:
    """Prefill answer at one ISL.

    ``isl`` is the ISL asked about; when ``clamped`` is true it lay outside the profiled
    range and ``ttft_ms``/``thpt_per_gpu`` are the values at the nearest end of that range.
    """

    isl: float
    ttft_ms: float
    thpt_per_gpu: float
    clamped: bool


class _Curve:
    """One interpolated curve y(x) on sorted, distinct x; evaluated vectorised."""

    def __init__(self, x: FloatArray, y: FloatArray) -> None:
        self._x = x
        self._y = y
        self.kind: CurveKind = "linear"
        self._spline = None
        if x.size >= _MIN_CUBIC_POINTS:
            spline = make_interp_spline(x, y, k=3)
            # The cubic's minimum is at a sample or where its derivative vanishes.
            critical = PPoly.from_spline(spline).derivative().roots(extrapolate=False)
            probe = np.concatenate([x, critical[np.isfinite(critical)]])
            if np.all(spline(probe) > 0):
                self._spline = spline
                self.kind = "cubic"

    def __call__(self, xq: FloatArray) -> FloatArray:
        xq = np.clip(xq, self._x[0], self._x[-1])
        if self._spline is not None:
            out = np.asarray(self._spline(xq), dtype=np.float64)
        else:
            out = np.interp(xq, self._x, self._y)
        return out


class PrefillInterpolator:
    """TTFT and throughput per GPU of one prefill engine, by ISL (see the module docstring).

    >>> p = PrefillInterpolator.from_arrays(
    ...     isl=[1000, 2000, 4000], ttft_ms=[25.0, 50.0, 110.0], thpt_per_gpu=[40e3, 40e3, 36e3])
    >>> p.ttft_ms(2000), p.thpt_per_gpu(3000)
    (50.0, 38000.0)
    >>> p.lookup(8000).clamped
    True
    """

    def __init__(self, data: PrefillData) -> None:
        self.data = data
        self._ttft = _Curve(data.isl, data.ttft_ms)
        self._thpt = _Curve(data.isl, data.thpt_per_gpu)

    @classmethod
    def from_arrays(
        cls,
        *,
        isl: npt.ArrayLike,
        ttft_ms: npt.ArrayLike,
        thpt_per_gpu: npt.ArrayLike,
    ) -> PrefillInterpolator:
        """Build from in-memory samples, validated like a profile file."""
        return cls(
            prefill_data(
                isl=np.asarray(isl),
                ttft_ms=np.asarray(ttft_ms),
                thpt_per_gpu=np.asarray(thpt_per_gpu),
            )
        )

    @property
    def isl_range(self) -> tuple[float, float]:
        """Smallest and largest profiled ISL, tokens."""
        return float(self.data.isl[0]), float(self.data.isl[-1])

    @property
    def kinds(self) -> dict[str, CurveKind]:
        """How each curve interpolates: ``cubic`` or ``linear``."""
        return {"ttft_ms": self._ttft.kind, "thpt_per_gpu": self._thpt.kind}

    def ttft_ms(self, isl: float) -> float:
        """TTFT in ms of one request of ``isl`` tokens (ISL clamped to the profiled range)."""
        return float(self._ttft(_finite_array(isl, "isl")))

    def thpt_per_gpu(self, isl: float) -> float:
        """Prefill throughput in tokens/s/GPU at ``isl`` (ISL clamped to the profiled range)."""
        return float(self._thpt(_finite_array(isl, "isl")))

    def lookup(self, isl: float) -> PrefillPoint:
        """Both curves at ``isl`` and whether ``isl`` had to be clamped."""
        lo, hi = self.isl_range
        x = _finite_array(isl, "isl")
        return PrefillPoint(
            isl=float(isl),
            ttft_ms=float(self._ttft(x)),
            thpt_per_gpu=float(self._thpt(x)),
            clamped=not (lo <= float(isl) <= hi),
        )

    def ttft_ms_many(self, isl: npt.ArrayLike) -> FloatArray:
        """Vectorised :meth:`ttft_ms` (same shape as ``isl``)."""
        return self._ttft(_finite_array(isl, "isl"))

    def thpt_per_gpu_many(self, isl: npt.ArrayLike) -> FloatArray:
        """Vectorised :meth:`thpt_per_gpu` (same shape as ``isl``)."""
        return self._thpt(_finite_array(isl, "isl"))


def _finite_array(values: npt.ArrayLike, name: str) -> FloatArray:
    arr = np.asarray(values, dtype=np.float64)
    if not np.all(np.isfinite(arr)):
        raise ValueError(f"{name} must be a finite number, got {values!r}")
    return arr
