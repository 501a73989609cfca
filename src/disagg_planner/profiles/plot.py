"""Plotly figures of a profile: prefill curves by ISL and decode surfaces by KV usage and
context length, with the measured samples drawn on top of the interpolation."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from disagg_planner.profiles.profile import Profile

__all__ = ["profile_figure", "write_profile_html"]

_CURVE_POINTS = 200
_SURFACE_POINTS = 100


def profile_figure(profile: Profile) -> Any:
    """A 2x2 figure: prefill TTFT and throughput curves; decode ITL and throughput surfaces."""
    import plotly.graph_objects as go  # plotting is optional; keep import time off the planner
    from plotly.subplots import make_subplots

    fig = make_subplots(
        rows=2,
        cols=2,
        specs=[[{"type": "xy"}, {"type": "xy"}], [{"type": "scene"}, {"type": "scene"}]],
        subplot_titles=(
            "Prefill TTFT (ms) by ISL",
            "Prefill throughput (tokens/s/GPU) by ISL",
            "Decode ITL (ms)",
            "Decode throughput (tokens/s/GPU)",
        ),
        vertical_spacing=0.08,
    )
    pre = profile.prefill
    lo, hi = pre.isl_range
    isl = np.linspace(lo, hi, _CURVE_POINTS)
    for col, (label, curve, samples) in enumerate(
        (
            ("TTFT", pre.ttft_ms_many(isl), pre.data.ttft_ms),
            ("throughput", pre.thpt_per_gpu_many(isl), pre.data.thpt_per_gpu),
        ),
        start=1,
    ):
        kind = pre.kinds["ttft_ms" if label == "TTFT" else "thpt_per_gpu"]
        fig.add_trace(
            go.Scatter(x=isl, y=curve, mode="lines", name=f"prefill {label} ({kind})"),
            row=1,
            col=col,
        )
        fig.add_trace(
            go.Scatter(x=pre.data.isl, y=samples, mode="markers", name=f"prefill {label} samples"),
            row=1,
            col=col,
        )
        fig.update_xaxes(title_text="ISL (tokens)", row=1, col=col)

    dec = profile.decode
    kv = np.linspace(0.0, 1.0, _SURFACE_POINTS)
    # Profiles sample contexts geometrically (256 to the model's context).
    ctx = np.geomspace(*dec.context_range, _SURFACE_POINTS)
    itl, thpt = dec.surfaces_many(kv[None, :], ctx[:, None])
    d = dec.data
    for col, (label, surface, samples) in enumerate(
        (("ITL (ms)", itl, d.itl_ms), ("tokens/s/GPU", thpt, d.thpt_per_gpu)), start=1
    ):
        fig.add_trace(
            go.Surface(x=kv, y=ctx, z=surface, showscale=False, opacity=0.85, name=label),
            row=2,
            col=col,
        )
        fig.add_trace(
            go.Scatter3d(
                x=d.kv_usage,
                y=d.context_length,
                z=samples,
                mode="markers",
                marker={"size": 3, "color": "black"},
                name=f"decode {label} samples",
            ),
            row=2,
            col=col,
        )
    axes = {"xaxis_title": "KV usage", "yaxis_title": "context (tokens)"}
    fig.update_layout(
        scene={**axes, "zaxis_title": "ITL (ms)"},
        scene2={**axes, "zaxis_title": "tokens/s/GPU"},
        height=1100,
        title_text=_title(profile),
    )
    return fig


def _title(profile: Profile) -> str:
    what = profile.manifest.summary() if profile.manifest else str(profile.source_dir)
    return f"Profile: {what} (max_kv_tokens {profile.max_kv_tokens})"


def write_profile_html(
    profile: Profile, path: str | Path, *, include_plotlyjs: bool | str = True
) -> Path:
    """Write :func:`profile_figure` as a standalone HTML file (plotly.js inlined unless
    ``include_plotlyjs="cdn"``) and return its path."""
    out = Path(path)
    profile_figure(profile).write_html(out, include_plotlyjs=include_plotlyjs, full_html=True)
    return out
