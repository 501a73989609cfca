"""Decode interpolation: grid semantics, best throughput under an ITL target, infeasibility."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from disagg_planner.profiles import DecodeInterpolator, ProfileError
from tests.unit.profiles.engine_model import Engine

ENGINE = Engine()


def engine_decode() -> DecodeInterpolator:
    a = ENGINE.arrays()
    return DecodeInterpolator.from_arrays(
        kv_usage=a["x_kv_usage"],
        context_length=a["y_context_length"],
        itl_ms=a["z_itl"],
        thpt_per_gpu=a["z_thpt_per_gpu"],
        max_kv_tokens=ENGINE.max_kv_tokens,
    )


DECODE = engine_decode()


# Known answers from the analytic engine. Rows cite what they guard against.
KNOWN = [
    # (context, ITL target ms, why)
    (1024, 10.0, "between KV samples on a sampled context"),
    (2048, 8.0, "low concurrency"),
    (3075, 10.0, "between context rows (Dynamo's grid snaps 3075 to 3144)"),
    (8192, 9.0, "Dynamo's cubic overshoots here to a negative throughput"),
    (12000, 15.0, "the KV cache, not the ITL, limits"),
    (16384, 7.0, "longest context"),
    (5000, 20.0, "target above every ITL: the jagged top edge must not inflate throughput"),
]


@pytest.mark.parametrize(("context", "target", "why"), KNOWN, ids=[k[2] for k in KNOWN])
def test_best_throughput_is_close_to_the_engines_truth(
    context: float, target: float, why: str
) -> None:
    best = DECODE.find_best_throughput_per_gpu(target, context)
    truth = ENGINE.best_decode_thpt(target, context)
    assert best.feasible
    # Only an answer past the KV usage the sweep reached there is extrapolated, and says so.
    covered = DECODE.profiled_kv_usage(context)
    assert covered is not None
    assert best.extrapolated == (best.kv_usage > covered[1])
    assert (best.note is not None) == best.extrapolated
    assert best.itl_ms <= target + 1e-9
    assert best.thpt_per_gpu == pytest.approx(truth, rel=0.10), why
    # The answer is a point of the surface: querying it gives the same numbers.
    assert DECODE.itl_ms(best.kv_usage, context) == pytest.approx(best.itl_ms, rel=1e-9)
    assert DECODE.thpt_per_gpu(best.kv_usage, context) == pytest.approx(best.thpt_per_gpu, rel=1e-9)


def test_exact_on_a_linear_surface_without_grid_snapping() -> None:
    # ITL = 5 + 20 x and thpt = 1000 + 4000 x - 0.01 c are reproduced by the interpolant (to
    # its gradient estimate's tolerance), so the answer at ITL 15 is x = 0.5. Dynamo's
    # 100-node grid would answer at node x = 0.495 and context 3144 instead.
    kv_grid, ctx_grid = np.meshgrid(np.linspace(0.05, 1.0, 6), [1000.0, 4000.0, 9000.0])
    kv, ctx = kv_grid.ravel(), ctx_grid.ravel()
    dec = DecodeInterpolator.from_arrays(
        kv_usage=kv,
        context_length=ctx,
        itl_ms=5 + 20 * kv,
        thpt_per_gpu=1000 + 4000 * kv - 0.01 * ctx,
        max_kv_tokens=100_000,
    )
    best = dec.find_best_throughput_per_gpu(15.0, 3075.0)
    assert best.kv_usage == pytest.approx(0.5, abs=1e-6)
    # (to 0.2%: what is interpolated is the ratio to the cost fit, over log context)
    assert best.thpt_per_gpu == pytest.approx(1000 + 2000 - 30.75, rel=2e-3)
    assert best.itl_ms == pytest.approx(15.0)


def test_infeasible_target_is_explicit() -> None:
    best = DECODE.find_best_throughput_per_gpu(3.0, 4096)
    assert not best.feasible
    assert best.thpt_per_gpu == 0.0
    # It reports the lowest ITL there is at that context with at least one request running,
    # which misses the target.
    xs, ys, itl, _thpt = DECODE.grid
    one_request = 4096.0 / DECODE.max_kv_tokens
    row = itl[list(ys).index(4096.0)]
    lowest = min(row[xs >= one_request].min(), DECODE.itl_ms(one_request, 4096))
    assert best.itl_ms == pytest.approx(lowest)
    assert best.kv_usage >= one_request
    assert best.itl_ms > 3.0
    assert DECODE.itl_ms(best.kv_usage, 4096) == pytest.approx(best.itl_ms)


def test_cost_fit_recovers_a_linear_engine() -> None:
    fit = DECODE.fit
    assert fit.base_ms == pytest.approx(ENGINE.itl_base_ms, rel=1e-3)
    assert fit.per_seq_ms == pytest.approx(ENGINE.itl_per_seq_ms, rel=1e-3)
    assert fit.per_kv_token_ms == pytest.approx(ENGINE.itl_per_kv_token_ms, rel=1e-3)
    assert fit.gpus == pytest.approx(1.0)


@pytest.mark.parametrize("context", [100.0, 300.0, 30_000.0, 50_000.0])
def test_context_outside_the_profile_is_extrapolated_and_flagged(context: float) -> None:
    far = DECODE.find_best_throughput_per_gpu(10.0, context)
    assert far.extrapolated and far.note is not None
    assert "outside the profiled 512-16384" in far.note
    # Not the edge's answer: the engine's cost carried on past the sampled contexts.
    assert far.thpt_per_gpu == pytest.approx(ENGINE.best_decode_thpt(10.0, context), rel=0.02)
    assert not DECODE.find_best_throughput_per_gpu(10.0, 16384).extrapolated
    point = DECODE.lookup(0.3, context)
    assert point.extrapolated
    truth = ENGINE.decode_itl_ms(np.array(0.3), np.array(context))
    assert point.itl_ms == pytest.approx(float(truth), rel=0.02)


def test_kv_usage_outside_0_1_is_flagged() -> None:
    assert DECODE.lookup(1.5, 4096).extrapolated
    assert "outside 0-1" in (DECODE.lookup(1.5, 4096).note or "")
    assert not DECODE.lookup(0.5, 4096).extrapolated


def cut_short_row() -> DecodeInterpolator:
    """The old bundled profile's shape: a short context whose sweep max_num_seqs stopped at
    KV usage 0.05, next to a long one that reached 0.95."""
    rows = [(350.0, np.linspace(0.005, 0.05, 5)), (3507.0, np.linspace(0.02, 0.95, 6))]
    kv = np.concatenate([k for _c, k in rows])
    ctx = np.concatenate([np.full(k.size, c) for c, k in rows])
    return DecodeInterpolator.from_arrays(
        kv_usage=kv,
        context_length=ctx,
        itl_ms=ENGINE.decode_itl_ms(kv, ctx),
        thpt_per_gpu=ENGINE.decode_thpt(kv, ctx),
        max_kv_tokens=ENGINE.max_kv_tokens,
    )


def test_kv_usage_beyond_a_short_sweep_is_not_clamped_to_the_neighbouring_row() -> None:
    dec = cut_short_row()
    answers = [dec.find_best_throughput_per_gpu(t, 3150.0) for t in (7.0, 9.0, 12.0, 20.0)]
    thpts = [a.thpt_per_gpu for a in answers]
    assert len(set(thpts)) == 4 and thpts == sorted(thpts)
    for target, answer in zip((7.0, 9.0, 12.0, 20.0), answers, strict=True):
        assert answer.thpt_per_gpu == pytest.approx(
            ENGINE.best_decode_thpt(target, 3150.0), rel=0.05
        )
    # Beyond the 350-token row's sweep the ITL keeps rising with the batch.
    at_row = dec.lookup(0.3, 350.0)
    assert at_row.extrapolated and at_row.note is not None and "0.005-0.050" in at_row.note
    assert at_row.itl_ms == pytest.approx(
        float(ENGINE.decode_itl_ms(np.array(0.3), np.array(350.0))), rel=0.02
    )


def test_many_contexts_at_once_equal_one_by_one() -> None:
    contexts = np.array([[300.0, 1024.0, 3075.0], [7000.0, 16384.0, 40000.0]])
    many = DECODE.find_best_many(9.5, contexts)
    assert many.thpt_per_gpu.shape == contexts.shape
    for idx, c in np.ndenumerate(contexts):
        one = DECODE.find_best_throughput_per_gpu(9.5, float(c))
        assert many.thpt_per_gpu[idx] == one.thpt_per_gpu
        assert many.kv_usage[idx] == one.kv_usage
        assert many.feasible[idx] == one.feasible
        assert many.extrapolated[idx] == one.extrapolated


def test_concurrency_uses_dynamos_kv_usage_formula() -> None:
    kv = DECODE.kv_usage_at(concurrency=20, context_length=4096)
    assert kv == pytest.approx(20 * 4096 / 200_000)
    assert DECODE.itl_ms_at_concurrency(concurrency=20, context_length=4096) == pytest.approx(
        DECODE.itl_ms(kv, 4096)
    )
    assert DECODE.itl_ms(kv, 4096) == pytest.approx(
        float(ENGINE.decode_itl_ms(np.array(kv), np.array(4096.0))), rel=0.01
    )


def test_scattered_points_without_rows_extrapolate_outside_the_hull() -> None:
    # One point per context length: outside their hull the cost fit answers (ITL linear in
    # the KV tokens here, which the fit's form holds exactly).
    kv = np.array([0.1, 0.9, 0.5, 0.2, 0.8])
    ctx = np.array([1000.0, 2000.0, 3000.0, 4000.0, 5000.0])
    dec = DecodeInterpolator.from_arrays(
        kv_usage=kv,
        context_length=ctx,
        itl_ms=5 + 10 * kv,
        thpt_per_gpu=100 + 900 * kv,
        max_kv_tokens=10_000,
    )
    np.testing.assert_allclose(dec.surfaces_many(kv, ctx)[0], 5 + 10 * kv)
    far = dec.lookup(0.95, 5000)
    assert far.extrapolated
    assert far.itl_ms == pytest.approx(5 + 10 * 0.95, rel=1e-3)


def test_bad_queries_and_settings() -> None:
    with pytest.raises(ValueError, match="ITL target must be a positive number"):
        DECODE.find_best_throughput_per_gpu(0.0, 1000)
    with pytest.raises(ValueError, match="context_length must be a finite number"):
        DECODE.find_best_throughput_per_gpu(10.0, float("inf"))
    with pytest.raises(ValueError, match="resolution must be at least 2"):
        DecodeInterpolator(DECODE.data, resolution=1)


def test_in_memory_samples_are_validated_like_files() -> None:
    with pytest.raises(ProfileError, match=r"x_kv_usage\[0\] = -0.1: must be a fraction"):
        DecodeInterpolator.from_arrays(
            kv_usage=[-0.1, 0.2, 0.3],
            context_length=[1, 2, 3],
            itl_ms=[1, 2, 3],
            thpt_per_gpu=[1, 2, 3],
            max_kv_tokens=10,
        )


# --- properties on random profiles ---------------------------------------------------------


@st.composite
def row_profiles(draw: st.DrawFn) -> DecodeInterpolator:
    """Random decode profiles in Dynamo's shape: a few context lengths, each with a sweep of
    KV usages; ITL and throughput arbitrary positive numbers (no physics assumed)."""
    contexts = sorted(draw(st.sets(st.integers(16, 100_000), min_size=2, max_size=5)))
    kv, ctx = [], []
    for c in contexts:
        usages = draw(st.sets(st.integers(1, 1000), min_size=2, max_size=6))
        kv += [u / 1000 for u in sorted(usages)]
        ctx += [float(c)] * len(usages)
    n = len(kv)
    values = st.floats(min_value=0.5, max_value=5000, allow_nan=False)
    itl = draw(st.lists(values, min_size=n, max_size=n))
    thpt = draw(st.lists(values, min_size=n, max_size=n))
    return DecodeInterpolator.from_arrays(
        kv_usage=kv,
        context_length=ctx,
        itl_ms=itl,
        thpt_per_gpu=thpt,
        max_kv_tokens=1_000_000,
        resolution=60,
    )


@settings(max_examples=40, deadline=None)
@given(row_profiles())
def test_reproduces_its_sample_points_and_stays_within_them(dec: DecodeInterpolator) -> None:
    d = dec.data
    itl, thpt = dec.surfaces_many(d.kv_usage, d.context_length)
    np.testing.assert_allclose(itl, d.itl_ms, rtol=1e-9)
    np.testing.assert_allclose(thpt, d.thpt_per_gpu, rtol=1e-5)
    # No overshoot: inside the samples' hull every node's ratio to the cost fit lies within
    # the samples' ratios; everywhere the surfaces are finite and not negative.
    _, _, grid_itl, grid_thpt = dec.grid
    assert np.all(np.isfinite(grid_itl)) and np.all(grid_itl >= 0)
    assert np.all(np.isfinite(grid_thpt)) and np.all(grid_thpt >= 0)
    gx, gy = np.meshgrid(dec.grid[0], dec.grid[1])
    inside = ~dec.extrapolated_many(gx, gy)
    sample_ratio = d.itl_ms / dec.fit.itl_ms(d.kv_usage, d.context_length)
    node_ratio = grid_itl[inside] / dec.fit.itl_ms(gx[inside], gy[inside])
    assert sample_ratio.min() * (1 - 1e-9) <= node_ratio.min()
    assert node_ratio.max() <= sample_ratio.max() * (1 + 1e-9)


@settings(max_examples=40, deadline=None)
@given(
    row_profiles(),
    st.floats(min_value=0, max_value=1.2e5),
    st.lists(st.floats(min_value=0.4, max_value=6000), min_size=2, max_size=6),
)
def test_best_throughput_never_rises_as_the_itl_target_tightens(
    dec: DecodeInterpolator, context: float, targets: list[float]
) -> None:
    previous_thpt, previous_feasible = np.inf, True
    for target in sorted(targets, reverse=True):  # loosest first
        best = dec.find_best_throughput_per_gpu(target, context)
        assert best.thpt_per_gpu <= previous_thpt * (1 + 1e-9)
        assert previous_feasible or not best.feasible
        if best.feasible:
            assert best.itl_ms <= target * (1 + 1e-9)
        else:
            assert best.thpt_per_gpu == 0.0 and best.itl_ms > target
        previous_thpt, previous_feasible = best.thpt_per_gpu, best.feasible
