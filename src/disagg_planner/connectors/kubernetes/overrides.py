"""The manual-edit policy, as a pure function (see the package docstring).

A manual edit is a desired count that differs from what this planner last set (or first saw)
and is not a write of its own that merely reported failure (``pending``). Policy ``respect``
adopts the new value and holds the role for one adjustment interval; ``revert`` writes the
planner's value back. With ``advisory`` nothing is written, so ``revert`` behaves as
``respect``.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass
from typing import Literal

from disagg_planner.connectors.base import Hold, HoldReason, ManualOverride


@dataclass(frozen=True)
class EditVerdict:
    """What one read's manual edits lead to: the new baseline per role (``expected``), the
    values to write back (``reverts``), the holds to add, and the edits found."""

    expected: Mapping[str, int]
    reverts: Mapping[str, int]
    holds: Mapping[str, Hold]
    overrides: tuple[ManualOverride, ...]


def judge_edits(
    *,
    roles: Collection[str],
    observed: Mapping[str, int],
    expected: Mapping[str, int],
    pending: Mapping[str, int],
    targets: Mapping[str, str],
    policy: Literal["respect", "revert"],
    advisory: bool,
    now_s: float,
    hold_s: float,
) -> EditVerdict:
    """Compare what the deployment asks for (``observed``) with the planner's baseline.

    ``targets`` names where each role's count lives (an adapter, ``spec.services.<name>``);
    ``now_s`` is the connector's monotonic clock, which the holds' ends are on.
    """
    baseline = dict(expected)
    reverts: dict[str, int] = {}
    holds: dict[str, Hold] = {}
    overrides: list[ManualOverride] = []
    for role in roles:
        seen, before = observed[role], expected.get(role)
        if before is None or seen in (before, pending.get(role)):
            baseline[role] = seen
            continue
        if policy == "revert" and not advisory:
            reverts[role] = before
            overrides.append(ManualOverride(role, targets[role], before, seen, "reverted"))
            continue
        baseline[role] = seen
        holds[role] = Hold(
            role=role,
            reason=HoldReason.MANUAL_OVERRIDE,
            detail=f"replicas changed by someone else from {before} to {seen}; "
            f"respected for {hold_s:g} s",
            until_s=now_s + hold_s,
        )
        overrides.append(ManualOverride(role, targets[role], before, seen, "respected"))
    return EditVerdict(baseline, reverts, holds, tuple(overrides))
