"""The manual-edit policy (connectors/kubernetes/overrides.py): one named row per case, the
new baseline, the write-back and the edit found in one assert."""

from __future__ import annotations

from typing import Literal

import pytest

from disagg_planner.connectors.base import HoldReason
from disagg_planner.connectors.kubernetes.overrides import judge_edits

Policy = Literal["respect", "revert"]


@pytest.mark.parametrize(
    ("name", "observed", "expected", "pending", "policy", "advisory", "outcome"),
    [
        ("first read is the baseline", 3, None, None, "respect", False, (3, None, None)),
        ("unchanged", 3, 3, None, "respect", False, (3, None, None)),
        ("our write that reported failure", 4, 3, 4, "respect", False, (4, None, None)),
        ("edit respected", 5, 3, None, "respect", False, (5, None, "respected")),
        ("edit reverted", 5, 3, None, "revert", False, (3, 3, "reverted")),
        ("advisory never writes back", 5, 3, None, "revert", True, (5, None, "respected")),
    ],
)
def test_manual_edits(
    name: str,
    observed: int,
    expected: int | None,
    pending: int | None,
    policy: Policy,
    advisory: bool,
    outcome: tuple[int, int | None, str | None],
) -> None:
    verdict = judge_edits(
        roles=("decode",),
        observed={"decode": observed},
        expected={} if expected is None else {"decode": expected},
        pending={} if pending is None else {"decode": pending},
        targets={"decode": "spec.services.Worker"},
        policy=policy,
        advisory=advisory,
        now_s=10.0,
        hold_s=60.0,
    )
    action = verdict.overrides[0].action if verdict.overrides else None
    got = (verdict.expected["decode"], verdict.reverts.get("decode"), action)
    assert got == outcome, name


def test_a_respected_edit_holds_the_role_for_one_interval_saying_so() -> None:
    verdict = judge_edits(
        roles=("decode",),
        observed={"decode": 5},
        expected={"decode": 3},
        pending={},
        targets={"decode": "adapter graph-worker"},
        policy="respect",
        advisory=False,
        now_s=10.0,
        hold_s=60.0,
    )
    hold = verdict.holds["decode"]
    assert (hold.reason, hold.until_s, hold.detail) == (
        HoldReason.MANUAL_OVERRIDE,
        70.0,
        "replicas changed by someone else from 3 to 5; respected for 60 s",
    )
