"""Prefill interpolation: Dynamo's cubic semantics, clamping, sample reproduction."""

from __future__ import annotations

import doctest

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy.interpolate import interp1d

import disagg_planner.profiles.prefill
from disagg_planner.profiles import PrefillInterpolator, ProfileError
from tests.unit.profiles.engine_model import PREFILL_ISL, Engine

ENGINE = Engine()


def make(isl: np.ndarray, ttft: np.ndarray, thpt: np.ndarray) -> PrefillInterpolator:
    return PrefillInterpolator.from_arrays(isl=isl, ttft_ms=ttft, thpt_per_gpu=thpt)


def test_matches_dynamos_cubic_interp1d_between_samples() -> None:
    ttft, thpt = ENGINE.ttft_ms(PREFILL_ISL), ENGINE.prefill_thpt(PREFILL_ISL)
    p = make(PREFILL_ISL, ttft, thpt)
    assert p.kinds == {"ttft_ms": "cubic", "thpt_per_gpu": "cubic"}
    query = np.linspace(100, 16000, 97)
    np.testing.assert_allclose(
        p.ttft_ms_many(query), interp1d(PREFILL_ISL, ttft, kind="cubic")(query), rtol=1e-10
    )
    np.testing.assert_allclose(
        p.thpt_per_gpu_many(query), interp1d(PREFILL_ISL, thpt, kind="cubic")(query), rtol=1e-10
    )
    # And close to the engine it was sampled from.
    np.testing.assert_allclose(p.ttft_ms_many(query), ENGINE.ttft_ms(query), rtol=0.02)


def test_linear_with_fewer_than_four_points() -> None:
    p = make(np.array([1000.0, 2000.0, 4000.0]), np.array([20.0, 50.0, 110.0]), np.ones(3) * 1e4)
    assert p.kinds["ttft_ms"] == "linear"
    assert p.ttft_ms(1500) == pytest.approx(35.0)
    assert p.ttft_ms(3000) == pytest.approx(80.0)


def test_cubic_that_dips_below_zero_falls_back_to_linear() -> None:
    # A sharp drop after a plateau makes the not-a-knot spline undershoot below zero.
    isl = np.array([100.0, 200.0, 300.0, 400.0, 500.0])
    thpt = np.array([1000.0, 1000.0, 1000.0, 1.0, 1.0])
    assert np.min(interp1d(isl, thpt, kind="cubic")(np.linspace(100, 500, 401))) <= 0
    p = make(isl, np.array([1.0, 2.0, 3.0, 4.0, 5.0]), thpt)
    assert p.kinds == {"ttft_ms": "cubic", "thpt_per_gpu": "linear"}
    assert np.min(p.thpt_per_gpu_many(np.linspace(100, 500, 401))) > 0


def test_outside_the_range_extrapolates_from_the_cost_fit_and_says_so() -> None:
    p = make(PREFILL_ISL, ENGINE.ttft_ms(PREFILL_ISL), ENGINE.prefill_thpt(PREFILL_ISL))
    # The analytic engine's TTFT is quadratic in the ISL, the fit's form: it is recovered.
    assert p.fit.base_ms == pytest.approx(ENGINE.ttft_base_ms, rel=1e-3)
    assert p.fit.per_token_ms == pytest.approx(ENGINE.ttft_per_token_ms, rel=1e-3)
    assert p.fit.per_pair_ms == pytest.approx(ENGINE.ttft_quadratic_ms, rel=1e-3)
    for isl in (10.0, 50_000.0, 131_072.0):
        point = p.lookup(isl)
        assert point.extrapolated and point.isl == isl
        assert point.note is not None and "outside the profiled 100-16000" in point.note
        # Not the end's value: the quadratic cost carried on.
        truth_ttft = float(ENGINE.ttft_ms(np.array(isl)))
        assert point.ttft_ms == pytest.approx(truth_ttft, rel=1e-3)
        assert point.thpt_per_gpu == pytest.approx(
            float(ENGINE.prefill_thpt(np.array(isl))), rel=1e-3
        )
    assert p.lookup(50_000).ttft_ms > p.ttft_ms(16000) * 3
    np.testing.assert_array_equal(p.extrapolated_many([10, 3000, 50_000]), [True, False, True])
    inside = p.lookup(3000)
    assert not inside.extrapolated and inside.note is None
    assert p.lookup(100).extrapolated is False and p.lookup(16000).extrapolated is False
    assert p.isl_range == (100.0, 16000.0)
    # Continuous where the fit takes over.
    assert p.ttft_ms(16000 * (1 + 1e-9)) == pytest.approx(p.ttft_ms(16000), rel=1e-6)


def test_non_finite_query_is_rejected() -> None:
    p = make(PREFILL_ISL, ENGINE.ttft_ms(PREFILL_ISL), ENGINE.prefill_thpt(PREFILL_ISL))
    with pytest.raises(ValueError, match="isl must be a finite number"):
        p.ttft_ms(float("nan"))


def test_in_memory_samples_are_validated_like_files() -> None:
    with pytest.raises(ProfileError, match=r"prefill_isl\[1\] = 100.0: duplicate ISL point"):
        make(np.array([100.0, 100.0]), np.ones(2), np.ones(2))


def test_docstring_example_runs() -> None:
    assert doctest.testmod(disagg_planner.profiles.prefill, raise_on_error=True).attempted > 0


positive = st.floats(min_value=1e-3, max_value=1e6, allow_nan=False, allow_infinity=False)


@st.composite
def prefill_samples(draw: st.DrawFn) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    isl = np.array(
        sorted(draw(st.sets(st.integers(1, 200_000), min_size=2, max_size=12))), dtype=float
    )
    n = isl.size
    ttft = np.array(draw(st.lists(positive, min_size=n, max_size=n)))
    thpt = np.array(draw(st.lists(positive, min_size=n, max_size=n)))
    return isl, ttft, thpt


@settings(max_examples=60, deadline=None)
@given(prefill_samples())
def test_reproduces_its_sample_points(samples: tuple[np.ndarray, ...]) -> None:
    isl, ttft, thpt = samples
    p = make(isl, ttft, thpt)
    np.testing.assert_allclose(p.ttft_ms_many(isl), ttft, rtol=1e-9)
    np.testing.assert_allclose(p.thpt_per_gpu_many(isl), thpt, rtol=1e-9)
    # Whatever the data, answers inside the range stay positive (planner divides by them).
    query = np.linspace(isl[0], isl[-1], 257)
    assert np.all(p.thpt_per_gpu_many(query) > 0)
    assert np.all(p.ttft_ms_many(query) > 0)
