"""How far the simulator's engine models are from public measurements they were not fitted to.

Every validation point of ``disagg_planner.simulator.calibration.POINTS`` (the set the fit
refuses) on each engine model: the roofline (``sim``, the default) and AIConfigurator's tables
(``aic``, when the extra ``disagg-planner[aic]`` is installed), its error, the issue's goal for
its metric (TTFT <= 15%, ITL and throughput <= 10%) and whether it is met; then per metric the
mean absolute error and the share of points met (the goal: mean within the tolerance and at
least 80% of the points individually).

    python benchmarks/fidelity.py                 # print the tables
    python benchmarks/fidelity.py --write         # and put them into benchmarks/RESULTS.md
    python benchmarks/fidelity.py --check         # exit 1 when a sim validation point misses

A few minutes on two cores: the offline points simulate up to 10,000 requests per engine model.
"""

from __future__ import annotations

import argparse
import importlib.util
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from results_block import markers, write_block

from disagg_planner.simulator.calibration import POINTS, TARGET, CalibrationPoint, spread_text

BLOCK = "fidelity"
# The share of points that must meet their tolerance individually.
MIN_SHARE_MET = 0.8


@dataclass(frozen=True)
class Row:
    number: int  # the point's number in CALIBRATION.md
    point: CalibrationPoint
    engine_model: str
    value: float
    error: float

    @property
    def met(self) -> bool:
        return abs(self.error) <= self.point.target_tolerance


def engine_models() -> tuple[str, ...]:
    """``sim``, and ``aic`` where its extra is installed."""
    has_aic = importlib.util.find_spec("aiconfigurator_core") is not None
    return ("sim", "aic") if has_aic else ("sim",)


def rows(
    points: Sequence[CalibrationPoint] = POINTS, models: Sequence[str] = ("sim",)
) -> list[Row]:
    """One row per validation point and engine model (training points are never judged)."""
    out = []
    for i, p in enumerate(points, 1):
        if p.point_set != "validation":
            continue
        for e in models:
            value = p.model_value(e)
            out.append(Row(i, p, e, value, (value - p.target) / p.target))
    return out


def _fmt(value: float) -> str:
    return f"{value:,.0f}" if abs(value) >= 100 else f"{value:,.2f}"


def point_table(table_rows: Sequence[Row]) -> str:
    lines = [
        "| # | point | metric | engine model | reference | model | seeds (min-max) | error | goal "
        "| verdict |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in table_rows:
        p = r.point
        lines.append(
            f"| {r.number} | {p.name} | {p.metric} | {r.engine_model} | "
            f"{_fmt(p.target)} {p.unit} | {_fmt(r.value)} | {spread_text(p, r.engine_model)} | "
            f"{r.error:+.1%} | "
            f"<= {p.target_tolerance:.0%} | {'met' if r.met else 'missed'} |"
        )
    return "\n".join(lines)


def metric_table(table_rows: Sequence[Row], models: Sequence[str]) -> str:
    lines = [
        "| engine model | metric | points | mean abs error | met | goal | verdict |",
        "|---|---|---|---|---|---|---|",
    ]
    for e in models:
        for metric, tolerance in TARGET.items():
            mine = [r for r in table_rows if r.engine_model == e and r.point.metric == metric]
            if not mine:
                continue
            mae = sum(abs(r.error) for r in mine) / len(mine)
            met = sum(r.met for r in mine)
            ok = mae <= tolerance and met >= MIN_SHARE_MET * len(mine)
            lines.append(
                f"| {e} | {metric} | {len(mine)} | {mae:.1%} | {met} of {len(mine)} | "
                f"mean <= {tolerance:.0%}, >= {MIN_SHARE_MET:.0%} met | "
                f"{'met' if ok else 'missed'} |"
            )
    return "\n".join(lines)


def missed(table_rows: Sequence[Row], engine_model: str = "sim") -> list[Row]:
    return [r for r in table_rows if r.engine_model == engine_model and not r.met]


def report(table_rows: Sequence[Row], models: Sequence[str]) -> str:
    return "\n".join(
        [
            "Validation points (never fitted; `python benchmarks/fidelity.py`), per point:",
            "",
            point_table(table_rows),
            "",
            "Per metric (the goal: mean absolute error within the tolerance and at least "
            f"{MIN_SHARE_MET:.0%} of the points met):",
            "",
            metric_table(table_rows, models),
            "",
            "The cause of each miss: `src/disagg_planner/simulator/CALIBRATION.md`, "
            '"Which engine model by point set".',
        ]
    )


def main(argv: Sequence[str] | None = None, points: Sequence[CalibrationPoint] = POINTS) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--write", action="store_true", help="write benchmarks/RESULTS.md")
    parser.add_argument(
        "--check", action="store_true", help="exit 1 when a validation point of sim misses"
    )
    args = parser.parse_args(argv)
    models = engine_models()
    table_rows = rows(points, models)
    text = report(table_rows, models)
    if models == ("sim",):
        text += "\n\n(aic not installed: `pip install 'disagg-planner[aic]'` adds its rows.)"
    print(text)
    if args.write:
        begin, end = markers(BLOCK)
        write_block(BLOCK, f"{begin}\n## Engine-model fidelity\n\n{text}\n{end}")
    bad = missed(table_rows)
    if args.check and bad:
        print(
            f"\nFAILED: {len(bad)} validation point(s) outside tolerance on sim: "
            + "; ".join(f"#{r.number} {r.error:+.1%}" for r in bad),
            file=sys.stderr,
        )
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
