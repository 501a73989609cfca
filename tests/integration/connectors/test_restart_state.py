"""State that survives restarts: what one connector (one planner process) recorded on the
DGD, a second connector for the same DGD (the restarted or failed-over planner) reads back
on adoption: it keeps waiting for a change that has not converged, keeps a manual-edit hold,
and does not take its predecessor's writes for manual edits (issue 19, problem 3)."""

from __future__ import annotations

import json
import logging
from typing import Any

import pytest

from disagg_planner.connectors.base import HoldReason
from disagg_planner.connectors.kubernetes import STATE_ANNOTATION, KubernetesConnector
from tests.integration.connectors.conftest import (
    DGD_PLURAL,
    NS,
    FakeTime,
    frontend,
    k8s_settings,
    worker,
)
from tests.kube_dynamo import DGD, DGDSA

pytestmark = pytest.mark.filterwarnings("ignore:read_binary is deprecated:DeprecationWarning")

EPOCH = 1_800_000_000.0  # the wall clock's reading when the fake monotonic clock reads 0


def services() -> dict[str, dict[str, Any]]:
    return {
        "Frontend": frontend(),
        "prefill-pool": worker("prefill", 1, gpu_limit="2"),
        "decode-pool": worker("decode", 1, gpu_limit="2"),
    }


def planner(api_client: Any, fake_time: FakeTime, **overrides: Any) -> KubernetesConnector:
    """One planner process's connector; wall and monotonic clocks move together."""
    values: dict[str, Any] = {"scaling_convergence_timeout_seconds": 300.0}
    values.update(overrides)
    return KubernetesConnector(
        k8s_settings(**values),
        api_client=api_client,
        clock=fake_time.clock,
        sleep=fake_time.sleep,
        wall_clock=lambda: EPOCH + fake_time.now,
    )


def replica_patches(cluster: Any) -> list[Any]:
    return [r for r in cluster.requests("PATCH", DGD_PLURAL) if "spec" in r.data]


async def test_a_restarted_planner_waits_for_the_change_its_predecessor_made(
    cluster, api_client, fake_time
):
    cluster.add_dgd(services())  # ready stays at 1: the new pods are pending
    first = planner(api_client, fake_time)
    await first.validate()
    assert (await first.set_replicas({"prefill": 4})).applied == {"prefill": 4}
    fake_time.now += 20.0

    # killed; the next planner adopts the DGD 20 s after the change, 1 of 4 ready
    second = planner(api_client, fake_time)
    await second.validate()
    writes = len(replica_patches(cluster))
    outcome = await second.set_replicas({"prefill": 8})
    assert outcome.applied == {}
    assert outcome.held["prefill"].reason is HoldReason.AWAITING_CONVERGENCE
    assert "1/4" in outcome.held["prefill"].detail, outcome.held["prefill"].detail
    assert set(second.holds()) == {"prefill", "decode"}
    assert len(replica_patches(cluster)) == writes, "no write while the change converges"
    assert second.last_manual_overrides == (), "its predecessor's write is not a manual edit"

    # converged: planning resumes at once
    cluster.set_ready("prefill-pool", 4)
    await second.status()
    assert second.holds() == {}
    assert (await second.set_replicas({"prefill": 8})).applied == {"prefill": 8}


async def test_the_wait_ends_at_the_convergence_timeout(cluster, api_client, fake_time, caplog):
    cluster.add_dgd(services())
    first = planner(api_client, fake_time)
    await first.validate()
    await first.set_replicas({"prefill": 4})
    fake_time.now += 200.0

    second = planner(api_client, fake_time)
    await second.status()
    assert second.holds()["prefill"].reason is HoldReason.AWAITING_CONVERGENCE
    fake_time.now += 101.0  # 301 s after the change: it did not converge within 300 s
    caplog.set_level(logging.WARNING, logger="disagg_planner.connectors.kubernetes")
    await second.status()
    assert second.holds() == {}
    assert "did not converge within 300 s" in caplog.text


async def test_a_converged_change_does_not_hold_the_next_planner(cluster, api_client, fake_time):
    cluster.add_dgd(services())
    first = planner(api_client, fake_time)
    await first.validate()
    await first.set_replicas({"prefill": 4})
    cluster.set_ready("prefill-pool", 4)

    second = planner(api_client, fake_time)
    await second.status()
    assert second.holds() == {}
    assert cluster.events() == []


@pytest.mark.parametrize("adapter", [False, True])
async def test_a_manual_edit_hold_survives_a_restart(cluster, api_client, fake_time, adapter: bool):
    cluster.add_dgd(services())
    adapter_name = cluster.add_adapter("decode-pool", 1) if adapter else None
    first = planner(api_client, fake_time, throughput_adjustment_interval_seconds=60.0)
    await first.validate()
    await first.set_replicas({"decode": 2})
    cluster.set_ready("decode-pool", 2)
    if adapter_name is not None:
        cluster.kmock.objects[DGDSA, NS, adapter_name].patch({"spec": {"replicas": 5}})
    else:
        cluster.edit_dgd({"spec": {"services": {"decode-pool": {"replicas": 5}}}})
    cluster.set_ready("decode-pool", 5)
    await first.status()
    assert first.holds()["decode"].reason is HoldReason.MANUAL_OVERRIDE
    fake_time.now += 40.0

    second = planner(api_client, fake_time, throughput_adjustment_interval_seconds=60.0)
    await second.status()
    hold = second.holds()["decode"]
    assert hold.reason is HoldReason.MANUAL_OVERRIDE
    assert "20 s" in hold.detail, hold.detail
    outcome = await second.set_replicas({"decode": 2})
    assert set(outcome.held) == {"decode"} and outcome.applied == {}
    assert len(cluster.events()) == 1, "the edit is not reported a second time"

    fake_time.now += 21.0
    assert "decode" not in second.holds()
    assert (await second.set_replicas({"decode": 2})).applied == {"decode": 2}


async def test_an_edit_made_while_no_planner_ran_is_a_manual_edit(cluster, api_client, fake_time):
    cluster.add_dgd(services())
    first = planner(api_client, fake_time)
    await first.validate()
    await first.set_replicas({"decode": 2})
    cluster.set_ready("decode-pool", 2)
    cluster.edit_dgd({"spec": {"services": {"decode-pool": {"replicas": 6}}}})

    second = planner(api_client, fake_time)
    await second.status()
    (override,) = second.last_manual_overrides
    assert (override.expected, override.observed, override.action) == (2, 6, "respected")


@pytest.mark.parametrize(
    "annotation",
    ["not json", json.dumps({"version": 99}), json.dumps({"version": 1, "set": {"decode": "x"}})],
)
async def test_an_unreadable_state_is_ignored_with_a_warning(
    cluster, api_client, fake_time, caplog, annotation: str
):
    cluster.add_dgd(services())
    cluster.kmock.objects[DGD, NS, "graph"].patch(
        {"metadata": {"annotations": {STATE_ANNOTATION: annotation}}}
    )
    caplog.set_level(logging.WARNING, logger="disagg_planner.connectors.kubernetes")
    conn = planner(api_client, fake_time)
    await conn.validate()
    assert conn.holds() == {}
    assert f"ignoring annotation {STATE_ANNOTATION}" in caplog.text
    assert (await conn.set_replicas({"decode": 3})).applied == {"decode": 3}


async def test_the_state_of_another_object_is_not_read_back(cluster, api_client, fake_time):
    # `kubectl get -o yaml | kubectl apply` of a deleted DGD carries the old annotation.
    cluster.add_dgd(services())
    first = planner(api_client, fake_time)
    await first.validate()
    await first.set_replicas({"prefill": 4})
    state = cluster.dgd()["metadata"]["annotations"][STATE_ANNOTATION]
    cluster.add_dgd(services(), uid="another-uid")
    cluster.kmock.objects[DGD, NS, "graph"].patch(
        {"metadata": {"annotations": {STATE_ANNOTATION: state}}}
    )

    second = planner(api_client, fake_time)
    await second.status()
    assert second.holds() == {}
