"""Replay's page of one policy: what only replay knows added to the diagnostics report
(per-request latency percentiles, load against the profiled capacity of the ready replicas,
the score's card); the series it is drawn from, which the comparison page of several
policies (:mod:`disagg_planner.replay.comparison`) reads back from their folders."""

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
from disagg_planner.replay.replay_summary import ElasticFigures
from disagg_planner.replay.runner import ReplayResult
from disagg_planner.report.elements import (
    SLO_COLOUR,
    LatencyWindows,
    LoadCapacity,
    Panel,
    RoleLoad,
    layout,
    ordered_roles,
)

_MAX_POINTS = 20_000  # keep the HTML small; a regular subsample keeps the shape
LATENCY_WINDOW_S = 60.0
LOAD_WINDOW_S = 30.0


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
    return layout(fig, height=320)


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
    return layout(fig, height=360)
