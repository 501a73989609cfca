"""Which decisions a run's flaps are: the cause the scorecard prints beside a missed
"flaps <= 2 per hour" target.

A flap is a change of a role's desired replicas that the next change reverses within the
flap window (:meth:`disagg_planner.replay.summary.ScaleLog.reversals`, the one definition the
summary counts). Each is told as its two decisions, the counts they went between and the
clauses of their reasons that sized the role, so a reader sees whether the load moved (a
step the second decision answers) or the count hovered over a rounding boundary.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from pathlib import Path

# Loaded by a test as a file, this folder is not on sys.path for its sibling (scorecard's note).
if str(Path(__file__).resolve().parent) not in sys.path:
    sys.path.append(str(Path(__file__).resolve().parent))

from excess_gpu_hours import Row, reason_clauses

from disagg_planner.replay.summary import Reversal


def flap_cause(timeline: Sequence[Row], reversals: Sequence[Reversal]) -> str:
    """One sentence per flap of ``reversals``, from the decisions of ``timeline`` that made
    them; empty when there is none."""
    told = []
    for flap in reversals:
        first = _decided(timeline, flap.first_s, flap.role)
        second = _decided(timeline, flap.second_s, flap.role)
        if first is None or second is None:
            continue  # a change the timeline does not hold as a decision (none today)
        to = first.desired[flap.role]
        back = second.desired[flap.role]
        told.append(
            f"{flap.role} {to - flap.first_by} -> {to} at {flap.first_s:.0f} s "
            f'("{reason_clauses(first.message, flap.role)}"), then -> {back} at '
            f'{flap.second_s:.0f} s ("{reason_clauses(second.message, flap.role)}")'
        )
    return "; ".join(told)


def _decided(timeline: Sequence[Row], t_s: float, role: str) -> Row | None:
    """The tick of ``timeline`` at ``t_s`` that decided ``role``'s replicas."""
    for row in timeline:
        if row.t_s == t_s and row.event == "tick" and row.decision and role in row.desired:
            return row
    return None
