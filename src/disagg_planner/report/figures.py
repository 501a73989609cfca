"""The report's figures, one per panel: load against the capacity the ready replicas provide at
the SLO, replicas desired and ready with every decision marked, latency against the SLO lines,
GPUs and GPU-hours, and the folded detail (forecast, lengths, corrections, per-engine queues).
A figure with nothing to draw is None, and its panel says why."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from disagg_planner.report.decisions import short_reason
from disagg_planner.report.elements import (
    PANEL_HEIGHT,
    SLO_COLOUR,
    Decision,
    LatencyWindows,
    LoadCapacity,
    Panel,
    layout,
    ordered_roles,
    role_colour,
)
from disagg_planner.report.snapshot import TickSnapshot


def _has(values: Sequence[Any]) -> bool:
    return any(v is not None and not (isinstance(v, float) and math.isnan(v)) for v in values)


def load_capacity_figure(load: LoadCapacity) -> Any | None:
    roles = [r for r in load.roles if _has(r.demand_tokens_s)]
    if not roles:
        return None
    fig = make_subplots(
        rows=len(roles),
        cols=1,
        shared_xaxes=True,
        vertical_spacing=0.12,
    )
    for i, r in enumerate(roles, start=1):
        colour = role_colour(r.role)
        fig.add_trace(
            go.Scatter(
                x=list(r.t_s),
                y=list(r.demand_tokens_s),
                name=f"{r.role} {r.demand_label}",
                mode="lines",
                line={"color": colour, "width": 2},
            ),
            row=i,
            col=1,
        )
        if _has(r.capacity_tokens_s):
            fig.add_trace(
                go.Scatter(
                    x=list(r.t_s),
                    y=list(r.capacity_tokens_s),
                    name=f"{r.role} {r.capacity_label}",
                    mode="lines",
                    line={"color": colour, "dash": "dash", "shape": "hv"},
                    fill=None,
                ),
                row=i,
                col=1,
            )
        fig.update_yaxes(title_text=f"{r.role} tokens/s", rangemode="tozero", row=i, col=1)
    fig.update_xaxes(title_text="time (s)", row=len(roles), col=1)
    return layout(fig, height=max(PANEL_HEIGHT, 260 * len(roles)))


def replicas_figure(
    snapshots: Sequence[TickSnapshot],
    decisions: Sequence[Decision],
    *,
    timeline: Sequence[Mapping[str, Any]] | None = None,
) -> Any | None:
    """Desired and ready replicas per role (from the full timeline when given, which also
    shows replicas becoming ready between ticks), each decision a labelled marker, every
    tick a small mark."""
    roles = ordered_roles(r for s in snapshots for r in s.desired)
    if not roles:
        return None
    fig = make_subplots(rows=len(roles), cols=1, shared_xaxes=True, vertical_spacing=0.1)
    for i, role in enumerate(roles, start=1):
        colour = role_colour(role)
        if timeline:
            t = [row["t_s"] for row in timeline]
            desired = [row["desired"].get(role) for row in timeline]
            ready = [row["ready"].get(role) for row in timeline]
        else:
            t = [s.t_s for s in snapshots]
            desired = [s.desired.get(role) for s in snapshots]
            ready = [s.ready.get(role) for s in snapshots]
        fig.add_trace(
            go.Scatter(
                x=t,
                y=desired,
                name=f"{role} desired",
                mode="lines",
                line={"color": colour, "shape": "hv", "width": 2.5},
            ),
            row=i,
            col=1,
        )
        fig.add_trace(
            go.Scatter(
                x=t,
                y=ready,
                name=f"{role} ready",
                mode="lines",
                line={"color": colour, "shape": "hv", "dash": "dot", "width": 1.5},
                opacity=0.8,
            ),
            row=i,
            col=1,
        )
        ticks = [s for s in snapshots if role in s.desired]
        fig.add_trace(
            go.Scatter(
                x=[s.t_s for s in ticks],
                y=[s.desired[role] for s in ticks],
                name=f"{role} tick (no change)",
                mode="markers",
                marker={"color": colour, "size": 4, "opacity": 0.5},
                text=[f"{short_reason(s)}: {s.message}"[:200] for s in ticks],
                hoverinfo="text+x",
                showlegend=i == 1,
            ),
            row=i,
            col=1,
        )
        mine = [d for d in decisions if d.role == role]
        if mine:
            fig.add_trace(
                go.Scatter(
                    x=[d.t_s for d in mine],
                    y=[d.after for d in mine],
                    name=f"{role} decision",
                    mode="markers+text",
                    marker={
                        "color": colour,
                        "size": 11,
                        "symbol": [
                            "triangle-up" if d.after > d.before else "triangle-down" for d in mine
                        ],
                        "line": {"color": "black", "width": 1},
                    },
                    text=[f"{d.before}->{d.after} {d.reason}" for d in mine],
                    # scale-downs labelled below, so two at one instant do not overlap
                    textposition=[
                        "top center" if d.after > d.before else "bottom center" for d in mine
                    ],
                    textfont={"size": 10},
                    hovertext=[d.message[:300] for d in mine],
                    hoverinfo="text+x",
                ),
                row=i,
                col=1,
            )
        top = max((v for v in desired + ready if v is not None), default=1)
        fig.update_yaxes(
            title_text=f"{role} replicas",
            rangemode="tozero",
            range=[0, top * 1.35 + 1],
            row=i,
            col=1,
        )
    fig.update_xaxes(title_text="time (s)", row=len(roles), col=1)
    return layout(fig, height=max(PANEL_HEIGHT, 250 * len(roles)))


def latency_figure(
    windows: LatencyWindows | None,
    snapshots: Sequence[TickSnapshot],
    *,
    metric: str,
    slo_ms: float | None,
) -> tuple[Any | None, str]:
    """One latency (``ttft`` or ``itl``) against its SLO line; the figure and the statistic
    it plots (or why there is none)."""
    unit_name = "TTFT" if metric == "ttft" else "ITL"
    fig = go.Figure()
    basis = ""
    if windows is not None and _has(getattr(windows, f"{metric}_p50")):
        p50 = list(getattr(windows, f"{metric}_p50"))
        p99 = list(getattr(windows, f"{metric}_p99"))
        fig.add_trace(go.Scatter(x=list(windows.t_s), y=p99, name=f"{unit_name} p99", mode="lines"))
        fig.add_trace(
            go.Scatter(
                x=list(windows.t_s), y=p50, name=f"{unit_name} p50", mode="lines", line={"width": 1}
            )
        )
        basis = f"p50 and p99 over rolling {windows.window_s:.0f} s windows, {windows.basis}"
        values = [v for v in p99 if v is not None]
    else:
        observed = [getattr(s, f"observed_{metric}_ms") for s in snapshots]
        if not _has(observed):
            return None, (
                f"no {unit_name} measured: this run has no per-request records and its ticks "
                "read no traffic window"
            )
        fig.add_trace(
            go.Scatter(
                x=[s.t_s for s in snapshots], y=observed, name=f"{unit_name} mean", mode="lines"
            )
        )
        basis = "mean over each tick's traffic window (the frontend's histograms)"
        values = [v for v in observed if v is not None]
    estimated = [getattr(s, f"estimated_{metric}_ms") for s in snapshots]
    if _has(estimated):
        fig.add_trace(
            go.Scatter(
                x=[s.t_s for s in snapshots],
                y=estimated,
                name=f"{unit_name} the load loop expected",
                mode="markers",
                marker={"size": 4},
            )
        )
    if slo_ms:
        fig.add_trace(
            go.Scatter(
                x=[fig.data[0].x[0], fig.data[0].x[-1]] if fig.data[0].x else [0, 1],
                y=[slo_ms, slo_ms],
                name=f"SLO {slo_ms:g} ms",
                mode="lines",
                line={"color": SLO_COLOUR, "dash": "dash"},
            )
        )
    # A long outage would squash the SLO line to the axis: cap the view at 5x the SLO.
    peak = max(values, default=0.0)
    if slo_ms and peak > 5 * slo_ms:
        fig.update_yaxes(range=[0, 5 * slo_ms])
        basis += f"; axis capped at 5x the SLO (peak {peak:,.0f} ms)"
    fig.update_yaxes(title_text=f"{unit_name} (ms)", rangemode="tozero")
    fig.update_xaxes(title_text="time (s)")
    return layout(fig), basis


def gpu_figure(
    snapshots: Sequence[TickSnapshot], *, timeline: Sequence[Mapping[str, Any]] | None = None
) -> Any:
    """GPUs in use and cumulative GPU-hours, on two axes of their own."""
    fig = make_subplots(
        rows=1,
        cols=2,
        horizontal_spacing=0.1,
    )
    if timeline:
        t = [row["t_s"] for row in timeline]
        gpus = [row["gpus_in_use"] for row in timeline]
        hours, acc = [], 0.0
        for k, row in enumerate(timeline):
            if k:
                acc += timeline[k - 1]["gpus_in_use"] * (row["t_s"] - timeline[k - 1]["t_s"])
            hours.append(acc / 3600.0)
    else:
        t = [s.t_s for s in snapshots]
        gpus = [s.gpus_in_use for s in snapshots]
        hours = [s.gpu_hours for s in snapshots]
    fig.add_trace(
        go.Scatter(x=t, y=gpus, name="GPUs in use", mode="lines", line={"shape": "hv"}),
        row=1,
        col=1,
    )
    fig.add_trace(go.Scatter(x=t, y=hours, name="GPU-hours so far", mode="lines"), row=1, col=2)
    fig.update_yaxes(title_text="GPUs", rangemode="tozero", row=1, col=1)
    fig.update_yaxes(title_text="GPU-hours (cumulative)", rangemode="tozero", row=1, col=2)
    fig.update_xaxes(title_text="time (s)")
    return layout(fig, height=300)


def _line_figure(
    t: Sequence[float], series: Sequence[tuple[str, Sequence[Any], dict[str, Any]]], y_title: str
) -> Any | None:
    if not any(_has(ys) for _, ys, _ in series):
        return None
    fig = go.Figure()
    for name, ys, style in series:
        # a value alone between gaps (a forecast made every throughput interval, on a tick
        # every few seconds) draws nothing as a line: mark the points too
        mode = "lines+markers" if _has_lone_point(ys) else "lines"
        extra = {"marker": {"size": 5}} if mode != "lines" else {}
        fig.add_trace(go.Scatter(x=list(t), y=list(ys), name=name, mode=mode, **extra, **style))
    fig.update_yaxes(title_text=y_title, rangemode="tozero")
    fig.update_xaxes(title_text="time (s)")
    return layout(fig, height=300)


def _has_lone_point(ys: Sequence[Any]) -> bool:
    """Whether some value of ``ys`` has no value next to it (None on both sides, or an end)."""
    values = [y is not None for y in ys]
    for i, here in enumerate(values):
        before = i > 0 and values[i - 1]
        after = i + 1 < len(values) and values[i + 1]
        if here and not before and not after:
            return True
    return False


_THROUGHPUT_OFF = (
    "the throughput loop did not run in this mode (load-only, or a baseline policy), so there "
    "is no forecast"
)


def detail_panels(snapshots: Sequence[TickSnapshot], max_engines: int = 64) -> list[Panel]:
    """The planner's internals: traffic against its forecast, lengths, corrections, and each
    engine's queue."""
    t = [s.t_s for s in snapshots]
    panels = []
    rate = _line_figure(
        t,
        [
            ("observed req/s", [s.observed_rps for s in snapshots], {}),
            ("forecast req/s", [s.predicted_rps for s in snapshots], {"line": {"dash": "dot"}}),
        ],
        "requests/s",
    )
    panels.append(
        Panel(
            "rate",
            "Request rate: observed against the forecast",
            rate,
            "" if rate else "no traffic window was read: " + _THROUGHPUT_OFF,
        )
    )
    lengths = _line_figure(
        t,
        [
            ("observed ISL", [s.observed_isl for s in snapshots], {}),
            ("forecast ISL", [s.predicted_isl for s in snapshots], {"line": {"dash": "dot"}}),
            ("observed OSL", [s.observed_osl for s in snapshots], {}),
            ("forecast OSL", [s.predicted_osl for s in snapshots], {"line": {"dash": "dot"}}),
        ],
        "tokens per request",
    )
    panels.append(
        Panel(
            "lengths",
            "Sequence lengths: observed against the forecast",
            lengths,
            "" if lengths else _THROUGHPUT_OFF,
        )
    )
    corrections = _line_figure(
        t,
        [
            ("prefill correction", [s.prefill_correction for s in snapshots], _role("prefill")),
            ("decode correction", [s.decode_correction for s in snapshots], _role("decode")),
        ],
        "observed / profiled latency",
    )
    panels.append(
        Panel(
            "corrections",
            "Correction factors",
            corrections,
            "" if corrections else _THROUGHPUT_OFF,
        )
    )
    keys = sorted({(e.role, e.worker_id, e.dp_rank) for s in snapshots for e in s.engines})
    engines = None
    if keys:
        engines = go.Figure()
        for role, worker, rank in keys[:max_engines]:
            ys = []
            for s in snapshots:
                value = None
                for e in s.engines:
                    if (e.role, e.worker_id, e.dp_rank) == (role, worker, rank):
                        value = (
                            e.queued_prefill_tokens
                            if role == "prefill"
                            else e.queued_decode_kv_tokens
                        )
                        break
                ys.append(value)
            engines.add_trace(
                go.Scatter(
                    x=t,
                    y=ys,
                    name=f"{role} {worker}/{rank}",
                    mode="lines",
                    line={"color": role_colour(role), "width": 1},
                    legendgroup=role,
                )
            )
        engines.update_yaxes(title_text="queued tokens", rangemode="tozero")
        engines.update_xaxes(title_text="time (s)")
        layout(engines, height=360)
        engines.update_layout(legend={"orientation": "v", "x": 1.02, "y": 1})
    panels.append(
        Panel(
            "engines",
            "Engine queues: queued prefill tokens (prefill) and queued decode KV tokens "
            "(decode), one line per engine and DP rank",
            engines,
            ""
            if engines
            else "no ForwardPassMetrics were read: the load loop is off in this mode and "
            "this policy reads none",
            f"first {max_engines} of {len(keys)} engines" if len(keys) > max_engines else "",
        )
    )
    return panels


def _role(role: str) -> dict[str, Any]:
    return {"line": {"color": role_colour(role)}}
