"""Distribution-aware sizing against Dynamo's mean-based sizing."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest

from disagg_planner.profiles import Profile, load_profile
from disagg_planner.profiles.sizing import (
    decode_gpus_for_distribution,
    decode_gpus_for_mean,
    decode_sizing_for_distribution,
    histogram_mean,
    prefill_gpus_for_distribution,
    prefill_gpus_for_mean,
    prefill_sizing_for_distribution,
)
from tests.unit.profiles.engine_model import Engine, write_dynamo_layout

# Token-count buckets like the frontend's (powers of two) with the overflow bucket.
BOUNDS = [2.0**k for k in range(4, 18)] + [math.inf]
INTERVAL_S = 60.0
N = 6000


@pytest.fixture(scope="module")
def profile(tmp_path_factory: pytest.TempPathFactory) -> Profile:
    directory: Path = tmp_path_factory.mktemp("profile")
    return load_profile(write_dynamo_layout(directory, Engine().arrays()))


def histogram(lengths: np.ndarray) -> list[float]:
    """Per-bucket counts of ``lengths`` under ``le`` semantics (bucket i is (b[i-1], b[i]])."""
    index = np.searchsorted(BOUNDS, lengths, side="left")
    return np.bincount(index, minlength=len(BOUNDS)).astype(float).tolist()


def bimodal(rng: np.random.Generator, short: float, long: float, long_share: float) -> np.ndarray:
    is_long = rng.random(N) < long_share
    lengths = np.where(
        is_long, rng.lognormal(np.log(long), 0.15, N), rng.lognormal(np.log(short), 0.3, N)
    )
    return np.maximum(np.round(lengths), 1.0)


def test_bimodal_prompts_mean_sizing_under_provisions_prefill(profile: Profile) -> None:
    """90% short prompts, 10% very long ones. The true prefill work is the sum over requests
    of isl / T_p(isl); sizing from the mean ISL misses the long prompts' extra cost."""
    isl = bimodal(np.random.default_rng(7), short=500, long=12000, long_share=0.1)
    needed = float(np.sum(isl / profile.prefill.thpt_per_gpu_many(isl))) / INTERVAL_S

    mean_based = prefill_gpus_for_mean(
        profile.prefill, mean_isl=float(isl.mean()), num_requests=N, interval_s=INTERVAL_S
    )
    aware = prefill_sizing_for_distribution(
        profile.prefill,
        isl_bounds=BOUNDS,
        isl_counts=histogram(isl),
        interval_s=INTERVAL_S,
        isl_sum=float(isl.sum()),
    )
    assert mean_based < 0.85 * needed  # ~21% short
    assert aware.gpus == pytest.approx(needed, rel=0.02)
    assert math.ceil(mean_based) < math.ceil(needed) <= math.ceil(aware.gpus)
    assert aware.requests == N
    assert aware.demand_tokens_per_s == pytest.approx(isl.sum() / INTERVAL_S)
    # Without the histogram's sum the within-bucket shape is uniform: cruder, still not short.
    uniform = prefill_gpus_for_distribution(
        profile.prefill, isl_bounds=BOUNDS, isl_counts=histogram(isl), interval_s=INTERVAL_S
    )
    assert needed <= uniform < 1.1 * needed


def test_bimodal_outputs_mean_sizing_under_provisions_decode(profile: Profile) -> None:
    """10% of requests generate long outputs at long contexts, where the ITL target allows
    far less throughput per GPU; the mean context hides them."""
    rng = np.random.default_rng(11)
    isl = np.maximum(np.round(rng.lognormal(np.log(1000), 0.3, N)), 1.0)
    osl = bimodal(rng, short=150, long=4000, long_share=0.1)
    itl = 20.0
    best = profile.decode.find_best_many(itl, isl + osl / 2)
    assert best.feasible.all()
    needed = float(np.sum(osl / best.thpt_per_gpu)) / INTERVAL_S

    mean_based = decode_gpus_for_mean(
        profile.decode,
        mean_isl=float(isl.mean()),
        mean_osl=float(osl.mean()),
        num_requests=N,
        itl_ms=itl,
        interval_s=INTERVAL_S,
    )
    aware = decode_sizing_for_distribution(
        profile.decode,
        isl_bounds=BOUNDS,
        isl_counts=histogram(isl),
        osl_bounds=BOUNDS,
        osl_counts=histogram(osl),
        itl_ms=itl,
        interval_s=INTERVAL_S,
        isl_sum=float(isl.sum()),
        osl_sum=float(osl.sum()),
    )
    assert mean_based < 0.6 * needed  # about half of what is needed
    assert needed <= aware.gpus < 1.15 * needed
    assert aware.infeasible_share == 0.0
    assert aware.demand_tokens_per_s == pytest.approx(osl.sum() / INTERVAL_S)
    assert aware.effective_thpt_per_gpu == pytest.approx(aware.demand_tokens_per_s / aware.gpus)


def test_one_narrow_bucket_equals_dynamos_mean_formula(profile: Profile) -> None:
    bounds, counts = [2999.0, 3001.0], [0.0, 120.0]
    aware = prefill_gpus_for_distribution(
        profile.prefill, isl_bounds=bounds, isl_counts=counts, interval_s=60
    )
    # Dynamo's formula: num_req * isl / interval / thpt(isl).
    expected = 120 * 3000 / 60 / profile.prefill.thpt_per_gpu(3000)
    assert aware == pytest.approx(expected, rel=1e-4)
    assert prefill_gpus_for_mean(
        profile.prefill, mean_isl=3000, num_requests=120, interval_s=60
    ) == pytest.approx(expected)
    decode = decode_gpus_for_distribution(
        profile.decode,
        isl_bounds=bounds,
        isl_counts=counts,
        osl_bounds=[149.9, 150.1],
        osl_counts=[0.0, 120.0],
        itl_ms=10,
        interval_s=60,
    )
    best = profile.decode.find_best_throughput_per_gpu(10, 3000 + 150 / 2)
    assert decode == pytest.approx(120 * 150 / 60 / best.thpt_per_gpu, rel=1e-3)


def test_forecast_request_count_rescales_the_histogram(profile: Profile) -> None:
    counts = [0.0] * 5 + [30.0, 10.0] + [0.0] * 8
    base = prefill_gpus_for_distribution(
        profile.prefill, isl_bounds=BOUNDS, isl_counts=counts, interval_s=60
    )
    doubled = prefill_gpus_for_distribution(
        profile.prefill, isl_bounds=BOUNDS, isl_counts=counts, interval_s=60, num_requests=80
    )
    assert doubled == pytest.approx(2 * base)


def test_infeasible_contexts_are_reported_and_sized_at_the_lowest_itl(profile: Profile) -> None:
    est = decode_sizing_for_distribution(
        profile.decode,
        isl_bounds=[1024, 2048],
        isl_counts=[10, 10],
        osl_bounds=[128, 256],
        osl_counts=[20, 0],
        itl_ms=6.05,
        interval_s=60,
    )
    assert 0 < est.infeasible_share < 1
    assert math.isfinite(est.gpus) and est.gpus > 0


def test_overflow_bucket_and_zero_traffic(profile: Profile) -> None:
    est = prefill_sizing_for_distribution(
        profile.prefill,
        isl_bounds=[1000, math.inf],
        isl_counts=[3, 1],
        interval_s=60,
        isl_sum=3 * 500 + 20_000,
    )
    assert est.overflow_share == pytest.approx(0.25)
    # Clamped: the overflow (20k > the profiled 16k) and the lowest of the 8 quantile samples
    # of the (0, 1000] bucket (62.5 < the profiled 100).
    assert est.clamped_share == pytest.approx(0.25 + 0.75 / 8)
    assert est.demand_tokens_per_s == pytest.approx(21_500 / 60)
    zero = prefill_sizing_for_distribution(
        profile.prefill, isl_bounds=[1000, math.inf], isl_counts=[0, 0], interval_s=60
    )
    assert zero.gpus == 0.0 and zero.effective_thpt_per_gpu == 0.0


def test_histogram_mean() -> None:
    assert histogram_mean([10, 20, math.inf], [1, 1, 2]) == pytest.approx((5 + 15 + 40) / 4)
    assert histogram_mean([10], [0]) == 0.0


@pytest.mark.parametrize(
    ("bounds", "counts", "message"),
    [
        ([10, 5], [1, 1], r"isl_bounds\[1\] = 5.0: must be greater than isl_bounds\[0\] = 10.0"),
        ([10, 20], [1], "must be equally long"),
        ([0, 20], [1, 1], r"isl_bounds\[0\] = 0.0: bucket bounds must be positive"),
        ([math.inf, 20], [1, 1], r"isl_bounds\[0\] = inf: .* \+inf allowed only last"),
        ([10, 20], [1, -1], r"isl_counts\[1\] = -1.0: must be a count >= 0"),
        ([math.inf], [1], "only the \\+inf bucket"),
    ],
)
def test_bad_histograms_are_named(
    profile: Profile, bounds: list[float], counts: list[float], message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        prefill_gpus_for_distribution(
            profile.prefill, isl_bounds=bounds, isl_counts=counts, interval_s=60
        )


def test_bad_scalars_are_named(profile: Profile) -> None:
    with pytest.raises(ValueError, match="interval_s must be a positive number"):
        prefill_gpus_for_mean(profile.prefill, mean_isl=10, num_requests=1, interval_s=0)
    with pytest.raises(ValueError, match="itl_ms must be a positive number"):
        decode_gpus_for_mean(
            profile.decode, mean_isl=10, mean_osl=10, num_requests=1, itl_ms=-1, interval_s=60
        )
    with pytest.raises(ValueError, match="isl_sum must be a token count"):
        prefill_gpus_for_distribution(
            profile.prefill, isl_bounds=[10], isl_counts=[1], interval_s=60, isl_sum=-5
        )
