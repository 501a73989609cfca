"""Replay's reports: one page per policy (what only replay knows added to the diagnostics
report: per-request latency percentiles, load against the profiled capacity of the ready
replicas, the score) and a comparison page of several policies built from their output
folders (``summary.json``, ``timeline.csv``, ``requests.csv``), so it can be rebuilt later
from earlier runs (``planner report --compare DIR...``)."""

from __future__ import annotations

import bisect
import csv
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from disagg_planner.errors import SpecError
from disagg_planner.profiles import Profile
from disagg_planner.replay.headline import headline_card
from disagg_planner.replay.plan import ReplayPlan
from disagg_planner.replay.replay_summary import SUMMARY_FILE, ElasticFigures, ReplaySummary
from disagg_planner.replay.runner import ReplayResult
from disagg_planner.report.html import (
    SLO_COLOUR,
    LatencyWindows,
    LoadCapacity,
    Page,
    Panel,
    RoleLoad,
    _layout,
    fmt_number,
    fmt_percent,
    fmt_ratio,
    ordered_roles,
    policy_colour,
    render_page,
)

_MAX_POINTS = 20_000  # keep the HTML small; a regular subsample keeps the shape
LATENCY_WINDOW_S = 60.0
LOAD_WINDOW_S = 30.0
COMPARISON_FILE = "comparison.html"


# --- per-request series ---------------------------------------------------------------------------


@dataclass(frozen=True)
class RequestSeries:
    """Every request's arrival, lengths and outcome (from records or requests.csv)."""

    arrival_s: np.ndarray
    isl: np.ndarray
    osl: np.ndarray
    ttft_ms: np.ndarray  # NaN where none
    itl_ms: np.ndarray
    ok: np.ndarray

    @classmethod
    def of_records(cls, records: Sequence[Any]) -> RequestSeries:
        rs = sorted(records, key=lambda r: r.arrival_s)
        return cls(
            np.array([r.arrival_s for r in rs], dtype=float),
            np.array([r.isl for r in rs], dtype=float),
            np.array([r.osl for r in rs], dtype=float),
            np.array([np.nan if r.ttft_ms is None else r.ttft_ms for r in rs], dtype=float),
            np.array([np.nan if r.itl_ms is None else r.itl_ms for r in rs], dtype=float),
            np.array([bool(r.ok) for r in rs], dtype=bool),
        )

    @classmethod
    def of_csv(cls, path: Path) -> RequestSeries:
        columns: dict[str, list[str]] = {}
        with path.open(newline="", encoding="utf-8") as handle:
            reader = csv.DictReader(handle)
            missing = {"arrival_s", "isl", "osl", "ttft_ms", "itl_ms", "ok"} - set(
                reader.fieldnames or ()
            )
            if missing:
                raise SpecError(f"{path}: missing column(s) {', '.join(sorted(missing))}")
            for row in reader:
                for key, value in row.items():
                    columns.setdefault(key, []).append(value)

        def floats(name: str) -> np.ndarray:
            return np.array([float(v) if v else np.nan for v in columns.get(name, [])])

        order = np.argsort(floats("arrival_s"), kind="stable")
        return cls(
            floats("arrival_s")[order],
            floats("isl")[order],
            floats("osl")[order],
            floats("ttft_ms")[order],
            floats("itl_ms")[order],
            np.array([v == "1" for v in columns.get("ok", [])], dtype=bool)[order],
        )


def latency_windows(
    requests: RequestSeries, *, window_s: float = LATENCY_WINDOW_S, step_s: float | None = None
) -> LatencyWindows:
    """p50 and p99 of TTFT and ITL of the completed requests arriving in each rolling window
    (window end every ``step_s``, default a quarter window)."""
    step = step_s or window_s / 4
    end = float(requests.arrival_s[-1]) if len(requests.arrival_s) else 0.0
    ends = np.arange(window_s, end + step, step) if end > window_s else np.array([end])
    lo = np.searchsorted(requests.arrival_s, ends - window_s, side="left")
    hi = np.searchsorted(requests.arrival_s, ends, side="right")
    out: dict[str, list[float | None]] = {k: [] for k in ("tp50", "tp99", "ip50", "ip99")}
    for a, b in zip(lo, hi, strict=True):
        ok = requests.ok[a:b]
        for prefix, values in (("t", requests.ttft_ms[a:b]), ("i", requests.itl_ms[a:b])):
            v = values[ok & ~np.isnan(values)]
            if len(v):
                p50, p99 = np.percentile(v, [50, 99])
                out[prefix + "p50"].append(float(p50))
                out[prefix + "p99"].append(float(p99))
            else:
                out[prefix + "p50"].append(None)
                out[prefix + "p99"].append(None)
    return LatencyWindows(
        t_s=[float(t) for t in ends],
        ttft_p50=out["tp50"],
        ttft_p99=out["tp99"],
        itl_p50=out["ip50"],
        itl_p99=out["ip99"],
        window_s=window_s,
        basis="completed requests by arrival time (failed requests count only against attainment)",
    )


# --- load against capacity --------------------------------------------------------------------


def load_capacity(
    requests: RequestSeries,
    timeline: Sequence[Mapping[str, Any]],
    *,
    profile: Profile | None,
    gpus_per_replica: Mapping[str, int],
    itl_slo_ms: float,
    window_s: float = LOAD_WINDOW_S,
) -> LoadCapacity:
    """Per window: the prompt tokens/s arriving (prefill) and the output tokens/s asked for
    (decode), against the ready replicas at the window's start times what one replica serves
    at the SLO by the profile: prefill its throughput at the window's mean ISL, decode its
    best throughput with ITL within the SLO at the window's mean context (ISL + OSL/2)."""
    roles = ordered_roles(r for row in timeline for r in row["desired"])
    end = float(requests.arrival_s[-1]) if len(requests.arrival_s) else 0.0
    starts = np.arange(0.0, max(end, window_s), window_s)
    lo = np.searchsorted(requests.arrival_s, starts, side="left")
    hi = np.searchsorted(requests.arrival_s, starts + window_s, side="left")
    isl_sum = np.array([requests.isl[a:b].sum() for a, b in zip(lo, hi, strict=True)])
    osl_sum = np.array([requests.osl[a:b].sum() for a, b in zip(lo, hi, strict=True)])
    count = (hi - lo).astype(float)
    mean_isl = np.divide(isl_sum, count, out=np.full_like(isl_sum, np.nan), where=count > 0)
    mean_osl = np.divide(osl_sum, count, out=np.full_like(osl_sum, np.nan), where=count > 0)
    t_mid = [float(s + window_s / 2) for s in starts]
    times = [row["t_s"] for row in timeline]

    def ready_at(role: str, t: float) -> int:
        k = bisect.bisect_right(times, t) - 1
        return int(timeline[max(k, 0)]["ready"].get(role, 0))

    note = (
        f"demand per {window_s:.0f} s window of arrivals; capacity = ready replicas x what "
        "one replica serves at the SLO by the profile (prefill: profiled throughput at the "
        "window's mean ISL; decode: best profiled throughput with ITL <= SLO at the window's "
        "mean context)"
    )
    loads = []
    for role in roles:
        if role == "decode":
            demand = osl_sum / window_s
            label = "output tokens/s asked"
        else:
            demand = (isl_sum + (osl_sum if role == "agg" else 0)) / window_s
            label = "prompt tokens/s arriving" if role == "prefill" else "tokens/s asked"
        capacity: list[float | None] = []
        for k, start in enumerate(starts):
            per_replica = _per_replica_capacity(
                profile,
                role,
                isl=float(mean_isl[k]),
                osl=float(mean_osl[k]),
                itl_slo_ms=itl_slo_ms,
                gpus=gpus_per_replica.get(role, 1),
            )
            capacity.append(
                None if per_replica is None else per_replica * ready_at(role, float(start))
            )
        loads.append(
            RoleLoad(
                role,
                t_mid,
                [float(v) for v in demand],
                capacity,
                label,
                "capacity of the ready replicas at the SLO",
            )
        )
    if profile is None:
        note = (
            f"demand per {window_s:.0f} s window of arrivals; no capacity line: this replay "
            "has no profile (it simulates --engine without one, e.g. in load-only mode), so "
            "what a replica serves at the SLO is not known"
        )
    elif "agg" in roles:
        note += "; an aggregated engine's capacity is not drawn (prefill and decode share it)"
    return LoadCapacity(loads, note=note)


def _per_replica_capacity(
    profile: Profile | None, role: str, *, isl: float, osl: float, itl_slo_ms: float, gpus: int
) -> float | None:
    if profile is None or role == "agg" or not np.isfinite(isl) or isl <= 0:
        return None
    if role == "prefill":
        return profile.prefill.thpt_per_gpu(isl) * gpus
    context = max(1.0, isl + osl / 2)
    best = profile.decode.find_best_throughput_per_gpu(itl_slo_ms, context)
    return best.thpt_per_gpu * gpus if best.feasible else 0.0


# --- one policy's page --------------------------------------------------------------------------


def timeline_dicts(result: ReplayResult) -> list[dict[str, Any]]:
    return [
        {"t_s": row.t_s, "desired": row.desired, "ready": row.ready, "gpus_in_use": row.gpus_in_use}
        for row in result.timeline
    ]


def replay_report_sections(result: ReplayResult, plan: ReplayPlan, *, title: str) -> dict[str, Any]:
    """:func:`policy_report_sections` for a policy of ``plan`` (``title``: the page's)."""
    return policy_report_sections(
        result,
        title=title,
        profile=plan.profile,
        gpus_per_replica={role: spec.gpus for role, spec in plan.setup.specs.items()},
        ttft_slo_ms=plan.config.ttft_ms,
        itl_slo_ms=plan.config.itl_ms,
    )


def policy_report_sections(
    result: ReplayResult,
    *,
    title: str,
    profile: Profile | None,
    gpus_per_replica: Mapping[str, int],
    ttft_slo_ms: float,
    itl_slo_ms: float,
) -> dict[str, Any]:
    """What :func:`disagg_planner.report.html.render_report` adds for a replayed policy
    (pass as keyword arguments to ``DiagnosticsRecorder.write_report``)."""
    requests = RequestSeries.of_records(result.records)
    timeline = timeline_dicts(result)
    setup = result.summary.setup
    elastic = result.summary.elastic_ep
    panels = []
    if elastic is not None:
        panels.append(
            Panel(
                "elastic",
                f"Elastic EP: the {elastic.role} engine's serving DP size and its GPUs "
                "(followers included while they start); shaded: resizes pausing serving, "
                f"{result.summary.rejected} request(s) rejected with 503 in them",
                elastic_figure(result, elastic),
                "",
            )
        )
    return {
        "headline": headline_card(result.summary, title=title),
        "latency": latency_windows(requests),
        "load": load_capacity(
            requests,
            timeline,
            profile=profile,
            gpus_per_replica=gpus_per_replica,
            itl_slo_ms=itl_slo_ms,
        ),
        "timeline": timeline,
        "initial_desired": None if setup is None else setup.initial_replicas,
        "extra_panels": [
            Panel(
                "requests",
                "Every request's TTFT and ITL (ms), failed requests marked x",
                per_request_figure(requests, ttft_slo_ms=ttft_slo_ms, itl_slo_ms=itl_slo_ms),
                "no request was replayed",
            ),
            *panels,
        ],
    }


def elastic_figure(result: ReplayResult, elastic: ElasticFigures) -> Any:
    """DP size (steps) and GPUs in use over time, with each resize's pause shaded."""
    role = elastic.role
    t = [row.t_s for row in result.timeline]
    fig = go.Figure()
    fig.add_trace(
        go.Scatter(
            x=t,
            y=[row.dp.get(role, 0) for row in result.timeline],
            mode="lines",
            line={"shape": "hv"},
            name=f"DP size ({role})",
        )
    )
    fig.add_trace(
        go.Scatter(
            x=t,
            y=[row.gpus_in_use for row in result.timeline],
            mode="lines",
            line={"shape": "hv", "dash": "dot"},
            name="GPUs in use",
        )
    )
    for resize in elastic.resizes:
        fig.add_vrect(
            x0=resize.pause_start_s,
            x1=resize.end_s,
            fillcolor="red",
            opacity=0.2,
            line_width=0,
        )
    fig.update_xaxes(title_text="time (s)")
    fig.update_yaxes(title_text="DP ranks / GPUs")
    return _layout(fig, height=320)


def per_request_figure(requests: RequestSeries, *, ttft_slo_ms: float, itl_slo_ms: float) -> Any:
    step = max(1, len(requests.arrival_s) // _MAX_POINTS)
    idx = np.arange(0, len(requests.arrival_s), step)
    ok = idx[requests.ok[idx]]
    failed = idx[~requests.ok[idx]]
    fig = make_subplots(rows=1, cols=2, horizontal_spacing=0.1)
    for col, values, name, slo in (
        (1, requests.ttft_ms, "TTFT", ttft_slo_ms),
        (2, requests.itl_ms, "ITL", itl_slo_ms),
    ):
        fig.add_trace(
            go.Scattergl(
                x=requests.arrival_s[ok],
                y=values[ok],
                mode="markers",
                marker={"size": 3},
                name=f"{name} per request",
            ),
            row=1,
            col=col,
        )
        fig.add_trace(
            go.Scatter(
                x=[0, float(requests.arrival_s[-1]) if len(requests.arrival_s) else 1],
                y=[slo, slo],
                mode="lines",
                line={"color": SLO_COLOUR, "dash": "dash"},
                name=f"{name} SLO {slo:g} ms",
            ),
            row=1,
            col=col,
        )
        fig.update_yaxes(title_text=f"{name} (ms)", type="log", row=1, col=col)
    if len(failed):
        fig.add_trace(
            go.Scattergl(
                x=requests.arrival_s[failed],
                y=[ttft_slo_ms] * len(failed),
                mode="markers",
                marker={"size": 6, "symbol": "x", "color": "black"},
                name="failed (drawn at the TTFT SLO)",
            ),
            row=1,
            col=1,
        )
    fig.update_xaxes(title_text="arrival (s)")
    return _layout(fig, height=360)


# --- the comparison page ----------------------------------------------------------------------


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
                }
            )
    return rows


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


def render_comparison(
    runs: Sequence[RunFolder], *, title: str = "planner replay: comparison"
) -> str:
    """One page: each policy's headline, then their replicas, GPUs and latency overlaid (one
    colour per policy, one subplot per role)."""
    if not runs:
        raise SpecError("nothing to compare: give at least one replay output folder")
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
                    line={"color": colour},
                )
            )
    replicas.update_xaxes(title_text="time (s)", row=len(roles), col=1)
    _layout(replicas, height=max(340, 240 * len(roles)))
    gpus.update_yaxes(title_text="GPUs", rangemode="tozero")
    gpus.update_xaxes(title_text="time (s)")
    _layout(gpus, height=300)
    slo = runs[0].summary.slo
    panels = [
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
        _layout(fig, height=320)
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
            headline_html=_comparison_table(runs) + headlines,
            panels=panels,
            footer="Built from "
            + ", ".join(str(r.path) for r in runs)
            + ". Each policy's own report.html is in its folder.",
        )
    )


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
