"""Backtest every load predictor on real traces at several intervals; write the tables.

For each trace and interval the trace is bucketed, and each predictor (constant, ARIMA,
Kalman, Prophet, auto) forecasts each interval's request count, mean ISL and mean OSL one
step ahead (``disagg_planner.predictors.backtest``: last, partial interval left out). Printed and
written to
``benchmarks/RESULTS.md`` between ``<!-- BEGIN predictors -->`` and ``<!-- END predictors -->``:

- MAPE per predictor, the best single predictor and auto's ratio to it (the issue's target:
  auto within 5% of the best single predictor), for auto's default answer (a blend of the
  candidates) and for ``auto-best`` (the single best recent candidate, with hysteresis);
- the same per trace and interval with one predictor for the three series (MAPE averaged
  over them), as the planner's config has it: the best single predictor a user can choose;
- both again at held-out intervals (45, 90, 120, 240 s): auto's settings were chosen on the
  30/60/180 s backtests, these say whether the choice carries over;
- the under-forecast rate of each predictor on the request count;
- step times: p90 over all steps, and p90 after the first 20 intervals (warm);
- ARIMA's order re-selections: how often, at which points, and what they cost.

Usage::

    python benchmarks/predictors.py [TRACE ...] [--intervals 30 60 180]
        [--held-out-intervals 45 90 120 240] [--no-write]

Without TRACE arguments the Azure 2023 and Mooncake conversation traces are read from
``$PLANNER_TRACE_DIR`` (default ``../shared/traces`` beside the repository; ``tests/traces.py``).
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

from disagg_planner.predictors import PREDICTOR_NAMES  # noqa: E402
from disagg_planner.predictors.arima import ArimaPredictor  # noqa: E402
from disagg_planner.predictors.auto import AutoPredictor, EvidencePool  # noqa: E402
from disagg_planner.predictors.backtest import BacktestResult, backtest_family, run_backtest  # noqa: E402
from disagg_planner.predictors.base import BasePredictor, LoadPredictor  # noqa: E402
from disagg_planner.predictors.factory import AUTO_CANDIDATES, make_predictor  # noqa: E402
from disagg_planner.predictors.traces import bucket_trace, read_trace  # noqa: E402
from disagg_planner.predictors.warmup import SERIES, series_of  # noqa: E402
from tests.traces import AZURE_CONV, MOONCAKE_CONV, for_script  # noqa: E402

RESULTS = REPO / "benchmarks" / "RESULTS.md"
BEGIN, END = "<!-- BEGIN predictors -->", "<!-- END predictors -->"
SINGLES = ("constant", "arima", "kalman", "prophet")
AUTO_BEST = "auto-best"
COLUMNS = (*PREDICTOR_NAMES, AUTO_BEST)
WARM_STEPS = 20
TARGET = 1.05

Run = tuple[str, float, list[BacktestResult]]  # (trace label, interval, results)


def default_traces() -> list[Path]:
    return [for_script(AZURE_CONV), for_script(MOONCAKE_CONV)]


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
            results += auto_best(buckets, interval)
            runs.append((label_of(path), interval, results))
            print(
                f"{label_of(path)} @ {interval:g} s: {len(buckets) - 1} intervals, "
                f"{time.perf_counter() - started:.1f} s",
                file=sys.stderr,
            )
    return runs


def auto_best(buckets: list, interval: float) -> list[BacktestResult]:
    """Backtest auto answering with its single best recent candidate (``answer="best"``),
    its three series sharing evidence as the default auto's do."""
    values = series_of(buckets[:-1])  # the last, partial interval left out, as run_backtest
    pool = EvidencePool()
    family: dict[str, LoadPredictor] = {}
    for key in SERIES:
        candidates: dict[str, BasePredictor] = {}
        for name in AUTO_CANDIDATES:
            single = make_predictor(name, interval_s=interval)
            assert isinstance(single, BasePredictor)
            candidates[name] = single
        family[key] = AutoPredictor(candidates, answer="best", pool=pool)
    return backtest_family(family, values, name=AUTO_BEST)


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
                warm = result.step_ms[WARM_STEPS:] or result.step_ms  # short runs: all steps
                best = min(best, float(np.percentile(warm, 90)))
            out[name].append(best)
    return out


def _by(results: list[BacktestResult]) -> dict[tuple[str, str], BacktestResult]:
    return {(r.predictor, r.series): r for r in results}


def _fmt(value: float | None, spec: str = ".2f") -> str:
    return "-" if value is None else format(value, spec)


AUTOS = ("auto", AUTO_BEST)
Ratios = dict[str, list[tuple[str, float]]]  # auto variant -> (row label, MAPE / best single)


def _ratio_head(first: list[str], first_rule: str) -> list[str]:
    """Header and rule of a table of :func:`_ratio_row` lines."""
    names = [*first, *COLUMNS, "best single", *(f"{v} / best" for v in AUTOS)]
    return ["| " + " | ".join(names) + " |", first_rule + "---:|" * (len(COLUMNS) + 3)]


def _ratio_row(
    head: list[str], mapes: dict[str, float | None], row_label: str, ratios: Ratios
) -> str:
    """One table line: ``head`` cells, each predictor's MAPE (the best single in bold), the
    best single's name and each auto variant's ratio to it (also appended to ``ratios``)."""
    singles = {p: m for p, m in mapes.items() if p in SINGLES and m is not None}
    best = min(singles, key=lambda p: singles[p])
    row: dict[str, float | None] = {}
    for variant in AUTOS:
        got = mapes.get(variant)
        row[variant] = got / singles[best] if got is not None else None
        if got is not None:
            ratios[variant].append((row_label, got / singles[best]))
    cells = [f"**{_fmt(mapes.get(p))}**" if p == best else _fmt(mapes.get(p)) for p in COLUMNS]
    return "| " + " | ".join([*head, *cells, best, *(_fmt(row[v], ".3f") for v in AUTOS)]) + " |"


def mape_table(runs: list[Run]) -> tuple[list[str], Ratios]:
    """The MAPE table, and per auto variant its ratio to the best single predictor per row."""
    lines = _ratio_head(["trace", "interval", "series", "n"], "|---|---:|---|---:|")
    ratios: Ratios = {a: [] for a in AUTOS}
    for label, interval, results in runs:
        by = _by(results)
        for series in SERIES:
            head = [label, f"{interval:g} s", series, str(by[("auto", series)].intervals)]
            mapes = {p: by[(p, series)].mape for p in COLUMNS}
            lines.append(_ratio_row(head, mapes, f"{label} {interval:g} s {series}", ratios))
    return lines, ratios


def hit_lines(ratios: Ratios, unit: str = "rows") -> list[str]:
    out = []
    for variant in AUTOS:
        rows = ratios[variant]
        missed = [f"{label} ({r:.3f})" for label, r in rows if r > TARGET]
        values = [r for _, r in rows]
        out.append(
            f"- `{variant}` within {TARGET - 1:.0%} of the best single predictor in "
            f"{len(rows) - len(missed)} of {len(rows)} {unit} (mean ratio {np.mean(values):.3f}, "
            f"worst {max(values):.3f})" + (f"; missed: {'; '.join(missed)}." if missed else ".")
        )
    return out


def config_table(runs: list[Run]) -> tuple[list[str], Ratios]:
    """Per trace and interval, each predictor's MAPE averaged over the three series: the
    planner's config names one predictor for all three, so this is the choice a user has."""
    lines = _ratio_head(["trace", "interval"], "|---|---:|")
    ratios: Ratios = {a: [] for a in AUTOS}
    for label, interval, results in runs:
        by = _by(results)
        means: dict[str, float | None] = {}
        for p in COLUMNS:
            values = [by[(p, series)].mape for series in SERIES]
            clean = [v for v in values if v is not None]
            means[p] = float(np.mean(clean)) if len(clean) == len(values) else None
        head = [label, f"{interval:g} s"]
        lines.append(_ratio_row(head, means, f"{label} {interval:g} s", ratios))
    return lines, ratios


def under_table(runs: list[Run]) -> list[str]:
    lines = [
        "| trace | interval | " + " | ".join(COLUMNS) + " |",
        "|---|---:|" + "---:|" * len(COLUMNS),
    ]
    for label, interval, results in runs:
        by = _by(results)
        cells = [_fmt(by[(p, "num_req")].under_rate, ".2f") for p in COLUMNS]
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
            f"{_fmt(float(np.percentile(warm, 90)) if warm else None)} | {max(steps):.0f} | "
            f"{len(steps)} | "
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


def render(
    runs: list[Run],
    held_out: list[Run],
    best_of: dict[str, list[float]],
    repeat: int,
    command: str,
) -> str:
    mape_lines, ratios = mape_table(runs)
    load = os.getloadavg()[0]
    out = [
        BEGIN,
        "## Load predictors (`benchmarks/predictors.py`)",
        "",
        "One-step-ahead rolling backtest (`disagg_planner.predictors.backtest`, the same code as "
        "`planner backtest`), cold start, last partial interval left out. MAPE in percent "
        "(best single predictor in bold). `auto` is the default (a blend of the four, weighted "
        "by their recent errors); `auto-best` answers with the single best recent candidate, "
        "switching with hysteresis. The ratios are each one's MAPE over the best single "
        f"predictor's (target <= {TARGET}).",
        "",
        *mape_lines,
        "",
        *hit_lines(ratios),
        "",
    ]
    config_lines, config_ratios = config_table(runs)
    out += [
        "One predictor for the three series, as the planner's config has it "
        "(`--load-predictor` applies to all three): MAPE averaged over request count, ISL "
        "and OSL per trace and interval. The best single predictor here is the best choice "
        "a user could configure; the per-series best above mixes predictors no config can.",
        "",
        *config_lines,
        "",
        *hit_lines(config_ratios, unit="trace/interval pairs"),
        "",
    ]
    if held_out:
        held_lines, held_ratios = mape_table(held_out)
        held_config_lines, held_config_ratios = config_table(held_out)
        out += [
            "Held out: the same at intervals auto's settings (sharpness, window, pool weight) "
            "were not chosen on. Per series:",
            "",
            *held_lines,
            "",
            *hit_lines(held_ratios),
            "",
            "One predictor for the three series:",
            "",
            *held_config_lines,
            "",
            *hit_lines(held_config_ratios, unit="trace/interval pairs"),
            "",
        ]
    out += [
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
        "Command (without TRACE arguments it reads the Azure and Mooncake conversation "
        "traces from `$PLANNER_TRACE_DIR`, default `../shared/traces`):",
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
    parser.add_argument("traces", nargs="*", type=Path, help="trace files (default: shared)")
    parser.add_argument("--intervals", nargs="+", type=float, default=[30.0, 60.0, 180.0])
    parser.add_argument(
        "--held-out-intervals",
        nargs="*",
        type=float,
        default=[45.0, 90.0, 120.0, 240.0],
        help="intervals reported apart (auto's settings were not chosen on them); none: skip",
    )
    parser.add_argument("--repeat", type=int, default=3, help="timing runs per predictor")
    parser.add_argument("--no-write", action="store_true", help="print only")
    args = parser.parse_args(argv)
    traces = args.traces or default_traces()
    runs = run_all(traces, args.intervals)
    held_out = run_all(traces, args.held_out_intervals)
    best_of = timing_repeats(traces, interval=30.0, repeat=args.repeat)
    command = "python benchmarks/predictors.py " + shlex.join(
        sys.argv[1:] if argv is None else list(argv)
    )
    section = render(runs, held_out, best_of, args.repeat, command.strip())
    print(section)
    if not args.no_write:
        write_section(section)
    return 0


if __name__ == "__main__":
    sys.exit(main())
