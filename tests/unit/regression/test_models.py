"""The three wall-time models learn known laws from FPM streams."""

from __future__ import annotations

import numpy as np
import pytest

from disagg_planner.regression.models import AggModel, DecodeModel, ModelNotReadyError, PrefillModel
from tests.unit.regression.fpm_factory import (
    AGG_B,
    AGG_C,
    DECODE_C,
    PREFILL_A,
    PREFILL_B,
    agg_law,
    decode_law,
    fpm,
    heartbeat,
    prefill_law,
)


def _noise(rng: np.random.Generator) -> float:
    return float(1.0 + rng.normal(0.0, 0.03))


def _prefill_stream(rng: np.random.Generator, n: int, *, worker: str = "w0", start: int = 1000):
    for i in range(n):
        tokens = int(rng.integers(128, 8192))
        yield fpm(
            worker=worker,
            counter=start + i,
            wall=prefill_law(tokens) * _noise(rng),
            prefill_reqs=max(1, tokens // 2000),
            prefill_tokens=tokens,
        )


def test_prefill_model_recovers_law_and_predicts() -> None:
    rng = np.random.default_rng(11)
    model = PrefillModel(min_observations=5)
    assert model.observe_all(_prefill_stream(rng, 200)) == 200
    assert model.ready
    assert model.num_observations == 64  # bounded window
    fit = model.fit
    assert fit.slopes[0] == pytest.approx(PREFILL_B, rel=0.05)  # type: ignore[union-attr]
    assert model.predict_wall_time(4096) == pytest.approx(prefill_law(4096), rel=0.03)
    assert model.status().reason == "ready"


def test_not_ready_until_min_observations() -> None:
    rng = np.random.default_rng(12)
    model = PrefillModel(min_observations=8)
    stream = list(_prefill_stream(rng, 8))
    model.observe_all(stream[:7])
    assert not model.ready
    assert model.status().reason == "too_few_samples"
    with pytest.raises(ModelNotReadyError, match="PrefillModel is not ready"):
        model.predict_wall_time(1000)
    model.observe(stream[7])
    assert model.ready


def test_idle_heartbeats_are_not_samples() -> None:
    model = PrefillModel(min_observations=2)
    for counter in range(1000, 1020):
        assert not model.observe(heartbeat(counter=counter))
    assert model.num_observations == 0
    assert model.skipped["idle"] == 20
    assert model.averages().iterations == 0  # a heartbeat is not an iteration either


def test_warmup_iterations_are_excluded_so_they_cannot_poison_the_fit() -> None:
    """Dynamo issue #12430: an engine's first iterations are far slower than its law."""

    def stream():
        rng = np.random.default_rng(13)
        for counter in range(60):
            tokens = int(rng.integers(128, 8192))
            slow = 8.0 if counter < 10 else 1.0  # cold start: graph capture, compilation
            yield fpm(
                counter=counter,
                wall=prefill_law(tokens) * slow,
                prefill_reqs=1,
                prefill_tokens=tokens,
            )

    guarded = PrefillModel(warmup_iterations=10)
    guarded.observe_all(stream())
    assert guarded.skipped["warmup"] == 10
    assert guarded.predict_wall_time(1000) == pytest.approx(prefill_law(1000), rel=1e-6)

    naive = PrefillModel(warmup_iterations=0)
    naive.observe_all(stream())
    worst = max(abs(naive.predict_wall_time(t) / prefill_law(t) - 1) for t in (500, 2000, 8000))
    assert worst > 0.25  # what the guard prevents


def test_engine_restart_warms_up_again() -> None:
    model = PrefillModel(warmup_iterations=5, min_observations=2)
    model.observe_all(
        fpm(counter=c, wall=prefill_law(c * 10), prefill_reqs=1, prefill_tokens=c * 10)
        for c in range(100, 110)
    )
    before = model.num_observations
    # the engine restarts under the same id: its counter starts again at 0
    taken = [
        model.observe(fpm(counter=c, wall=1.0, prefill_reqs=1, prefill_tokens=500))
        for c in range(5)
    ]
    assert taken == [False] * 5
    assert model.num_observations == before


def test_invalid_wall_time_is_skipped() -> None:
    model = PrefillModel()
    bad = fpm(wall=float("nan"), prefill_reqs=1, prefill_tokens=100)
    assert not model.observe(bad)
    assert model.skipped["invalid"] == 1


def test_decode_model_recovers_kv_slope_from_pure_decode_iterations() -> None:
    rng = np.random.default_rng(14)
    model = DecodeModel()
    for i in range(300):
        num = int(rng.integers(1, 256))
        kv = int(num * rng.uniform(200, 4000))
        model.observe(
            fpm(
                counter=1000 + i,
                wall=decode_law(num, kv) * _noise(rng),
                decode_reqs=num,
                decode_kv=kv,
            )
        )
    # an iteration where a prefill joined is not a decode sample
    assert not model.observe(
        fpm(wall=0.5, prefill_reqs=1, prefill_tokens=10, decode_reqs=3, decode_kv=3000)
    )
    assert model.ready
    assert model.fit.slopes[1] == pytest.approx(DECODE_C, rel=0.15)  # type: ignore[union-attr]
    assert model.predict_wall_time(num_decode_requests=64, decode_kv_tokens=128_000) == (
        pytest.approx(decode_law(64, 128_000), rel=0.05)
    )


def test_agg_model_recovers_both_slopes() -> None:
    rng = np.random.default_rng(15)
    model = AggModel()
    for i in range(400):
        prefill = int(rng.integers(0, 8192)) if rng.random() < 0.5 else 0
        num = int(rng.integers(1, 128))
        kv = int(num * rng.uniform(500, 3000))
        model.observe(
            fpm(
                counter=1000 + i,
                wall=agg_law(prefill, kv) * _noise(rng),
                prefill_reqs=1 if prefill else 0,
                prefill_tokens=prefill,
                decode_reqs=num,
                decode_kv=kv,
            )
        )
    fit = model.fit
    assert fit.slopes[0] == pytest.approx(AGG_B, rel=0.1)  # type: ignore[union-attr]
    assert fit.slopes[1] == pytest.approx(AGG_C, rel=0.2)  # type: ignore[union-attr]


def test_bucketed_window_keeps_light_load_accuracy_after_a_burst() -> None:
    """A FIFO window would forget the light-load end; the intercept would drift."""
    rng = np.random.default_rng(16)
    model = PrefillModel()
    for i in range(64):
        tokens = int(rng.integers(100, 1500))
        model.observe(
            fpm(
                counter=1000 + i,
                wall=prefill_law(tokens) * _noise(rng),
                prefill_reqs=1,
                prefill_tokens=tokens,
            )
        )
    for i in range(2000):  # a long burst of full chunks with small variations
        tokens = int(rng.integers(7900, 8192))
        model.observe(
            fpm(
                counter=2000 + i,
                wall=prefill_law(tokens) * _noise(rng),
                prefill_reqs=4,
                prefill_tokens=tokens,
            )
        )
    assert model.predict_wall_time(256) == pytest.approx(prefill_law(256), rel=0.25)
    assert model.fit.intercept_s == pytest.approx(PREFILL_A, abs=0.003)  # type: ignore[union-attr]


def test_averages_per_engine_and_overall() -> None:
    model = PrefillModel()
    model.observe(
        fpm(worker="a", wall=0.1, prefill_reqs=2, prefill_tokens=4000, queued_prefill_tokens=9000)
    )
    model.observe(fpm(worker="b", wall=0.1, prefill_reqs=1, prefill_tokens=1000))
    assert model.averages(("a", 0)).isl == 2000
    assert model.averages(("a", 0)).queued_prefill_tokens == 9000
    assert model.averages(("b", 0)).isl == 1000
    assert model.averages().isl == 1500
    assert model.averages(("unknown", 0)).isl == 1500  # falls back to all engines
    model.retain({("b", 0)})
    assert model.averages(("a", 0)).isl == 1500  # "a" forgotten: overall average again


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [({"min_observations": 0}, "min_observations"), ({"warmup_iterations": -1}, "warmup")],
)
def test_bad_settings_are_named(kwargs: dict[str, int], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        PrefillModel(**kwargs)
