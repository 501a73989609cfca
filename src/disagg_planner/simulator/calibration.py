"""Public measurements both engine models are judged against, in two disjoint point sets.

``python -m disagg_planner.simulator.calibration`` prints the tables that ``CALIBRATION.md``
reproduces; ``--write`` puts them into it (``tests/unit/simulator/test_calibration_doc.py``
fails when the two differ):

- **training**: the points the roofline's efficiency factors (``engine_fit.yaml``) were
  fitted to; its errors there say how well it fits, not how well it predicts. A training point
  marked ``outlier`` (with the reason) is reported with its residual but not fitted: no
  plausible factor reconciles it with the rest (``fit.py`` refuses the mark when the fit meets
  it after all);
- **validation**: points neither engine model was fitted to (``fit.py`` refuses them).

Training points of source ``aic-vllm`` are AIConfigurator's measured vLLM kernel tables
composed by ``aic_engine`` (the aic column of the same point): their reference values are
recorded here as ``python -m disagg_planner.simulator.calibration --aic-references`` prints
them, and ``tests/unit/simulator/test_calibration_doc.py`` fails when the two differ.

Each point is computed with the roofline (``sim:``) and with AIConfigurator's tables
(``aic:``, the extra ``disagg-planner[aic]``, with the backend the reference was measured on).
AIConfigurator was fitted to none of them. The issue's targets are <= 15% on TTFT and
<= 10% on ITL and throughput; each row says whether each engine model meets its target.

How each kind of point is computed, so that the comparison is like for like:

- ``prefill_ttft``: TTFT of one request alone (frontend latency plus the chunked prefill);
- ``prefill_thpt``: ``ISL / TTFT`` per GPU (Dynamo's profiler definition);
- ``decode_thpt_at_itl``: tokens/s/GPU of the largest decode batch whose step time at the
  given context stays within the ITL target;
- ``decode_step``: one decode step of ``batch`` requests at ``context`` tokens each;
- ``offline_thpt``: an offline run as the benchmarks do it: ``requests`` requests all queued
  at t = 0 on one aggregated engine of the simulator (its vLLM-like scheduler), throughput =
  output tokens per GPU / the time the last one finishes;
- ``serving_ttft`` / ``serving_tpot`` / ``serving_thpt``: one closed-loop serving benchmark
  as ``vllm bench serve`` runs it (``serving_bench``: ``concurrency`` clients from t = 0,
  ``requests`` prompts, random lengths in ``[int(r * L), L]``, outputs to their drawn
  length) on one aggregated engine: its median TTFT, median TPOT and total (input + output)
  token throughput per GPU, the mean over ``seeds`` length draws; the lowest and highest
  seed are listed with the sources.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from pathlib import Path

from disagg_planner.simulator.calibration_points import (
    ENGINE_MODELS,
    POINT_SETS,
    POINTS,
    SERVING_KINDS,
    SOURCES,
    TARGET,
    CalibrationPoint,
    compute_sim,
)


def _fmt(value: float) -> str:
    return f"{value:,.0f}" if abs(value) >= 100 else f"{value:,.2f}"


def _verdict(error: float, tolerance: float) -> str:
    return "met" if abs(error) <= tolerance else "missed"


def table(point_set: str, engine_models: Sequence[str] = ENGINE_MODELS) -> str:
    """One point set as a Markdown table, both engine models side by side."""
    header = ["#", "point", "source", "setting", "reference"]
    for e in engine_models:
        header += [f"{e}", f"{e} error", f"{e} target"]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for i, p in enumerate(POINTS, 1):
        if p.point_set != point_set:
            continue
        name = f"{p.name} (outlier: not fitted)" if p.outlier else p.name
        row = [str(i), name, p.source, p.setting, f"{_fmt(p.target)} {p.unit}"]
        for e in engine_models:
            flag = " (extrapolated)" if p.extrapolated(e) else ""
            row += [
                f"{_fmt(p.model_value(e))}{flag}",
                f"{p.error(e):+.1%}",
                f"{_verdict(p.error(e), p.target_tolerance)} ({p.target_tolerance:.0%})",
            ]
        lines.append("| " + " | ".join(row) + " |")
    return "\n".join(lines)


def spread_text(point: CalibrationPoint, engine_model: str) -> str:
    """A serving point's lowest to highest value over its seeds ("" for other kinds)."""
    spread = point.seed_spread(engine_model)
    if spread is None:
        return ""
    return f"{_fmt(spread[0])}-{_fmt(spread[1])} {point.unit}"


def mean_abs_error(point_set: str, engine_model: str) -> float:
    errors = [abs(p.error(engine_model)) for p in POINTS if p.point_set == point_set]
    return sum(errors) / len(errors)


def default_engine(point_set: str, engine_models: Sequence[str] = ENGINE_MODELS) -> str:
    """The engine model with the smaller mean absolute error on ``point_set``."""
    return min(engine_models, key=lambda e: mean_abs_error(point_set, e))


def summary(engine_models: Sequence[str] = ENGINE_MODELS) -> str:
    """Per point set: each engine model's mean absolute error, targets met, and the choice."""
    lines = [
        "| point set | points | "
        + " | ".join(f"{e} mean abs error | {e} targets met" for e in engine_models)
        + " | lower error |",
        "|" + "---|" * (3 + 2 * len(engine_models)),
    ]
    for s in POINT_SETS:
        points = [p for p in POINTS if p.point_set == s]
        cells = [s, str(len(points))]
        for e in engine_models:
            met = sum(abs(p.error(e)) <= p.target_tolerance for p in points)
            cells += [f"{mean_abs_error(s, e):.1%}", f"{met} of {len(points)}"]
        cells.append(default_engine(s, engine_models))
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def tables(engine_models: Sequence[str] = ENGINE_MODELS) -> str:
    """Everything ``CALIBRATION.md`` reproduces: the summary, both tables, the sources."""
    parts = [
        "### Summary",
        "",
        summary(engine_models),
        "",
        "### Training set",
        "",
        table("training", engine_models),
        "",
        "### Validation set",
        "",
        table("validation", engine_models),
        "",
        "### Sources and assumptions",
        "",
    ]
    parts += [f"- `{key}`: {text}." for key, text in SOURCES.items()]
    notes = sorted({a for p in POINTS for a in p.assumptions})
    parts += [f"- Assumed: {a}." for a in notes]
    parts += [
        f"- Seed spread, point {i} ({p.name}): "
        + ", ".join(f"{e} {spread_text(p, e)}" for e in engine_models)
        + f" ({p.seeds} seeds)."
        for i, p in enumerate(POINTS, 1)
        if p.kind in SERVING_KINDS
    ]
    parts += [
        f"- Outlier, point {i} ({p.name}): reported, not fitted: {p.outlier}."
        for i, p in enumerate(POINTS, 1)
        if p.outlier
    ]
    return "\n".join(parts)


DOC = Path(__file__).with_name("CALIBRATION.md")
BEGIN = "<!-- BEGIN calibration tables: python -m disagg_planner.simulator.calibration --write -->"
END = "<!-- END calibration tables -->"


def doc_tables(text: str) -> str:
    """The generated part of ``CALIBRATION.md``'s text (between its markers)."""
    if BEGIN not in text or END not in text:
        raise ValueError(f"{DOC}: the markers {BEGIN!r} and {END!r} are missing")
    return text.split(BEGIN, 1)[1].split(END, 1)[0].strip("\n")


def aic_references() -> dict[str, float]:
    """The reference value of every ``aic-vllm`` point as the aic engine model computes it now
    (rounded as recorded; needs the extra ``disagg-planner[aic]``)."""
    return {p.name: round(p.model_value("aic"), 2) for p in POINTS if p.source == "aic-vllm"}


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if args == ["--aic-references"]:
        for name, value in aic_references().items():
            print(f"{value:10.2f}  {name}")
        return 0
    if args not in ([], ["--write"]):
        print(
            "usage: python -m disagg_planner.simulator.calibration [--write | --aic-references]",
            file=sys.stderr,
        )
        return 2
    generated = tables()
    if not args:
        print(generated)
        return 0
    text = DOC.read_text()
    old = doc_tables(text)
    DOC.write_text(
        text.replace(old, generated, 1) if old else text.replace(BEGIN, BEGIN + "\n" + generated, 1)
    )
    print(f"wrote the tables into {DOC}")
    return 0


__all__ = [
    "DOC",
    "ENGINE_MODELS",
    "POINTS",
    "POINT_SETS",
    "SOURCES",
    "TARGET",
    "CalibrationPoint",
    "aic_references",
    "compute_sim",
    "doc_tables",
    "main",
    "spread_text",
    "summary",
    "table",
    "tables",
]


if __name__ == "__main__":
    sys.exit(main())
