"""``planner backtest --load-predictor-warmup-trace`` warms the predictors up as the planner
does, so the backtest scores what the planner would run (it used to be accepted and ignored)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from disagg_planner.cli.main import main


def write_trace(path: Path, *, per_interval: int, intervals: int, interval_s: float) -> Path:
    """A Mooncake-format trace with ``per_interval`` requests in each interval."""
    lines = []
    for i in range(intervals):
        for j in range(per_interval):
            t_ms = (i + j / per_interval) * interval_s * 1000
            lines.append(
                json.dumps({"timestamp": t_ms, "input_length": 1000, "output_length": 100})
            )
    path.write_text("\n".join(lines) + "\n")
    return path


def kalman_num_req_mape(capsys: pytest.CaptureFixture[str], *extra: str, trace: Path) -> float:
    args = ["backtest", "--trace", str(trace), "--interval", "10", "--predictor", "kalman"]
    assert main([*args, "--series", "num_req", "--json", *extra]) == 0
    (result,) = json.loads(capsys.readouterr().out)["results"]
    return float(result["mape"])


def test_the_warmup_trace_changes_what_is_scored(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    trace = write_trace(tmp_path / "now.jsonl", per_interval=10, intervals=12, interval_s=10)
    # Yesterday ran at ten times today's level: warmed up, the Kalman filter starts high and
    # over-forecasts the first intervals; cold, it follows today's flat level at once.
    yesterday = write_trace(tmp_path / "old.jsonl", per_interval=100, intervals=30, interval_s=10)
    cold = kalman_num_req_mape(capsys, trace=trace)
    warm = kalman_num_req_mape(capsys, "--load-predictor-warmup-trace", str(yesterday), trace=trace)
    assert cold < 1.0
    assert warm > cold + 5.0


def test_the_table_says_the_predictors_were_warmed_up(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    trace = write_trace(tmp_path / "now.jsonl", per_interval=10, intervals=12, interval_s=10)
    old = write_trace(tmp_path / "old.jsonl", per_interval=10, intervals=12, interval_s=10)
    args = ["backtest", "--trace", str(trace), "--interval", "10", "--predictor", "constant"]
    assert main([*args, "--load-predictor-warmup-trace", str(old)]) == 0
    assert f"predictors warmed up on {old}" in capsys.readouterr().out.splitlines()[0]


def test_a_missing_warmup_trace_is_named(tmp_path: Path, capsys: pytest.CaptureFixture[str]):
    trace = write_trace(tmp_path / "now.jsonl", per_interval=10, intervals=12, interval_s=10)
    missing = tmp_path / "absent.jsonl"
    args = ["backtest", "--trace", str(trace), "--interval", "10", "--predictor", "constant"]
    assert main([*args, "--load-predictor-warmup-trace", str(missing)]) == 2
    assert f"load_predictor_warmup_trace = {str(missing)!r}" in capsys.readouterr().err
