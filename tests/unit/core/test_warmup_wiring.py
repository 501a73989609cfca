"""``--load-predictor-warmup-trace``: the planner's predictors start from a recorded trace."""

from __future__ import annotations

from pathlib import Path

import pytest

from disagg_planner.config.schema import PlannerConfig
from disagg_planner.errors import TraceError
from disagg_planner.runtime.wiring import build_core
from tests.unit.core.conftest import write_h200_like_profile


@pytest.fixture(scope="module")
def profile_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_h200_like_profile(tmp_path_factory.mktemp("warmup") / "h200")


def config(profile_dir: Path, **extra: object) -> PlannerConfig:
    return PlannerConfig.model_validate(
        {
            "profile_results_dir": str(profile_dir),
            "load_predictor": "kalman",
            "throughput_adjustment_interval_seconds": 6,
            **extra,
        }
    )


def test_warm_up_trace_feeds_all_three_predictors(mooncake_head: Path, profile_dir: Path) -> None:
    core = build_core(
        config(profile_dir, load_predictor_warmup_trace=str(mooncake_head)), start_s=0.0
    )
    assert core.throughput is not None
    # 300 requests over 102 s: 17 complete 6 s intervals, past Kalman's 5 minimum points
    for series, predictor in core.throughput.predictors.items():
        forecast = predictor.predict_next()
        assert forecast.fallback is False, series
        assert forecast.value > 0, series


def test_without_warm_up_the_predictors_start_empty(profile_dir: Path) -> None:
    core = build_core(config(profile_dir), start_s=0.0)
    assert core.throughput is not None
    forecast = core.throughput.predictors["num_req"].predict_next()
    assert (forecast.fallback, forecast.value) == (True, 0.0)


@pytest.mark.slow
def test_auto_warm_up_shares_evidence_across_series(mooncake_head: Path, profile_dir: Path) -> None:
    core = build_core(
        config(profile_dir, load_predictor="auto", load_predictor_warmup_trace=str(mooncake_head)),
        start_s=0.0,
    )
    assert core.throughput is not None
    predictors = list(core.throughput.predictors.values())
    pools = {id(p.pool) for p in predictors}  # type: ignore[attr-defined]
    assert len(pools) == 1
    assert all(p.predict_next().note.startswith("auto blend of") for p in predictors)


def test_a_bad_warm_up_trace_names_the_setting_and_the_file(
    profile_dir: Path, tmp_path: Path
) -> None:
    missing = tmp_path / "nope.jsonl"
    with pytest.raises(TraceError, match=r"load_predictor_warmup_trace = '.*nope\.jsonl'"):
        build_core(config(profile_dir, load_predictor_warmup_trace=str(missing)), start_s=0.0)
    broken = tmp_path / "broken.jsonl"
    broken.write_text('{"timestamp": 0, "input_length": 10, "output_length": 5}\n{"timestamp": \n')
    with pytest.raises(TraceError, match=r"broken\.jsonl:2: not valid JSON"):
        build_core(config(profile_dir, load_predictor_warmup_trace=str(broken)), start_s=0.0)
