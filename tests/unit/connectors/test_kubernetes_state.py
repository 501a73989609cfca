"""The restart-state annotation (connectors/kubernetes/state.py): what a restarted planner
reads back, row by row."""

from __future__ import annotations

import json

import pytest

from disagg_planner.connectors.kubernetes.state import (
    ForeignStateError,
    PlannerState,
    decode_state,
    encode_state,
    remaining_holds,
    resumed_baseline,
)

ROLES = ("prefill", "decode")


def test_a_state_written_is_the_state_read_back() -> None:
    state = PlannerState(
        uid="u1",
        set={"prefill": 2, "decode": 3},
        pending={"decode": 4},
        holds={"prefill": 1_000.0},
        last_action=(900.0, {"decode": 4}),
    )
    assert decode_state(encode_state(state), uid="u1", roles=ROLES) == state


@pytest.mark.parametrize(
    ("name", "raw", "error"),
    [
        ("not JSON", "{", ValueError),
        ("another version", json.dumps({"version": 2}), ValueError),
        ("a list", "[]", ValueError),
        (
            "a count that is no number",
            json.dumps({"version": 1, "set": {"decode": "x"}}),
            ValueError,
        ),
        ("a hold without its end", json.dumps({"version": 1, "holds": {"decode": {}}}), ValueError),
        ("another object's uid", json.dumps({"version": 1, "uid": "old"}), ForeignStateError),
    ],
)
def test_an_annotation_that_cannot_be_used_is_refused_with_why(
    name: str, raw: str, error: type[Exception]
) -> None:
    with pytest.raises(error):
        decode_state(raw, uid="new", roles=ROLES)


@pytest.mark.parametrize(
    ("name", "set_", "pending", "expected", "also_own"),
    [
        ("settled writes", {"decode": 3}, {}, {"decode": 3}, {}),
        ("a write of unknown outcome", {"decode": 3}, {"decode": 4}, {"decode": 4}, {"decode": 3}),
        ("a pending write equal to the set", {"decode": 3}, {"decode": 3}, {"decode": 3}, {}),
        ("a first write pending", {}, {"decode": 2}, {"decode": 2}, {}),
    ],
)
def test_the_baseline_after_a_restart(
    name: str,
    set_: dict[str, int],
    pending: dict[str, int],
    expected: dict[str, int],
    also_own: dict[str, int],
) -> None:
    state = PlannerState(uid=None, set=set_, pending=pending)
    assert resumed_baseline(state) == (expected, also_own), name


def test_only_holds_still_running_are_resumed_and_roles_not_planned_are_dropped() -> None:
    raw = json.dumps(
        {
            "version": 1,
            "set": {"prefill": 1, "agg": 5},
            "holds": {
                "prefill": {"reason": "manual_override", "until": 150.0},
                "decode": {"reason": "manual_override", "until": 90.0},
                "agg": {"reason": "manual_override", "until": 500.0},
            },
        }
    )
    state = decode_state(raw, uid=None, roles=ROLES)
    assert (state.set, remaining_holds(state, wall_s=100.0)) == ({"prefill": 1}, {"prefill": 50.0})
