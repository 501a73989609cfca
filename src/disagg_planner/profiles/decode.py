"""Decode capacity as a function of KV-cache usage and context length.

Model: the profile samples, at scattered (KV usage, context length) points, the inter-token
latency of a decode engine (``itl_ms``, ms) and the decode throughput per GPU it achieves there
(``thpt_per_gpu``, output tokens/s/GPU). KV usage is the fraction of the engine's
``max_kv_tokens`` held by running requests, so ``kv_usage = concurrency * context_length /
max_kv_tokens``.

As in Dynamo, the scattered samples are put on a regular grid once, with a piecewise cubic
(Clough-Tocher) interpolant over their Delaunay triangulation (``griddata(method="cubic")``).
Unlike Dynamo:

* the triangulation and the cubic work in coordinates where KV usage and the logarithm of the
  context length both span 0-1 (profiles sample contexts geometrically, 256 to 128k; in raw
  coordinates the KV axis is ~10^4 times shorter, Qhull drops samples lying along a context
  row as numerically coplanar, and triangles are needlessly thin);
* the grid also contains every sampled KV usage and context length, so the samples are
  reproduced exactly, and lookups interpolate bilinearly between nodes instead of rounding to
  the nearest node (Dynamo's 100x100 snapping costs a few percent);
* where the cubic leaves the range of its triangle's three sample values (an overshoot, which
  in Dynamo can even give negative throughput), the node takes the linear interpolant's value;
* outside the samples' convex hull -- a KV usage above what a context's sweep reached, below
  the first sample, or a context outside the sampled ones -- the value is **extrapolated**
  from a fit of the decode step's cost (below), anchored to the nearest interpolated value, and
  the answer says so (``extrapolated``, with a ``note``). Nothing is clamped to neighbouring
  rows or to the nearest sample: a KV usage beyond one row's sweep still reads the ITL rising
  with the batch;
* :meth:`DecodeInterpolator.find_best_throughput_per_gpu` maximises throughput over the exact
  set of KV usages whose ITL meets the target (vectorised; crossing points between nodes are
  solved for), and says "infeasible" when none does instead of returning the first node.

The fit (:class:`DecodeCostFit`, :mod:`disagg_planner.profiles.decode_fit`) is the form of a
decode step in a roofline engine model; beyond a row's sweep the extrapolated values are the
fit scaled by the ratio (sample / fit) at the row's last node inside the hull; beyond the
sampled contexts, by the edge row's ratio at the same KV usage.

The grid spans KV usage 0-1 and the sampled contexts; a KV usage outside 0-1 is clamped and
flagged (no engine holds more than its cache).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt
from scipy.interpolate import CloughTocher2DInterpolator, LinearNDInterpolator
from scipy.spatial import Delaunay, QhullError
from threadpoolctl import threadpool_limits  # type: ignore[import-untyped]

from disagg_planner.profiles.decode_fit import DecodeCostFit
from disagg_planner.profiles.errors import ProfileError
from disagg_planner.profiles.storage import DECODE_KEYS, DecodeData, FloatArray, decode_data

__all__ = ["DecodeBest", "DecodeBestMany", "DecodeCostFit", "DecodeInterpolator", "DecodePoint"]

DEFAULT_RESOLUTION = 200
# A request holds at least one token; shorter "contexts" are answered as this one.
_MIN_CONTEXT = 1.0
# Rows of the (contexts x KV nodes) work arrays handled at once by the vectorised search.
_CHUNK_CELLS = 1 << 20


@dataclass(frozen=True)
class DecodePoint:
    """ITL (ms) and throughput (tokens/s/GPU) at one KV usage and context length.

    ``extrapolated`` is true when the point lay outside the profiled samples (the values
    come from the cost fit, see the module doc); ``note`` then says where and how.
    """

    kv_usage: float
    context_length: float
    itl_ms: float
    thpt_per_gpu: float
    extrapolated: bool
    note: str | None = None

    @property
    def clamped(self) -> bool:
        """The former name of :attr:`extrapolated` (outside the profiled samples)."""
        return self.extrapolated


@dataclass(frozen=True)
class DecodeBest:
    """The highest-throughput operating point whose ITL meets a target, at one context length.

    When ``feasible`` is false no KV usage meets the target: ``thpt_per_gpu`` is 0.0 and
    ``itl_ms``/``kv_usage`` describe the lowest-ITL point there is (how far off the target
    is). ``extrapolated`` says the answer lay outside the profiled samples (a context outside
    the sampled ones, or a KV usage beyond the sweep there), so it comes from the cost fit;
    ``note`` says where, for a decision's reasons.
    """

    thpt_per_gpu: float
    itl_ms: float
    kv_usage: float
    feasible: bool
    extrapolated: bool
    context_length: float = 0.0
    itl_target_ms: float = 0.0
    note: str | None = None

    @property
    def clamped(self) -> bool:
        """The former name of :attr:`extrapolated`."""
        return self.extrapolated


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
    extrapolated: npt.NDArray[np.bool_]
    lowest_itl_thpt_per_gpu: FloatArray

    @property
    def clamped(self) -> npt.NDArray[np.bool_]:
        """The former name of :attr:`extrapolated`."""
        return self.extrapolated


class DecodeInterpolator:
    """ITL and throughput per GPU of one decode engine by KV usage and context length.

    The grid is built once here; every query afterwards is array arithmetic on it.
    ``resolution`` is the number of evenly spaced nodes on each axis before the sampled
    coordinates are merged in (Dynamo uses 100).
    """

    def __init__(
        self,
        data: DecodeData,
        *,
        resolution: int = DEFAULT_RESOLUTION,
        max_running: float | None = None,
    ) -> None:
        if resolution < 2:
            raise ValueError(f"resolution must be at least 2, got {resolution}")
        if max_running is not None and not (math.isfinite(max_running) and max_running >= 1):
            raise ValueError(f"max_running must be a number >= 1 or None, got {max_running!r}")
        self.data = data
        # The most requests the engine runs at once (max_num_seqs x DP ranks, from the
        # profile's manifest): no answer of find_best holds more, wherever the surface would
        # put a higher KV usage at a short context (the sweep stops there: the seats are full).
        self.max_running = max_running
        # Qhull solves one tiny LAPACK system per triangle; with OpenBLAS's thread pool on a
        # busy or CPU-limited host each solve spins for milliseconds (measured: 1.5 s instead
        # of 0.1 ms for 56 samples), so the grid is built with one BLAS thread.
        self.fit = fit = DecodeCostFit.of(data)
        with threadpool_limits(limits=1, user_api="blas"):
            points = np.column_stack([data.kv_usage, data.context_length])
            # What is interpolated is each sample's ratio to the cost fit, close to 1 and
            # smooth, so that between sparse samples (a row the sweep stopped short, rows far
            # apart) the surface follows the engine's cost instead of blending neighbours.
            fit_itl = fit.itl_ms(data.kv_usage, data.context_length)
            fit_thpt = fit.thpt_per_gpu(data.kv_usage, data.context_length, data.itl_ms)
            values = np.column_stack(
                [_ratio(data.itl_ms, fit_itl), _ratio(data.thpt_per_gpu, fit_thpt)]
            )
            try:
                tri = Delaunay(self._unit(points))
            except QhullError as exc:
                raise ProfileError(
                    "the decode points lie on one line, so no surface can be interpolated; "
                    "profile more than one KV usage at more than one context length",
                    file=data.file,
                    key=DECODE_KEYS[1],
                ) from exc
            xs = np.unique(np.concatenate([np.linspace(0.0, 1.0, resolution), data.kv_usage]))
            lo, hi = self.context_range
            ys = np.unique(np.concatenate([np.geomspace(lo, hi, resolution), data.context_length]))
            gx, gy = np.meshgrid(xs, ys)  # shape (len(ys), len(xs)): rows are context lengths
            nodes = np.column_stack([gx.ravel(), gy.ravel()])
            ratios, inside_flat = _interpolate(tri, values, self._unit(nodes))
            inside = inside_flat.reshape(gx.shape)
            r_itl = _anchor_outside(ratios[:, 0].reshape(gx.shape), inside)
            r_thpt = _anchor_outside(ratios[:, 1].reshape(gx.shape), inside)
        self._xs = xs
        self._ys = ys
        self._r_itl = r_itl
        self._r_thpt = r_thpt
        self._itl, self._thpt = self._from_ratios(gx, gy, r_itl, r_thpt)
        self._outside = np.ascontiguousarray(~inside)
        for arr in (self._xs, self._ys, self._itl, self._thpt, self._outside, r_itl, r_thpt):
            arr.setflags(write=False)

    def _from_ratios(
        self, x: FloatArray, y: FloatArray, r_itl: FloatArray, r_thpt: FloatArray
    ) -> tuple[FloatArray, FloatArray]:
        """ITL and throughput from the cost fit and the ratios to it."""
        itl = self.fit.itl_ms(x, y) * r_itl
        thpt = self.fit.thpt_per_gpu(x, y, itl) * r_thpt
        return np.ascontiguousarray(itl), np.ascontiguousarray(thpt)

    def _unit(self, points: FloatArray) -> FloatArray:
        """(KV usage, context) to the triangulation's coordinates: KV usage and log context,
        both spanning about 0-1 over the samples."""
        lo, hi = np.log(self.context_range)
        span = max(float(hi - lo), 1e-12)
        return np.column_stack([points[:, 0], (np.log(points[:, 1]) - lo) / span])

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
        """Both surfaces at one point, bilinear between grid nodes (extrapolated, and said
        so, outside the profiled samples)."""
        x = _finite(kv_usage, "kv_usage")
        y = _finite(context_length, "context_length")
        itl, thpt, outside = self._surfaces(np.array([x]), np.array([y]))
        extrapolated = bool(outside[0])
        return DecodePoint(
            kv_usage=x,
            context_length=y,
            itl_ms=float(itl[0]),
            thpt_per_gpu=float(thpt[0]),
            extrapolated=extrapolated,
            note=self._note(x, y) if extrapolated else None,
        )

    def surfaces_many(
        self, kv_usage: npt.ArrayLike, context_length: npt.ArrayLike
    ) -> tuple[FloatArray, FloatArray]:
        """Vectorised ``(itl_ms, thpt_per_gpu)`` at broadcast arrays of points."""
        itl, thpt, _outside = self._surfaces(kv_usage, context_length)
        return itl, thpt

    def extrapolated_many(
        self, kv_usage: npt.ArrayLike, context_length: npt.ArrayLike
    ) -> npt.NDArray[np.bool_]:
        """Whether each point lies outside the profiled samples (see :meth:`lookup`)."""
        return self._surfaces(kv_usage, context_length)[2]

    def _surfaces(
        self, kv_usage: npt.ArrayLike, context_length: npt.ArrayLike
    ) -> tuple[FloatArray, FloatArray, npt.NDArray[np.bool_]]:
        x, y = np.broadcast_arrays(
            np.asarray(kv_usage, dtype=np.float64), np.asarray(context_length, dtype=np.float64)
        )
        shape = x.shape
        xf, yf = x.ravel(), np.maximum(y.ravel(), _MIN_CONTEXT)
        xc = np.clip(xf, 0.0, 1.0)
        ix, wx = _bracket(self._xs, xc)
        iy, wy = _bracket(self._ys, yf)
        out = []
        for surf in (self._itl, self._thpt):
            low = surf[iy, ix] * (1 - wx) + surf[iy, ix + 1] * wx
            high = surf[iy + 1, ix] * (1 - wx) + surf[iy + 1, ix + 1] * wx
            out.append(low * (1 - wy) + high * wy)
        itl, thpt = out
        o = self._outside
        # A node counts when it carries weight: a sample on the hull's edge is not outside.
        outside = (
            (o[iy, ix] & (wx < 1) & (wy < 1))
            | (o[iy, ix + 1] & (wx > 0) & (wy < 1))
            | (o[iy + 1, ix] & (wx < 1) & (wy > 0))
            | (o[iy + 1, ix + 1] & (wx > 0) & (wy > 0))
            | (xf != xc)
        )
        lo, hi = self.context_range
        beyond = (yf < lo) | (yf > hi)
        if beyond.any():
            # The edge row's ratios to the fit, carried on at the same KV usage.
            row = np.where(yf[beyond] < lo, 0, self._ys.size - 1)
            ib, wb = ix[beyond], wx[beyond]
            ratios = [
                r[row, ib] * (1 - wb) + r[row, ib + 1] * wb for r in (self._r_itl, self._r_thpt)
            ]
            itl[beyond], thpt[beyond] = self._from_ratios(xc[beyond], yf[beyond], *ratios)
            outside[beyond] = True
        return itl.reshape(shape), thpt.reshape(shape), outside.reshape(shape)

    def _rows(self, ctx: FloatArray) -> tuple[FloatArray, FloatArray, npt.NDArray[np.bool_]]:
        """ITL, throughput and outside-the-samples flags along the KV axis at each context,
        shape ``(len(ctx), len(kv_usage grid))``."""
        iy, wy = _bracket(self._ys, ctx)
        w = wy[:, None]
        itl = self._itl[iy] * (1 - w) + self._itl[iy + 1] * w
        thpt = self._thpt[iy] * (1 - w) + self._thpt[iy + 1] * w
        outside = (self._outside[iy] & (w < 1)) | (self._outside[iy + 1] & (w > 0))
        lo, hi = self.context_range
        beyond = (ctx < lo) | (ctx > hi)
        if beyond.any():
            row = np.where(ctx[beyond] < lo, 0, self._ys.size - 1)
            itl[beyond], thpt[beyond] = self._from_ratios(
                self._xs[None, :], ctx[beyond][:, None], self._r_itl[row], self._r_thpt[row]
            )
            outside[beyond] = True
        return itl, thpt, outside

    def profiled_kv_usage(self, context_length: float) -> tuple[float, float] | None:
        """KV-usage range the samples cover at ``context_length`` (None outside them)."""
        _itl, _thpt, outside = self._rows(np.array([_finite(context_length, "context_length")]))
        inside = self._xs[~outside[0]]
        return (float(inside.min()), float(inside.max())) if inside.size else None

    def _note(self, kv_usage: float, context_length: float) -> str:
        lo, hi = self.context_range
        if not lo <= context_length <= hi:
            where = f"context {context_length:g} is outside the profiled {lo:g}-{hi:g}"
        elif not 0.0 <= kv_usage <= 1.0:
            where = f"KV usage {kv_usage:g} is outside 0-1 (taken at the nearest end)"
        else:
            covered = self.profiled_kv_usage(context_length)
            span = f"{covered[0]:.3f}-{covered[1]:.3f}" if covered else "none"
            where = (
                f"KV usage {kv_usage:.3f} at context {context_length:g} is outside the "
                f"profiled samples (KV usage {span} there)"
            )
        f = self.fit
        return (
            f"{where}: extrapolated from the decode cost fit ITL = {f.base_ms:.3g} ms + "
            f"{f.per_seq_ms:.3g} ms x requests + {f.per_kv_token_ms:.3g} ms x KV tokens"
            + (
                f" + {f.per_seq_above_knee_ms:.3g} ms x requests above {f.knee_batch:.0f}"
                if f.per_seq_above_knee_ms > 0
                else ""
            )
        )

    # --- capacity under an ITL target ------------------------------------------------------

    def find_best_throughput_per_gpu(self, itl_ms: float, context_length: float) -> DecodeBest:
        """Highest throughput per GPU whose ITL is at most ``itl_ms`` at ``context_length``.

        Along the context length's row the surfaces are piecewise linear in KV usage, so the
        feasible KV usages form a union of intervals whose ends are grid nodes or points where
        the ITL crosses the target; the best throughput is at one of those ends. The result is
        therefore exact for the interpolated (or extrapolated) surface, and it can only fall
        as the target tightens.
        """
        target = _finite(itl_ms, "itl_ms")
        ctx = _finite(context_length, "context_length")
        many = self.find_best_many(target, np.array([ctx]))
        extrapolated = bool(many.extrapolated[0])
        kv = float(many.kv_usage[0])
        return DecodeBest(
            thpt_per_gpu=float(many.thpt_per_gpu[0]),
            itl_ms=float(many.itl_ms[0]),
            kv_usage=kv,
            feasible=bool(many.feasible[0]),
            extrapolated=extrapolated,
            context_length=ctx,
            itl_target_ms=target,
            note=self._note(kv, ctx) if extrapolated else None,
        )

    def find_best_many(self, itl_ms: float, context_length: npt.ArrayLike) -> DecodeBestMany:
        """:meth:`find_best_throughput_per_gpu` for an array of context lengths at once.

        ``itl_ms`` may be ``math.inf``: no target, the saturated engine's best throughput (up
        to its seats), the physical limit a policy that ignores the SLO can reach."""
        if not (itl_ms > 0):  # NaN fails this too
            raise ValueError(f"the ITL target must be a positive number of ms, got {itl_ms!r}")
        ctx = np.asarray(context_length, dtype=np.float64)
        if not np.all(np.isfinite(ctx)):
            raise ValueError("context lengths must be finite numbers")
        flat = np.maximum(ctx.ravel(), _MIN_CONTEXT)
        parts = []
        step = max(1, _CHUNK_CELLS // self._xs.size)
        for start in range(0, flat.size, step):
            parts.append(self._best_rows(float(itl_ms), flat[start : start + step]))
        fields = [np.concatenate([p[i] for p in parts]) if parts else np.empty(0) for i in range(6)]
        return DecodeBestMany(
            thpt_per_gpu=fields[0].reshape(ctx.shape),
            itl_ms=fields[1].reshape(ctx.shape),
            kv_usage=fields[2].reshape(ctx.shape),
            feasible=fields[3].astype(bool).reshape(ctx.shape),
            extrapolated=fields[5].astype(bool).reshape(ctx.shape),
            lowest_itl_thpt_per_gpu=fields[4].reshape(ctx.shape),
        )

    def _best_rows(self, target: float, ctx: FloatArray) -> list[FloatArray]:
        itl, thpt, outside = self._rows(ctx)  # (m, nx)
        xs = self._xs
        m = ctx.size
        # An operating point holds at least one request: KV usage below one request's share
        # (a fraction of a batch) is no answer, though the fit gives ITLs there.
        x_one = np.minimum(ctx / self.data.max_kv_tokens, 1.0)
        j, wj = _bracket(xs, x_one)
        rows = np.arange(m)
        one_itl = itl[rows, j] * (1 - wj) + itl[rows, j + 1] * wj
        one_thpt = thpt[rows, j] * (1 - wj) + thpt[rows, j + 1] * wj
        one_out = (outside[rows, j] & (wj < 1)) | (outside[rows, j + 1] & (wj > 0))
        # ... and at most the engine's seats: KV usage above the full batch's is no answer
        if self.max_running is None:
            x_cap = np.ones_like(ctx)
        else:
            x_cap = np.minimum(self.max_running * ctx / self.data.max_kv_tokens, 1.0)
        k, wk = _bracket(xs, x_cap)
        cap_itl = itl[rows, k] * (1 - wk) + itl[rows, k + 1] * wk
        cap_thpt = thpt[rows, k] * (1 - wk) + thpt[rows, k + 1] * wk
        cap_out = (outside[rows, k] & (wk < 1)) | (outside[rows, k + 1] & (wk > 0))
        # nodes with at least one request and no more than the seats
        real = (xs[None, :] >= x_one[:, None]) & (xs[None, :] <= x_cap[:, None])
        # Candidates: feasible nodes, points inside a segment where the ITL crosses the
        # target (the feasible part of a segment ends there), and the one-request point.
        node_ok = (itl <= target) & real
        a, b = itl[:, :-1], itl[:, 1:]
        with np.errstate(divide="ignore", invalid="ignore"):
            frac = np.where((a - target) * (b - target) < 0, (target - a) / (b - a), 0.0)
        cross_x = xs[:-1] + frac * np.diff(xs)
        crossing = (
            ((a - target) * (b - target) < 0)
            & (cross_x >= x_one[:, None])
            & (cross_x <= x_cap[:, None])
        )
        cross_thpt = thpt[:, :-1] + frac * (thpt[:, 1:] - thpt[:, :-1])
        cand = np.concatenate(
            [
                np.where(node_ok, thpt, -np.inf),
                np.where(crossing, cross_thpt, -np.inf),
                np.where(one_itl <= target, one_thpt, -np.inf)[:, None],
                np.where((cap_itl <= target) & (x_cap >= x_one), cap_thpt, -np.inf)[:, None],
            ],
            axis=1,
        )
        cand_x = np.concatenate(
            [np.broadcast_to(xs, itl.shape), cross_x, x_one[:, None], x_cap[:, None]], axis=1
        )
        cand_itl = np.concatenate(
            [itl, np.full_like(cross_x, target), one_itl[:, None], cap_itl[:, None]], axis=1
        )
        cand_thpt = np.concatenate([thpt, cross_thpt, one_thpt[:, None], cap_thpt[:, None]], axis=1)
        cand_out = np.concatenate(
            [outside, outside[:, :-1] | outside[:, 1:], one_out[:, None], cap_out[:, None]],
            axis=1,
        )
        pick = np.argmax(cand, axis=1)
        best = cand[rows, pick]
        feasible = np.isfinite(best)
        # Infeasible: the lowest ITL among the real operating points.
        real_itl = np.concatenate(
            [
                np.where(real, itl, np.inf),
                np.full_like(cross_x, np.inf),
                one_itl[:, None],
                np.where(x_cap >= x_one, cap_itl, np.inf)[:, None],
            ],
            axis=1,
        )
        lowest = np.argmin(real_itl, axis=1)
        return [
            np.where(feasible, best, 0.0),
            np.where(feasible, cand_itl[rows, pick], cand_itl[rows, lowest]),
            np.where(feasible, cand_x[rows, pick], cand_x[rows, lowest]),
            feasible.astype(np.float64),
            cand_thpt[rows, lowest],
            np.where(feasible, cand_out[rows, pick], cand_out[rows, lowest]).astype(np.float64),
        ]


def _interpolate(
    tri: Delaunay, values: FloatArray, q: FloatArray
) -> tuple[FloatArray, npt.NDArray[np.bool_]]:
    """Limited Clough-Tocher interpolation at the points ``q`` (the triangulation's
    coordinates): values shape ``(len(q), k)`` (NaN outside the hull) and which points lie
    inside the hull."""
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
    return out, inside


def _ratio(value: FloatArray, fit: FloatArray) -> FloatArray:
    """``value / fit``, 1 where the fit is zero (no load at all: nothing to scale)."""
    out = np.ones_like(value)
    np.divide(value, fit, out=out, where=fit > 0)
    return out


def _anchor_outside(ratio: FloatArray, inside: npt.NDArray[np.bool_]) -> FloatArray:
    """Ratios at nodes outside the hull: those of the row's nearest node inside it (1, the
    pure fit, in a row without one). The hull is convex, so a row's inside nodes are one run:
    nodes left of it take its first node's ratio, nodes right of it its last's."""
    out = ratio.copy()
    for r in range(ratio.shape[0]):
        row_in = np.flatnonzero(inside[r])
        outside = np.flatnonzero(~inside[r])
        if outside.size == 0:
            continue
        if row_in.size == 0:
            out[r, outside] = 1.0
        else:
            out[r, outside] = ratio[r, np.where(outside < row_in[0], row_in[0], row_in[-1])]
    return out


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
