"""Self-contained HTML reports (plotly.js inlined once, no network) built to be read top down.

First screen: the verdict as a headline card (SLO attainment against the target, GPU-hours and
their ratio to the oracle and to the best static policy, flaps). Then one figure per panel,
each with its own legend and titled axes: load against the capacity the ready replicas
provide at the SLO, replicas desired and ready with every decision marked and labelled,
latency percentiles against the SLO lines, GPUs and GPU-hours (never on one axis), and a table
of the decisions. Per-engine detail and the planner's internals are folded below. A panel
with nothing to show says why instead of drawing empty axes.

One colour per role everywhere (:data:`ROLE_COLOURS`); a comparison page keeps one colour per
policy (:data:`POLICY_COLOURS`) and one subplot per role.
"""

from __future__ import annotations

import html
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from disagg_planner.report.snapshot import TickSnapshot

ROLE_COLOURS = {"prefill": "#1f77b4", "decode": "#ff7f0e", "agg": "#2ca02c"}
_OTHER_ROLE_COLOUR = "#7f7f7f"
POLICY_COLOURS = ("#1b9e77", "#d95f02", "#7570b3", "#e7298a", "#66a61e", "#e6ab02", "#a6761d")
SLO_COLOUR = "#c00000"
_PANEL_HEIGHT = 340


def role_colour(role: str) -> str:
    return ROLE_COLOURS.get(role, _OTHER_ROLE_COLOUR)


def ordered_roles(roles: Any) -> list[str]:
    """Roles in the order requests meet them (prefill, decode), then any other."""
    order = list(ROLE_COLOURS)
    return sorted(set(roles), key=lambda r: (order.index(r) if r in order else len(order), r))


def policy_colour(index: int) -> str:
    return POLICY_COLOURS[index % len(POLICY_COLOURS)]


# --- inputs a caller may add to the snapshots ---------------------------------------------------


@dataclass(frozen=True)
class RoleLoad:
    """One role's demand and the capacity its ready replicas provide at the SLO, per window
    (tokens/s; ``capacity`` None where unknown)."""

    role: str
    t_s: Sequence[float]
    demand_tokens_s: Sequence[float | None]
    capacity_tokens_s: Sequence[float | None]
    demand_label: str
    capacity_label: str


@dataclass(frozen=True)
class LoadCapacity:
    roles: Sequence[RoleLoad]
    note: str = ""  # how the capacity was computed, or why it is missing


@dataclass(frozen=True)
class LatencyWindows:
    """Latency percentiles over rolling windows (ms), by window end."""

    t_s: Sequence[float]
    ttft_p50: Sequence[float | None]
    ttft_p99: Sequence[float | None]
    itl_p50: Sequence[float | None]
    itl_p99: Sequence[float | None]
    window_s: float
    basis: str  # e.g. "requests arriving in the window"


@dataclass(frozen=True)
class Decision:
    """One change of one role's desired replicas (or a hold with a reason)."""

    t_s: float
    role: str
    before: int
    after: int
    reason: str
    message: str


@dataclass
class Panel:
    """One figure of a page, or the reason it has none."""

    key: str
    title: str
    figure: Any | None = None
    empty_reason: str = ""
    note: str = ""


@dataclass
class Page:
    title: str
    headline_html: str
    panels: list[Panel] = field(default_factory=list)
    decisions_html: str = ""
    folded: list[Panel] = field(default_factory=list)
    footer: str = ""


# --- formatting shared by the card, the tables and the tests ------------------------------------


def fmt_percent(value: float | None) -> str:
    return "not computed" if value is None else f"{value:.2%}"


def fmt_number(value: float | None, digits: int = 2) -> str:
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return "not computed"
    return f"{value:.{digits}f}"


def fmt_ratio(value: float | None) -> str:
    return "not computed" if value is None else f"{value:.2f}x"


def esc(text: Any) -> str:
    return html.escape(str(text), quote=True)


def headline_live(snapshots: Sequence[TickSnapshot], *, title: str) -> str:
    """The card of a live controller's report: what its ticks measured (no per-request
    outcomes exist live, so no attainment)."""
    last = snapshots[-1]
    changes = sum(1 for s in snapshots if s.scale_to)
    replicas = ", ".join(f"{r} {n}" for r, n in sorted(last.ready.items()))
    return (
        "<section class='headline'>"
        f"<h2>{esc(title)} <span class='verdict neutral'>live controller</span></h2>"
        "<div class='tiles'>"
        "<div class='tile big'><div class='label'>SLO attainment</div>"
        "<div class='value' data-key='slo_attainment.both'>not computed</div>"
        "<div class='sub'>live metrics are window means, not per-request outcomes</div></div>"
        "<div class='tile big'><div class='label'>GPU-hours</div>"
        f"<div class='value' data-key='gpu_hours'>{last.gpu_hours:.2f}</div>"
        f"<div class='sub'>{last.gpus_in_use} GPUs in use now</div></div>"
        "<div class='tile'><div class='label'>ticks</div>"
        f"<div class='value' data-key='ticks'>{len(snapshots)}</div>"
        f"<div class='sub'>{changes} changed replicas</div></div>"
        "<div class='tile'><div class='label'>ready now</div>"
        f"<div class='value' data-key='ready'>{esc(replicas or '-')}</div>"
        f"<div class='sub'>at t = {last.t_s:.0f} s</div></div>"
        "</div></section>"
    )


# --- decisions ----------------------------------------------------------------------------------


def short_reason(snapshot: TickSnapshot) -> str:
    """The reason codes of one tick, e.g. ``throughput scale`` or ``load scale_up``."""
    parts = []
    if snapshot.throughput_reason:
        parts.append(f"throughput {snapshot.throughput_reason}")
    if snapshot.load_reason:
        parts.append(f"load {snapshot.load_reason}")
    if parts:
        return ", ".join(parts)
    return (snapshot.message or "").split(":")[0][:40]


def decisions_of(
    snapshots: Sequence[TickSnapshot], *, initial: Mapping[str, int] | None = None
) -> list[Decision]:
    """Every change of a role's desired replicas, with the tick's reason."""
    previous: dict[str, int] = dict(initial or (snapshots[0].desired if snapshots else {}))
    out: list[Decision] = []
    for s in snapshots:
        for role in ordered_roles(s.desired):
            after = s.desired[role]
            before = previous.get(role, after)
            if after != before:
                out.append(Decision(s.t_s, role, before, after, short_reason(s), s.message))
        previous.update(s.desired)
    return out


def reason_tally(snapshots: Sequence[TickSnapshot]) -> list[tuple[str, int]]:
    """How many ticks decided each way (``short_reason``), most frequent first: a tick that
    changes nothing is a decision too (to hold), and its reason says why."""
    counts: dict[str, int] = {}
    for snapshot in snapshots:
        reason = short_reason(snapshot) or "no reason recorded"
        counts[reason] = counts.get(reason, 0) + 1
    return sorted(counts.items(), key=lambda item: (-item[1], item[0]))


def decisions_table(
    decisions: Sequence[Decision], *, ticks: int, tally: Sequence[tuple[str, int]] = ()
) -> str:
    held = ""
    if tally:
        tally_rows = "".join(
            f"<tr><td>{esc(reason)}</td><td>{count}</td></tr>" for reason, count in tally
        )
        held = (
            f"<h4>Every decision of the {ticks} ticks, by reason</h4>"
            "<table class='tally'><thead><tr><th>reason</th><th>ticks</th></tr></thead>"
            f"<tbody>{tally_rows}</tbody></table>"
        )
    if not decisions:
        return (
            "<section class='decisions'><h3>Decisions</h3>"
            f"<p class='empty'>No replica change in {ticks} ticks.</p>{held}</section>"
        )
    rows = "".join(
        f"<tr><td>{d.t_s:.0f}</td><td><span class='role' style='color:{role_colour(d.role)}'>"
        f"{esc(d.role)}</span></td><td>{d.before} &rarr; {d.after}</td>"
        f"<td>{esc(d.reason)}</td><td class='message'>{esc(d.message)}</td></tr>"
        for d in decisions
    )
    return (
        "<section class='decisions'>"
        f"<h3>Decisions: {len(decisions)} replica changes in {ticks} ticks</h3>"
        "<table class='changes'><thead><tr><th>time (s)</th><th>role</th><th>from &rarr; to</th>"
        "<th>reason</th><th>the planner's words</th></tr></thead>"
        f"<tbody>{rows}</tbody></table>{held}</section>"
    )


# --- figures ------------------------------------------------------------------------------------


def _layout(fig: Any, *, height: int = _PANEL_HEIGHT) -> Any:
    fig.update_layout(
        height=height,
        margin={"l": 70, "r": 20, "t": 30, "b": 45},
        legend={"orientation": "h", "yanchor": "bottom", "y": 1.02, "x": 0},
        hovermode="x unified",
        template="plotly_white",
    )
    return fig


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
    return _layout(fig, height=max(_PANEL_HEIGHT, 260 * len(roles)))


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
    return _layout(fig, height=max(_PANEL_HEIGHT, 250 * len(roles)))


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
    return _layout(fig), basis


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
    return _layout(fig, height=300)


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
    return _layout(fig, height=300)


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
        _layout(engines, height=360)
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


# --- assembling pages ---------------------------------------------------------------------------

_CSS = """
body{font-family:system-ui,-apple-system,'Segoe UI',Roboto,sans-serif;margin:0 auto;
max-width:1400px;padding:12px 20px;color:#222;background:#fafafa}
h1{font-size:20px;margin:4px 0 10px}
h2{font-size:17px;margin:6px 0 8px}
h3{font-size:15px;margin:4px 0 4px}
.headline{background:#fff;border:1px solid #ddd;border-radius:8px;padding:10px 14px;
margin-bottom:12px}
.tiles{display:flex;flex-wrap:wrap;gap:8px}
.tile{flex:1 1 130px;border:1px solid #e4e4e4;border-radius:6px;padding:6px 10px;background:#fcfcfc}
.tile.big{flex:1 1 190px}
.tile .label{font-size:12px;color:#555}
.tile .value{font-size:22px;font-weight:600;margin:2px 0}
.tile.big .value{font-size:30px}
.tile .sub{font-size:11px;color:#666;min-height:13px}
.tile.pass{border-color:#2e7d32;background:#f1f8f1}.tile.pass .value{color:#2e7d32}
.tile.fail{border-color:#c62828;background:#fdf1f1}.tile.fail .value{color:#c62828}
.verdict{font-size:13px;font-weight:600;padding:2px 8px;border-radius:10px;margin-left:8px}
.verdict.pass{background:#2e7d32;color:#fff}.verdict.fail{background:#c62828;color:#fff}
.verdict.neutral{background:#777;color:#fff}
.panel{background:#fff;border:1px solid #ddd;border-radius:8px;padding:8px 12px;margin-bottom:12px}
.panel .note{font-size:12px;color:#555;margin:0 0 4px}
.panel .empty{font-size:14px;color:#8a5a00;background:#fff8e1;border:1px dashed #e0b050;
padding:16px;border-radius:6px}
.grid2{display:grid;grid-template-columns:1fr 1fr;gap:12px}
@media(max-width:1000px){.grid2{grid-template-columns:1fr}}
.decisions table{border-collapse:collapse;width:100%;font-size:12px}
.decisions th,.decisions td{border-bottom:1px solid #eee;padding:3px 6px;text-align:left;
vertical-align:top}
.decisions td.message{color:#555;font-family:ui-monospace,monospace;font-size:11px}
.decisions{background:#fff;border:1px solid #ddd;border-radius:8px;padding:8px 12px;
margin-bottom:12px;max-height:420px;overflow:auto}
details{background:#fff;border:1px solid #ddd;border-radius:8px;padding:8px 12px;
margin-bottom:12px}
summary{cursor:pointer;font-weight:600}
.legend-roles span{margin-right:14px;font-size:12px}
footer{font-size:11px;color:#777;margin:16px 0}
.cards{display:grid;grid-template-columns:repeat(auto-fit,minmax(430px,1fr));gap:10px}
.cards .headline{margin-bottom:0}.cards .tile{flex:1 1 110px}.cards .tile .value{font-size:17px}
.cards .tile.big .value{font-size:22px}.cards h2{font-size:15px}
"""

# Plots drawn inside a closed <details> have no width: redraw them when it opens.
_SCRIPT = """
document.querySelectorAll('details').forEach(function(d){d.addEventListener('toggle',function(){
if(d.open){d.querySelectorAll('.js-plotly-plot').forEach(function(p){Plotly.Plots.resize(p);});}
});});
"""


def _panel_html(panel: Panel, *, first_plot: list[bool]) -> str:
    body: str
    if panel.figure is None:
        body = f"<p class='empty'>No data: {esc(panel.empty_reason)}</p>"
        has = "0"
    else:
        include = first_plot[0]
        first_plot[0] = False
        body = panel.figure.to_html(
            full_html=False,
            include_plotlyjs=include,
            div_id=f"plot-{panel.key}",
            config={"displaylogo": False, "responsive": True},
        )
        has = "1"
    note = f"<p class='note'>{esc(panel.note)}</p>" if panel.note else ""
    return (
        f"<section class='panel' id='panel-{esc(panel.key)}' data-has-plot='{has}'>"
        f"<h3>{esc(panel.title)}</h3>{note}{body}</section>"
    )


def render_page(page: Page) -> str:
    """The page's HTML; plotly.js is inlined once, with the first plot."""
    first_plot = [True]
    role_key = "".join(
        f"<span style='color:{c}'>&#9632; {r}</span>" for r, c in ROLE_COLOURS.items()
    )
    parts = [
        f"<h1>{esc(page.title)}</h1>",
        page.headline_html,
    ]
    main = [_panel_html(p, first_plot=first_plot) for p in page.panels]
    parts.extend(main)
    if page.decisions_html:
        parts.append(page.decisions_html)
    if page.folded:
        inner = "".join(_panel_html(p, first_plot=first_plot) for p in page.folded)
        parts.append(
            "<details id='detail'><summary>Detail: forecast, lengths, corrections, "
            f"per-engine queues, every request</summary>{inner}</details>"
        )
    parts.append(
        f"<footer><div class='legend-roles'>Colours: {role_key}</div>{esc(page.footer)}</footer>"
    )
    # with no figure at all plotly.js was never loaded: no script to run
    script = "" if first_plot[0] else f"<script>{_SCRIPT}</script>"
    return (
        "<!DOCTYPE html><html><head><meta charset='utf-8'>"
        f"<title>{esc(page.title)}</title><style>{_CSS}</style></head>"
        f"<body>{''.join(parts)}{script}</body></html>"
    )


def render_report(
    snapshots: Sequence[TickSnapshot],
    *,
    title: str,
    ttft_slo_ms: float | None,
    itl_slo_ms: float | None,
    headline: str | None = None,
    load: LoadCapacity | None = None,
    latency: LatencyWindows | None = None,
    timeline: Sequence[Mapping[str, Any]] | None = None,
    initial_desired: Mapping[str, int] | None = None,
    extra_panels: Sequence[Panel] = (),
    footer: str = "",
) -> str:
    """One run's page. Replay passes its score's card (``headline``: the HTML of
    :func:`disagg_planner.replay.headline.headline_card`), the load and capacity per window,
    latency percentiles from every request, and the replica timeline; the live controller
    passes its ticks alone (its card is what they measured) and every panel says what it is
    built from."""
    if headline is None:
        headline = headline_live(snapshots, title=title)
    decisions = decisions_of(snapshots, initial=initial_desired)
    if load is None:
        load = load_from_snapshots(snapshots)
    load_fig = load_capacity_figure(load)
    panels = [
        Panel(
            "capacity",
            "Load against provisioned capacity at the SLO, per role",
            load_fig,
            "no traffic was measured at any tick" if load_fig is None else "",
            load.note,
        ),
        Panel(
            "replicas",
            "Replicas per role: desired (solid) and ready (dotted); labelled markers are "
            "decisions, small dots ticks without a change",
            replicas_figure(snapshots, decisions, timeline=timeline),
            "no tick recorded any replica count",
        ),
    ]
    for metric, slo in (("ttft", ttft_slo_ms), ("itl", itl_slo_ms)):
        fig, basis = latency_figure(latency, snapshots, metric=metric, slo_ms=slo)
        name = "TTFT" if metric == "ttft" else "ITL"
        panels.append(
            Panel(
                metric,
                f"{name} against the SLO" + (f" ({slo:g} ms)" if slo else ""),
                fig,
                basis if fig is None else "",
                basis if fig is not None else "",
            )
        )
    panels.append(
        Panel("gpus", "GPUs in use and GPU-hours", gpu_figure(snapshots, timeline=timeline))
    )
    return render_page(
        Page(
            title=title,
            headline_html=headline,
            panels=panels,
            decisions_html=decisions_table(
                decisions, ticks=len(snapshots), tally=reason_tally(snapshots)
            ),
            folded=[*detail_panels(snapshots), *extra_panels],
            footer=footer,
        )
    )


def load_from_snapshots(snapshots: Sequence[TickSnapshot]) -> LoadCapacity:
    """Demand per role from each tick's traffic window (request rate x ISL for prefill,
    x OSL for decode); the live loop records no capacity per replica."""
    t = [s.t_s for s in snapshots]

    def product(a: float | None, b: float | None) -> float | None:
        return a * b if a is not None and b is not None else None

    roles = ordered_roles(r for s in snapshots for r in s.desired)
    out = []
    for role in roles:
        if role == "decode":
            demand = [product(s.observed_rps, s.observed_osl) for s in snapshots]
            label = "output tokens/s"
        else:
            demand = [product(s.observed_rps, s.observed_isl) for s in snapshots]
            label = "prompt tokens/s"
        out.append(RoleLoad(role, t, demand, [None] * len(t), label, "capacity"))
    return LoadCapacity(
        out,
        note="demand from each tick's traffic window; the capacity of the ready replicas is "
        "drawn by replay, which knows the engines' profiled throughput at the SLO",
    )
