"""The planner's state on the DGD (the annotation ``planner.autoscaling.dev/state``), as pure
functions: what a restarted or failed-over planner reads back (see "State that survives
restarts" in the package docstring).

The JSON holds ``version``, the DGD's ``uid``, what the planner set per role (``set``), writes
whose outcome is unknown (``pending``), the manual-edit holds (``holds``: reason and end, Unix
s) and the last change (``lastActionAt``, Unix s, and ``waitingFor``).
"""

from __future__ import annotations

import json
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from typing import Any

from disagg_planner.connectors.base import HoldReason

STATE_ANNOTATION = "planner.autoscaling.dev/state"
STATE_VERSION = 1


class ForeignStateError(ValueError):
    """The annotation was written for another object (a DGD deleted and applied again)."""

    def __init__(self, uid: object) -> None:
        super().__init__(f"annotation {STATE_ANNOTATION} is of another object (uid {uid})")
        self.uid = uid


@dataclass(frozen=True)
class PlannerState:
    """What the annotation records. ``holds``: role -> end of its manual-edit hold (Unix s);
    ``last_action``: (Unix s, targets) of the last change, None before any."""

    uid: str | None
    set: Mapping[str, int] = field(default_factory=dict)
    pending: Mapping[str, int] = field(default_factory=dict)
    holds: Mapping[str, float] = field(default_factory=dict)
    last_action: tuple[float, Mapping[str, int]] | None = None


def encode_state(state: PlannerState) -> str:
    """The annotation's JSON (keys sorted, so that an unchanged state is an unchanged text)."""
    body: dict[str, Any] = {
        "version": STATE_VERSION,
        "uid": state.uid,
        "set": dict(state.set),
        "pending": dict(state.pending),
        "holds": {
            role: {"reason": HoldReason.MANUAL_OVERRIDE.value, "until": until}
            for role, until in state.holds.items()
        },
    }
    if state.last_action is not None:
        body["lastActionAt"], body["waitingFor"] = state.last_action[0], dict(state.last_action[1])
    return json.dumps(body, sort_keys=True)


def decode_state(raw: str, *, uid: str | None, roles: Collection[str]) -> PlannerState:
    """The state in ``raw`` for the DGD of ``uid``, keeping only ``roles``.

    Raises :class:`ForeignStateError` when it names another uid, ValueError (with what is
    wrong) when it cannot be read.
    """
    try:
        state = json.loads(raw)
        if not isinstance(state, dict) or state.get("version") != STATE_VERSION:
            raise ValueError(f"expected an object with version {STATE_VERSION}")
        if state.get("uid") not in (None, uid):
            raise ForeignStateError(state.get("uid"))
        wanted = set(roles)
        expected = {r: int(n) for r, n in (state.get("set") or {}).items() if r in wanted}
        pending = {r: int(n) for r, n in (state.get("pending") or {}).items() if r in wanted}
        ends = {role: float(hold["until"]) for role, hold in (state.get("holds") or {}).items()}
        holds = {role: until for role, until in ends.items() if role in wanted}
        last = None
        if state.get("lastActionAt") is not None:
            targets = {r: int(n) for r, n in (state.get("waitingFor") or {}).items() if r in wanted}
            last = (float(state["lastActionAt"]), targets)
    except ForeignStateError:
        raise
    except (ValueError, TypeError, KeyError, AttributeError) as exc:
        raise ValueError(str(exc) or type(exc).__name__) from exc
    return PlannerState(uid=uid, set=expected, pending=pending, holds=holds, last_action=last)


def resumed_baseline(state: PlannerState) -> tuple[dict[str, int], dict[str, int]]:
    """(what the planner set, what it may also have set) per role after a restart.

    The last value written is the baseline; the one before it is also the planner's own while
    that write's outcome is unknown (it may never have landed): seeing either is no manual
    edit.
    """
    expected = dict(state.set)
    pending: dict[str, int] = {}
    for role, count in state.pending.items():
        if role in expected and expected[role] != count:
            pending[role] = expected[role]
        expected[role] = count
    return expected, pending


def remaining_holds(state: PlannerState, wall_s: float) -> dict[str, float]:
    """Role -> seconds its manual-edit hold still runs at ``wall_s`` (ended holds left out)."""
    return {role: until - wall_s for role, until in state.holds.items() if until - wall_s > 0}
