"""``planner backtest`` end to end on real trace slices, and the backtest's metrics."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest

from disagg_planner.cli.backtest_cmd import COLUMNS, column_legend
from disagg_planner.cli.main import main
from disagg_planner.predictors.backtest import (
    JSON_KEYS,
    backtest_family,
    backtest_series,
    last_value_explanation,
    run_backtest,
)
from disagg_planner.predictors.constant import ConstantPredictor
from disagg_planner.predictors.traces import bucket_trace, read_trace

DATA = Path(__file__).parent / "data"


def run_json(capsys: pytest.CaptureFixture[str], *args: str) -> list[dict]:
    assert main(["backtest", *args, "--json"]) == 0
    return json.loads(capsys.readouterr().out)["results"]


def test_json_shape_and_constant_scores_by_hand(
    azure_head: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    results = run_json(
        capsys, "--trace", str(azure_head), "--interval", "5", "--predictor", "constant", "kalman"
    )
    assert [(r["predictor"], r["series"]) for r in results] == [
        (p, s) for p in ("constant", "kalman") for s in ("num_req", "isl", "osl")
    ]
    assert all(tuple(r) == JSON_KEYS for r in results)
    # by hand: the constant forecast of interval t is the count of t - 1; the last, partial
    # interval is left out and interval 0 has no forecast
    counts = np.array([iv.num_req for iv in bucket_trace(read_trace(azure_head), interval_s=5)])
    actual, forecast = counts[1:-1], counts[:-2]
    constant = results[0]
    assert constant["intervals"] == len(actual)
    assert constant["mape"] == pytest.approx(np.mean(np.abs(forecast - actual) / actual) * 100)
    assert constant["rmse"] == pytest.approx(math.sqrt(np.mean((forecast - actual) ** 2)))
    assert constant["under_rate"] == pytest.approx(np.mean(forecast < actual))
    assert constant["p90_step_ms"] >= 0


@pytest.mark.slow
def test_all_predictors_table_on_mooncake(
    mooncake_head: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["backtest", "--trace", str(mooncake_head), "--interval", "6"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith(f"{mooncake_head}: mooncake, 300 requests; 17 intervals of 6 s")
    assert out[1].split() == [
        "predictor",
        "series",
        "MAPE",
        "%",
        "sMAPE",
        "%",
        "RMSE",
        "under",
        "%",
        "p90",
        "ms",
        "n",
    ]
    rows = [line.split() for line in out[2:17]]
    assert [(r[0], r[1]) for r in rows] == [
        (p, s)
        for p in ("constant", "arima", "kalman", "prophet", "auto")
        for s in ("num_req", "isl", "osl")
    ]
    assert all(r[-1] == "16" for r in rows)
    # what to configure: the lowest MAPE averaged over the three series, and auto against it
    mean_mape = {
        name: np.mean([float(r[2]) for r in rows if r[0] == name])
        for name in ("constant", "arima", "kalman", "prophet", "auto")
    }
    best = min((n for n in mean_mape if n != "auto"), key=lambda n: mean_mape[n])
    # the footer: what each column means, then what to configure
    assert out[17 : 17 + len(COLUMNS)] == column_legend().splitlines()
    summary, weights = [line for line in out[17 + len(COLUMNS) :] if " = constant on " not in line]
    assert summary.startswith(f"lowest MAPE averaged over isl, num_req, osl: {best} ")
    ratio = float(summary.rsplit("(", 1)[1].rstrip("x)"))
    assert ratio == pytest.approx(mean_mape["auto"] / mean_mape[best], abs=0.002)
    assert weights.startswith("at the end of the trace, auto blend of ")


def test_quantile_scores_the_upper_forecast(
    azure_head: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    args = ["--trace", str(azure_head), "--interval", "2", "--predictor", "constant"]
    point = run_json(capsys, *args, "--series", "num_req")[0]
    upper = run_json(capsys, *args, "--series", "num_req", "--load-predictor-quantile", "0.9")[0]
    assert upper["under_rate"] < point["under_rate"]


def test_bad_trace_exits_2_with_one_line(
    azure_head: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bad = tmp_path / "bad.csv"
    lines = azure_head.read_bytes().decode().splitlines(keepends=True)
    bad.write_bytes(
        "".join([*lines[:50], "2023-11-16 18:16:00.0,many,3\r\n", *lines[50:]]).encode()
    )
    assert main(["backtest", "--trace", str(bad), "--interval", "5"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [
        f"planner: invalid trace: {bad}:51: ContextTokens = 'many': expected a whole "
        "number of tokens >= 0"
    ]

    assert (
        main(
            [
                "backtest",
                "--trace",
                str(bad),
                "--interval",
                "5",
                "--predictor",
                "constant",
                "--skip-bad-rows",
            ]
        )
        == 0
    )
    captured = capsys.readouterr()
    assert "300 requests, 1 bad row(s) skipped" in captured.out
    assert f"{bad}:51" in captured.err  # the warning names the first bad row


def test_too_short_and_missing_traces(
    azure_head: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["backtest", "--trace", str(azure_head), "--interval", "600"]) == 2
    assert "a backtest needs at least 3" in capsys.readouterr().err
    assert main(["backtest", "--trace", str(tmp_path / "nope.jsonl")]) == 2
    assert "no such file or directory" in capsys.readouterr().err


@pytest.mark.parametrize(
    "args",
    [["--predictor", "lstm"], ["--interval", "0"], ["--interval", "soon"], ["--series", "rps"]],
)
def test_bad_arguments_exit_2(
    azure_head: Path, args: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as info:
        main(["backtest", "--trace", str(azure_head), *args])
    assert info.value.code == 2
    assert "backtest" in capsys.readouterr().err


# --- metric definitions -------------------------------------------------------------------------


def test_metrics_skip_missing_actuals_and_zero_for_mape() -> None:
    result = backtest_series(
        ConstantPredictor(), [10.0, 20.0, math.nan, 0.0, 10.0], name="constant", series="isl"
    )
    # forecasts: 0 (unscored), 10 (a=20), 20 (a=NaN: unscored), 20 (a=0), 0 (a=10)
    assert result.forecasts == (0.0, 10.0, 20.0, 20.0, 0.0)
    assert result.intervals == 3
    assert result.mape == pytest.approx((10 / 20 + 10 / 10) / 2 * 100)  # a=0 has no APE
    assert result.smape == pytest.approx((20 / 30 + 2.0 + 2.0) / 3 * 100)
    assert result.under_rate == pytest.approx(2 / 3)


def test_run_backtest_rejects_unknown_series() -> None:
    with pytest.raises(ValueError, match=r"series \['rps'\]"):
        run_backtest([], predictors=["constant"], series=["rps"])


def test_backtest_family_rejects_series_of_different_lengths() -> None:
    with pytest.raises(ValueError, match="backtest series lengths"):
        backtest_family(
            {"num_req": ConstantPredictor(), "isl": ConstantPredictor()},
            {"num_req": [1.0, 2.0], "isl": [1.0]},
            name="constant",
        )


@pytest.mark.slow
def test_auto_is_backtested_with_all_three_series_as_in_the_planner(mooncake_head: Path) -> None:
    # auto's series share evidence, so scoring one series must still run the other two
    intervals = bucket_trace(read_trace(mooncake_head), interval_s=6.0)
    (alone,) = run_backtest(intervals, predictors=["auto"], series=["num_req"])
    together = run_backtest(intervals, predictors=["auto"])
    assert [r.series for r in together] == ["num_req", "isl", "osl"]
    assert alone.forecasts == together[0].forecasts
    assert alone.mape == together[0].mape


# --- arima against constant -------------------------------------------------------------------


def table_rows(out: list[str]) -> dict[tuple[str, str], list[str]]:
    """The table's rows by (predictor, series): the cells after those two."""
    start = next(i for i, line in enumerate(out) if line.startswith("predictor "))
    rows = {}
    for line in out[start + 1 :]:
        cells = line.split()
        if len(cells) != 8:
            break
        rows[(cells[0], cells[1])] = cells[2:]
    return rows


def test_arima_scoring_like_constant_on_the_hour_of_mooncake_is_explained(
    mooncake_trace: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # 18 intervals of 180 s: every order ARIMA selects is (0,1,0) without a constant, the
    # random walk, so its rows equal constant's; the footer must say so, and why
    args = ["backtest", "--trace", str(mooncake_trace), "--predictor", "constant", "arima"]
    assert main(args) == 0
    out = capsys.readouterr().out.splitlines()
    rows = table_rows(out)
    for series in ("num_req", "isl", "osl"):
        # the scores (not the step time) are constant's
        assert rows[("arima", series)][:4] == rows[("constant", series)][:4]
    (note,) = [line for line in out if line.startswith("arima = constant on ")]
    assert note.startswith("arima = constant on num_req, isl, osl: the last value on all 18 ")
    assert "ARIMA(0,1,0) without a constant, the random walk" in note
    assert "the series had 18" in note
    assert any("shorter --interval" in line for line in out)


def test_arima_differs_from_constant_on_mooncake_per_minute(mooncake_trace: Path) -> None:
    # the same hour per minute: enough points for ARIMA to find structure, so it must not
    # forecast the last value throughout (nor be explained away), and it beats constant
    intervals = bucket_trace(read_trace(mooncake_trace), interval_s=60.0)
    constant, arima = run_backtest(intervals, predictors=["constant", "arima"], series=["num_req"])
    assert arima.last_value_intervals < arima.intervals
    assert last_value_explanation(arima) is None
    assert arima.forecasts != constant.forecasts
    assert arima.mape is not None and constant.mape is not None
    assert arima.mape < constant.mape


def write_mooncake(path: Path, counts: list[int], interval_s: float) -> Path:
    """A Mooncake JSONL trace with ``counts[t]`` requests spread over interval ``t``."""
    lines = []
    for t, count in enumerate(counts):
        for i in range(count):
            ms = int((t + i / count) * interval_s * 1000)
            lines.append(
                json.dumps(
                    {"timestamp": ms, "input_length": 1000, "output_length": 100, "hash_ids": []}
                )
            )
    path.write_text("\n".join(lines) + "\n")
    return path


def test_arima_follows_a_seasonal_load_that_constant_lags(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # a period-8 oscillation (an AR(2) once sampled) with noise: ARIMA must follow it, the
    # last value is a step behind; ISL and OSL are flat, where every model is the last value
    rng = np.random.default_rng(7)
    counts = [round(100 + 40 * math.sin(2 * math.pi * t / 8) + rng.normal(0, 2)) for t in range(81)]
    trace = write_mooncake(tmp_path / "seasonal.jsonl", counts, 60.0)
    args = ["backtest", "--trace", str(trace), "--interval", "60", "--predictor", "constant"]
    assert main([*args, "arima"]) == 0
    out = capsys.readouterr().out.splitlines()
    rows = table_rows(out)
    assert float(rows[("arima", "num_req")][0]) < 0.5 * float(rows[("constant", "num_req")][0])
    notes = [line for line in out if " = constant on " in line]
    assert notes == [
        "arima = constant on isl, osl: the last value on all 79 intervals "
        "(75 flat series: its constant value, 4 below its minimum points)"
    ]


def test_help_explains_every_column(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["backtest", "--help"])
    out = capsys.readouterr().out
    header = ("MAPE %", "sMAPE %", "RMSE", "under %", "p90 ms", "n")
    assert tuple(name for name, _ in COLUMNS) == header
    assert column_legend() in out
