"""``planner backtest``: score the load predictors on a recorded trace before deploying.

The trace is bucketed into intervals of ``--interval`` seconds (default: the throughput
interval of the config); each predictor forecasts each interval's request count, mean ISL and
mean OSL one step ahead, and is scored on the whole trace. The prediction settings
(``--load-predictor-log1p``, ``--load-predictor-quantile``, ``--kalman-*`` ...) come from the
usual config sources, so the backtest runs the predictors exactly as the planner would.
"""

from __future__ import annotations

import argparse
import json
import textwrap
from collections.abc import Mapping
from typing import Any

from disagg_planner.cli.arguments import add_skip_bad_rows, positive_seconds
from disagg_planner.config import load_config
from disagg_planner.config.flags import add_config_arguments, config_flags
from disagg_planner.errors import TraceError, register_foreign_error
from disagg_planner.predictors import PREDICTOR_NAMES
from disagg_planner.predictors.auto import AutoPredictor
from disagg_planner.predictors.backtest import (
    BacktestResult,
    last_value_explanation,
    run_backtest,
)
from disagg_planner.predictors.base import LoadPredictor
from disagg_planner.predictors.traces import FORMATS, bucket_trace, read_trace
from disagg_planner.predictors.warmup import SERIES, WarmupReport
from disagg_planner.runtime.wiring import warm_up_predictors

# The predictors library raises its own TraceError (it may not import planner); the CLI shows
# it as one line and exits 2, like every other bad input.
register_foreign_error("disagg_planner.predictors.traces.errors", "TraceError", TraceError)

MIN_INTERVALS = 3

# What each column of the table means: in `--help` and under the table, one text.
COLUMNS: tuple[tuple[str, str], ...] = (
    ("MAPE %", "mean |forecast - actual| / actual, percent (intervals with actual > 0)"),
    ("sMAPE %", "mean 2 |forecast - actual| / (|forecast| + |actual|), percent"),
    ("RMSE", "root mean squared error, in the series' unit (requests, tokens)"),
    ("under %", "share of intervals forecast below the actual (the ones that cost SLO)"),
    ("p90 ms", "90th percentile wall time of one observe + predict step of the predictor"),
    ("n", "intervals scored"),
)


def column_legend() -> str:
    """The table's columns, one per line (``--help``'s epilog and the table's footer)."""
    width = max(len(name) for name, _ in COLUMNS)
    return "\n".join(f"  {name:<{width}}  {text}" for name, text in COLUMNS)


def register(sub: Any) -> None:
    parser = sub.add_parser(
        "backtest",
        help="Score the load predictors on a request trace (one-step-ahead, rolling).",
        # raw, so that the epilog's legend keeps its columns; the description is wrapped here
        description=textwrap.fill(
            "Replay a request trace interval by interval: each predictor forecasts the "
            "next interval's request count, mean ISL and mean OSL, then sees the actual value. "
            "Reports MAPE and sMAPE (percent), RMSE (series unit), the under-forecast rate (share "
            "of intervals forecast below the actual: percent in the table, 0-1 in --json) and the "
            "p90 time of one observe+predict "
            "step. The trace's last interval is left out (its end is unknown, so it is usually "
            "partial). With --load-predictor-quantile the upper forecast is scored. A predictor "
            "whose forecasts were the last value on every interval (so that it scores exactly "
            "like constant) is named under the table, with why.",
            width=79,
        ),
        epilog="columns of the table:\n" + column_legend(),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--trace",
        required=True,
        metavar="FILE",
        help="Trace file, glob or directory (Mooncake/Dynamo JSONL, Azure/BurstGPT CSV, .gz), "
        "or servegen:DIR[,options] (ServeGen client descriptions; see README).",
    )
    parser.add_argument(
        "--trace-format",
        choices=FORMATS,
        default=None,
        help="Trace format (default: detected from the first line of each file).",
    )
    add_skip_bad_rows(parser)
    parser.add_argument(
        "--interval",
        type=positive_seconds,
        metavar="S",
        default=None,
        help="Interval length in seconds (default: the config's throughput interval, 180).",
    )
    parser.add_argument(
        "--predictor",
        nargs="+",
        type=_predictor_choice,
        default=["all"],
        metavar="NAME",
        help=f"Predictors to score: all, or some of {', '.join(PREDICTOR_NAMES)}.",
    )
    parser.add_argument(
        "--series",
        nargs="+",
        default=list(SERIES),
        choices=SERIES,
        help="Series to score (default: all three).",
    )
    parser.add_argument(
        "--json",
        action="store_true",
        help='Print {"results": [{"predictor", "series", "mape", "smape", "rmse", '
        '"under_rate", "p90_step_ms", "intervals"}, ...]} instead of a table.',
    )
    add_config_arguments(parser)
    parser.set_defaults(handler=_run)


def _predictor_choice(text: str) -> str:
    if text != "all" and text not in PREDICTOR_NAMES:
        raise argparse.ArgumentTypeError(
            f"{text!r}: expected all or some of {', '.join(PREDICTOR_NAMES)}"
        )
    return text


def _predictor_names(requested: list[str]) -> list[str]:
    names: list[str] = []
    for name in requested:
        for item in PREDICTOR_NAMES if name == "all" else (name,):
            if item not in names:
                names.append(item)
    return names


def _run(args: argparse.Namespace) -> int:
    names = _predictor_names(args.predictor)
    config = load_config(config_arg=args.config, flags=config_flags(args)).config
    interval = (
        config.throughput_adjustment_interval_seconds if args.interval is None else args.interval
    )
    reader = read_trace(
        args.trace, trace_format=args.trace_format, skip_bad_rows=args.skip_bad_rows
    )
    intervals = bucket_trace(reader, interval_s=interval)
    if len(intervals) < MIN_INTERVALS:
        raise TraceError(
            f"{args.trace}: {reader.requests} request(s) span {len(intervals)} interval(s) of "
            f"{interval:g} s; a backtest needs at least {MIN_INTERVALS}"
        )
    settings = {
        "log1p": config.load_predictor_log1p,
        "quantile": config.load_predictor_quantile,
        "prophet_window_size": config.prophet_window_size,
        "kalman_q_level": config.kalman_q_level,
        "kalman_q_trend": config.kalman_q_trend,
        "kalman_r": config.kalman_r,
        "kalman_min_points": config.kalman_min_points,
        "interval_s": interval,
    }
    warmup = None
    if config.load_predictor_warmup_trace:

        def warmup(family: Mapping[str, LoadPredictor]) -> WarmupReport:
            return warm_up_predictors(family, config, interval_s=interval)

    results = run_backtest(
        intervals, predictors=names, series=args.series, settings=settings, prepare=warmup
    )
    if args.json:
        print(json.dumps({"results": [r.as_json() for r in results]}, indent=2))
        return 0
    skipped = f", {reader.bad_rows} bad row(s) skipped" if reader.bad_rows else ""
    scored = (
        f"upper quantile {config.load_predictor_quantile:g}"
        if config.load_predictor_quantile is not None
        else "point forecast"
    )
    print(
        f"{args.trace}: {reader.format}, {reader.requests} requests{skipped}; "
        f"{len(intervals) - 1} intervals of {interval:g} s (last, partial one left out); "
        f"scored: {scored}"
        + (
            f"; predictors warmed up on {config.load_predictor_warmup_trace}"
            if warmup is not None
            else ""
        )
    )
    print(format_table(results))
    print(column_legend())
    for line in last_value_lines(results):
        print(line)
    for line in summary_lines(results):
        print(line)
    return 0


def last_value_lines(results: list[BacktestResult]) -> list[str]:
    """One line per predictor and series whose forecasts were the last value on every
    scored interval (identical to ``constant``'s row), with why."""
    # series with the same account share a line
    grouped: dict[tuple[str, str], list[str]] = {}
    for r in results:
        why = last_value_explanation(r)
        if why is not None:
            grouped.setdefault((r.predictor, why), []).append(r.series)
    lines = [
        f"{name} = constant on {', '.join(series)}: {why}"
        for (name, why), series in grouped.items()
    ]
    if any(name == "arima" for name, _ in grouped):
        lines.append(
            "  (a shorter --interval gives ARIMA more points to find an AR/MA term or a drift in)"
        )
    return lines


def summary_lines(results: list[BacktestResult]) -> list[str]:
    """What to configure: the predictor with the lowest MAPE averaged over the series scored
    (one ``--load-predictor`` serves all three), auto against it, and auto's final weights."""
    by_name: dict[str, list[float]] = {}
    for r in results:
        by_name.setdefault(r.predictor, [])
        if r.mape is not None:
            by_name[r.predictor].append(r.mape)
    series = {r.series for r in results}
    means = {
        name: sum(mapes) / len(mapes)
        for name, mapes in by_name.items()
        if mapes and len(mapes) == len(series)
    }
    lines: list[str] = []
    singles = {name: m for name, m in means.items() if name != "auto"}
    if singles:
        best = min(singles, key=lambda n: singles[n])
        text = f"lowest MAPE averaged over {', '.join(sorted(series))}: {best} {singles[best]:.2f}"
        if "auto" in means and singles[best] > 0:
            text += f"; auto {means['auto']:.2f} ({means['auto'] / singles[best]:.3f}x)"
        lines.append(text)
    autos = [r for r in results if r.predictor == "auto" and isinstance(r.model, AutoPredictor)]
    if autos:
        lines.append(f"at the end of the trace, {autos[0].model.predict_next().note}")
    return lines


def _cell(value: float | None, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def format_table(results: list[BacktestResult]) -> str:
    """A fixed-width table, one row per predictor and series."""
    header = ("predictor", "series", *(name for name, _ in COLUMNS))
    rows = [header]
    for r in results:
        rows.append(
            (
                r.predictor,
                r.series,
                _cell(r.mape, ".2f"),
                _cell(r.smape, ".2f"),
                _cell(r.rmse, ".4g"),
                _cell(None if r.under_rate is None else r.under_rate * 100, ".1f"),
                _cell(r.p90_step_ms, ".2f"),
                str(r.intervals),
            )
        )
    widths = [max(len(row[i]) for row in rows) for i in range(len(header))]
    lines = []
    for row in rows:
        cells = [
            cell.ljust(widths[i]) if i < 2 else cell.rjust(widths[i]) for i, cell in enumerate(row)
        ]
        lines.append("  ".join(cells).rstrip())
    return "\n".join(lines)
