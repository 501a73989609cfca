"""The verdict card of one scored replay (its ``summary.json``): whether it met the SLO
attainment target, its latencies, GPU-hours against the references, flaps, requests. Shown on
each policy's page and on the comparison page; the live controller's card is
:func:`disagg_planner.report.html.headline_live` (live, no request is scored)."""

from __future__ import annotations

from disagg_planner.replay.replay_summary import ReplaySummary
from disagg_planner.report.elements import esc, fmt_number, fmt_percent, fmt_ratio, fmt_target


def _tile(key: str, label: str, value: str, sub: str = "", css: str = "", big: bool = False) -> str:
    cls = "tile big" if big else "tile"
    return (
        f"<div class='{cls} {css}'><div class='label'>{esc(label)}</div>"
        f"<div class='value' data-key='{esc(key)}'>{esc(value)}</div>"
        f"<div class='sub'>{esc(sub)}</div></div>"
    )


def headline_card(summary: ReplaySummary, *, title: str = "") -> str:
    """The card's HTML. Every number carries a ``data-key`` naming the ``summary.json``
    field it shows."""
    slo = summary.slo
    att = summary.slo_attainment
    target = None if slo is None else slo.attainment_target
    meets = summary.meets_target
    if meets is None or target is None:
        verdict, verdict_class = "scored without an attainment target", "neutral"
    elif meets:
        verdict, verdict_class = f"meets the SLO target ({fmt_target(target)})", "pass"
    else:
        verdict, verdict_class = f"misses the SLO target ({fmt_target(target)})", "fail"
    by_role = ", ".join(f"{r} {v:.2f}" for r, v in summary.gpu_hours_by_role.items())
    refs = summary.references
    best_note = oracle_note = fluid_note = ""
    if refs is not None:
        best = refs.best_static
        shape = ",".join(f"{r}={n}" for r, n in best.replicas.items())
        best_note = f"static {shape}: {fmt_number(best.gpu_hours)} GPU-h"
        oracle_note = f"oracle {fmt_number(refs.oracle_gpu_hours)} GPU-h"
        if refs.fluid_bound_gpu_hours is not None:
            fluid_note = f"bound {fmt_number(refs.fluid_bound_gpu_hours)} GPU-h"
    flaps, actions = summary.flaps, summary.scale_actions

    def pass_class(value: float) -> str:
        if target is None:
            return ""
        return "pass" if value >= target else "fail"

    tiles = [
        _tile(
            "slo_attainment.both",
            "SLO attainment, TTFT and ITL",
            fmt_percent(att.both),
            f"target {fmt_target(target)}" if target is not None else "no target set",
            pass_class(att.both),
            big=True,
        ),
        _tile(
            "slo_attainment.ttft",
            f"TTFT <= {fmt_number(None if slo is None else slo.ttft_target_ms, 0)} ms",
            fmt_percent(att.ttft),
            f"p50 {fmt_number(summary.ttft_ms.p50, 0)} / p99 {fmt_number(summary.ttft_ms.p99, 0)} "
            "ms",
            pass_class(att.ttft),
        ),
        _tile(
            "slo_attainment.itl",
            f"ITL <= {fmt_number(None if slo is None else slo.itl_target_ms, 0)} ms",
            fmt_percent(att.itl),
            f"p50 {fmt_number(summary.itl_ms.p50, 1)} / p99 {fmt_number(summary.itl_ms.p99, 1)} ms",
            pass_class(att.itl),
        ),
        _tile("gpu_hours", "GPU-hours", fmt_number(summary.gpu_hours), by_role, big=True),
        _tile(
            "gpu_hours_ratio_to_oracle",
            "vs oracle",
            fmt_ratio(None if refs is None else refs.gpu_hours_ratio_to_oracle),
            oracle_note,
        ),
        _tile(
            "gpu_hours_ratio_to_best_static",
            "vs best static",
            fmt_ratio(None if refs is None else refs.gpu_hours_ratio_to_best_static),
            best_note,
        ),
        _tile(
            "gpu_hours_ratio_to_fluid_bound",
            "vs fluid bound",
            fmt_ratio(None if refs is None else refs.gpu_hours_ratio_to_fluid_bound),
            fluid_note,
        ),
        _tile(
            "flaps",
            "flaps",
            str(sum(flaps.values())) if flaps else "not computed",
            f"reversals within {fmt_number(summary.flap_window_s, 0)} s; "
            f"{sum(actions.values())} scale actions"
            if flaps
            else "",
        ),
        _tile("requests", "requests", str(summary.requests), f"{summary.failed} failed"),
    ]
    heading = title or f"policy {summary.policy}"
    return (
        f"<section class='headline' data-policy='{esc(summary.policy)}'>"
        f"<h2>{esc(heading)} <span class='verdict {verdict_class}'>{esc(verdict)}</span></h2>"
        f"<div class='tiles'>{''.join(tiles)}</div></section>"
    )
