"""Self-contained Plotly HTML of a run: traffic and forecast, replicas and decisions, latency
against the SLOs, engine queues, corrections and GPU-hours."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from disagg_planner.report.recorder import TickSnapshot

_PANELS = (
    "Request rate: observed vs forecast (req/s)",
    "Replicas per role: desired, ready and decisions",
    "TTFT (ms) against the SLO",
    "ITL (ms) against the SLO",
    "Engine queues (tokens)",
    "Correction factors (observed / profiled latency)",
    "Sequence lengths (tokens)",
    "GPUs in use and cumulative GPU-hours",
)


def render_report(
    snapshots: Sequence[TickSnapshot],
    *,
    title: str,
    ttft_slo_ms: float | None,
    itl_slo_ms: float | None,
    extra_figures: Iterable[Any] = (),
) -> str:
    """One HTML page (plotly.js inlined once) for the given ticks."""
    t = [s.t_s for s in snapshots]
    fig = make_subplots(rows=4, cols=2, subplot_titles=_PANELS, vertical_spacing=0.07)

    def line(row: int, col: int, ys: list[Any], name: str, **kw: Any) -> None:
        fig.add_trace(go.Scatter(x=t, y=ys, name=name, mode="lines", **kw), row=row, col=col)

    line(1, 1, [s.observed_rps for s in snapshots], "observed req/s", connectgaps=False)
    line(1, 1, [s.predicted_rps for s in snapshots], "forecast req/s", line={"dash": "dot"})

    roles = sorted({r for s in snapshots for r in s.desired})
    for role in roles:
        line(1, 2, [s.desired.get(role) for s in snapshots], f"{role} desired", line_shape="hv")
        line(1, 2, [s.ready.get(role) for s in snapshots], f"{role} ready", line_shape="hv")
        decided = [s for s in snapshots if s.scale_to and role in s.scale_to]
        fig.add_trace(
            go.Scatter(
                x=[s.t_s for s in decided],
                y=[s.scale_to[role] for s in decided if s.scale_to],
                mode="markers",
                name=f"{role} decision",
                text=[
                    f"{s.throughput_reason or ''} {s.load_reason or ''}: {s.message}"
                    for s in decided
                ],
                hoverinfo="text+x+y",
            ),
            row=1,
            col=2,
        )

    line(2, 1, [s.observed_ttft_ms for s in snapshots], "observed TTFT")
    line(2, 1, [s.estimated_ttft_ms for s in snapshots], "estimated TTFT", line={"dash": "dot"})
    line(2, 2, [s.observed_itl_ms for s in snapshots], "observed ITL")
    line(2, 2, [s.estimated_itl_ms for s in snapshots], "estimated ITL", line={"dash": "dot"})
    if ttft_slo_ms:
        fig.add_hline(y=ttft_slo_ms, line_dash="dash", line_color="red", row=2, col=1)
    if itl_slo_ms:
        fig.add_hline(y=itl_slo_ms, line_dash="dash", line_color="red", row=2, col=2)

    engine_keys = sorted({(e.role, e.worker_id, e.dp_rank) for s in snapshots for e in s.engines})
    for role, worker, rank in engine_keys[:32]:  # bounded legend; the JSONL log has all
        series = []
        for s in snapshots:
            match = [
                e for e in s.engines if (e.role, e.worker_id, e.dp_rank) == (role, worker, rank)
            ]
            value = None
            if match:
                e = match[0]
                value = e.queued_prefill_tokens if role == "prefill" else e.queued_decode_kv_tokens
            series.append(value)
        line(3, 1, series, f"{role} {worker}/{rank}")

    line(3, 2, [s.prefill_correction for s in snapshots], "prefill correction")
    line(3, 2, [s.decode_correction for s in snapshots], "decode correction")
    line(4, 1, [s.observed_isl for s in snapshots], "observed ISL")
    line(4, 1, [s.predicted_isl for s in snapshots], "forecast ISL", line={"dash": "dot"})
    line(4, 1, [s.observed_osl for s in snapshots], "observed OSL")
    line(4, 1, [s.predicted_osl for s in snapshots], "forecast OSL", line={"dash": "dot"})
    line(4, 2, [s.gpus_in_use for s in snapshots], "GPUs in use", line_shape="hv")
    line(4, 2, [s.gpu_hours for s in snapshots], "GPU-hours")

    fig.update_layout(height=1600, title=title, hovermode="x unified")
    fig.update_xaxes(title_text="time (s)")
    parts = [fig.to_html(full_html=False, include_plotlyjs=True)]
    parts += [f.to_html(full_html=False, include_plotlyjs=False) for f in extra_figures]
    body = "\n".join(parts)
    return (
        f"<!DOCTYPE html><html><head><meta charset='utf-8'><title>{title}</title></head>"
        f"<body>{body}</body></html>"
    )
