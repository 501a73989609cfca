"""A fleet replay's page (``fleet.html``: the pool's GPUs in use per member against its
ceiling, borrow and reclaim events, each member's score) and its terminal table."""

from __future__ import annotations

from collections.abc import Sequence

import plotly.graph_objects as go

from disagg_planner.replay.fleet_model import FleetResult, FleetSpec
from disagg_planner.report.elements import (
    SLO_COLOUR,
    Page,
    Panel,
    fmt_number,
    fmt_percent,
    policy_colour,
)
from disagg_planner.report.html import render_page


def render_fleet(result: FleetResult, spec: FleetSpec) -> str:
    """The fleet page: GPUs in use stacked by member against the ceiling, each member's
    attainment, the borrow and reclaim events."""
    fleet = result.fleet
    names = [m.name for m in spec.members]
    t = [s[0] for s in result.pool_series]
    stacked = go.Figure()
    for k, name in enumerate(names):
        stacked.add_trace(
            go.Scatter(
                x=t,
                y=[at.get(name, 0) for _, at in result.pool_series],
                name=name,
                mode="lines",
                stackgroup="gpus",
                line={"shape": "hv", "color": policy_colour(k)},
            )
        )
    ceiling = spec.pool.max_total_gpus
    stacked.add_trace(
        go.Scatter(
            x=[0, t[-1] if t else 1],
            y=[ceiling, ceiling],
            name=f"max_total_gpus {ceiling}",
            mode="lines",
            line={"color": SLO_COLOUR, "dash": "dash"},
        )
    )
    for e in fleet["events"]:
        if e["kind"] == "reclaim":
            stacked.add_vline(x=e["t_s"], line={"width": 1, "dash": "dot", "color": "#999"})
    stacked.update_yaxes(title_text="GPUs in use (starting, ready, draining)", rangemode="tozero")
    stacked.update_xaxes(title_text="time (s)")
    stacked.update_layout(height=380, margin={"l": 60, "r": 20, "t": 30, "b": 40})
    rows = "".join(
        f"<tr><td>{name}</td><td>{m['priority']}</td><td>{m['floor_gpus']}</td>"
        f"<td>{m['static_share_gpus']}</td><td>{fmt_percent(m['slo_attainment']['both'])}</td>"
        f"<td>{fmt_number(m['gpu_hours'])}</td><td>{m['peak_gpus']}</td>"
        f"<td>{m['borrows']}</td><td>{m['reclaims']}</td></tr>"
        for name, m in fleet["members"].items()
    )
    head = (
        f"<div class='card'><p>split <b>{result.split}</b>: peak {fleet['max_gpus_in_use']} "
        f"GPUs in use of {ceiling} (budget {'EXCEEDED' if fleet['budget_exceeded'] else 'held'}"
        f"), {fmt_number(fleet['gpu_hours'])} GPU-hours, {fleet['reclaims']} reclaims, "
        f"{fleet['borrows']} borrows, {fleet['flips']} flips</p>"
        "<table><tr><th>member</th><th>priority</th><th>floor</th><th>static share</th>"
        "<th>SLO attainment (both)</th><th>GPU-h</th><th>peak GPUs</th><th>borrows</th>"
        f"<th>reclaims</th></tr>{rows}</table></div>"
    )
    event_rows = "".join(
        f"<tr><td>{e['t_s']:.0f}</td><td>{e['kind']}</td><td>{e['member']}</td>"
        f"<td>{e['held']} -> {e['grant']}</td><td>{e['message']}</td></tr>"
        for e in fleet["events"][:500]
    )
    events_html = (
        "<section class='panel'><h3>Borrow and reclaim events</h3><table><tr><th>t (s)</th>"
        f"<th>event</th><th>member</th><th>held -> grant</th><th>why</th></tr>{event_rows}"
        "</table></section>"
        if event_rows
        else ""
    )
    return render_page(
        Page(
            title=f"planner replay --fleet ({result.split})",
            headline_html=head,
            panels=[
                Panel("fleet-gpus", "GPUs in use by member, against the pool's ceiling", stacked)
            ],
            decisions_html=events_html,
            footer="Each member's own report.html is in its folder.",
        )
    )


def fleet_table(results: Sequence[FleetResult]) -> str:
    """One line per split: the pool and each member's attainment."""
    lines = []
    for r in results:
        f = r.fleet
        per = ", ".join(f"{n} {m['slo_attainment']['both']:.2%}" for n, m in f["members"].items())
        lines.append(
            f"{r.split:<10} peak {f['max_gpus_in_use']:>3} GPUs  {f['gpu_hours']:.2f} GPU-h  "
            f"reclaims {f['reclaims']}  flips {f['flips']}  |  {per}"
        )
    return "\n".join(lines)
