"""Replay-only figures added to the diagnostics report: every request's TTFT and ITL."""

from __future__ import annotations

from typing import Any

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from disagg_planner.config.schema import PlannerConfig
from disagg_planner.replay.runner import ReplayResult

_MAX_POINTS = 20_000  # keep the HTML small; a regular subsample keeps the shape


def latency_figure(result: ReplayResult, config: PlannerConfig) -> Any:
    records = sorted(result.records, key=lambda r: r.arrival_s)
    step = max(1, len(records) // _MAX_POINTS)
    shown = records[::step]
    fig = make_subplots(
        rows=2, cols=1, subplot_titles=("TTFT per request (ms)", "ITL per request (ms)")
    )
    ok = [r for r in shown if r.ok]
    failed = [r for r in shown if not r.ok]
    fig.add_trace(
        go.Scattergl(
            x=[r.arrival_s for r in ok],
            y=[r.ttft_ms for r in ok],
            mode="markers",
            marker={"size": 3},
            name="TTFT",
        ),
        row=1,
        col=1,
    )
    fig.add_trace(
        go.Scattergl(
            x=[r.arrival_s for r in ok],
            y=[r.itl_ms for r in ok],
            mode="markers",
            marker={"size": 3},
            name="ITL",
        ),
        row=2,
        col=1,
    )
    if failed:
        fig.add_trace(
            go.Scattergl(
                x=[r.arrival_s for r in failed],
                y=[config.ttft_ms] * len(failed),
                mode="markers",
                marker={"size": 6, "symbol": "x", "color": "black"},
                name="failed",
            ),
            row=1,
            col=1,
        )
    fig.add_hline(y=config.ttft_ms, line_dash="dash", line_color="red", row=1, col=1)
    fig.add_hline(y=config.itl_ms, line_dash="dash", line_color="red", row=2, col=1)
    s = result.summary
    fig.update_layout(
        height=700,
        title=(
            f"{result.policy}: SLO attainment {s['slo_attainment']['both']:.2%}, "
            f"{s['gpu_hours']:.2f} GPU-hours"
            + (
                f" ({s['gpu_hours_ratio_to_oracle']:.2f}x oracle)"
                if s.get("gpu_hours_ratio_to_oracle")
                else ""
            )
        ),
    )
    fig.update_xaxes(title_text="arrival (s)")
    return fig
