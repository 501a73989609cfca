"""Self-contained HTML reports (plotly.js inlined once, no network) built to be read top down.

First screen: the verdict as a headline card (a replay's score, :mod:`disagg_planner.replay.
headline`: SLO attainment against the target, GPU-hours and their ratio to the oracle and to
the best static policy, flaps; live, what the ticks measured). Then one figure per panel
(:mod:`disagg_planner.report.figures`), each with its own legend and titled axes: load against
the capacity the ready replicas provide at the SLO, replicas desired and ready with every
decision marked and labelled, latency percentiles against the SLO lines, GPUs and GPU-hours
(never on one axis), and a table of the decisions (:mod:`disagg_planner.report.decisions`).
Per-engine detail and the planner's internals are folded below. A panel with nothing to show
says why instead of drawing empty axes.

One colour per role everywhere (:data:`disagg_planner.report.elements.ROLE_COLOURS`); a
comparison page keeps one colour per policy and one subplot per role.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from disagg_planner.report.decisions import decisions_of, decisions_table, reason_tally
from disagg_planner.report.elements import (
    ROLE_COLOURS,
    LatencyWindows,
    LoadCapacity,
    Page,
    Panel,
    RoleLoad,
    esc,
    ordered_roles,
)
from disagg_planner.report.figures import (
    detail_panels,
    gpu_figure,
    latency_figure,
    load_capacity_figure,
    replicas_figure,
)
from disagg_planner.report.snapshot import TickSnapshot


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
.headline .note,.headline .unservable{font-size:12px;color:#555;margin:6px 0}
.headline .unservable{color:#8a5a00}
.winner{font-size:16px;margin:2px 0 8px}.winner .rule{font-size:12px;color:#555}
.verdicts{list-style:none;padding:0;margin:0}
.verdicts li{padding:4px 0;border-bottom:1px solid #eee;font-size:14px}
.verdicts .why{display:block;font-size:12px;color:#555;margin-left:22px}
.swatch{font-size:16px;margin-right:6px}
.tallies{display:grid;grid-template-columns:repeat(auto-fit,minmax(280px,1fr));gap:10px}
.tallies table{border-collapse:collapse;width:100%;font-size:12px}
.tallies th,.tallies td{border-bottom:1px solid #eee;padding:3px 6px;text-align:left}
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
    colours = ROLE_COLOURS.items() if page.colours is None else page.colours
    key = "".join(
        f"<span data-colour='{esc(c)}' style='color:{esc(c)}'>&#9632; {esc(name)}</span>"
        for name, c in colours
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
        f"<footer><div class='legend-roles'>Colours: {key}</div>{esc(page.footer)}</footer>"
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
