"""The closed-loop serving benchmark (``vllm bench serve`` on the simulated engine) and the
calibration points built on it (issue 31: TTFT under load as the public benchmark measured it)."""

from __future__ import annotations

import dataclasses
import re

import pytest

from disagg_planner.simulator import fit
from disagg_planner.simulator.calibration import POINTS
from disagg_planner.simulator.calibration_points import SERVING_KINDS, CalibrationPoint
from disagg_planner.simulator.request import RequestRecord
from disagg_planner.simulator.serving_bench import (
    ServingResult,
    ServingSettings,
    draw_lengths,
    run_serving,
)

SMALL = "sim:llama-3.1-8b-fp8@h200_sxm:tp1"
SETTINGS = ServingSettings(concurrency=4, prompts=11, isl=200, osl=24, range_ratio=0.5)


@pytest.fixture(scope="module")
def small_run() -> ServingResult:
    return run_serving(SMALL, SETTINGS, seed=0)


def test_the_client_keeps_its_concurrency_in_flight_and_sends_every_prompt(
    small_run: ServingResult,
) -> None:
    records = small_run.records
    assert len(records) == SETTINGS.prompts
    arrivals = sorted(r.arrival_s for r in records)
    finishes = sorted(r.finish_s for r in records)
    c = SETTINGS.concurrency
    # All C clients start at t = 0 ...
    assert arrivals[:c] == [0.0] * c and arrivals[c] > 0.0
    # ... and each later prompt is sent the moment an earlier one finishes, so that exactly C
    # are in flight until the last prompt is sent.
    assert arrivals[c:] == pytest.approx(finishes[: SETTINGS.prompts - c], abs=1e-9)
    for t in arrivals[c:]:
        in_flight = sum(r.arrival_s <= t < r.finish_s for r in records)
        assert in_flight == c


def test_lengths_fall_in_the_range_ratio_and_follow_the_seed() -> None:
    lengths = draw_lengths(SETTINGS, seed=0)
    assert len(lengths) == SETTINGS.prompts
    assert all(100 <= isl <= 200 and 12 <= osl <= 24 for isl, osl in lengths)
    assert draw_lengths(SETTINGS, seed=0) == lengths
    assert draw_lengths(SETTINGS, seed=1) != lengths
    # With a ratio of 1 every prompt has exactly the nominal lengths.
    fixed = dataclasses.replace(SETTINGS, range_ratio=1.0)
    assert set(draw_lengths(fixed, seed=3)) == {(200, 24)}


def test_every_output_runs_to_its_drawn_length(small_run: ServingResult) -> None:
    sent = sorted(draw_lengths(SETTINGS, seed=0))
    assert sorted((r.isl, r.osl) for r in small_run.records) == sent


def test_the_same_seed_gives_the_same_run_and_another_seed_another() -> None:
    again = run_serving(SMALL, SETTINGS, seed=0)
    first = run_serving(SMALL, SETTINGS, seed=0)
    assert again.records == first.records
    other = run_serving(SMALL, SETTINGS, seed=1)
    assert other.throughput_per_gpu != first.throughput_per_gpu


def _record(
    i: int, arrival: float, first: float, finish: float, isl: int, osl: int
) -> RequestRecord:
    return RequestRecord(
        request_id=i,
        arrival_s=arrival,
        isl=isl,
        osl=osl,
        first_token_s=first,
        finish_s=finish,
        ttft_ms=(first - arrival) * 1000.0,
        itl_ms=(finish - first) * 1000.0 / (osl - 1) if osl > 1 else None,
        ok=True,
    )


def test_the_metrics_are_the_clients() -> None:
    # TTFTs 100, 200, 400 ms; TPOTs (e2e - TTFT) / (osl - 1): 900 / 9 = 100, 1,800 / 9 = 200,
    # and none for the one-token answer; 60 + 40 + 10 + 10 + 100 + 1 tokens over 4 s on 2 GPUs.
    result = ServingResult(
        (
            _record(0, 0.0, 0.1, 1.0, 60, 10),
            _record(1, 0.0, 0.2, 2.0, 40, 10),
            _record(2, 2.0, 2.4, 4.0, 100, 1),
        ),
        gpus=2,
    )
    assert result.median_ttft_ms == pytest.approx(200.0)
    assert result.median_tpot_ms == pytest.approx(150.0)
    assert result.duration_s == 4.0
    assert result.throughput_per_gpu == pytest.approx(221 / 4.0 / 2)


def test_a_simulated_run_reports_tpot_as_the_client_computes_it(small_run: ServingResult) -> None:
    tpots = sorted((r.e2e_ms - r.ttft_ms) / (r.osl - 1) for r in small_run.records if r.ttft_ms)
    assert small_run.median_tpot_ms == pytest.approx(tpots[len(tpots) // 2])


def _serving_point() -> CalibrationPoint:
    return next(p for p in POINTS if p.kind in SERVING_KINDS)


@pytest.mark.parametrize(
    ("field", "value"),
    [("concurrency", 0), ("requests", 0), ("isl", 0), ("osl", 0), ("range_ratio", 0.0)],
)
def test_a_serving_point_without_its_client_settings_is_refused(field: str, value: float) -> None:
    point = _serving_point()
    with pytest.raises(ValueError, match=f"{re.escape(point.name)}.*needs.*{field}"):
        # a field named at run time: mypy checks a ** dict against every field's type
        dataclasses.replace(point, **{field: value})  # type: ignore[arg-type]


def test_serving_points_are_validation_points_the_fit_refuses() -> None:
    serving = [p for p in POINTS if p.kind in SERVING_KINDS]
    assert {p.kind for p in serving} == set(SERVING_KINDS)
    assert all(p.point_set == "validation" for p in serving)
    stage = fit.Stage("leaky", lambda p: p is serving[0] or p.source == "vllm-latency", "test")
    with pytest.raises(fit.FitError, match="selects validation points"):
        fit.stage_points(stage)


def test_one_simulation_serves_a_benchmarks_three_metrics_and_the_fit_path_agrees() -> None:
    from disagg_planner.simulator import calibration_points

    first = _serving_point()
    same_run = [p for p in POINTS if p.engine == first.engine and p.kind in SERVING_KINDS]
    assert len(same_run) == 3
    before = calibration_points._cached_runs.cache_info().misses
    values = [p.model_value("sim") for p in same_run]
    assert calibration_points._cached_runs.cache_info().misses - before <= 1
    lowest, highest = first.seed_spread("sim") or (0.0, 0.0)
    assert lowest <= values[0] <= highest
    # The fit computes validation errors without the cache (at trial factors): the same value.
    assert calibration_points.compute_sim(first) == pytest.approx(values[0])
