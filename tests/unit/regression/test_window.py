"""Bucketed retirement keeps the load range covered; a FIFO window would not."""

from __future__ import annotations

import numpy as np
import pytest

from disagg_planner.regression.window import BucketedWindow


def test_uniformly_covered_window_behaves_as_fifo() -> None:
    window = BucketedWindow(capacity=8, bucket_count=4, num_features=1)
    for i in range(20):
        window.add((float(i % 4),), 0.0)  # every bucket gets the same share
    assert len(window) == 8
    # the 8 newest samples survive: two of each level
    assert sorted(window.features()[:, 0].tolist()) == [0, 0, 1, 1, 2, 2, 3, 3]


def test_long_burst_does_not_erase_light_load_samples() -> None:
    window = BucketedWindow(capacity=64, bucket_count=16, num_features=1)
    rng = np.random.default_rng(1)
    for tokens in rng.uniform(100, 1000, size=64):  # light load first
        window.add((tokens,), 0.0)
    for tokens in rng.uniform(7000, 8192, size=500):  # then a long burst
        window.add((tokens,), 0.0)
    x = window.features()[:, 0]
    assert len(window) == 64
    light = int((x < 1000).sum())
    # a FIFO window would hold 0 light samples; buckets keep a bucket's worth or more
    assert light >= 64 // 16
    assert (x > 7000).sum() >= 32  # and the burst still dominates the window


def test_two_dimensional_buckets_keep_both_corners() -> None:
    window = BucketedWindow(capacity=16, bucket_count=4, num_features=2)
    window.add((0.0, 1e5), 0.0)  # prefill-free, KV-heavy corner, seen once early
    for i in range(300):
        window.add((8000.0 + i, 100.0 + i), 0.0)  # then only prefill-heavy iterations
    rows = window.features()
    assert any(row[0] == 0.0 and row[1] == 1e5 for row in rows)


def test_bucket_axes_choose_the_columns_buckets_span() -> None:
    window = BucketedWindow(capacity=4, bucket_count=4, num_features=2, bucket_axes=(1,))
    # column 0 varies wildly but buckets follow column 1 only
    for i, kv in enumerate([10.0, 10.0, 10.0, 10.0, 1000.0]):
        window.add((float(i * 1000), kv), float(i))
    assert 1000.0 in window.features()[:, 1]
    assert window.wall_times().tolist() == [1.0, 2.0, 3.0, 4.0]  # oldest of the full bucket went


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"capacity": 0, "bucket_count": 4, "num_features": 1}, "capacity must be >= 1"),
        ({"capacity": 4, "bucket_count": 0, "num_features": 1}, "bucket_count must be >= 1"),
        ({"capacity": 4, "bucket_count": 8, "num_features": 2}, "perfect square"),
        (
            {"capacity": 4, "bucket_count": 4, "num_features": 1, "bucket_axes": (1,)},
            "bucket_axes",
        ),
    ],
)
def test_bad_construction_is_named(kwargs: dict[str, object], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        BucketedWindow(**kwargs)  # type: ignore[arg-type]


def test_wrong_feature_count_is_rejected() -> None:
    window = BucketedWindow(capacity=4, bucket_count=4, num_features=2)
    with pytest.raises(ValueError, match="expected 2 features, got 1"):
        window.add((1.0,), 0.0)
