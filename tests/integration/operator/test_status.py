"""A policy's status: conditions from tick outcomes, transition times, and a writer that
patches only what changed (against kmock's ``/status``)."""

from __future__ import annotations

from typing import Any

import pytest

from disagg_planner.core.planner import Effects
from disagg_planner.core.types import DeploymentStatus, RoleStatus
from disagg_planner.operator.crd import GROUP, VERSION
from disagg_planner.operator.status import (
    StatusWriter,
    merge_patch,
    policy_status,
    rfc3339,
    tick_conditions,
)
from disagg_planner.runtime.loop import DeploymentRef
from disagg_planner.runtime.outcome import Problem, ProblemKind, TickOutcome
from tests.integration.connectors.conftest import NS
from tests.integration.operator.conftest import POLICY, OperatorCluster

TARGET = DeploymentRef(NS, "graph")
T0 = 1_700_000_000.0


def status(prefill: tuple[int, int], decode: tuple[int, int]) -> DeploymentStatus:
    return DeploymentStatus(
        roles={
            "prefill": RoleStatus(desired=prefill[0], ready=prefill[1], gpus_per_replica=1),
            "decode": RoleStatus(desired=decode[0], ready=decode[1], gpus_per_replica=2),
        }
    )


def outcome(**kw: Any) -> TickOutcome:
    base: dict[str, Any] = {
        "t_s": T0,
        "ran_throughput": True,
        "status": status((1, 1), (2, 2)),
        "effects": Effects(now_s=T0, scale_to=None, next_tick_at_s=T0 + 60),
        "throughput_reason": "no_change",
    }
    base.update(kw)
    return TickOutcome(**base)


def reasons(conditions: dict[str, tuple[str, str, str]]) -> dict[str, tuple[str, str]]:
    return {kind: (c[0], c[1]) for kind, c in conditions.items()}


@pytest.mark.parametrize(
    ("name", "tick", "expected"),
    [
        (
            "steady",
            outcome(),
            {
                "Ready": ("True", "Planning"),
                "Scaling": ("False", "Stable"),
                "Degraded": ("False", "AsExpected"),
            },
        ),
        (
            "scale up written",
            outcome(scale_to={"prefill": 3, "decode": 2}, applied={"prefill": 3}),
            {
                "Ready": ("True", "Planning"),
                "Scaling": ("True", "ScaleUp"),
                "Degraded": ("False", "AsExpected"),
            },
        ),
        (
            "one up one down",
            outcome(applied={"prefill": 3, "decode": 1}),
            {"Scaling": ("True", "Rebalance")},
        ),
        (
            "waiting for replicas",
            outcome(status=status((3, 1), (2, 2))),
            {"Scaling": ("True", "Converging")},
        ),
        (
            "manual edit respected",
            outcome(held={"decode": "manual_override"}),
            {"Scaling": ("False", "ManualOverrideHold")},
        ),
        (
            "prometheus down: still planning, degraded",
            outcome(
                problems=(
                    Problem(ProblemKind.TRAFFIC_MISSING, "prometheus_unreachable", "x", "traffic"),
                )
            ),
            {"Ready": ("True", "Planning"), "Degraded": ("True", "TrafficMissing")},
        ),
        (
            "dgd unreadable",
            outcome(
                status=None,
                problems=(
                    Problem(ProblemKind.CONNECTOR_ERROR, "connector_error", "403", "status"),
                ),
            ),
            {
                "Ready": ("False", "ConnectorError"),
                # nothing is known to be scaling: not "Stable" (issue 19, problem 7)
                "Scaling": ("False", "NotPlanning"),
                "Degraded": ("True", "ConnectorError"),
            },
        ),
        (
            "dgd deleted while planning",
            outcome(
                status=None,
                problems=(
                    Problem(ProblemKind.DEPLOYMENT_INVALID, "deployment_error", "404", "status"),
                ),
            ),
            {
                "Ready": ("False", "DeploymentInvalid"),
                "Scaling": ("False", "NotPlanning"),
                "Degraded": ("True", "DeploymentInvalid"),
            },
        ),
        (
            "start-up failed: dgd missing",
            TickOutcome(
                t_s=T0,
                problems=(
                    Problem(ProblemKind.DEPLOYMENT_INVALID, "deployment_error", "404", "validate"),
                ),
            ),
            {
                "Ready": ("False", "DeploymentInvalid"),
                "Scaling": ("False", "NotPlanning"),
                "Degraded": ("True", "DeploymentInvalid"),
            },
        ),
    ],
)
def test_conditions_of_a_tick(name: str, tick: TickOutcome, expected: dict[str, Any]) -> None:
    got = reasons(tick_conditions(tick))
    assert {k: got[k] for k in expected} == expected, name


def test_transition_time_moves_only_when_a_condition_flips() -> None:
    first = policy_status(outcome(), target=TARGET, previous=None, wall_now_s=T0)
    same = policy_status(outcome(), target=TARGET, previous=first, wall_now_s=T0 + 60)
    flipped = policy_status(
        outcome(applied={"prefill": 2}), target=TARGET, previous=same, wall_now_s=T0 + 120
    )
    times = [
        {c["type"]: c["lastTransitionTime"] for c in s["conditions"]}
        for s in (first, same, flipped)
    ]
    assert times[1] == times[0]
    assert times[2]["Scaling"] == rfc3339(T0 + 120)
    assert times[2]["Ready"] == rfc3339(T0)


def test_the_last_decision_stays_visible_on_quiet_ticks() -> None:
    decided = policy_status(
        outcome(
            scale_to={"prefill": 3, "decode": 2}, applied={"prefill": 3}, throughput_reason="scale"
        ),
        target=TARGET,
        previous=None,
        wall_now_s=T0,
    )
    quiet = policy_status(outcome(), target=TARGET, previous=decided, wall_now_s=T0 + 60)
    assert quiet["lastDecision"] == decided["lastDecision"]
    assert quiet["lastDecision"]["applied"] == {"prefill": 3}
    assert quiet["reasons"]["throughput"] == "no_change"
    assert quiet["replicasSummary"] == "prefill 1/1, decode 2/2"
    assert quiet["gpusInUse"] == 5


def test_merge_patch_nulls_what_disappeared_and_keeps_what_did_not_change() -> None:
    old = {"a": 1, "m": {"x": 1, "y": 2}, "l": [1, 2], "gone": True}
    new = {"a": 1, "m": {"x": 1, "y": 3}, "l": [1]}
    assert merge_patch(old, new) == {"gone": None, "m": {"y": 3}, "l": [1]}
    assert merge_patch(new, new) == {}


async def test_the_writer_patches_changes_only_and_rate_limits_measurements(
    operator_cluster: OperatorCluster,
) -> None:
    cluster = operator_cluster
    await cluster.add_policy("p", {"targetRef": {"name": "graph"}})
    now = [T0]
    writer = StatusWriter(
        cluster.api.api_client,
        namespace=NS,
        name="p",
        min_interval_s=30.0,
        wall_clock=lambda: now[0],
    )
    writer.target = TARGET

    def status_patches() -> int:
        return len(cluster.requests("PATCH", "plannerpolicies", "status"))

    await writer.write_outcome(outcome())
    assert status_patches() == 1
    stored = cluster.kmock.objects[POLICY, NS, "p"].raw["status"]
    assert stored["replicasSummary"] == "prefill 1/1, decode 2/2"
    assert {c["type"] for c in stored["conditions"]} == {"Ready", "Scaling", "Degraded"}

    now[0] += 5  # only the tick time moved: not written
    await writer.write_outcome(outcome(t_s=now[0]))
    assert status_patches() == 1
    now[0] += 5  # a condition changes: written at once, and only what changed is sent
    await writer.write_outcome(outcome(t_s=now[0], applied={"prefill": 2}))
    assert status_patches() == 2
    patch = cluster.requests("PATCH", "plannerpolicies", "status")[-1].data["status"]
    assert "replicas" not in patch and "conditions" in patch
    now[0] += 31  # measurements alone are refreshed after the interval
    await writer.write_outcome(outcome(t_s=now[0], applied={"prefill": 2}))
    assert status_patches() == 3


async def test_a_degraded_episode_the_status_could_not_show_is_written_afterwards(
    operator_cluster: OperatorCluster,
) -> None:
    # The API server unreachable: the tick that lacked the DGD cannot write its status
    # either; the next status written says what happened meanwhile.
    cluster = operator_cluster
    await cluster.add_policy("p", {"targetRef": {"name": "graph"}})
    now = [T0]
    writer = StatusWriter(cluster.api.api_client, namespace=NS, name="p", wall_clock=lambda: now[0])
    writer.target = TARGET
    await writer.write_outcome(outcome())
    assert "lastDegraded" not in cluster.kmock.objects[POLICY, NS, "p"].raw["status"]

    now[0] += 5
    cluster.fail(
        "patch", "plannerpolicies", [503], subresource="status", group=GROUP, version=VERSION
    )
    lost = Problem(ProblemKind.CONNECTOR_ERROR, "connector_error", "connection failed", "status")
    await writer.write_outcome(outcome(t_s=now[0], status=None, effects=None, problems=[lost]))
    assert writer.writes == 1  # refused (kmock stores a patch before its answer: not read)

    now[0] += 5
    await writer.write_outcome(outcome(t_s=now[0]))
    last = cluster.kmock.objects[POLICY, NS, "p"].raw["status"]["lastDegraded"]
    assert last["reason"] == "ConnectorError" and "connection failed" in last["message"]
    assert (last["since"], last["until"]) == (rfc3339(T0 + 5), rfc3339(T0 + 10))
