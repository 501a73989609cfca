"""The decision-id protocol against a real etcd server (started per module on loopback)."""

from __future__ import annotations

import asyncio
import itertools
import json
import socket
from typing import Any

import pytest

from disagg_planner.config.schema import PlannerConfig
from disagg_planner.connectors.base import Connector, HoldReason
from disagg_planner.connectors.etcd import EtcdGateway, ModRevisionIs, Put
from disagg_planner.connectors.virtual import (
    ExternalScalerClient,
    ScalingDecision,
    VirtualConnector,
    VirtualSettings,
)
from disagg_planner.errors import ConnectorError
from disagg_planner.runtime.connector_settings import virtual_settings
from tests.integration.connectors.conftest import FakeTime

_names = itertools.count()


@pytest.fixture
def namespace() -> str:
    """A fresh Dynamo namespace per test: the tests share one etcd."""
    return f"graph{next(_names)}"


def settings_for(namespace: str, etcd_url: str, **overrides: Any) -> VirtualSettings:
    """The virtual connector's settings for ``namespace`` on the test's etcd."""
    values: dict[str, Any] = {
        "environment": "virtual",
        "namespace": namespace,
        "prefill_engine_num_gpu": 2,
        "decode_engine_num_gpu": 1,
        "scaling_check_interval_seconds": 0.05,
        "virtual_etcd_endpoint": etcd_url,
        "virtual_etcd_timeout_seconds": 2.0,
    }
    values.update(overrides)
    return virtual_settings(PlannerConfig(**values))


def keys(etcd_url: str, namespace: str) -> dict[str, bytes]:
    _, kvs = EtcdGateway(etcd_url, timeout_s=2).range_prefix(f"v1/{namespace}/planner/")
    return {k.rsplit("/", 1)[1]: kv.value for k, kv in kvs.items()}


async def test_first_decision_is_published_as_record_and_legacy_keys(etcd_url, namespace):
    planner = VirtualConnector(settings_for(namespace, etcd_url))
    assert isinstance(planner, Connector)
    await planner.validate()

    outcome = await planner.set_replicas({"prefill": 2, "decode": 3})

    assert outcome.applied == {"prefill": 2, "decode": 3}
    stored = keys(etcd_url, namespace)
    assert json.loads(stored["scaling_decision"]) == {
        "num_prefill_workers": 2,
        "num_decode_workers": 3,
        "decision_id": 0,
    }
    assert (stored["num_prefill_workers"], stored["num_decode_workers"]) == (b"2", b"3")
    assert stored["decision_id"] == b"0"
    assert "scaled_decision_id" not in stored

    scaler = ExternalScalerClient(etcd_url, namespace)
    assert await scaler.get() == ScalingDecision(2, 3, 0)
    status = await planner.status()
    assert (status.desired("prefill"), status.ready("prefill")) == (2, 0)
    assert status.roles["prefill"].gpus_per_replica == 2


async def test_handshake_next_decision_after_acknowledgement(etcd_url, namespace):
    planner = VirtualConnector(settings_for(namespace, etcd_url))
    scaler = ExternalScalerClient(etcd_url, namespace)
    await planner.set_replicas({"prefill": 1, "decode": 1})

    # unacknowledged: the next decision waits
    held = await planner.set_replicas({"decode": 4})
    assert held.applied == {}
    assert held.held["decode"].reason is HoldReason.AWAITING_ACKNOWLEDGEMENT
    assert set(planner.holds()) == {"prefill", "decode"}
    assert json.loads(keys(etcd_url, namespace)["scaling_decision"])["decision_id"] == 0

    decision = await scaler.wait(timeout_s=5)
    assert decision == ScalingDecision(1, 1, 0)
    await scaler.complete(decision)
    assert keys(etcd_url, namespace)["scaled_decision_id"] == b"0"
    assert await planner.wait_until_ready(1.0) is True

    outcome = await planner.set_replicas({"decode": 4})
    assert outcome.applied == {"decode": 4}
    assert planner.holds() == {}
    assert await scaler.get() == ScalingDecision(1, 4, 1)
    status = await planner.status()
    assert (status.desired("decode"), status.ready("decode")) == (4, 1)


async def test_acknowledgement_that_never_comes(etcd_url, namespace):
    fake = FakeTime()
    planner = VirtualConnector(
        settings_for(
            namespace, etcd_url, scaling_max_wait_seconds=30.0, scaling_check_interval_seconds=5.0
        ),
        clock=fake.clock,
        sleep=fake.sleep,
    )
    await planner.set_replicas({"prefill": 1, "decode": 2})

    # a blocking call gives up after the max wait (on the fake clock)
    waited = await planner.wait_until_ready(30.0)
    assert waited is False
    assert sum(fake.sleeps) == pytest.approx(30.0)

    # after the max wait the planner issues its next decision anyway
    outcome = await planner.set_replicas({"decode": 5})
    assert outcome.applied == {"decode": 5}
    assert json.loads(keys(etcd_url, namespace)["scaling_decision"])["decision_id"] == 1


async def test_blocking_scale_times_out_on_the_real_clock(etcd_url, namespace):
    planner = VirtualConnector(settings_for(namespace, etcd_url, scaling_max_wait_seconds=0.3))
    outcome = await planner.set_replicas({"prefill": 1, "decode": 1}, blocking=True)
    assert outcome.applied == {"prefill": 1, "decode": 1}
    assert outcome.ready is False


async def test_blocking_scale_returns_when_acknowledged(etcd_url, namespace):
    planner = VirtualConnector(settings_for(namespace, etcd_url))
    scaler = ExternalScalerClient(etcd_url, namespace, watch_slice_s=0.5)

    async def external_system() -> ScalingDecision:
        decision = await scaler.wait(timeout_s=5)
        await scaler.complete(decision)
        return decision

    task = asyncio.create_task(external_system())
    outcome = await planner.set_replicas({"prefill": 3, "decode": 2}, blocking=True)
    assert outcome.ready is True
    assert await task == ScalingDecision(3, 2, 0)


async def test_unchanged_decision_is_not_republished(etcd_url, namespace):
    planner = VirtualConnector(settings_for(namespace, etcd_url))
    await planner.set_replicas({"prefill": 2, "decode": 2})
    outcome = await planner.set_replicas({"prefill": 2, "decode": 2})
    assert outcome.applied == {}
    assert outcome.unchanged == ("prefill", "decode")
    assert outcome.held == {}
    assert keys(etcd_url, namespace)["decision_id"] == b"0"


async def test_restarted_planner_continues_the_decision_ids(etcd_url, namespace):
    first = VirtualConnector(settings_for(namespace, etcd_url))
    await first.set_replicas({"prefill": 1, "decode": 1})
    await ExternalScalerClient(etcd_url, namespace).complete(ScalingDecision(1, 1, 0))

    second = VirtualConnector(settings_for(namespace, etcd_url))
    await second.validate()
    assert (await second.status()).ready("decode") == 1
    await second.set_replicas({"decode": 2})  # one more than the acknowledged decision
    assert json.loads(keys(etcd_url, namespace)["scaling_decision"]) == {
        "num_prefill_workers": 1,
        "num_decode_workers": 2,
        "decision_id": 1,
    }


async def test_legacy_keys_are_read_when_the_record_is_absent(etcd_url, namespace):
    root = f"v1/{namespace}/planner"
    EtcdGateway(etcd_url, timeout_s=2).txn(
        [],
        [
            Put(f"{root}/num_prefill_workers", b"4"),
            Put(f"{root}/num_decode_workers", b"6"),
            Put(f"{root}/decision_id", b"7"),
            Put(f"{root}/scaled_decision_id", b"7"),
        ],
    )
    scaler = ExternalScalerClient(etcd_url, namespace)
    assert await scaler.get() == ScalingDecision(4, 6, 7)

    planner = VirtualConnector(settings_for(namespace, etcd_url, mode="decode"))
    await planner.set_replicas({"decode": 5})
    assert await scaler.get() == ScalingDecision(4, 5, 8)  # prefill count carried over


async def test_scaler_wait_wakes_on_a_new_decision_and_times_out_without(etcd_url, namespace):
    planner = VirtualConnector(settings_for(namespace, etcd_url, mode="agg"))
    scaler = ExternalScalerClient(etcd_url, namespace, watch_slice_s=5.0)

    with pytest.raises(TimeoutError, match="no new decision"):
        await scaler.wait(timeout_s=0.2)

    waiter = asyncio.create_task(scaler.wait(timeout_s=10))
    await asyncio.sleep(0.2)
    assert not waiter.done()
    await planner.set_replicas({"agg": 3})
    # the watch wakes the waiter well before its 5 s watch slice ends
    decision = await asyncio.wait_for(waiter, timeout=3)
    assert decision == ScalingDecision(0, 3, 0)


async def test_acknowledgements_only_rise(etcd_url, namespace):
    planner = VirtualConnector(settings_for(namespace, etcd_url))
    scaler = ExternalScalerClient(etcd_url, namespace)
    await planner.set_replicas({"prefill": 1, "decode": 1})
    fake = FakeTime()
    later = VirtualConnector(settings_for(namespace, etcd_url), clock=fake.clock, sleep=fake.sleep)
    await later.status()
    fake.now += 1800.0  # decision 0 never acknowledged within the max wait
    assert (await later.set_replicas({"decode": 2})).applied == {"decode": 2}

    await scaler.complete(ScalingDecision(1, 2, 1))
    await scaler.complete(ScalingDecision(1, 1, 0))  # late ack of the older one: ignored
    assert keys(etcd_url, namespace)["scaled_decision_id"] == b"1"
    with pytest.raises(ValueError, match="never issued"):
        await scaler.complete(ScalingDecision(1, 2, 9))


async def test_malformed_record_is_reported_with_its_key(etcd_url, namespace):
    root = f"v1/{namespace}/planner"
    EtcdGateway(etcd_url, timeout_s=2).txn([], [Put(f"{root}/scaling_decision", b"{oops")])
    planner = VirtualConnector(settings_for(namespace, etcd_url))
    with pytest.raises(ConnectorError, match=f"{root}/scaling_decision"):
        await planner.validate()


async def test_unreachable_etcd_is_a_connector_error(namespace):
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    planner = VirtualConnector(settings_for(namespace, f"http://127.0.0.1:{port}"))
    with pytest.raises(ConnectorError, match="unreachable"):
        await planner.validate()


def test_gateway_compare_and_swap_refuses_a_stale_revision(etcd_url, namespace):
    gateway = EtcdGateway(etcd_url, timeout_s=2)
    key = f"v1/{namespace}/planner/scaling_decision"
    assert gateway.txn([ModRevisionIs(key, 0)], [Put(key, b"first")]) is True
    assert gateway.txn([ModRevisionIs(key, 0)], [Put(key, b"second")]) is False  # exists now
    _, kvs = gateway.range_prefix(key)
    assert kvs[key].value == b"first"
    assert gateway.txn([ModRevisionIs(key, kvs[key].mod_revision)], [Put(key, b"third")]) is True
    _, kvs = gateway.range_prefix(key)
    assert kvs[key].value == b"third"


async def test_advisory_mode_publishes_nothing(etcd_url, namespace):
    planner = VirtualConnector(settings_for(namespace, etcd_url, advisory=True))
    outcome = await planner.set_replicas({"prefill": 1, "decode": 2})
    assert outcome.applied == {}
    assert outcome.held["decode"].reason is HoldReason.ADVISORY
    assert keys(etcd_url, namespace) == {}
