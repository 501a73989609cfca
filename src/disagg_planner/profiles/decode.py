"""Decode capacity as a function of KV-cache usage and context length.

Model: the profile samples, at scattered (KV usage, context length) points, the inter-token
latency of a decode engine (``itl_ms``, ms) and the decode throughput per GPU it achieves there
(``thpt_per_gpu``, output tokens/s/GPU). KV usage is the fraction of the engine's
``max_kv_tokens`` held by running requests, so ``kv_usage = concurrency * context_length /
max_kv_tokens``.

As in Dynamo, the scattered samples are put on a regular grid once, with a piecewise cubic
(Clough-Tocher) interpolant over their Delaunay triangulation (``griddata(method="cubic")``),
and grid nodes outside the samples' convex hull take the value of the nearest sample in raw
coordinates (``method="nearest"``). Unlike Dynamo:

* the triangulation and the cubic work in coordinates where context length is divided by the
  largest sampled context, so both axes span about 0-1 (``griddata(rescale=True)``). In raw
  coordinates the KV axis is ~10^4 times shorter, Qhull drops samples lying along a context
  row as numerically coplanar (they are then not reproduced), and triangles are needlessly
  thin;

* the grid also contains every sampled KV usage and context length, so the samples are
  reproduced exactly, and lookups interpolate bilinearly between nodes instead of rounding to
  the nearest node (Dynamo's 100x100 snapping costs a few percent);
* where the cubic leaves the range of its triangle's three sample values (an overshoot, which
  in Dynamo can even give negative throughput), the node takes the linear interpolant's value;
* when the samples come in rows (every sampled context length has at least two KV usages, as
  Dynamo's profiler sweeps concurrency per context), a node beyond the KV usages profiled at
  both neighbouring sampled contexts takes the value at the edge of that range. Without this,
  thin triangles along the jagged top edge (each row's largest concurrency reaches a slightly
  different KV usage) blend a short context's high throughput into long contexts. Since
  distances in raw coordinates are dominated by context length, this is what "nearest" means
  there anyway, only continuous;
* :meth:`DecodeInterpolator.find_best_throughput_per_gpu` maximises throughput over the exact
  set of KV usages whose ITL meets the target (vectorised; crossing points between nodes are
  solved for), and says "infeasible" when none does instead of returning the first node.

The grid spans KV usage 0-1 and context length 0 to the largest sampled context, like
Dynamo's. Queries outside it are clamped; a context length outside the sampled contexts is
flagged ``clamped``.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt
from scipy.interpolate import (
    CloughTocher2DInterpolator,
    LinearNDInterpolator,
    NearestNDInterpolator,
)
from scipy.spatial import Delaunay, QhullError
from threadpoolctl import threadpool_limits  # type: ignore[import-untyped]

from disagg_planner.profiles.errors import ProfileError
from disagg_planner.profiles.storage import DECODE_KEYS, DecodeData, FloatArray, decode_data

__all__ = ["DecodeBest", "DecodeBestMany", "DecodeInterpolator", "DecodePoint"]

DEFAULT_RESOLUTION = 200
# Rows of the (contexts x KV nodes) work arrays handled at once by the vectorised search.
_CHUNK_CELLS = 1 << 20


@dataclass(frozen=True)
class DecodePoint:
    """ITL (ms) and throughput (tokens/s/GPU) at one KV usage and context length.

    ``clamped`` is true when the context length lay outside the sampled contexts or the KV
    usage outside 0-1; the values are then those at the nearest edge.
    """

    kv_usage: float
    context_length: float
    itl_ms: float
    thpt_per_gpu: float
    clamped: bool


@dataclass(frozen=True)
class DecodeBest:
    """The highest-throughput operating point whose ITL meets a target, at one context length.

    When ``feasible`` is false no KV usage meets the target: ``thpt_per_gpu`` is 0.0 and
    ``itl_ms``/``kv_usage`` describe the lowest-ITL point there is (how far off the target
    is). ``clamped`` says the context length lay outside the sampled contexts.
    """

    thpt_per_gpu: float
    itl_ms: float
    kv_usage: float
    feasible: bool
    clamped: bool
    context_length: float = 0.0
    itl_target_ms: float = 0.0


@dataclass(frozen=True, eq=False)
class DecodeBestMany:
    """:class:`DecodeBest` for many context lengths at once (arrays of the same shape).

    ``lowest_itl_thpt_per_gpu`` is the throughput at the lowest-ITL point, the best an engine
    can do for a context length where the target is infeasible (sizing uses it then).
    """

    thpt_per_gpu: FloatArray
    itl_ms: FloatArray
    kv_usage: FloatArray
    feasible: npt.NDArray[np.bool_]
    clamped: npt.NDArray[np.bool_]
    lowest_itl_thpt_per_gpu: FloatArray


class DecodeInterpolator:
    """ITL and throughput per GPU of one decode engine by KV usage and context length.

    The grid is built once here; every query afterwards is array arithmetic on it.
    ``resolution`` is the number of evenly spaced nodes on each axis before the sampled
    coordinates are merged in (Dynamo uses 100).
    """

    def __init__(self, data: DecodeData, *, resolution: int = DEFAULT_RESOLUTION) -> None:
        if resolution < 2:
            raise ValueError(f"resolution must be at least 2, got {resolution}")
        self.data = data
        # Qhull solves one tiny LAPACK system per triangle; with OpenBLAS's thread pool on a
        # busy or CPU-limited host each solve spins for milliseconds (measured: 1.5 s instead
        # of 0.1 ms for 56 samples), so the grid is built with one BLAS thread.
        with threadpool_limits(limits=1, user_api="blas"):
            points = np.column_stack([data.kv_usage, data.context_length])
            values = np.column_stack([data.itl_ms, data.thpt_per_gpu])
            try:
                tri = Delaunay(points * self._scale(data))
            except QhullError as exc:
                raise ProfileError(
                    "the decode points lie on one line, so no surface can be interpolated; "
                    "profile more than one KV usage at more than one context length",
                    file=data.file,
                    key=DECODE_KEYS[1],
                ) from exc
            xs = np.unique(np.concatenate([np.linspace(0.0, 1.0, resolution), data.kv_usage]))
            ys = np.unique(
                np.concatenate(
                    [
                        np.linspace(0.0, float(data.context_length.max()), resolution),
                        data.context_length,
                    ]
                )
            )
            gx, gy = np.meshgrid(xs, ys)  # shape (len(ys), len(xs)): rows are context lengths
            rows = _RowSupport.of(data)
            if rows is not None:
                gx, gy = rows.clamp(gx, gy)
            grid = _interpolate(tri, points, values, gx, gy, scale=self._scale(data))
        self._xs = xs
        self._ys = ys
        self._itl = np.ascontiguousarray(grid[..., 0])
        self._thpt = np.ascontiguousarray(grid[..., 1])
        for arr in (self._xs, self._ys, self._itl, self._thpt):
            arr.setflags(write=False)

    @staticmethod
    def _scale(data: DecodeData) -> FloatArray:
        """Factors taking (KV usage, context) to about 0-1 each for the triangulation."""
        return np.array([1.0, 1.0 / float(data.context_length.max())])

    @classmethod
    def from_arrays(
        cls,
        *,
        kv_usage: npt.ArrayLike,
        context_length: npt.ArrayLike,
        itl_ms: npt.ArrayLike,
        thpt_per_gpu: npt.ArrayLike,
        max_kv_tokens: int,
        resolution: int = DEFAULT_RESOLUTION,
    ) -> DecodeInterpolator:
        """Build from in-memory samples, validated like a profile file."""
        data = decode_data(
            kv_usage=np.asarray(kv_usage),
            context_length=np.asarray(context_length),
            itl_ms=np.asarray(itl_ms),
            thpt_per_gpu=np.asarray(thpt_per_gpu),
            max_kv_tokens=max_kv_tokens,
        )
        return cls(data, resolution=resolution)

    # --- facts about the profile ----------------------------------------------------------

    @property
    def max_kv_tokens(self) -> int:
        """KV-cache capacity of one decode engine, tokens."""
        return self.data.max_kv_tokens

    @property
    def context_range(self) -> tuple[float, float]:
        """Smallest and largest sampled context length, tokens."""
        return float(self.data.context_length.min()), float(self.data.context_length.max())

    @property
    def grid(self) -> tuple[FloatArray, FloatArray, FloatArray, FloatArray]:
        """``(kv_usage, context_length, itl_ms, thpt_per_gpu)``: the axes, then two
        ``(len(context_length), len(kv_usage))`` surfaces (read-only)."""
        return self._xs, self._ys, self._itl, self._thpt

    def kv_usage_at(self, *, concurrency: float, context_length: float) -> float:
        """KV usage of ``concurrency`` requests of ``context_length`` tokens (Dynamo's formula)."""
        return concurrency * context_length / self.data.max_kv_tokens

    # --- point queries --------------------------------------------------------------------

    def itl_ms(self, kv_usage: float, context_length: float) -> float:
        """ITL in ms at ``kv_usage`` (0-1) and ``context_length`` tokens (clamped to the grid)."""
        return self.lookup(kv_usage, context_length).itl_ms

    def thpt_per_gpu(self, kv_usage: float, context_length: float) -> float:
        """Decode throughput in tokens/s/GPU at ``kv_usage`` and ``context_length``."""
        return self.lookup(kv_usage, context_length).thpt_per_gpu

    def itl_ms_at_concurrency(self, *, concurrency: float, context_length: float) -> float:
        """ITL in ms with ``concurrency`` running requests of ``context_length`` tokens each
        (what the planner's correction factor compares observed ITL against)."""
        return self.itl_ms(
            self.kv_usage_at(concurrency=concurrency, context_length=context_length),
            context_length,
        )

    def lookup(self, kv_usage: float, context_length: float) -> DecodePoint:
        """Both surfaces at one point, bilinear between grid nodes."""
        x = _finite(kv_usage, "kv_usage")
        y = _finite(context_length, "context_length")
        itl, thpt = self.surfaces_many(np.array([x]), np.array([y]))
        lo, hi = self.context_range
        return DecodePoint(
            kv_usage=x,
            context_length=y,
            itl_ms=float(itl[0]),
            thpt_per_gpu=float(thpt[0]),
            clamped=not (lo <= y <= hi and 0.0 <= x <= 1.0),
        )

    def surfaces_many(
        self, kv_usage: npt.ArrayLike, context_length: npt.ArrayLike
    ) -> tuple[FloatArray, FloatArray]:
        """Vectorised ``(itl_ms, thpt_per_gpu)`` at broadcast arrays of points."""
        x, y = np.broadcast_arrays(
            np.asarray(kv_usage, dtype=np.float64), np.asarray(context_length, dtype=np.float64)
        )
        ix, wx = _bracket(self._xs, x)
        iy, wy = _bracket(self._ys, y)
        out = []
        for surf in (self._itl, self._thpt):
            low = surf[iy, ix] * (1 - wx) + surf[iy, ix + 1] * wx
            high = surf[iy + 1, ix] * (1 - wx) + surf[iy + 1, ix + 1] * wx
            out.append(low * (1 - wy) + high * wy)
        return out[0], out[1]

    # --- capacity under an ITL target ------------------------------------------------------

    def find_best_throughput_per_gpu(self, itl_ms: float, context_length: float) -> DecodeBest:
        """Highest throughput per GPU whose ITL is at most ``itl_ms`` at ``context_length``.

        Along the context length's row the surfaces are piecewise linear in KV usage, so the
        feasible KV usages form a union of intervals whose ends are grid nodes or points where
        the ITL crosses the target; the best throughput is at one of those ends. The result is
        therefore exact for the interpolated surface, and it can only fall as the target
        tightens.
        """
        target = _finite(itl_ms, "itl_ms")
        many = self.find_best_many(target, np.array([_finite(context_length, "context_length")]))
        return DecodeBest(
            thpt_per_gpu=float(many.thpt_per_gpu[0]),
            itl_ms=float(many.itl_ms[0]),
            kv_usage=float(many.kv_usage[0]),
            feasible=bool(many.feasible[0]),
            clamped=bool(many.clamped[0]),
            context_length=float(context_length),
            itl_target_ms=target,
        )

    def find_best_many(self, itl_ms: float, context_length: npt.ArrayLike) -> DecodeBestMany:
        """:meth:`find_best_throughput_per_gpu` for an array of context lengths at once."""
        if not (np.isfinite(itl_ms) and itl_ms > 0):
            raise ValueError(f"the ITL target must be a positive number of ms, got {itl_ms!r}")
        ctx = np.asarray(context_length, dtype=np.float64)
        if not np.all(np.isfinite(ctx)):
            raise ValueError("context lengths must be finite numbers")
        flat = ctx.ravel()
        parts = []
        step = max(1, _CHUNK_CELLS // self._xs.size)
        for start in range(0, flat.size, step):
            parts.append(self._best_rows(float(itl_ms), flat[start : start + step]))
        fields = [np.concatenate([p[i] for p in parts]) if parts else np.empty(0) for i in range(5)]
        lo, hi = self.context_range
        return DecodeBestMany(
            thpt_per_gpu=fields[0].reshape(ctx.shape),
            itl_ms=fields[1].reshape(ctx.shape),
            kv_usage=fields[2].reshape(ctx.shape),
            feasible=fields[3].astype(bool).reshape(ctx.shape),
            clamped=((ctx < lo) | (ctx > hi)),
            lowest_itl_thpt_per_gpu=fields[4].reshape(ctx.shape),
        )

    def _best_rows(self, target: float, ctx: FloatArray) -> list[FloatArray]:
        iy, wy = _bracket(self._ys, ctx)
        w = wy[:, None]
        itl = self._itl[iy] * (1 - w) + self._itl[iy + 1] * w  # (m, nx)
        thpt = self._thpt[iy] * (1 - w) + self._thpt[iy + 1] * w
        xs = self._xs
        # Candidates: feasible nodes, and points inside a segment where the ITL crosses the
        # target (the feasible part of a segment ends there).
        node_ok = itl <= target
        a, b = itl[:, :-1], itl[:, 1:]
        crossing = (a - target) * (b - target) < 0
        with np.errstate(divide="ignore", invalid="ignore"):
            frac = np.where(crossing, (target - a) / (b - a), 0.0)
        cross_thpt = thpt[:, :-1] + frac * (thpt[:, 1:] - thpt[:, :-1])
        cross_x = xs[:-1] + frac * np.diff(xs)
        cand = np.concatenate(
            [np.where(node_ok, thpt, -np.inf), np.where(crossing, cross_thpt, -np.inf)], axis=1
        )
        cand_x = np.concatenate([np.broadcast_to(xs, itl.shape), cross_x], axis=1)
        cand_itl = np.concatenate([itl, np.full_like(cross_x, target)], axis=1)
        rows = np.arange(ctx.size)
        pick = np.argmax(cand, axis=1)
        best = cand[rows, pick]
        feasible = np.isfinite(best)
        lowest = np.argmin(itl, axis=1)
        return [
            np.where(feasible, best, 0.0),
            np.where(feasible, cand_itl[rows, pick], itl[rows, lowest]),
            np.where(feasible, cand_x[rows, pick], xs[lowest]),
            feasible.astype(np.float64),
            thpt[rows, lowest],
        ]


@dataclass(frozen=True, eq=False)
class _RowSupport:
    """KV-usage range profiled at each sampled context length (samples in rows)."""

    contexts: FloatArray  # sorted distinct sampled context lengths
    kv_min: FloatArray
    kv_max: FloatArray

    @classmethod
    def of(cls, data: DecodeData) -> _RowSupport | None:
        contexts, row, counts = np.unique(
            data.context_length, return_inverse=True, return_counts=True
        )
        if counts.min() < 2:  # truly scattered: keep the convex hull + nearest semantics
            return None
        kv_min = np.full(contexts.size, np.inf)
        kv_max = np.full(contexts.size, -np.inf)
        np.minimum.at(kv_min, row, data.kv_usage)
        np.maximum.at(kv_max, row, data.kv_usage)
        return cls(contexts=contexts, kv_min=kv_min, kv_max=kv_max)

    def clamp(self, x: FloatArray, y: FloatArray) -> tuple[FloatArray, FloatArray]:
        """Points moved into the profiled region: context into the sampled range, KV usage
        into the range profiled at both sampled contexts around it."""
        c = self.contexts
        y = np.clip(y, c[0], c[-1])
        above = np.clip(np.searchsorted(c, y, side="left"), 0, c.size - 1)
        below = np.clip(np.searchsorted(c, y, side="right") - 1, 0, c.size - 1)
        lo = np.maximum(self.kv_min[below], self.kv_min[above])
        hi = np.minimum(self.kv_max[below], self.kv_max[above])
        # Rows whose ranges do not overlap leave no common range; keep x there (hull rules).
        ok = lo <= hi
        return np.where(ok, np.clip(x, np.minimum(lo, hi), hi), x), y


def _interpolate(
    tri: Delaunay,
    points: FloatArray,
    values: FloatArray,
    x: FloatArray,
    y: FloatArray,
    *,
    scale: FloatArray,
) -> FloatArray:
    """Limited Clough-Tocher interpolation at ``(x, y)``, nearest sample outside the hull.

    ``tri`` triangulates ``points * scale``; the nearest sample is found in raw coordinates.
    Returns shape ``x.shape + (values.shape[1],)``.
    """
    raw = np.column_stack([x.ravel(), y.ravel()])
    q = raw * scale
    out = CloughTocher2DInterpolator(tri, values)(q)
    simplex = tri.find_simplex(q)
    inside = simplex >= 0
    corner_values = values[tri.simplices[simplex[inside]]]  # (m, 3, k)
    lo, hi = corner_values.min(axis=1), corner_values.max(axis=1)
    cubic = out[inside]
    overshoot = ~((cubic >= lo) & (cubic <= hi))  # also catches NaN
    if overshoot.any():
        linear = LinearNDInterpolator(tri, values)(q[inside])
        cubic[overshoot] = linear[overshoot]
        out[inside] = cubic
    missing = np.any(np.isnan(out), axis=1)
    if missing.any():
        out[missing] = NearestNDInterpolator(points, values)(raw[missing])
    return out.reshape((*x.shape, values.shape[1]))


def _bracket(grid: FloatArray, q: FloatArray) -> tuple[npt.NDArray[np.intp], FloatArray]:
    """Index ``i`` of the grid cell holding each ``q`` (clamped) and its weight 0-1 in it."""
    q = np.clip(q, grid[0], grid[-1])
    i = np.clip(np.searchsorted(grid, q, side="right") - 1, 0, grid.size - 2)
    w = (q - grid[i]) / (grid[i + 1] - grid[i])
    return i, w


def _finite(value: float, name: str) -> float:
    out = float(value)
    if not np.isfinite(out):
        raise ValueError(f"{name} must be a finite number, got {value!r}")
    return out
