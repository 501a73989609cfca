"""The connector reading through watch caches (connectors/kubernetes/cache.py) against kmock
with the real ``kubernetes`` client: no GET per tick, its own writes never mistaken for
someone else's, others' edits seen, and a re-created DGD wakes its subscriber."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest
from kubernetes import client as k8s_client

from disagg_planner.connectors.kubernetes import KubernetesConnector
from disagg_planner.connectors.kubernetes.cache import WatchCaches
from tests.integration.connectors.conftest import (
    DGD_PLURAL,
    DGDSA_PLURAL,
    GROUP,
    NS,
    VERSION,
    FakeTime,
    apply_dgd_via_api,
    frontend,
    k8s_settings,
    worker,
)

pytestmark = pytest.mark.filterwarnings("ignore:read_binary is deprecated:DeprecationWarning")


async def until(condition: Callable[[], bool], what: str, timeout_s: float = 10.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout_s
    while not condition():
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.05)


@pytest.fixture
async def caches(api_client: Any) -> AsyncIterator[WatchCaches]:
    shared = WatchCaches(api_client)
    yield shared
    shared.close()


def services() -> dict[str, dict[str, Any]]:
    return {
        "Frontend": frontend(),
        "prefill-pool": worker("prefill", 1),
        "decode-pool": worker("decode", 2),
    }


def gets(cluster: Any) -> int:
    return len(cluster.requests("GET", DGD_PLURAL)) + len(cluster.requests("GET", DGDSA_PLURAL))


async def test_ticks_read_the_cache_and_a_write_is_never_taken_for_a_manual_edit(
    cluster: Any, api_client: Any, caches: WatchCaches, fake_time: FakeTime
) -> None:
    cluster.add_dgd(services())
    conn = KubernetesConnector(
        k8s_settings(),
        api_client=api_client,
        clock=fake_time.clock,
        sleep=fake_time.sleep,
        caches=caches,
    )
    await conn.validate()  # starts the watches
    await until(lambda: all(c.synced for c in conn._watched.values()), "the caches to sync")
    before = gets(cluster)
    for _ in range(10):
        await conn.status()
    steady = gets(cluster) - before

    await conn.set_replicas({"decode": 4})
    after_write = await conn.status()  # the watch may not have the write yet: no edit
    # someone else's edit, through the API (kmock streams only those to watches)
    await asyncio.to_thread(
        k8s_client.CustomObjectsApi(api_client).patch_namespaced_custom_object,
        GROUP,
        VERSION,
        NS,
        DGD_PLURAL,
        "graph",
        {"spec": {"services": {"decode-pool": {"replicas": 7}}}},
        _content_type="application/merge-patch+json",
    )
    await until(
        lambda: (
            (conn._watched[DGD_PLURAL].get("graph")[1] or {})["spec"]["services"]["decode-pool"][
                "replicas"
            ]
            == 7
        ),
        "the edit to reach the cache",
    )
    edited = await conn.status()
    assert (steady, after_write.desired("decode"), edited.desired("decode")) == (0, 4, 7)
    assert [(o.expected, o.observed) for o in conn.last_manual_overrides] == [(4, 7)]
    await conn.close()


async def test_a_dgd_applied_again_wakes_its_subscriber(
    cluster: Any, api_client: Any, caches: WatchCaches, fake_time: FakeTime
) -> None:
    conn = KubernetesConnector(
        k8s_settings(),
        api_client=api_client,
        clock=fake_time.clock,
        sleep=fake_time.sleep,
        caches=caches,
    )
    woken = threading.Event()
    unsubscribe = conn.on_deployment_change(woken.set)
    # subscribed once discovery has told the DGD's served version (issue 35)
    await until(
        lambda: DGD_PLURAL in conn._watched and conn._watched[DGD_PLURAL].synced,
        "the DGD cache to sync",
    )
    await apply_dgd_via_api(api_client, services(), uid="second")
    await until(woken.is_set, "the subscriber to be called")
    unsubscribe()
    await conn.close()
