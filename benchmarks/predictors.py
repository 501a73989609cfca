"""Backtest every load predictor on real traces at several intervals; write the tables.

For each trace and interval the trace is bucketed, and each predictor (constant, ARIMA,
Kalman, Prophet, auto) forecasts each interval's request count, mean ISL and mean OSL one
step ahead (``predictors.backtest``: last, partial interval left out). Printed and written to
``benchmarks/RESULTS.md`` between ``<!-- BEGIN predictors -->`` and ``<!-- END predictors -->``:

- MAPE per predictor, the best single predictor and auto's ratio to it (the issue's target:
  auto within 5% of the best single predictor);
- the under-forecast rate of each predictor on the request count;
- step times: p90 over all steps, and p90 after the first 20 intervals (warm);
- ARIMA's order re-selections: how often, at which points, and what they cost.

Usage::

    python benchmarks/predictors.py [TRACE ...] [--intervals 30 60 180] [--no-write]

Without TRACE arguments the traces bundled under ``planner/data/traces/`` are used.
"""

from __future__ import annotations

import argparse
import math
import os
import re
import shlex
import sys
import time
from collections.abc import Sequence
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from predictors import PREDICTOR_NAMES  # noqa: E402
from predictors.arima import ArimaPredictor  # noqa: E402
from predictors.backtest import BacktestResult, run_backtest  # noqa: E402
from predictors.traces import bucket_trace, read_trace  # noqa: E402
from predictors.warmup import SERIES  # noqa: E402

DEFAULT_TRACE_DIR = REPO / "planner" / "data" / "traces"
RESULTS = REPO / "benchmarks" / "RESULTS.md"
BEGIN, END = "<!-- BEGIN predictors -->", "<!-- END predictors -->"
SINGLES = ("constant", "arima", "kalman", "prophet")
WARM_STEPS = 20
TARGET = 1.05

Run = tuple[str, float, list[BacktestResult]]  # (trace label, interval, results)


def default_traces() -> list[Path]:
    if not DEFAULT_TRACE_DIR.is_dir():
        return []
    return sorted(
        p for p in DEFAULT_TRACE_DIR.iterdir() if p.name.endswith((".csv", ".jsonl", ".gz"))
    )


def label_of(path: Path) -> str:
    name = path.name.lower()
    if "azure" in name:
        return "Azure 2023 conv"
    if "mooncake" in name:
        return "Mooncake conv"
    return path.name


def run_all(traces: Sequence[Path], intervals: Sequence[float]) -> list[Run]:
    runs: list[Run] = []
    for path in traces:
        requests = list(read_trace(path))
        for interval in intervals:
            started = time.perf_counter()
            buckets = bucket_trace(requests, interval_s=interval)
            results = run_backtest(
                buckets, predictors=PREDICTOR_NAMES, settings={"interval_s": interval}
            )
            runs.append((label_of(path), interval, results))
            print(
                f"{label_of(path)} @ {interval:g} s: {len(buckets) - 1} intervals, "
                f"{time.perf_counter() - started:.1f} s",
                file=sys.stderr,
            )
    return runs


def timing_repeats(
    traces: Sequence[Path], *, interval: float, repeat: int
) -> dict[str, list[float]]:
    """p90 step time after warm-up (ms) of each predictor, one figure per trace and run.

    The machine is shared, so a single run's tail mostly measures the neighbours; the
    best of ``repeat`` runs is the figure that says what the predictor itself costs.
    """
    out: dict[str, list[float]] = {p: [] for p in PREDICTOR_NAMES}
    for path in traces:
        buckets = bucket_trace(read_trace(path), interval_s=interval)
        for name in PREDICTOR_NAMES:
            best = math.inf
            for _ in range(repeat):
                (result,) = run_backtest(
                    buckets,
                    predictors=[name],
                    series=["num_req"],
                    settings={"interval_s": interval},
                )
                best = min(best, float(np.percentile(result.step_ms[WARM_STEPS:], 90)))
            out[name].append(best)
    return out


def _by(results: list[BacktestResult]) -> dict[tuple[str, str], BacktestResult]:
    return {(r.predictor, r.series): r for r in results}


def _fmt(value: float | None, spec: str = ".2f") -> str:
    return "-" if value is None else format(value, spec)


def mape_table(runs: list[Run]) -> tuple[list[str], list[str]]:
    lines = [
        "| trace | interval | series | n | " + " | ".join(PREDICTOR_NAMES) + " | best single "
        "| auto / best |",
        "|---|---:|---|---:|" + "---:|" * (len(PREDICTOR_NAMES) + 2),
    ]
    misses: list[str] = []
    for label, interval, results in runs:
        by = _by(results)
        for series in SERIES:
            mapes = {p: by[(p, series)].mape for p in PREDICTOR_NAMES}
            singles = {p: m for p, m in mapes.items() if p in SINGLES and m is not None}
            best = min(singles, key=lambda p: singles[p])
            auto = mapes["auto"]
            ratio = auto / singles[best] if auto is not None else None
            if ratio is not None and ratio > TARGET:
                misses.append(f"{label} {interval:g} s {series} ({ratio:.3f})")
            cells = []
            for p in PREDICTOR_NAMES:
                text = _fmt(mapes[p])
                cells.append(f"**{text}**" if p == best else text)
            lines.append(
                f"| {label} | {interval:g} s | {series} | {by[('auto', series)].intervals} | "
                + " | ".join(cells)
                + f" | {best} | {_fmt(ratio, '.3f')} |"
            )
    return lines, misses


def under_table(runs: list[Run]) -> list[str]:
    lines = [
        "| trace | interval | " + " | ".join(PREDICTOR_NAMES) + " |",
        "|---|---:|" + "---:|" * len(PREDICTOR_NAMES),
    ]
    for label, interval, results in runs:
        by = _by(results)
        cells = [_fmt(by[(p, "num_req")].under_rate, ".2f") for p in PREDICTOR_NAMES]
        lines.append(f"| {label} | {interval:g} s | " + " | ".join(cells) + " |")
    return lines


def timing_table(runs: list[Run], best_of: dict[str, list[float]]) -> list[str]:
    lines = [
        "| predictor | p50 ms | p90 ms, all steps | p90 ms after "
        f"{WARM_STEPS} intervals | max ms | steps | p90 ms after {WARM_STEPS}, best run |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for p in PREDICTOR_NAMES:
        steps = [s for _, _, rs in runs for r in rs if r.predictor == p for s in r.step_ms]
        warm = [
            s for _, _, rs in runs for r in rs if r.predictor == p for s in r.step_ms[WARM_STEPS:]
        ]
        lines.append(
            f"| {p} | {np.percentile(steps, 50):.2f} | {np.percentile(steps, 90):.2f} | "
            f"{np.percentile(warm, 90):.2f} | {max(steps):.0f} | {len(steps)} | "
            f"{' / '.join(f'{v:.1f}' for v in best_of[p])} |"
        )
    return lines


def arima_lines(runs: list[Run]) -> list[str]:
    count = steps = 0
    seconds: list[float] = []
    schedules: set[tuple[int, ...]] = set()
    log_space = 0
    for _, _, results in runs:
        for r in results:
            if r.predictor != "arima" or not isinstance(r.model, ArimaPredictor):
                continue
            count += len(r.model.selections)
            steps += len(r.step_ms)
            seconds.extend(s.seconds for s in r.model.selections)
            log_space += sum(s.log_space for s in r.model.selections)
            schedules.add(tuple(s.points for s in r.model.selections))
    longest = max(schedules, key=len) if schedules else ()
    total = sum(seconds)
    return [
        f"- {count} order selections in {steps} steps ({count / max(steps, 1):.1%} of steps); "
        f"at points {', '.join(map(str, longest))} on the longest series "
        "(5, 10, 20, 40, 80, then every 48).",
        f"- cost per selection: mean {np.mean(seconds) * 1000:.0f} ms, p90 "
        f"{np.percentile(seconds, 90) * 1000:.0f} ms, max {max(seconds) * 1000:.0f} ms; "
        f"amortised over all steps {total / max(steps, 1) * 1000:.1f} ms per step.",
        f"- {log_space} of {count} selections kept the log1p model (spiky-series rule).",
    ]


def render(runs: list[Run], best_of: dict[str, list[float]], repeat: int, command: str) -> str:
    mape_lines, misses = mape_table(runs)
    load = os.getloadavg()[0]
    hits = sum(1 for _, _, rs in runs for _ in SERIES) - len(misses)
    out = [
        BEGIN,
        "## Load predictors (`benchmarks/predictors.py`)",
        "",
        "One-step-ahead rolling backtest (`predictors.backtest`, the same code as "
        "`planner backtest`), cold start, last partial interval left out. MAPE in percent "
        "(best single predictor in bold); `auto / best` is auto's MAPE over the best single "
        f"predictor's (target <= {TARGET}).",
        "",
        *mape_lines,
        "",
        f"auto within {TARGET - 1:.0%} of the best single predictor in {hits} of "
        f"{hits + len(misses)} rows" + (f"; missed: {'; '.join(misses)}." if misses else "."),
        "",
        "Under-forecast rate (share of intervals forecast below the actual), request count:",
        "",
        *under_table(runs),
        "",
        "Time of one observe + predict step over all runs above, on the shared 2-core machine "
        f"(load average {load:.1f} at the end; other jobs ran alongside). The last column is "
        f"the best of {repeat} repeated runs per trace (request count, 30 s intervals, "
        "one figure per trace in the order given), the predictor's own cost:",
        "",
        *timing_table(runs, best_of),
        "",
        "ARIMA order re-selection (`auto_arima` on the last <= 120 points):",
        "",
        *arima_lines(runs),
        "",
        "Command (the copies bundled under `planner/data/traces/` hold the same bytes, the "
        "Mooncake one gzipped, so `python benchmarks/predictors.py` reproduces these tables):",
        "",
        "```",
        command,
        "```",
        END,
    ]
    return "\n".join(out)


def write_section(section: str, path: Path = RESULTS) -> None:
    text = path.read_text() if path.exists() else "# Benchmark results\n"
    pattern = re.compile(re.escape(BEGIN) + ".*?" + re.escape(END), re.S)
    if pattern.search(text):
        text = pattern.sub(lambda _: section, text)
    else:
        text = text.rstrip("\n") + "\n\n" + section + "\n"
    path.write_text(text)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("traces", nargs="*", type=Path, help="trace files (default: bundled)")
    parser.add_argument("--intervals", nargs="+", type=float, default=[30.0, 60.0, 180.0])
    parser.add_argument("--repeat", type=int, default=3, help="timing runs per predictor")
    parser.add_argument("--no-write", action="store_true", help="print only")
    args = parser.parse_args(argv)
    traces = args.traces or default_traces()
    if not traces:
        parser.error(f"no traces given and none under {DEFAULT_TRACE_DIR}")
    runs = run_all(traces, args.intervals)
    best_of = timing_repeats(traces, interval=30.0, repeat=args.repeat)
    command = "python benchmarks/predictors.py " + shlex.join(
        sys.argv[1:] if argv is None else list(argv)
    )
    section = render(runs, best_of, args.repeat, command.strip())
    print(section)
    if not args.no_write:
        write_section(section)
    return 0


if __name__ == "__main__":
    sys.exit(main())
