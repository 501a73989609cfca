"""Where a run's GPU-hours above a fixed deployment's went: the cause the scorecard and the
speed sweep print beside a missed "GPU-hours <= best-static" target.

A replay's timeline meters every replica that exists (starting, ready or draining) from one
row to the next; against a fixed count per role, each span's replicas above that count are
excess and those under it are saving. Each excess span belongs to the decision that last
raised the role while it was above the fixed count, so the cause reads as that decision's
own words (the clauses of its reason that size the role), with the GPU-hours it held.
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

# How many of the costliest decisions a cause names, and how much of each reason it quotes.
TOP_DECISIONS = 3
CLAUSE_CHARS = 200


class Row(Protocol):
    """The fields of :class:`disagg_planner.replay.summary.TimelineRow` read here."""

    # read-only members: the timeline's rows are frozen
    @property
    def t_s(self) -> float: ...
    @property
    def desired(self) -> dict[str, int]: ...
    @property
    def ready(self) -> dict[str, int]: ...
    @property
    def replicas(self) -> dict[str, int]: ...
    @property
    def decision(self) -> str: ...
    @property
    def message(self) -> str: ...
    @property
    def event(self) -> str: ...


@dataclass(frozen=True)
class Excess:
    """One decision's share of the GPU-hours above the fixed count."""

    t_s: float  # when it was decided
    role: str
    to: int  # the replicas it asked the role for
    gpu_hours: float
    message: str


@dataclass(frozen=True)
class OverStatic:
    static: dict[str, int]
    over_gpu_hours: float  # replicas above the fixed count, GPU-hours
    under_gpu_hours: float  # replicas under it
    decisions: list[Excess]  # the costliest first

    def text(self, *, top: int = TOP_DECISIONS) -> str:
        """One sentence: the excess and saving against the fixed count, and the decisions
        that held the most of the excess, each with the clauses of its reason."""
        fixed = "/".join(str(n) for n in self.static.values())
        head = (
            f"above best-static's {fixed} for {self.over_gpu_hours:.2f} GPU-h, under it for "
            f"{self.under_gpu_hours:.2f}"
        )
        if not self.decisions:
            return head
        named = "; ".join(
            f"{d.role} to {d.to} at {d.t_s:.0f} s held {d.gpu_hours:.2f} GPU-h "
            f'("{reason_clauses(d.message, d.role)}")'
            for d in self.decisions[:top]
        )
        more = len(self.decisions) - top
        tail = f"; {more} more decision(s)" if more > 0 else ""
        return f"{head}; the most by {named}{tail}"


def over_static(
    timeline: Sequence[Row], static: Mapping[str, int], gpus: Mapping[str, int]
) -> OverStatic:
    """The GPU-hours of ``timeline`` above and under ``static`` replicas per role (``gpus``
    per replica), the excess split by the decision that last raised each role above it."""
    roles = [r for r in static if r in gpus]
    owner: dict[str, Excess | None] = {r: None for r in roles}
    if timeline:  # replicas above the fixed count from the start are the start's
        first = timeline[0]
        for role in roles:
            n = first.replicas.get(role, 0)
            if n > static[role]:
                owner[role] = Excess(first.t_s, role, n, 0.0, "the start")
    held: dict[tuple[float, str], float] = {}
    asked: dict[tuple[float, str], Excess] = {}
    over = under = 0.0
    for row, following in itertools.pairwise(timeline):
        for role in roles:
            if row.event == "tick" and row.decision and role in row.desired:
                to = row.desired[role]
                last = owner[role]
                if to > static[role] and (last is None or to > last.to):
                    owner[role] = Excess(row.t_s, role, to, 0.0, row.message)
                elif to <= static[role]:
                    owner[role] = None
        dt_h = max(0.0, following.t_s - row.t_s) / 3600.0
        for role in roles:
            gap = (row.replicas.get(role, 0) - static[role]) * gpus[role] * dt_h
            if gap < 0:
                under -= gap
                continue
            over += gap
            source = owner[role]
            if gap > 0 and source is not None:
                key = (source.t_s, role)
                held[key] = held.get(key, 0.0) + gap
                asked[key] = source
    decisions = sorted(
        (Excess(a.t_s, a.role, a.to, held[key], a.message) for key, a in asked.items()),
        key=lambda d: -d.gpu_hours,
    )
    return OverStatic(dict(static), over, under, decisions)


def reason_clauses(message: str, role: str) -> str:
    """The clauses of a decision's reason that made it: the fast check's finding when it
    acted, the rising rate it sized for, and the sentences naming ``role`` that carry a
    count (its sizing, a floor or a rule that raised it)."""
    clauses = [c.strip() for c in message.split(";") if c.strip()]
    kept: list[str] = []
    for clause in clauses:
        text = clause.removeprefix("throughput: ").removeprefix("scale: ")
        acted = text.startswith(("fast check: SLO at risk", "rate rising"))
        if acted or (text.startswith(f"{role}:") and any(ch.isdigit() for ch in text)):
            kept.append(text)
    quoted = [c if len(c) <= CLAUSE_CHARS else c[: CLAUSE_CHARS - 3] + "..." for c in kept]
    return "; ".join(quoted) if quoted else message[:CLAUSE_CHARS]
