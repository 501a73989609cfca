"""The bare-vLLM elastic-EP client and the single-flight controller against a local server
that answers like vLLM 0.17.0's API server (see conftest.py)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from disagg_planner.config.schema import PlannerConfig
from disagg_planner.connectors.elastic_ep import (
    DrainTimeout,
    ElasticEpController,
    PartialReconfiguration,
    ResizeInFlight,
    ResizeOutcome,
    ResizeOutcomeUnknown,
    ResizeRefused,
    VllmElasticEpAdmin,
    detect_api,
)
from disagg_planner.errors import ConnectorError
from disagg_planner.runtime.connector_settings import elastic_ep_settings
from tests.integration.conftest import free_port


def config(url: str, **overrides: Any) -> PlannerConfig:
    values: dict[str, Any] = {
        "mode": "agg",
        "elastic_ep": "agg",
        "elastic_ep_min_dp": 16,
        "elastic_ep_max_dp": 32,
        "elastic_ep_dp_step": 4,
        "elastic_ep_admin_url": url,
        "elastic_ep_api": "vllm",
        "elastic_ep_resize_timeout_seconds": 10.0,
        "max_gpu_budget": -1,
    }
    values.update(overrides)
    return PlannerConfig(**values)


def controller(url: str, **overrides: Any) -> ElasticEpController:
    cfg = config(url, **overrides)
    assert cfg.elastic_ep_admin_url is not None
    return ElasticEpController(
        elastic_ep_settings(cfg),
        admin=VllmElasticEpAdmin(
            cfg.elastic_ep_admin_url,
            drain_timeout_s=cfg.elastic_ep_drain_timeout_seconds,
            drains_requests=cfg.elastic_ep_engine_drains_requests,
        ),
        poll_interval_s=0.02,
    )


# --- the client ---------------------------------------------------------------------------


async def test_scale_sends_the_size_and_drain_timeout_and_returns_vllms_message(engine_factory):
    engine = engine_factory(dp=16)
    admin = VllmElasticEpAdmin(engine.url, drain_timeout_s=7)

    assert await admin.is_scaling() is False
    message = await admin.scale(20, timeout_s=5)

    assert message == "Scaled to 20 data parallel engines"
    assert engine.dp == 20
    assert engine.scale_calls()[-1].body == {"new_data_parallel_size": 20, "drain_timeout": 7}


async def test_a_size_the_engine_cannot_take_is_a_500_that_keeps_its_size(engine_factory):
    # vLLM 0.17 answers any engine error, a size past its limit included, 500 "Scale failed"
    engine = engine_factory(dp=16, max_dp=20)
    admin = VllmElasticEpAdmin(engine.url)

    with pytest.raises(ResizeRefused, match=r"500: the engine failed to resize \(Scale failed\)"):
        await admin.scale(24, timeout_s=5)

    assert engine.dp == 16
    assert any("Cannot scale to data_parallel_size 24" in line for line in engine.log)


async def test_invalid_sizes_are_rejected_before_any_request(engine_factory):
    engine = engine_factory()
    admin = VllmElasticEpAdmin(engine.url)

    for bad in (0, -4, True):
        with pytest.raises(ValueError, match="new_data_parallel_size"):
            await admin.scale(bad, timeout_s=5)
    with pytest.raises(ValueError, match="drain_timeout"):
        VllmElasticEpAdmin(engine.url, drain_timeout_s=0)
    assert engine.calls == []


async def test_a_drain_408_keeps_the_size_when_the_engine_drains(engine_factory):
    engine = engine_factory(dp=16, drain_requests=True)
    engine.stuck_requests = True
    admin = VllmElasticEpAdmin(engine.url, drain_timeout_s=1, drains_requests=True)

    with pytest.raises(DrainTimeout, match=r"408 after 1 s.*did not drain within 1 s.*keeps"):
        await admin.scale(20, timeout_s=10)

    assert engine.dp == 16
    assert await admin.is_scaling() is False


async def test_drain_timeout_does_nothing_unless_the_engine_drains(engine_factory):
    """Issue 20, problem 4: without VLLM_ELASTIC_EP_DRAIN_REQUESTS vLLM never waits for
    in-flight requests, so drain_timeout cannot stop a resize."""
    engine = engine_factory(dp=16, drain_requests=False)
    engine.stuck_requests = True
    admin = VllmElasticEpAdmin(engine.url, drain_timeout_s=1)

    assert await admin.scale(20, timeout_s=10) == "Scaled to 20 data parallel engines"
    assert engine.dp == 20


async def test_a_408_after_reconfiguration_started_is_a_partial_reconfiguration(engine_factory):
    """Issue 20, problem 4: a 408 can mean the new engines never started after the running
    ones were told to reconfigure; the engine then refuses every later resize."""
    engine = engine_factory(dp=16)
    engine.new_engines_start_s = 0.1
    admin = VllmElasticEpAdmin(engine.url, drain_timeout_s=1)

    with pytest.raises(PartialReconfiguration, match=r"408.*may be half reconfigured"):
        await admin.scale(20, timeout_s=10)
    # vLLM hides the reason of the refusal that follows: only its log says it
    engine.new_engines_start_s = None
    with pytest.raises(ResizeRefused, match=r"500.*Scale failed"):
        await admin.scale(20, timeout_s=10)
    assert engine.log[-1] == "Scale failed: Elastic EP reconfiguration is already active"


async def test_a_408_past_the_drain_window_is_not_read_as_a_drain(engine_factory):
    engine = engine_factory(dp=16, drain_requests=True)
    engine.new_engines_start_s = 1.5  # the drain finished; the new engines never start
    admin = VllmElasticEpAdmin(engine.url, drain_timeout_s=1, drains_requests=True, drain_grace_s=0)

    with pytest.raises(PartialReconfiguration, match="past the drain window"):
        await admin.scale(20, timeout_s=10)


async def test_engine_failure_is_a_500(engine_factory):
    engine = engine_factory(dp=16)
    engine.fail_next = ["weight transfer failed"]
    admin = VllmElasticEpAdmin(engine.url)

    with pytest.raises(ResizeRefused, match=r"500: the engine failed to resize \(Scale failed\)"):
        await admin.scale(20, timeout_s=5)
    assert engine.dp == 16


async def test_requests_while_a_resize_runs_get_503(engine_factory):
    engine = engine_factory(dp=16)
    admin = VllmElasticEpAdmin(engine.url)
    engine.resize_in_background(20, seconds=0.5)
    await asyncio.sleep(0.05)

    assert await admin.is_scaling() is True  # answered 503 by the middleware
    with pytest.raises(ResizeInFlight, match=r"503.*currently scaling"):
        await admin.scale(24, timeout_s=5)


async def test_unreachable_engine_is_a_connector_error():
    admin = VllmElasticEpAdmin(f"http://127.0.0.1:{free_port()}")

    with pytest.raises(ConnectorError, match="cannot reach the engine"):
        await admin.is_scaling()
    with pytest.raises(ConnectorError, match="cannot reach the engine"):
        await admin.scale(20, timeout_s=5)


async def test_the_route_is_detected(engine_factory):
    engine = engine_factory()
    assert await detect_api(engine.url) == "vllm"
    with pytest.raises(ConnectorError, match="neither vLLM's /is_scaling_elastic_ep"):
        await detect_api(engine.url + "/not-vllm")


# --- the controller: single flight, waiting, lost answers -----------------------------------


async def test_controller_waits_for_a_resize_someone_else_started(engine_factory):
    engine = engine_factory(dp=16)
    ctl = controller(engine.url)
    engine.resize_in_background(20, seconds=0.4)
    await asyncio.sleep(0.05)

    result = await ctl.resize(24)

    assert result.outcome is ResizeOutcome.RESIZED
    assert engine.dp == 24
    # the controller never sent its resize while the other one ran
    assert [c.status for c in engine.scale_calls()] == [200]


async def test_concurrent_resizes_of_one_controller_run_one_at_a_time(engine_factory):
    engine = engine_factory(dp=16, resize_s=0.2)
    ctl = controller(engine.url)

    first = asyncio.create_task(ctl.resize(20))
    await asyncio.sleep(0.05)
    assert ctl.in_flight
    second = asyncio.create_task(ctl.resize(24))
    results = await asyncio.gather(first, second)

    assert [r.to_dp for r in results] == [20, 24]
    assert [r.from_dp for r in results] == [16, 20]
    assert all(r.resize_s is not None and r.resize_s > 0 for r in results)
    assert engine.max_active == 1
    assert [c.body["new_data_parallel_size"] for c in engine.scale_calls()] == [20, 24]
    assert all(c.status == 200 for c in engine.scale_calls())
    assert engine.dp == 24 and await ctl.current_dp() == 24


async def test_a_lost_answer_is_followed_and_reissued_as_a_no_op(engine_factory):
    engine = engine_factory(dp=16, resize_s=1.0)
    ctl = controller(engine.url, elastic_ep_resize_timeout_seconds=0.6)

    result = await ctl.resize(20)

    assert result.outcome is ResizeOutcome.RESIZED and result.dp == 20
    calls = engine.scale_calls()
    # the first call's answer came after the client stopped listening; the re-issued call
    # found the engine at 20 already: vLLM treats the current size as a no-op
    assert [c.body["new_data_parallel_size"] for c in calls] == [20, 20]
    assert engine.max_active == 1


async def test_a_resize_that_never_finishes_is_reported_unknown(engine_factory):
    engine = engine_factory(dp=16, resize_s=3.0)
    ctl = controller(engine.url, elastic_ep_resize_timeout_seconds=0.3)

    with pytest.raises(ResizeOutcomeUnknown, match=r"DP 20: .*resizing for more than 0.3 s"):
        await ctl.resize(20)
    assert len(engine.scale_calls()) <= 1  # never re-issued while the engine still resized


async def test_refused_and_drain_timed_out_resizes_leave_the_size_unchanged(engine_factory):
    engine = engine_factory(dp=16, drain_requests=True)
    ctl = controller(
        engine.url,
        elastic_ep_engine_drains_requests=True,
        elastic_ep_drain_timeout_seconds=1,
    )
    engine.fail_next = ["a worker died"]

    with pytest.raises(ResizeRefused):
        await ctl.resize(20)
    assert await ctl.current_dp() == 16

    engine.stuck_requests = True
    with pytest.raises(DrainTimeout):
        await ctl.resize(20)
    assert await ctl.current_dp() == 16 and engine.dp == 16

    engine.stuck_requests = False
    assert (await ctl.resize(20)).dp == 20


async def test_after_a_partial_reconfiguration_the_controller_stops_resizing(engine_factory):
    engine = engine_factory(dp=16)
    engine.new_engines_start_s = 0.05
    ctl = controller(engine.url)

    with pytest.raises(PartialReconfiguration):
        await ctl.resize(20)
    calls = len(engine.scale_calls())

    assert await ctl.is_resizing() is True  # the policy holds
    assert "408" in (await ctl.partial_reconfiguration() or "")
    with pytest.raises(PartialReconfiguration, match="not resizing"):
        await ctl.resize(24)
    assert len(engine.scale_calls()) == calls  # nothing sent to a wedged engine


async def test_controller_rejects_sizes_off_the_configured_range(engine_factory):
    engine = engine_factory(dp=16)
    ctl = controller(engine.url)

    with pytest.raises(ValueError, match=r"outside \[16, 32\]"):
        await ctl.resize(36)
    with pytest.raises(ValueError, match=r"outside \[16, 32\]"):
        await ctl.resize(12)
    assert engine.calls == []
    assert (await ctl.resize(16)).outcome is ResizeOutcome.UNCHANGED


async def test_a_server_without_elastic_ep_says_how_to_enable_it(engine_factory):
    engine = engine_factory()
    admin = VllmElasticEpAdmin(engine.url + "/not-vllm")

    with pytest.raises(ConnectorError, match=r"404.*--enable-elastic-ep.*elastic_ep_api=dynamo"):
        await admin.is_scaling()
