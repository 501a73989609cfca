"""The five predictors on synthetic series with known answers, and their shared rules.

ARIMA and Prophet fits cost tens to hundreds of milliseconds, so each synthetic series is run
once through ``auto`` (which runs the four others in shadow on the same values, asking each
for a forecast every interval, exactly as they would run alone) and the tests read the
forecasts of all five from that one run.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import pytest

from disagg_planner.predictors import (
    PREDICTOR_NAMES,
    Forecast,
    LoadPredictor,
    make_predictor,
    make_predictors,
)
from disagg_planner.predictors.arima import ArimaPredictor
from disagg_planner.predictors.auto import AutoPredictor, EvidencePool
from disagg_planner.predictors.constant import ConstantPredictor
from disagg_planner.predictors.kalman import KalmanPredictor
from disagg_planner.predictors.prophet import ProphetPredictor

RNG = np.random.default_rng(20240601)
LINE = 50.0 + 5.0 * np.arange(30) + RNG.normal(0.0, 0.5, 30)  # next value: 200
SINE_PERIOD = 12
SINE = 100.0 + 30.0 * np.sin(2 * np.pi * np.arange(36) / SINE_PERIOD) + RNG.normal(0.0, 1.0, 36)
STEP = np.concatenate([100.0 + RNG.normal(0.0, 1.0, 15), 300.0 + RNG.normal(0.0, 1.0, 15)])


@dataclass
class Run:
    """Per-interval forecasts of every predictor, and the finished ``auto``."""

    forecasts: dict[str, np.ndarray]
    final: dict[str, Forecast]
    auto: AutoPredictor


def run_all(values: np.ndarray, *, interval_s: float = 60.0) -> Run:
    auto = make_predictor("auto", interval_s=interval_s)
    assert isinstance(auto, AutoPredictor)
    seen: dict[str, list[float]] = {name: [] for name in PREDICTOR_NAMES}
    for value in values:
        for name, candidate in auto.candidates.items():
            seen[name].append(candidate.predict_next().value)
        seen["auto"].append(auto.predict_next().value)
        auto.observe(float(value))
    final = {name: c.predict_next() for name, c in auto.candidates.items()}
    final["auto"] = auto.predict_next()
    return Run({k: np.array(v) for k, v in seen.items()}, final, auto)


@pytest.fixture(scope="module")
def line_run() -> Run:
    return run_all(LINE)


@pytest.fixture(scope="module")
def sine_run() -> Run:
    return run_all(SINE)


@pytest.fixture(scope="module")
def step_run() -> Run:
    return run_all(STEP)


def feed(predictor: LoadPredictor, values: list[float] | np.ndarray) -> Forecast:
    """Observe every value, asking for a forecast each interval as the planner does."""
    for value in values:
        predictor.predict_next()
        predictor.observe(float(value))
    return predictor.predict_next()


# --- known answers ---------------------------------------------------------------------------


@pytest.mark.parametrize("name", PREDICTOR_NAMES)
def test_constant_series_forecasts_the_constant(name: str) -> None:
    forecast = feed(make_predictor(name, interval_s=60), [120.0] * 12)
    assert forecast.value == pytest.approx(120.0, abs=1e-6)
    assert forecast.fallback is False
    assert forecast.upper is None


@pytest.mark.slow
def test_linear_trend_constant_lags_by_one_step(line_run: Run) -> None:
    assert line_run.final["constant"].value == LINE[-1]


@pytest.mark.slow
@pytest.mark.parametrize("name", ["kalman", "arima", "prophet", "auto"])
def test_linear_trend_is_extrapolated(line_run: Run, name: str) -> None:
    # the constant predictor is 5 behind; these must land within 1 of 200
    assert line_run.final[name].value == pytest.approx(200.0, abs=1.0)


@pytest.mark.slow
def test_linear_trend_auto_leaves_the_lagging_constant(line_run: Run) -> None:
    assert line_run.auto.choice != "constant"
    assert line_run.auto.switches >= 1


def last_period_errors(run: Run, name: str) -> np.ndarray:
    return np.abs(run.forecasts[name][-SINE_PERIOD:] - SINE[-SINE_PERIOD:])


@pytest.mark.slow
@pytest.mark.parametrize("name", ["arima", "auto"])
def test_sinusoid_arima_and_auto_follow_the_oscillation(sine_run: Run, name: str) -> None:
    # a sampled sinusoid is an exact AR(2) (y_t = 2 cos(w) y_{t-1} - y_{t-2} + c): ARIMA's
    # one-step errors stay near the noise (sd 1), the last value's reach 15 (amplitude 30)
    assert last_period_errors(sine_run, name).mean() < 3.0
    assert last_period_errors(sine_run, "constant").mean() > 8.0


@pytest.mark.slow
def test_sinusoid_auto_chooses_arima(sine_run: Run) -> None:
    assert sine_run.auto.choice == "arima"


@pytest.mark.slow
def test_sinusoid_constant_is_the_last_value(sine_run: Run) -> None:
    assert np.array_equal(sine_run.forecasts["constant"][1:], SINE[:-1])


@pytest.mark.slow
@pytest.mark.parametrize("name", ["kalman", "prophet"])
def test_sinusoid_trend_models_stay_unbiased(sine_run: Run, name: str) -> None:
    # without seasonality a trend model lags a fast oscillation, but over a full period its
    # forecasts must average to the level, not drift away
    assert sine_run.forecasts[name][-SINE_PERIOD:].mean() == pytest.approx(100.0, abs=5.0)


@pytest.mark.slow
def test_sinusoid_kalman_swings_with_the_wave(sine_run: Run) -> None:
    last = sine_run.forecasts["kalman"][-SINE_PERIOD:]
    assert 15.0 < (last.max() - last.min()) / 2 < 45.0  # amplitude 30


def test_sinusoid_prophet_daily_seasonality() -> None:
    # 2-hour intervals: the 12-interval period is a day, and three days of history turn on
    # Prophet's daily seasonality, which then carries the wave exactly
    prophet = ProphetPredictor(window_size=36, interval_s=7200)
    for value in SINE:
        prophet.observe(float(value))
    expected = 100.0 + 30.0 * np.sin(2 * np.pi * len(SINE) / SINE_PERIOD)
    assert prophet.predict_next().value == pytest.approx(expected, abs=3.0)


@pytest.mark.slow
@pytest.mark.parametrize(
    ("name", "low", "high"),
    [
        ("constant", 0.98, 1.02),
        ("kalman", 0.95, 1.05),
        ("arima", 0.95, 1.05),
        ("auto", 0.95, 1.05),
        # a piecewise-linear trend cannot jump: it ramps and overshoots, never undershoots
        ("prophet", 0.95, 1.30),
    ],
)
def test_step_forecast_settles_on_the_new_level(
    step_run: Run, name: str, low: float, high: float
) -> None:
    assert 300.0 * low <= step_run.final[name].value <= 300.0 * high


# --- shared rules ----------------------------------------------------------------------------


@pytest.mark.parametrize("name", PREDICTOR_NAMES)
def test_fallback_below_min_points_and_no_data(name: str) -> None:
    predictor = make_predictor(name, kalman_min_points=5)
    first = predictor.predict_next()
    assert (first.value, first.fallback) == (0.0, True)
    assert "no data" in first.note
    for value in (10.0, 20.0, 30.0, 40.0):
        predictor.observe(value)
    forecast = predictor.predict_next()
    # auto answers with its constant candidate, whose minimum is one point
    assert (forecast.value, forecast.fallback) == (40.0, name not in ("constant", "auto"))
    assert isinstance(predictor, LoadPredictor)


@pytest.mark.parametrize("name", PREDICTOR_NAMES)
def test_missing_values_are_not_zero(name: str) -> None:
    predictor = make_predictor(name)
    feed(predictor, [200.0] * 8)
    for missing in (math.nan, math.inf, -5.0):
        predictor.observe(missing)
    assert predictor.predict_next().value == pytest.approx(200.0, abs=1e-6)


@pytest.mark.parametrize("name", PREDICTOR_NAMES)
def test_leading_zeros_skipped_and_again_after_reset_idle(name: str) -> None:
    predictor = make_predictor(name)
    feed(predictor, [0.0, 0.0, 0.0, 80.0, 80.0])
    assert predictor.predict_next().value == 80.0
    feed(predictor, [80.0] * 6)
    predictor.reset_idle()
    feed(predictor, [0.0, 0.0])
    assert predictor.predict_next().value == pytest.approx(80.0, abs=1e-6)
    predictor.observe(40.0)
    predictor.observe(0.0)  # once traffic is back, a zero is data again
    assert predictor.predict_next().value < 80.0


def test_kalman_never_forecasts_below_zero_and_min_points_hold() -> None:
    # Dynamo's Kalman forecast went as low as -577 on a falling series, and its minimum
    # points were not enforced
    kalman = KalmanPredictor(min_points=6)
    assert feed(kalman, [500.0, 400.0, 300.0, 200.0, 100.0]).fallback is True
    kalman.observe(5.0)
    forecast = kalman.predict_next()
    assert forecast.fallback is False
    assert forecast.value == 0.0


def test_kalman_missing_value_continues_the_trend() -> None:
    kalman = KalmanPredictor()
    feed(kalman, 10.0 * np.arange(1, 21))  # next: 210
    kalman.observe(math.nan)  # the interval of 210 went unmeasured
    assert kalman.predict_next().value == pytest.approx(220.0, abs=2.0)


@pytest.mark.parametrize("name", PREDICTOR_NAMES)
def test_predict_next_is_idempotent_between_observations(name: str) -> None:
    predictor = make_predictor(name, interval_s=60)
    feed(predictor, LINE[:8])
    assert predictor.predict_next() == predictor.predict_next() == predictor.predict_next()


def test_log1p_models_the_log_and_returns_the_original_scale() -> None:
    growth = 10.0 * 1.3 ** np.arange(20)  # exponential: linear in log space
    logged = feed(KalmanPredictor(log1p=True), growth).value
    plain = feed(KalmanPredictor(), growth).value
    expected = 10.0 * 1.3**20
    assert abs(logged - expected) < abs(plain - expected)
    assert logged == pytest.approx(expected, rel=0.03)


# --- upper quantile --------------------------------------------------------------------------

NOISE = 500.0 + np.random.default_rng(7).normal(0.0, 40.0, 160)


@pytest.mark.slow
@pytest.mark.parametrize(
    "predictor",
    [
        ConstantPredictor(quantile=0.9),
        KalmanPredictor(quantile=0.9),
        ArimaPredictor(quantile=0.9, reselect_every=1000),
    ],
    ids=["constant", "kalman", "arima"],
)
def test_upper_quantile_covers_about_ninety_percent(predictor: LoadPredictor) -> None:
    below = []
    for t, value in enumerate(NOISE):
        forecast = predictor.predict_next()
        if t >= 40:
            assert forecast.upper is not None and forecast.upper >= forecast.value * 0.9
            below.append(forecast.upper < value)
        predictor.observe(float(value))
    assert 0.03 <= np.mean(below) <= 0.2


def test_upper_quantile_of_prophet_from_its_errors() -> None:
    prophet = ProphetPredictor(quantile=0.9, interval_s=60, window_size=12)
    forecast = feed(prophet, NOISE[:24])
    assert forecast.upper is not None and forecast.upper > forecast.value
    errors = [e for _, e in prophet.recent_errors]
    assert forecast.upper == pytest.approx(forecast.value + np.quantile(errors, 0.9))


def test_no_quantile_no_upper() -> None:
    assert feed(KalmanPredictor(), NOISE[:10]).upper is None


# --- ARIMA specifics -------------------------------------------------------------------------


@pytest.mark.slow
def test_arima_reselects_on_a_doubling_then_fixed_schedule() -> None:
    arima = ArimaPredictor(reselect_every=16)
    feed(arima, NOISE[:45])
    assert [s.points for s in arima.selections] == [5, 10, 20, 36]
    assert all(s.order[1] >= 1 for s in arima.selections)
    assert all(s.seconds > 0 for s in arima.selections)


def test_arima_selects_lazily_when_forecasts_are_asked_for() -> None:
    arima = ArimaPredictor()
    for value in NOISE[:30]:
        arima.observe(float(value))  # a warm-up: no forecasts asked for
    assert arima.selections == []
    arima.predict_next()
    assert [s.points for s in arima.selections] == [30]


def test_arima_flat_series_needs_no_fit() -> None:
    arima = ArimaPredictor()
    forecast = feed(arima, [7.0] * 10)
    assert forecast.note.startswith("flat series")
    assert arima.selections == []


def test_arima_failure_answers_the_last_value_and_says_why() -> None:
    arima = ArimaPredictor()
    for value in [1e300, 1.0] * 5:  # no ARIMA fits this
        arima.observe(value)
    forecast = arima.predict_next()
    assert (forecast.value, forecast.fallback) == (1.0, False)
    assert forecast.note.startswith("arima failed (ValueError: ")
    assert "\n" not in forecast.note


@pytest.mark.filterwarnings("ignore:The inplace keyword")  # prophet's own pandas usage
def test_prophet_trend_shortcut_equals_its_predict() -> None:
    import pandas as pd  # type: ignore[import-untyped]  # pandas ships no type information
    from prophet import Prophet

    from disagg_planner.predictors.prophet import next_yhat

    frame = pd.DataFrame(
        {"ds": pd.date_range("2024-01-01", periods=20, freq="min"), "y": LINE[:20]}
    )
    model = Prophet(n_changepoints=3, uncertainty_samples=0).fit(frame)
    ds = pd.Timestamp("2024-01-01 00:20:00")
    assert not model.seasonalities
    expected = float(model.predict(pd.DataFrame({"ds": [ds]}))["yhat"].iloc[0])
    assert next_yhat(model, ds) == pytest.approx(expected, rel=1e-9)


# --- auto specifics --------------------------------------------------------------------------


def cheap_auto(**kwargs: object) -> AutoPredictor:
    return AutoPredictor(
        {"constant": ConstantPredictor(), "kalman": KalmanPredictor()},
        **kwargs,  # type: ignore[arg-type]
    )


RAMP = 100.0 + 10.0 * np.arange(20)


def test_auto_best_waits_for_min_scored_intervals() -> None:
    auto = cheap_auto(answer="best", min_scored=8)
    # the forecast before the first value is not scored: 7 values leave 6 scored intervals
    feed(auto, RAMP[:7])
    assert auto.choice == "constant"
    feed(auto, RAMP[7:9])
    assert auto.choice == "kalman"


def test_auto_best_hysteresis_keeps_the_choice_unless_clearly_better() -> None:
    stubborn = cheap_auto(answer="best", hysteresis=0.99)
    feed(stubborn, RAMP)
    assert (stubborn.choice, stubborn.switches) == ("constant", 0)
    eager = cheap_auto(answer="best", hysteresis=0.0)
    feed(eager, RAMP)
    assert (eager.choice, eager.switches) == ("kalman", 1)
    assert "auto -> kalman" in eager.predict_next().note
    # the answer is exactly the chosen candidate's forecast
    assert eager.predict_next().value == eager.candidates["kalman"].predict_next().value


def test_auto_blend_starts_as_the_plain_mean_of_the_candidates() -> None:
    auto = cheap_auto()
    assert auto.predict_next().value == 0.0
    assert auto.predict_next().note == "auto: no data yet"
    for value in RAMP[:6]:
        auto.observe(float(value))
    weights = auto.weights()
    assert weights["constant"] > 0 and weights["kalman"] > 0
    # unscored evidence counts for nothing: with sharpness 0 the blend is the plain mean
    flat = cheap_auto(sharpness=0.0)
    feed(flat, RAMP)
    expected = np.mean([c.predict_next().value for c in flat.candidates.values()])
    assert flat.predict_next().value == pytest.approx(expected)


def test_auto_blend_moves_its_weight_to_the_better_candidate() -> None:
    auto = cheap_auto()
    errors: list[tuple[float, float, float]] = []  # (auto, constant, kalman) absolute errors
    for value in RAMP:
        forecasts = [auto.predict_next().value] + [
            c.predict_next().value for c in auto.candidates.values()
        ]
        weights = auto.weights()
        blend_bound = sum(
            weights[n] * abs(value - c.predict_next().value) for n, c in auto.candidates.items()
        )
        # the absolute error is convex: the blend is never worse than its weighted candidates
        assert abs(value - forecasts[0]) <= blend_bound + 1e-9
        errors.append(tuple(abs(value - f) for f in forecasts))
        auto.observe(float(value))
    weights = auto.weights()
    assert weights["kalman"] > 0.9  # the constant lags the ramp by 10 every interval
    assert auto.choice == "kalman"
    assert auto.predict_next().note.startswith("auto blend of kalman")
    late = np.array(errors[-5:])
    assert late[:, 0].mean() < 0.5 * late[:, 1].mean()


def test_auto_blend_forgets_errors_older_than_its_window() -> None:
    # a ramp (the constant lags) then a flat stretch (kalman overshoots, then settles):
    # with a short window only the flat stretch counts and the constant takes the lead back
    series = np.concatenate([RAMP, np.full(12, RAMP[-1])])
    short = cheap_auto(window=6, min_scored=1)
    long = cheap_auto(window=48)
    feed(short, series)
    feed(long, series)
    assert short.weights()["constant"] > 0.5
    assert long.weights()["kalman"] > 0.5


def test_auto_upper_quantile_from_its_own_errors() -> None:
    auto = AutoPredictor(
        {"constant": ConstantPredictor(quantile=0.9), "kalman": KalmanPredictor(quantile=0.9)},
        quantile=0.9,
    )
    noisy = 100.0 + RNG.normal(0.0, 10.0, 40)
    forecast = feed(auto, noisy)
    assert forecast.upper is not None and forecast.upper > forecast.value
    mine = list(auto._errors)
    assert len(mine) >= 8
    assert forecast.upper == pytest.approx(forecast.value + float(np.quantile(mine, 0.9)))


def test_auto_series_sharing_a_pool_borrow_each_others_evidence() -> None:
    # on the ramp the constant lags by 10 each interval; on the flat series every candidate
    # is exact, so only the pooled evidence can say which one reads this traffic better
    flat = np.full(len(RAMP), 50.0)
    pool = EvidencePool(weight=0.5)
    ramp_auto, flat_auto = cheap_auto(pool=pool), cheap_auto(pool=pool)
    alone = cheap_auto()
    for ramp_value, flat_value in zip(RAMP, flat, strict=True):
        for auto in (ramp_auto, flat_auto, alone):
            auto.predict_next()
        ramp_auto.observe(float(ramp_value))
        flat_auto.observe(float(flat_value))
        alone.observe(float(flat_value))
    assert flat_auto.weights()["kalman"] > 0.9
    assert alone.weights() == pytest.approx({"constant": 0.5, "kalman": 0.5})
    # the flat series' own losses are 0 for both, the ramp's count at half weight
    constant_sum, constant_n = flat_auto.evidence()["constant"]
    ramp_sum = sum(ramp_auto.losses()["constant"])
    assert constant_sum == pytest.approx(0.5 * ramp_sum)
    assert constant_n == pytest.approx(len(flat_auto.losses()["constant"]) * 1.5)


def test_auto_pooled_forecast_is_never_stale() -> None:
    pool = EvidencePool()
    first, second = cheap_auto(pool=pool), cheap_auto(pool=pool)
    feed(second, [50.0] * 6)
    before = second.predict_next()
    feed(first, RAMP)  # only the other series moves
    after = second.predict_next()
    assert after.note != before.note
    assert second.weights()["kalman"] > 0.9


def test_auto_pool_rejects_different_candidates() -> None:
    pool = EvidencePool()
    cheap_auto(pool=pool)
    with pytest.raises(ValueError, match=r"auto pool: candidates \['constant'\] differ"):
        AutoPredictor({"constant": ConstantPredictor()}, pool=pool)
    with pytest.raises(ValueError, match="auto pool weight = -1"):
        EvidencePool(weight=-1)


def test_make_predictors_shares_one_pool_for_auto_only() -> None:
    autos = make_predictors("auto", interval_s=60)
    assert sorted(autos) == ["isl", "num_req", "osl"]
    pools = {id(a.pool) for a in autos.values() if isinstance(a, AutoPredictor)}
    assert len(pools) == 1
    first = next(iter(autos.values()))
    assert isinstance(first, AutoPredictor)
    assert first.pool.members == list(autos.values())
    kalmans = make_predictors("kalman", ["num_req", "isl"])
    assert kalmans["num_req"] is not kalmans["isl"]
    assert all(isinstance(k, KalmanPredictor) for k in kalmans.values())


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"answer": "vote"}, "auto answer = 'vote'"),
        ({"sharpness": -1.0}, "auto sharpness = -1.0"),
        ({"window": 100}, "auto window = 100"),
        ({"initial": "prophet"}, "auto initial = 'prophet'"),
        ({"hysteresis": 1.0}, "auto hysteresis = 1.0"),
    ],
)
def test_auto_bad_settings_name_the_setting(kwargs: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        cheap_auto(**kwargs)


# --- construction ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"name": "lstm"}, "predictor 'lstm': expected one of constant, arima"),
        ({"name": "kalman", "quantile": 1.5}, "quantile = 1.5"),
        ({"name": "kalman", "kalman_r": -1.0}, "kalman r = -1.0"),
        ({"name": "kalman", "kalman_min_points": 0}, "min_points = 0"),
        ({"name": "prophet", "prophet_window_size": 1}, "prophet window_size = 1"),
        ({"name": "prophet", "interval_s": 0.0}, "interval_s = 0.0"),
    ],
)
def test_bad_settings_name_the_setting(kwargs: dict, message: str) -> None:
    name = kwargs.pop("name")
    with pytest.raises(ValueError, match=message):
        make_predictor(name, **kwargs)
