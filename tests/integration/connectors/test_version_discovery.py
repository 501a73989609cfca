"""Which DGD version the connectors of one process use, against kmock: looked up once for
all of them (a thousand operator loops starting together must not each ask discovery), and
looked up again when the version in use is withdrawn, the watch caches following it
(issue 36)."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import kmock as kmock_lib
import pytest
from kubernetes import client as k8s_client

from disagg_planner.connectors.kubernetes import KubernetesConnector
from disagg_planner.connectors.kubernetes.cache import WatchCaches
from tests.integration.connectors.conftest import (
    DGD_NAME,
    DGD_PLURAL,
    NS,
    Cluster,
    k8s_settings,
)
from tests.integration.connectors.test_v1beta1 import _store_in_both, connector, disagg
from tests.integration.connectors.test_watch_cache import until
from tests.kube_dynamo import BETA, GROUP, VERSION

pytestmark = pytest.mark.filterwarnings("ignore:read_binary is deprecated:DeprecationWarning")


def discovery_requests(cluster: Cluster) -> list[str]:
    """The discovery documents of the DGD group asked for (``/apis/nvidia.com/<version>``)."""
    return [
        r.url.path
        for r in cluster.kmock
        if r.method.value == "GET"
        and r.url.path.rstrip("/").startswith(f"/apis/{GROUP}/v")
        and r.url.path.rstrip("/").count("/") == 3
    ]


async def test_connectors_of_one_process_share_one_version_lookup(kmock, api_client, fake_time):
    cluster = Cluster(kmock)
    cluster.add_dgd(disagg())
    conns = [connector(api_client, fake_time) for _ in range(8)]

    await asyncio.gather(*(c.status() for c in conns))  # all start at once
    await asyncio.gather(*(c.status() for c in conns))

    # one lookup: each version's discovery document asked for once, not once per connector
    assert sorted(discovery_requests(cluster)) == [
        f"/apis/{GROUP}/v1alpha1",
        f"/apis/{GROUP}/v1beta1",
    ]
    assert len(cluster.requests("GET", DGD_PLURAL)) == 16


async def test_a_withdrawn_version_is_resolved_again(kmock, api_client, fake_time):
    cluster = Cluster(kmock, version=VERSION, served=(VERSION, BETA))
    cluster.add_dgd(disagg())
    _store_in_both(cluster, VERSION)  # written in v1alpha1: read and written in it
    conn = connector(api_client, fake_time)
    await conn.status()
    assert cluster.requests("GET", DGD_PLURAL)[-1].resource.version == VERSION

    # Dynamo upgraded: v1alpha1 is no longer served (its discovery document and paths
    # answer 404); the same object shows as v1beta1
    def withdrawn(request: Any) -> Any:
        raise kmock_lib.KubernetesError(status=404, reason="NotFound", message="not served")

    kmock[f"get /apis/{GROUP}/{VERSION}"] << withdrawn
    del kmock.objects[cluster.dgd_key, NS, DGD_NAME]
    before = len(discovery_requests(cluster))

    status = await conn.status()

    assert status is not None
    assert cluster.requests("GET", DGD_PLURAL)[-1].resource.version == BETA
    assert len(discovery_requests(cluster)) == before + 2  # looked up again, once
    outcome = await conn.set_replicas({"prefill": 2, "decode": 4})
    assert outcome.applied == {"decode": 4}
    assert {r.resource.version for r in cluster.requests("PATCH", DGD_PLURAL)} == {BETA}


async def test_a_missing_dgd_on_a_served_version_is_still_an_error(kmock, api_client, fake_time):
    from disagg_planner.errors import DeploymentError

    cluster = Cluster(kmock)
    cluster.add_dgd(disagg())
    conn = connector(api_client, fake_time)
    await conn.status()
    del kmock.objects[cluster.dgd_key, NS, DGD_NAME]
    with pytest.raises(DeploymentError, match="not found"):
        await conn.status()


async def test_the_dgd_watch_follows_a_version_resolved_again(kmock, api_client, fake_time):
    """The loop's wake-up (a re-created DGD ends its backoff) is a subscription to the
    watch of the DGD's version: when that version is withdrawn and the DGD resolved again,
    the subscription and the caches move to the new version's watch (issue 36 item 7)."""
    cluster = Cluster(kmock, version=VERSION, served=(VERSION, BETA))
    cluster.add_dgd(disagg())
    _store_in_both(cluster, VERSION)
    caches = WatchCaches(api_client)
    conn = KubernetesConnector(
        k8s_settings(), api_client=api_client, clock=fake_time.clock, caches=caches
    )
    woken = threading.Event()
    unsubscribe = conn.on_deployment_change(woken.set)
    try:
        await conn.status()
        await until(lambda: conn._watched[DGD_PLURAL].synced, "the v1alpha1 cache to sync")
        assert conn._watched[DGD_PLURAL].version == VERSION
        # Dynamo upgraded: the v1alpha1 object goes (its watch sees it go), the version is no
        # longer served, the same object shows as v1beta1
        await asyncio.to_thread(
            k8s_client.CustomObjectsApi(api_client).delete_namespaced_custom_object,
            GROUP,
            VERSION,
            NS,
            DGD_PLURAL,
            DGD_NAME,
        )
        await until(lambda: conn._watched[DGD_PLURAL].get(DGD_NAME) == (True, None), "the deletion")

        def withdrawn(request: Any) -> Any:
            raise kmock_lib.KubernetesError(status=404, reason="NotFound", message="not served")

        kmock[f"get /apis/{GROUP}/{VERSION}"] << withdrawn

        await conn.status()  # resolved again: v1beta1

        # the DGD's and the adapters' caches: on v1beta1, the old streams given up
        assert {c.version for c in conn._watched.values()} == {BETA}
        assert {version for _, _, version in caches._caches} == {BETA}
        await until(lambda: conn._watched[DGD_PLURAL].synced, "the v1beta1 cache to sync")
        woken.clear()
        await asyncio.to_thread(
            k8s_client.CustomObjectsApi(api_client).patch_namespaced_custom_object,
            GROUP,
            BETA,
            NS,
            DGD_PLURAL,
            DGD_NAME,
            {"metadata": {"labels": {"edited": "yes"}}},
            _content_type="application/merge-patch+json",
        )
        await until(woken.is_set, "the subscriber to hear of the v1beta1 change")
    finally:
        unsubscribe()
        await conn.close()
        caches.close()
    assert caches._caches == {}
