"""``--environment virtual``: the same loop publishes decisions over a real etcd, and the
external system's acknowledgement is what the next tick sees as ready."""

from __future__ import annotations

import asyncio
import uuid

from disagg_planner.connectors.virtual import ExternalScalerClient
from disagg_planner.observe.prometheus import PrometheusTrafficObserver
from disagg_planner.runtime.loop import DeploymentLoop
from disagg_planner.runtime.service import deployment_ref, make_connector
from tests.integration.connectors.conftest import etcd_url  # noqa: F401  (fixture)
from tests.integration.runtime.conftest import JumpClock
from tests.unit.runtime.conftest import loop_config


async def test_decisions_go_to_etcd_and_the_acknowledgement_is_the_ready_count(
    etcd_url: str,  # noqa: F811
    prometheus,
    profile,
) -> None:
    namespace = f"test-{uuid.uuid4().hex[:8]}"
    config = loop_config(
        environment="virtual",
        namespace=namespace,
        dgd_name=None,
        kubernetes_namespace=None,
        virtual_etcd_endpoint=etcd_url,
        prefill_engine_num_gpu=1,
        decode_engine_num_gpu=1,
        metric_pulling_prometheus_endpoint=prometheus.url,
    )
    clock = JumpClock()
    connector = make_connector(config, clock=clock)
    ref = deployment_ref(config, connector)
    assert (ref.namespace, ref.name) == (namespace, namespace)
    loop = DeploymentLoop(
        config,
        connector=connector,
        ref=ref,
        clock=clock,
        profile=profile,
        traffic_factory=lambda model: PrometheusTrafficObserver(config, model_name=model),
    )
    external = ExternalScalerClient(etcd_url, namespace)
    assert await loop.start(asyncio.Event())
    assert loop.core is not None
    clock.now_s = loop.core.next_tick_at_s
    first = await loop.tick()
    assert first is not None and first.scale_to is not None
    decision = await external.get()
    assert decision is not None and decision.decision_id == 0
    assert first.applied == {r: n for r, n in first.scale_to.items() if n != 0}
    assert (decision.num_prefill, decision.num_decode) == (
        first.scale_to["prefill"],
        first.scale_to["decode"],
    )

    await external.complete(decision)
    clock.now_s = loop.core.next_tick_at_s
    second = await loop.tick()
    assert second is not None and second.status is not None
    assert second.status.converged
    assert second.status.ready("prefill") == decision.num_prefill
    assert second.throughput_reason == "no_change" and second.applied == {}
    await loop.close()
