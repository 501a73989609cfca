"""The decisions of a run, read from its ticks: every change of a role's desired replicas with
its reason (the replicas panel marks them, the page lists them in a table)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from disagg_planner.report.elements import Decision, esc, ordered_roles, role_colour
from disagg_planner.report.snapshot import TickSnapshot


def short_reason(snapshot: TickSnapshot) -> str:
    """The reason codes of one tick, e.g. ``throughput scale`` or ``load scale_up``."""
    parts = []
    if snapshot.throughput_reason:
        parts.append(f"throughput {snapshot.throughput_reason}")
    if snapshot.load_reason:
        parts.append(f"load {snapshot.load_reason}")
    if parts:
        return ", ".join(parts)
    return (snapshot.message or "").split(":")[0][:40]


def decisions_of(
    snapshots: Sequence[TickSnapshot], *, initial: Mapping[str, int] | None = None
) -> list[Decision]:
    """Every change of a role's desired replicas, with the tick's reason."""
    previous: dict[str, int] = dict(initial or (snapshots[0].desired if snapshots else {}))
    out: list[Decision] = []
    for s in snapshots:
        for role in ordered_roles(s.desired):
            after = s.desired[role]
            before = previous.get(role, after)
            if after != before:
                out.append(Decision(s.t_s, role, before, after, short_reason(s), s.message))
        previous.update(s.desired)
    return out


NO_REASON = "no reason recorded"


@dataclass(frozen=True)
class ReasonCount:
    """How many ticks decided for one reason, and how many of them set replicas."""

    reason: str
    ticks: int
    changes: int


def count_reasons(ticks: Iterable[tuple[str, bool]]) -> tuple[ReasonCount, ...]:
    """``(reason, set replicas)`` of each tick counted by reason, most frequent first (then
    by name): a tick that changes nothing is a decision too (to hold), and its reason says
    why. An empty reason is counted as :data:`NO_REASON`."""
    ticks_by: dict[str, int] = {}
    changes_by: dict[str, int] = {}
    for reason, changed in ticks:
        key = reason or NO_REASON
        ticks_by[key] = ticks_by.get(key, 0) + 1
        changes_by[key] = changes_by.get(key, 0) + int(changed)
    return tuple(
        ReasonCount(reason, n, changes_by[reason])
        for reason, n in sorted(ticks_by.items(), key=lambda item: (-item[1], item[0]))
    )


def reason_tally(snapshots: Sequence[TickSnapshot]) -> list[tuple[str, int]]:
    """How many ticks decided each way (``short_reason``), most frequent first."""
    counted = count_reasons((short_reason(s), bool(s.scale_to)) for s in snapshots)
    return [(c.reason, c.ticks) for c in counted]


def decisions_table(
    decisions: Sequence[Decision], *, ticks: int, tally: Sequence[tuple[str, int]] = ()
) -> str:
    held = ""
    if tally:
        tally_rows = "".join(
            f"<tr><td>{esc(reason)}</td><td>{count}</td></tr>" for reason, count in tally
        )
        held = (
            f"<h4>Every decision of the {ticks} ticks, by reason</h4>"
            "<table class='tally'><thead><tr><th>reason</th><th>ticks</th></tr></thead>"
            f"<tbody>{tally_rows}</tbody></table>"
        )
    if not decisions:
        return (
            "<section class='decisions'><h3>Decisions</h3>"
            f"<p class='empty'>No replica change in {ticks} ticks.</p>{held}</section>"
        )
    rows = "".join(
        f"<tr><td>{d.t_s:.0f}</td><td><span class='role' style='color:{role_colour(d.role)}'>"
        f"{esc(d.role)}</span></td><td>{d.before} &rarr; {d.after}</td>"
        f"<td>{esc(d.reason)}</td><td class='message'>{esc(d.message)}</td></tr>"
        for d in decisions
    )
    return (
        "<section class='decisions'>"
        f"<h3>Decisions: {len(decisions)} replica changes in {ticks} ticks</h3>"
        "<table class='changes'><thead><tr><th>time (s)</th><th>role</th><th>from &rarr; to</th>"
        "<th>reason</th><th>the planner's words</th></tr></thead>"
        f"<tbody>{rows}</tbody></table>{held}</section>"
    )
