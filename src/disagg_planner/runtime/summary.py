"""The one line a deployment loop logs per tick (``[summary]``): what happened to the
deployment, what was recommended, and why a recommended change was not written."""

from __future__ import annotations

from collections.abc import Mapping

from disagg_planner.core.types import DeploymentStatus
from disagg_planner.runtime.outcome import TickOutcome


def summary_line(outcome: TickOutcome, label: str) -> str:
    """The line's first word is the action written (from ``outcome.applied``), else HOLD,
    with what was recommended and why it was not written when it was a change."""
    status = outcome.status
    current = " ".join(f"{r}={s.desired}" for r, s in status.roles.items()) if status else "unknown"
    target = outcome.scale_to
    recommended = current if target is None else " ".join(f"{r}={n}" for r, n in target.items())
    action = "HOLD"
    if status is not None:
        action = _action_word(status, outcome.applied)
        wanted = _action_word(status, target or {})
        if action == "HOLD" and wanted != "HOLD":
            if outcome.held:
                why = "held: " + ", ".join(
                    f"{role} {reason}" for role, reason in outcome.held.items()
                )
            else:
                failed = [p.reason for p in outcome.problems if p.source == "scale"]
                why = (
                    f"not written: the scale call failed ({', '.join(failed)})"
                    if failed
                    else "not written: unchanged"
                )
            action = f"HOLD (recommended {wanted}; {why})"
    return (
        f"{'[ADVISORY] ' if outcome.advisory else ''}{label} [summary] {action} | current: "
        f"{current} | recommended: {recommended} | throughput_reason="
        f"{outcome.throughput_reason or '-'} load_reason={outcome.load_reason or '-'}"
        + "".join(f" | {p.render()}" for p in outcome.problems)
    )


def _action_word(status: DeploymentStatus, replicas: Mapping[str, int]) -> str:
    """SCALE_UP, SCALE_DOWN, REBALANCE (both) or HOLD: ``replicas`` against the desired."""
    ups = any(n > status.desired(r) for r, n in replicas.items())
    downs = any(n < status.desired(r) for r, n in replicas.items())
    if ups and downs:
        return "REBALANCE"
    return "SCALE_UP" if ups else "SCALE_DOWN" if downs else "HOLD"
