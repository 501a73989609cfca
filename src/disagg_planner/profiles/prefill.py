"""Prefill capacity as a function of input sequence length (ISL).

Model: the profile samples, at a set of ISLs, the time to first token of one request on one
prefill engine (``ttft_ms``, ms) and the prefill throughput that gives per GPU
(``thpt_per_gpu``, input tokens/s/GPU). Between samples each curve is a not-a-knot cubic
spline through the samples, as Dynamo's ``interp1d(kind="cubic")``, when there are at least 4
samples, else piecewise linear. Should a cubic dip to zero or below anywhere in the profiled
range (wild data overshooting), that curve falls back to piecewise linear, which stays between
neighbouring samples.

Outside the profiled range a spline is not trustworthy, so the answer is **extrapolated** from
a fit of the prefill's cost, and says so (``extrapolated``, with a ``note``): ``TTFT = t0 +
t_token * ISL + t_pair * ISL^2`` -- fixed cost, GEMMs linear in the tokens, attention over
the pairs of tokens -- with non-negative coefficients fitted by least squares (relative) to
the samples, scaled to meet the curve at the nearest end of the range; throughput follows
from its definition, ``ISL / TTFT / GPUs``, with the GPUs taken from the samples at that end.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import numpy as np
import numpy.typing as npt
from scipy.interpolate import PPoly, make_interp_spline
from scipy.optimize import nnls

from disagg_planner.profiles.storage import FloatArray, PrefillData, prefill_data

__all__ = ["LoadedPrefill", "PrefillCostFit", "PrefillInterpolator", "PrefillPoint"]

CurveKind = Literal["cubic", "linear"]

_MIN_CUBIC_POINTS = 4


@dataclass(frozen=True)
class PrefillPoint:
    """Prefill answer at one ISL.

    ``isl`` is the ISL asked about; when ``extrapolated`` is true it lay outside the profiled
    range and ``ttft_ms``/``thpt_per_gpu`` come from the cost fit (``note`` says so).
    """

    isl: float
    ttft_ms: float
    thpt_per_gpu: float
    extrapolated: bool
    note: str | None = None

    @property
    def clamped(self) -> bool:
        """The former name of :attr:`extrapolated` (outside the profiled range)."""
        return self.extrapolated


@dataclass(frozen=True)
class PrefillCostFit:
    """``TTFT_ms = base_ms + per_token_ms * ISL + per_pair_ms * ISL^2`` fitted to the samples
    (see the module doc)."""

    base_ms: float
    per_token_ms: float
    per_pair_ms: float

    @classmethod
    def of(cls, data: PrefillData) -> PrefillCostFit:
        isl = data.isl
        design = np.column_stack([np.ones_like(isl), isl, isl**2])
        weights = 1.0 / data.ttft_ms  # relative: short prompts count as much as long ones
        coef, _residual = nnls(design * weights[:, None], data.ttft_ms * weights)
        return cls(base_ms=float(coef[0]), per_token_ms=float(coef[1]), per_pair_ms=float(coef[2]))

    def ttft_ms(self, isl: FloatArray) -> FloatArray:
        return np.asarray(
            self.base_ms + self.per_token_ms * isl + self.per_pair_ms * isl**2, dtype=np.float64
        )


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
    >>> p.lookup(8000).extrapolated
    True
    """

    def __init__(self, data: PrefillData) -> None:
        self.data = data
        self.fit = PrefillCostFit.of(data)
        self._ttft = _Curve(data.isl, data.ttft_ms)
        self._thpt = _Curve(data.isl, data.thpt_per_gpu)
        # Where the fit takes over: its scale to meet the curve at each end, and the
        # tokens/s/GPU per token/ms there (1000 / GPUs for a sweep).
        ends = np.array([data.isl[0], data.isl[-1]])
        self._end_ttft = np.array([data.ttft_ms[0], data.ttft_ms[-1]])
        self._end_scale = self._end_ttft / np.maximum(self.fit.ttft_ms(ends), 1e-12)
        self._end_rate = np.array([data.thpt_per_gpu[0], data.thpt_per_gpu[-1]]) * (
            self._end_ttft / ends
        )

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
        """TTFT in ms of one request of ``isl`` tokens (extrapolated outside the range)."""
        return float(self._both(_finite_array(isl, "isl"))[0])

    def thpt_per_gpu(self, isl: float) -> float:
        """Prefill throughput in tokens/s/GPU at ``isl`` (extrapolated outside the range)."""
        return float(self._both(_finite_array(isl, "isl"))[1])

    def lookup(self, isl: float) -> PrefillPoint:
        """Both curves at ``isl`` and whether it lay outside the profiled range."""
        lo, hi = self.isl_range
        ttft, thpt = self._both(_finite_array(isl, "isl"))
        extrapolated = not (lo <= float(isl) <= hi)
        note = None
        if extrapolated:
            f = self.fit
            note = (
                f"ISL {float(isl):g} is outside the profiled {lo:g}-{hi:g}: extrapolated from "
                f"the prefill cost fit TTFT = {f.base_ms:.3g} ms + {f.per_token_ms:.3g} ms x "
                f"tokens + {f.per_pair_ms:.3g} ms x tokens^2, scaled to the nearest sample"
            )
        return PrefillPoint(
            isl=float(isl),
            ttft_ms=float(ttft),
            thpt_per_gpu=float(thpt),
            extrapolated=extrapolated,
            note=note,
        )

    def extrapolated_many(self, isl: npt.ArrayLike) -> npt.NDArray[np.bool_]:
        """Whether each ISL lies outside the profiled range."""
        x = _finite_array(isl, "isl")
        lo, hi = self.isl_range
        return np.asarray((x < lo) | (x > hi))

    def ttft_ms_many(self, isl: npt.ArrayLike) -> FloatArray:
        """Vectorised :meth:`ttft_ms` (same shape as ``isl``)."""
        return self._both(_finite_array(isl, "isl"))[0]

    def thpt_per_gpu_many(self, isl: npt.ArrayLike) -> FloatArray:
        """Vectorised :meth:`thpt_per_gpu` (same shape as ``isl``)."""
        return self._both(_finite_array(isl, "isl"))[1]

    def _both(self, x: FloatArray) -> tuple[FloatArray, FloatArray]:
        ttft = np.asarray(self._ttft(x), dtype=np.float64)
        thpt = np.asarray(self._thpt(x), dtype=np.float64)
        lo, hi = self.isl_range
        beyond = (x < lo) | (x > hi)
        if np.any(beyond):
            xb = np.maximum(np.asarray(x, dtype=np.float64)[beyond], 1.0)
            end = (xb > hi).astype(np.intp)
            t = self.fit.ttft_ms(xb) * self._end_scale[end]
            ttft = np.array(ttft, dtype=np.float64, copy=True)
            thpt = np.array(thpt, dtype=np.float64, copy=True)
            ttft[beyond] = t
            thpt[beyond] = xb * self._end_rate[end] / t
        return ttft, thpt


def _finite_array(values: npt.ArrayLike, name: str) -> FloatArray:
    arr = np.asarray(values, dtype=np.float64)
    if not np.all(np.isfinite(arr)):
        raise ValueError(f"{name} must be a finite number, got {values!r}")
    return arr


@dataclass(frozen=True)
class LoadedPrefill:
    """A prefill engine under load: each prompt's own TTFT as profiled (``lone``), and the
    throughput per GPU it reaches when its chunk budget (``chunk_tokens``,
    ``max_num_batched_tokens``) is full of prompts of one length.

    A profile times one prompt at a time. Under load a vLLM-style scheduler fills each
    iteration with up to ``chunk_tokens`` tokens of several prompts: the fixed cost and the
    GEMMs are paid once for the whole chunk, while attention stays within each prompt. So a
    chunk of ``k = chunk_tokens / isl`` prompts takes the profiled TTFT of one prompt of
    ``chunk_tokens`` tokens, less that prompt's attention across the chunk and plus each
    prompt's own (the cost fit's pair term, :class:`PrefillCostFit`):
    ``T = TTFT(B) - a B^2 + k a isl^2``, and the engine carries ``B / T`` tokens/s, the
    profiled throughput at ``B`` scaled by ``TTFT(B) / T``. Never under the lone prompt's
    throughput (a prompt as long as the chunk or longer runs alone, chunk by chunk).

    >>> lone = PrefillInterpolator.from_arrays(
    ...     isl=[500, 1000, 2000, 4000], ttft_ms=[12.0, 19.0, 33.0, 61.0],
    ...     thpt_per_gpu=[41667.0, 52632.0, 60606.0, 65574.0])
    >>> loaded = LoadedPrefill(lone, chunk_tokens=4000)
    >>> round(loaded.thpt_per_gpu(4000)) == round(lone.thpt_per_gpu(4000))
    True
    >>> loaded.thpt_per_gpu(500) > 1.5 * lone.thpt_per_gpu(500)
    True
    >>> loaded.ttft_ms(500) == lone.ttft_ms(500)
    True
    """

    lone: PrefillInterpolator
    chunk_tokens: int

    def ttft_ms(self, isl: float) -> float:
        """One prompt's own TTFT, as profiled."""
        return self.lone.ttft_ms(isl)

    def thpt_per_gpu(self, isl: float) -> float:
        """Tokens/s/GPU of an engine whose chunks are full of ``isl``-token prompts."""
        alone = self.lone.thpt_per_gpu(isl)
        budget = float(self.chunk_tokens)
        if not 0 < isl < budget:
            return alone
        pair = self.lone.fit.per_pair_ms
        full = self.lone.ttft_ms(budget)
        chunk_ms = full - pair * budget * budget + (budget / isl) * pair * isl * isl
        if chunk_ms <= 0 or full <= 0:
            return alone
        return max(alone, self.lone.thpt_per_gpu(budget) * full / chunk_ms)

    def describe(self, isl: float) -> str:
        """The sentence a decision's reason gives for the throughput at ``isl``."""
        return (
            f"prefill at load: {self.thpt_per_gpu(isl):.0f} tok/s/GPU with a "
            f"{self.chunk_tokens}-token chunk of {isl:.0f}-token prompts "
            f"({self.lone.thpt_per_gpu(isl):.0f} alone)"
        )
