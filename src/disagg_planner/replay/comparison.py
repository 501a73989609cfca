"""The comparison page of several policies of a replay, built from their output folders
(``summary.json``, ``timeline.csv``, ``requests.csv``), so that it can be rebuilt later from
earlier runs (``planner report --compare DIR...``). Read top down: the winner by the rule the
page states and each policy's verdict in one line (what it says:
:mod:`disagg_planner.replay.comparison_model`), the offered load, their replicas, GPUs and
latency overlaid, each policy's ticks by reason, then the side-by-side table and each policy's
headline card. One colour per policy in every panel, the verdicts and the footer's key."""

from __future__ import annotations

import csv
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from disagg_planner.errors import SpecError
from disagg_planner.replay.comparison_model import (
    WINNER_RULE,
    Comparison,
    OfferedLoad,
    TickReason,
    compare,
    offered_load,
)
from disagg_planner.replay.headline import headline_card
from disagg_planner.replay.replay_summary import SUMMARY_FILE, ReplaySummary
from disagg_planner.replay.report import LATENCY_WINDOW_S, RequestSeries, latency_windows
from disagg_planner.report.elements import (
    SLO_COLOUR,
    Page,
    Panel,
    esc,
    fmt_number,
    fmt_percent,
    fmt_ratio,
    layout,
    ordered_roles,
    policy_colour,
)
from disagg_planner.report.html import render_page

COMPARISON_FILE = "comparison.html"
LOAD_COLOUR = "#444444"  # the offered load is every policy's: no policy's colour


@dataclass(frozen=True)
class RunFolder:
    """One policy's output folder, read back."""

    path: Path
    summary: ReplaySummary
    timeline: list[dict[str, Any]]
    requests: RequestSeries

    @property
    def policy(self) -> str:
        return self.summary.policy


def read_run(path: Path) -> RunFolder:
    """A folder replay wrote for one policy; a clear error naming what is missing."""
    path = Path(path)
    if not path.is_dir():
        raise SpecError(f"{path}: not a directory (expected a replay output folder)")
    summary_path = path / SUMMARY_FILE
    if not summary_path.is_file():
        raise SpecError(
            f"{path}: no {SUMMARY_FILE} (expected a folder planner replay wrote for one "
            "policy, e.g. replay-out/planner)"
        )
    summary = ReplaySummary.read(summary_path)
    for name in ("timeline.csv", "requests.csv"):
        if not (path / name).is_file():
            raise SpecError(f"{path}: no {name} (planner replay writes it beside summary.json)")
    return RunFolder(
        path,
        summary,
        read_timeline(path / "timeline.csv"),
        RequestSeries.of_csv(path / "requests.csv"),
    )


def read_timeline(path: Path) -> list[dict[str, Any]]:
    with path.open(newline="", encoding="utf-8") as handle:
        reader = csv.DictReader(handle)
        fields = reader.fieldnames or []
        roles = [f.removeprefix("desired_") for f in fields if f.startswith("desired_")]
        if "t_s" not in fields or "gpus_in_use" not in fields or not roles:
            raise SpecError(
                f"{path}: expected columns t_s, desired_<role>, ready_<role>, gpus_in_use"
            )
        rows = []
        for row in reader:
            rows.append(
                {
                    "t_s": float(row["t_s"]),
                    "desired": {r: int(row[f"desired_{r}"]) for r in roles},
                    "ready": {r: int(row[f"ready_{r}"]) for r in roles},
                    "gpus_in_use": int(row["gpus_in_use"]),
                    # a timeline written before these columns has no ticks to tally
                    "event": row.get("event") or "",
                    "decision": row.get("decision") or "",
                    "reason": row.get("reason") or "",
                }
            )
    return rows


def tick_reasons(timeline: Sequence[dict[str, Any]]) -> list[TickReason]:
    """The ticks of a timeline read by :func:`read_timeline`: each decision's reason, and
    whether it set replicas."""
    return [
        TickReason(row["reason"], bool(row["decision"]))
        for row in timeline
        if row["event"] == "tick"
    ]


def _comparison_table(runs: Sequence[RunFolder]) -> str:
    head = (
        "<tr><th>policy</th><th>SLO both</th><th>TTFT</th><th>ITL</th><th>TTFT p99 ms</th>"
        "<th>ITL p99 ms</th><th>GPU-h</th><th>x oracle</th><th>x best static</th>"
        "<th>scale actions</th><th>flaps</th></tr>"
    )
    rows = []
    for k, run in enumerate(runs):
        s = run.summary
        att = s.slo_attainment
        refs = s.references
        rows.append(
            f"<tr><td><span style='color:{policy_colour(k)}'>&#9632;</span> {run.policy}</td>"
            f"<td>{fmt_percent(att.both)}</td><td>{fmt_percent(att.ttft)}</td>"
            f"<td>{fmt_percent(att.itl)}</td>"
            f"<td>{fmt_number(s.ttft_ms.p99, 0)}</td>"
            f"<td>{fmt_number(s.itl_ms.p99, 1)}</td>"
            f"<td>{fmt_number(s.gpu_hours)}</td>"
            f"<td>{fmt_ratio(None if refs is None else refs.gpu_hours_ratio_to_oracle)}</td>"
            f"<td>{fmt_ratio(None if refs is None else refs.gpu_hours_ratio_to_best_static)}"
            "</td>"
            f"<td>{sum(s.scale_actions.values())}</td>"
            f"<td>{sum(s.flaps.values())}</td></tr>"
        )
    return (
        "<section class='decisions comparison-table'><h3>Side by side</h3>"
        f"<table><thead>{head}</thead><tbody>{''.join(rows)}</tbody></table></section>"
    )


def _verdicts_html(model: Comparison, colours: dict[str, str]) -> str:
    winner = model.winner
    items = []
    for v in model.verdicts:
        css = "neutral" if v.meets is None else "pass" if v.meets else "fail"
        crown = " <strong>(winner)</strong>" if v.policy == winner.policy else ""
        items.append(
            f"<li data-policy='{esc(v.policy)}' data-meets='{esc(v.meets)}'>"
            f"<span class='swatch' style='color:{colours[v.policy]}'>&#9632;</span>"
            f"<strong>{esc(v.policy)}</strong>{crown}: "
            f"<span class='verdict-line {css}'>{esc(v.line)}</span>"
            f"<span class='why'>{esc(v.reason)}</span></li>"
        )
    baseline = (
        f"GPU-hours are compared with {model.baseline}'s. " if model.baseline is not None else ""
    )
    unservable = (
        ""
        if model.unservable is None
        else f"<p class='unservable'>{esc(model.unservable.line)}.</p>"
    )
    return (
        "<section class='headline comparison-verdicts'>"
        f"<h2 class='winner' data-winner='{esc(winner.policy)}' data-rule='{winner.rule}'>"
        f"<span class='swatch' style='color:{colours[winner.policy]}'>&#9632;</span>"
        f"Winner: {esc(winner.policy)} <span class='rule'>({esc(winner.rule)}: "
        f"{esc(winner.why)})</span></h2>"
        f"{unservable}<ul class='verdicts'>{''.join(items)}</ul>"
        f"<p class='note'>{esc(baseline)}Rule: {esc(WINNER_RULE)}</p></section>"
    )


def _tallies_html(model: Comparison, colours: dict[str, str]) -> str:
    cards = []
    for policy, counts in model.tallies.items():
        ticks = sum(c.ticks for c in counts)
        rows = "".join(
            f"<tr><td>{esc(c.reason)}</td><td>{c.ticks}</td><td>{c.changes}</td></tr>"
            for c in counts
        )
        body = (
            "<table><thead><tr><th>reason</th><th>ticks</th><th>set replicas</th></tr></thead>"
            f"<tbody>{rows}</tbody></table>"
            if counts
            else "<p class='empty'>no tick recorded in its timeline.csv</p>"
        )
        cards.append(
            f"<div class='tally' data-policy='{esc(policy)}'><h4>"
            f"<span class='swatch' style='color:{colours[policy]}'>&#9632;</span>"
            f"{esc(policy)}: {ticks} ticks</h4>{body}</div>"
        )
    return (
        "<section class='headline reason-tally'><h3>Each policy's decisions, by reason</h3>"
        "<p class='note'>every tick counts (a tick that holds decides too); set replicas: the "
        f"ticks that changed them</p><div class='tallies'>{''.join(cards)}</div></section>"
    )


def _offered_load_panel(runs: Sequence[RunFolder], colours: dict[str, str]) -> Panel:
    """The requests arriving per window; one curve when every folder replayed the same
    arrivals (one replay's policies), else one per policy in its colour."""
    same = all(np.array_equal(r.requests.arrival_s, runs[0].requests.arrival_s) for r in runs[1:])
    shown = runs[:1] if same else runs
    loads: list[tuple[str, str, OfferedLoad]] = [
        (
            "every policy" if same else r.policy,
            LOAD_COLOUR if same else colours[r.policy],
            offered_load(r.requests.arrival_s, r.requests.isl),
        )
        for r in shown
    ]
    if not any(len(r.requests.arrival_s) for r in shown):
        return Panel("cmp-load", "Offered load", None, "no request in requests.csv")
    fig = make_subplots(specs=[[{"secondary_y": True}]])
    for name, colour, load in loads:
        # each window a step from its start to its end: the last window's end closes it
        x = [*load.t_s, load.t_s[-1] + load.window_s]
        # markers too: a short replay has a handful of windows
        fig.add_trace(
            go.Scatter(
                x=x,
                y=[*load.requests_per_s, load.requests_per_s[-1]],
                name=f"{name}: requests/s",
                mode="lines+markers",
                line={"color": colour, "shape": "hv", "width": 2},
                marker={"size": 4},
            ),
            secondary_y=False,
        )
        fig.add_trace(
            go.Scatter(
                x=x,
                y=[v / 1000 for v in (*load.prompt_tokens_per_s, load.prompt_tokens_per_s[-1])],
                name=f"{name}: prompt ktokens/s",
                mode="lines",
                line={"color": colour, "shape": "hv", "width": 1, "dash": "dot"},
            ),
            secondary_y=True,
        )
    fig.update_yaxes(title_text="requests/s", rangemode="tozero", secondary_y=False)
    fig.update_yaxes(title_text="prompt ktokens/s", rangemode="tozero", secondary_y=True)
    fig.update_xaxes(title_text="time (s)")
    layout(fig, height=300)
    window = loads[0][2].window_s
    note = f"arrivals per {window:.0f} s window"
    if not same:
        note += "; the folders replayed different arrivals, so each policy's are drawn"
    return Panel("cmp-load", "Offered load: requests and prompt tokens arriving", fig, note=note)


def render_comparison(
    runs: Sequence[RunFolder], *, title: str = "planner replay: comparison"
) -> str:
    """One page: each policy's headline, then their replicas, GPUs and latency overlaid (one
    colour per policy, one subplot per role)."""
    if not runs:
        raise SpecError("nothing to compare: give at least one replay output folder")
    model = compare([r.summary for r in runs], {r.policy: tick_reasons(r.timeline) for r in runs})
    colours = {r.policy: policy_colour(k) for k, r in enumerate(runs)}
    headlines = (
        "<div class='cards'>"
        + "".join(headline_card(r.summary, title=r.policy) for r in runs)
        + "</div>"
    )
    roles = ordered_roles(role for r in runs for row in r.timeline for role in row["desired"])
    replicas = make_subplots(rows=len(roles), cols=1, shared_xaxes=True, vertical_spacing=0.1)
    gpus = go.Figure()
    ttft = go.Figure()
    itl = go.Figure()
    for k, run in enumerate(runs):
        colour = policy_colour(k)
        t = [row["t_s"] for row in run.timeline]
        for i, role in enumerate(roles, start=1):
            replicas.add_trace(
                go.Scatter(
                    x=t,
                    y=[row["desired"].get(role) for row in run.timeline],
                    name=f"{run.policy} desired",
                    legendgroup=run.policy,
                    showlegend=i == 1,
                    mode="lines",
                    # overlapping steps stay apart by their dash
                    line={"color": colour, "shape": "hv", "width": 2, "dash": _dash(k)},
                ),
                row=i,
                col=1,
            )
            replicas.update_yaxes(title_text=f"{role} replicas", rangemode="tozero", row=i, col=1)
        gpus.add_trace(
            go.Scatter(
                x=t,
                y=[row["gpus_in_use"] for row in run.timeline],
                name=run.policy,
                mode="lines",
                line={"color": colour, "shape": "hv", "dash": _dash(k)},
            )
        )
        windows = latency_windows(run.requests)
        for fig, values in ((ttft, windows.ttft_p99), (itl, windows.itl_p99)):
            fig.add_trace(
                go.Scatter(
                    x=list(windows.t_s),
                    y=list(values),
                    name=f"{run.policy} p99",
                    mode="lines",
                    # equal latencies would hide one policy under another: dashes apart
                    line={"color": colour, "dash": _dash(k)},
                )
            )
    replicas.update_xaxes(title_text="time (s)", row=len(roles), col=1)
    layout(replicas, height=max(340, 240 * len(roles)))
    gpus.update_yaxes(title_text="GPUs", rangemode="tozero")
    gpus.update_xaxes(title_text="time (s)")
    layout(gpus, height=300)
    slo = runs[0].summary.slo
    panels = [
        _offered_load_panel(runs, colours),
        Panel("cmp-replicas", "Desired replicas per role, each policy", replicas),
        Panel("cmp-gpus", "GPUs in use, each policy", gpus),
    ]
    for key, fig, name, slo_ms in (
        ("cmp-ttft", ttft, "TTFT", None if slo is None else slo.ttft_target_ms),
        ("cmp-itl", itl, "ITL", None if slo is None else slo.itl_target_ms),
    ):
        if slo_ms:
            end = max(
                (float(r.requests.arrival_s[-1]) for r in runs if len(r.requests.arrival_s)),
                default=1.0,
            )
            fig.add_trace(
                go.Scatter(
                    x=[0, end],
                    y=[slo_ms, slo_ms],
                    name=f"SLO {slo_ms:g} ms",
                    mode="lines",
                    line={"color": SLO_COLOUR, "dash": "dash"},
                )
            )
            peak = max((v for tr in fig.data[:-1] for v in tr.y if v is not None), default=0.0)
            if peak > 5 * slo_ms:
                fig.update_yaxes(range=[0, 5 * slo_ms])
        fig.update_yaxes(title_text=f"{name} p99 (ms)", rangemode="tozero")
        fig.update_xaxes(title_text="time (s)")
        layout(fig, height=320)
        panels.append(
            Panel(
                key,
                f"{name} p99 over rolling {LATENCY_WINDOW_S:.0f} s windows, each policy",
                fig,
                note="axis capped at 5x the SLO where a policy's p99 runs far above it",
            )
        )
    return render_page(
        Page(
            title=title,
            headline_html=_verdicts_html(model, colours),
            panels=panels,
            decisions_html=_tallies_html(model, colours) + _comparison_table(runs) + headlines,
            colours=list(colours.items()),
            footer="Built from "
            + ", ".join(str(r.path) for r in runs)
            + ". Each policy's own report.html is in its folder.",
        )
    )


def winner_line(summaries: Sequence[ReplaySummary]) -> str:
    """The terminal's line under the table of several policies: the page's winner and why,
    and the requests nothing could serve."""
    model = compare(summaries, {})
    winner = model.winner
    line = f"winner: {winner.policy} ({winner.rule}: {winner.why})"
    if model.unservable is not None:
        line += f"\n{model.unservable.line}"
    return line


def outputs_message(out_dir: Path, policies: Sequence[str]) -> str:
    """The line replay ends with: where its files are, the page to open first."""
    if len(policies) == 1:
        return f"wrote {out_dir}/ (summary.json, requests.csv, timeline.csv, report.html)"
    return (
        f"wrote {out_dir / COMPARISON_FILE} (open it in a browser); each policy's "
        f"summary.json, requests.csv, timeline.csv and report.html are in {out_dir}/<policy>/"
    )


def _dash(index: int) -> str:
    return ("solid", "dash", "dot", "dashdot", "longdash")[index % 5]


def write_comparison(
    output: Path, run_dirs: Sequence[Path], *, title: str = "planner replay: comparison"
) -> Path:
    """Write the comparison page of ``run_dirs`` to ``output`` (a file, or a folder to
    write ``comparison.html`` into); returns its path."""
    runs = [read_run(Path(d)) for d in run_dirs]
    output = Path(output)
    path = output / COMPARISON_FILE if output.is_dir() or not output.suffix else output
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(render_comparison(runs, title=title), encoding="utf-8")
    return path
