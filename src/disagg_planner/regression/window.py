"""A bounded sample window that keeps coverage of the whole load range.

A plain FIFO window forgets the light-load samples during a long burst (and the heavy-load
ones during a quiet night), and a regression fitted on a narrow range extrapolates badly.
Here, when the window is over capacity, the oldest sample of the *fullest* bucket is
retired, so the well-covered load levels give way first. Buckets are equal-width over the
observed ``[min, max]`` of each bucketing axis and are recomputed on every retirement, so
they follow the range as it grows. With one bucketing axis there are ``bucket_count``
buckets; with two, ``sqrt(bucket_count)`` per axis (``bucket_count`` must then be a perfect
square).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt


@dataclass(frozen=True)
class _Sample:
    seq: int
    features: tuple[float, ...]
    wall_time: float


class BucketedWindow:
    """Samples ``(features, wall_time)`` with bucketed retirement.

    >>> w = BucketedWindow(capacity=4, bucket_count=2, num_features=1)
    >>> for x in (1.0, 2.0, 3.0, 100.0, 4.0):
    ...     w.add((x,), x / 10)
    >>> sorted(float(v) for v in w.features()[:, 0])  # 1.0, the oldest light one, retired
    [2.0, 3.0, 4.0, 100.0]
    """

    def __init__(
        self,
        *,
        capacity: int,
        bucket_count: int,
        num_features: int,
        bucket_axes: Sequence[int] | None = None,
    ) -> None:
        """``bucket_axes``: feature columns the buckets are laid over (default: all, max 2)."""
        if capacity < 1:
            raise ValueError(f"capacity must be >= 1, got {capacity}")
        if bucket_count < 1:
            raise ValueError(f"bucket_count must be >= 1, got {bucket_count}")
        if num_features < 1:
            raise ValueError(f"num_features must be >= 1, got {num_features}")
        axes = tuple(range(num_features)) if bucket_axes is None else tuple(bucket_axes)
        if not 1 <= len(axes) <= 2 or any(not 0 <= a < num_features for a in axes):
            raise ValueError(
                f"bucket_axes must name 1 or 2 of the {num_features} feature columns, got {axes}"
            )
        if len(axes) == 2:
            per_axis = math.isqrt(bucket_count)
            if per_axis * per_axis != bucket_count:
                raise ValueError(
                    f"bucket_count must be a perfect square for 2-D bucketing, got {bucket_count}"
                )
        else:
            per_axis = bucket_count
        self.capacity = capacity
        self.num_features = num_features
        self._axes = axes
        self._per_axis = per_axis
        self._samples: list[_Sample] = []
        self._seq = 0

    def __len__(self) -> int:
        return len(self._samples)

    def add(self, features: Sequence[float], wall_time: float) -> None:
        """Add one sample; retire one if over capacity."""
        if len(features) != self.num_features:
            raise ValueError(f"expected {self.num_features} features, got {len(features)}")
        self._samples.append(_Sample(self._seq, tuple(float(f) for f in features), wall_time))
        self._seq += 1
        if len(self._samples) > self.capacity:
            del self._samples[self._retiree()]

    def _retiree(self) -> int:
        """Index of the oldest sample in the fullest bucket (ties: the bucket with the
        oldest sample, which makes a uniformly covered window behave as a FIFO)."""
        coords = np.array([[s.features[a] for a in self._axes] for s in self._samples])
        lo = coords.min(axis=0)
        span = coords.max(axis=0) - lo
        scaled = np.where(span > 0, (coords - lo) / np.where(span > 0, span, 1.0), 0.0)
        cells = np.minimum((scaled * self._per_axis).astype(int), self._per_axis - 1)
        keys = [tuple(row) for row in cells.tolist()]
        counts: dict[tuple[int, ...], int] = {}
        first: dict[tuple[int, ...], int] = {}
        for i, key in enumerate(keys):  # samples are kept in arrival order
            counts[key] = counts.get(key, 0) + 1
            first.setdefault(key, i)
        fullest = max(counts.values())
        victim = min(first[k] for k, c in counts.items() if c == fullest)
        return victim

    def features(self) -> npt.NDArray[np.float64]:
        """Feature matrix, shape ``(n, num_features)``, in arrival order."""
        if not self._samples:
            return np.empty((0, self.num_features))
        return np.array([s.features for s in self._samples], dtype=np.float64)

    def wall_times(self) -> npt.NDArray[np.float64]:
        """Targets (s), shape ``(n,)``, aligned with :meth:`features`."""
        return np.array([s.wall_time for s in self._samples], dtype=np.float64)

    def clear(self) -> None:
        self._samples.clear()
