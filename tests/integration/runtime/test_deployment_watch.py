"""A loop backing off because its DGD is missing is woken by the DGD watch when the DGD is
applied (again), instead of waiting out its backoff (issue 36 item 7)."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest
from kubernetes import client as k8s_client

from disagg_planner.connectors.kubernetes import KubernetesConnector
from disagg_planner.connectors.kubernetes.cache import WatchCaches
from disagg_planner.profiles import Profile
from disagg_planner.runtime.clock import WallClock
from disagg_planner.runtime.connector_settings import kubernetes_settings
from disagg_planner.runtime.loop import DeploymentLoop, DeploymentRef
from tests.integration.connectors.conftest import (
    DGD_NAME,
    NS,
    apply_dgd_via_api,
    frontend,
    worker,
)
from tests.unit.runtime.conftest import loop_config

pytestmark = pytest.mark.filterwarnings("ignore:read_binary is deprecated:DeprecationWarning")


async def test_a_dgd_applied_while_the_loop_backs_off_starts_it_at_once(
    kmock: Any, api_client: k8s_client.ApiClient, profile: Profile
) -> None:
    from tests.integration.connectors.conftest import Cluster

    Cluster(kmock)  # declares Dynamo's resources; no DGD yet
    caches = WatchCaches(api_client)
    clock = WallClock()
    config = loop_config()  # backoff from 60 s: the first retry would come a minute later
    connector = KubernetesConnector(
        kubernetes_settings(config), api_client=api_client, clock=time.monotonic, caches=caches
    )
    loop = DeploymentLoop(
        config, connector=connector, ref=DeploymentRef(NS, DGD_NAME), clock=clock, profile=profile
    )
    stop = asyncio.Event()
    running = asyncio.create_task(loop.run(stop))
    try:
        await asyncio.sleep(1.0)  # the first validation failed: backing off
        assert loop.core is None
        applied_at = time.monotonic()
        await apply_dgd_via_api(
            api_client,
            {
                "Frontend": frontend(),
                "prefill": worker("prefill", 1),
                "decode": worker("decode", 1),
            },
            uid="u1",
        )
        while loop.core is None and time.monotonic() - applied_at < 20.0:
            await asyncio.sleep(0.05)
        assert loop.core is not None, "still backing off 20 s after the DGD was applied"
    finally:
        stop.set()
        await asyncio.wait_for(running, 30)
        caches.close()
