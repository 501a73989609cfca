"""The parts every report page is built of: one colour per role (:data:`ROLE_COLOURS`) and per
policy (:data:`POLICY_COLOURS`), the data a caller adds to the ticks (load against capacity,
latency windows), panels and pages, how numbers are written, and one figure layout. Shared by
the report's figures (:mod:`disagg_planner.report.figures`), its pages
(:mod:`disagg_planner.report.html`) and replay's pages."""

from __future__ import annotations

import html
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

ROLE_COLOURS = {"prefill": "#1f77b4", "decode": "#ff7f0e", "agg": "#2ca02c"}
_OTHER_ROLE_COLOUR = "#7f7f7f"
POLICY_COLOURS = ("#1b9e77", "#d95f02", "#7570b3", "#e7298a", "#66a61e", "#e6ab02", "#a6761d")
SLO_COLOUR = "#c00000"
PANEL_HEIGHT = 340


def role_colour(role: str) -> str:
    return ROLE_COLOURS.get(role, _OTHER_ROLE_COLOUR)


def ordered_roles(roles: Any) -> list[str]:
    """Roles in the order requests meet them (prefill, decode), then any other."""
    order = list(ROLE_COLOURS)
    return sorted(set(roles), key=lambda r: (order.index(r) if r in order else len(order), r))


def policy_colour(index: int) -> str:
    return POLICY_COLOURS[index % len(POLICY_COLOURS)]


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
    # (name, colour) of what the page's colours stand for; None: the roles (ROLE_COLOURS)
    colours: Sequence[tuple[str, str]] | None = None


def fmt_percent(value: float | None) -> str:
    return "not computed" if value is None else f"{value:.2%}"


def fmt_target(value: float) -> str:
    """An attainment target: a whole percent as such (99%), else to a tenth (99.9%, which
    ``.0%`` would print as 100%)."""
    return f"{value:.0%}" if round(value * 100, 6) == round(value * 100) else f"{value:.1%}"


def fmt_number(value: float | None, digits: int = 2) -> str:
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return "not computed"
    return f"{value:.{digits}f}"


def fmt_ratio(value: float | None) -> str:
    return "not computed" if value is None else f"{value:.2f}x"


def esc(text: Any) -> str:
    return html.escape(str(text), quote=True)


def layout(fig: Any, *, height: int = PANEL_HEIGHT) -> Any:
    fig.update_layout(
        height=height,
        margin={"l": 70, "r": 20, "t": 30, "b": 45},
        legend={"orientation": "h", "yanchor": "bottom", "y": 1.02, "x": 0},
        hovermode="x unified",
        template="plotly_white",
    )
    return fig
