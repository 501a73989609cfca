"""The elastic-EP client and controller against a local server that answers like Dynamo's
vLLM worker's control routes (``/engine/control/scale_elastic_ep``, ``ep_capacity``; see
conftest.py): no vLLM API server, no is_scaling, replies always 200 with a status."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from disagg_planner.config.schema import PlannerConfig
from disagg_planner.connectors.elastic_ep import (
    DynamoElasticEpAdmin,
    ElasticEpController,
    ElasticEpError,
    PartialReconfiguration,
    ResizeInFlight,
    ResizeOutcome,
    ResizeRefused,
    VllmElasticEpAdmin,
    detect_api,
)
from disagg_planner.errors import ConnectorError
from disagg_planner.runtime.connector_settings import elastic_ep_settings

SCALE = "/engine/control/scale_elastic_ep"


def controller(url: str, **overrides: Any) -> ElasticEpController:
    values: dict[str, Any] = {
        "mode": "agg",
        "elastic_ep": "agg",
        "elastic_ep_min_dp": 16,
        "elastic_ep_max_dp": 32,
        "elastic_ep_dp_step": 4,
        "elastic_ep_admin_url": url,
        "elastic_ep_api": "dynamo",
        "elastic_ep_resize_timeout_seconds": 5.0,
        "max_gpu_budget": -1,
    }
    values.update(overrides)
    cfg = PlannerConfig(**values)
    return ElasticEpController(
        elastic_ep_settings(cfg), admin=DynamoElasticEpAdmin(url), poll_interval_s=0.02
    )


async def test_a_resize_end_to_end_through_the_worker_control_route(dynamo_factory):
    """Issue 20, problem 1: under Dynamo there is no vLLM API server and no is_scaling; the
    resize must go through the worker's own route."""
    worker = dynamo_factory(dp=16, place_ranks=False)
    ctl = controller(worker.url)

    result = await ctl.resize(20)

    assert result.outcome is ResizeOutcome.RESIZED and result.dp == 20
    assert result.message == "Scaled to data_parallel_size=20"
    assert worker.dp == 20
    # the size read from ep_capacity, then one resize: no drain_timeout, no is_scaling
    assert [(c.path, c.body) for c in worker.calls] == [
        ("/engine/control/ep_capacity", {}),
        (SCALE, {"new_data_parallel_size": 20}),
    ]


async def test_the_bare_vllm_client_cannot_drive_a_dynamo_worker(dynamo_factory):
    worker = dynamo_factory(place_ranks=False)
    with pytest.raises(ConnectorError, match=r"404.*elastic_ep_api=dynamo"):
        await VllmElasticEpAdmin(worker.url).is_scaling()
    assert await detect_api(worker.url) == "dynamo"


async def test_a_200_with_status_error_is_a_refusal_with_its_reason(dynamo_factory):
    """Issue 20, problem 1: a 200 whose status is "error" is not a success."""
    worker = dynamo_factory(dp=16, place_ranks=False, failure="rollback")
    worker.fail_next = ["Only ray DP backend supports scaling elastic EP"]
    ctl = controller(worker.url)

    with pytest.raises(ResizeRefused, match=r"error: .*Only ray DP backend.*keeps its size"):
        await ctl.resize(20)
    assert worker.dp == 16 and await ctl.current_dp() == 16


async def test_an_ok_for_another_size_is_not_a_success(dynamo_factory):
    worker = dynamo_factory(dp=16, place_ranks=False)
    worker.echo_size = 24
    with pytest.raises(ElasticEpError, match=r"ok for new_data_parallel_size=24, not 20"):
        await DynamoElasticEpAdmin(worker.url).scale(20, timeout_s=5)


@pytest.mark.parametrize("busy_status", ["busy", "error"])
async def test_busy_answers_are_waited_out_without_is_scaling(dynamo_factory, busy_status):
    """Someone else's resize runs (Dynamo's single-flight lock): "busy" (or an older worker's
    "error ... already in progress") is retried until the worker takes ours."""
    worker = dynamo_factory(dp=16, resize_s=0.4, busy_status=busy_status, place_ranks=False)
    other = asyncio.create_task(DynamoElasticEpAdmin(worker.url).scale(20, timeout_s=5))
    await asyncio.sleep(0.1)
    ctl = controller(worker.url)

    result = await ctl.resize(24)

    assert (await other) == "Scaled to data_parallel_size=20"
    assert result.outcome is ResizeOutcome.RESIZED and worker.dp == 24
    assert worker.max_active == 1
    ours = [c for c in worker.scale_calls() if c.body["new_data_parallel_size"] == 24]
    assert len(ours) >= 2  # answered busy at least once, then taken


async def test_a_worker_busy_past_the_resize_timeout_is_a_resize_in_flight(dynamo_factory):
    worker = dynamo_factory(dp=16, resize_s=2.0, place_ranks=False)
    other = asyncio.create_task(DynamoElasticEpAdmin(worker.url).scale(20, timeout_s=5))
    await asyncio.sleep(0.1)
    ctl = controller(worker.url, elastic_ep_resize_timeout_seconds=0.3)

    with pytest.raises(ResizeInFlight, match=r"already in progress.*still busy after 0.3 s"):
        await ctl.resize(24)
    await other


async def test_a_lost_answer_is_reissued_once_the_worker_is_no_longer_busy(dynamo_factory):
    # The resize outlasts the call's timeout (so its answer is lost) but ends well inside the
    # re-issued call's own timeout: the margin (0.6 s) keeps a loaded machine from racing it.
    worker = dynamo_factory(dp=16, resize_s=1.0, place_ranks=False)
    ctl = controller(worker.url, elastic_ep_resize_timeout_seconds=0.8)

    result = await ctl.resize(20)

    assert result.dp == 20 and worker.dp == 20
    assert worker.max_active == 1
    sizes = [c.body["new_data_parallel_size"] for c in worker.scale_calls()]
    assert len(sizes) >= 2 and set(sizes) == {20}  # the lost call, then the re-issued one


async def test_an_active_reconfiguration_is_a_partial_reconfiguration(dynamo_factory):
    """Issue 20, problem 4: after a failed prepare or commit vLLM refuses resizes with
    "reconfiguration is already active"; the worker passes the reason on."""
    worker = dynamo_factory(dp=16, place_ranks=False, failure="rollback")
    worker.fail_next = ["Elastic EP reconfiguration is already active"]
    ctl = controller(worker.url)

    with pytest.raises(PartialReconfiguration, match="restart the engine"):
        await ctl.resize(20)
    with pytest.raises(PartialReconfiguration, match="not resizing"):
        await ctl.resize(20)
    assert len(worker.scale_calls()) == 1


async def test_joined_gpus_come_from_ep_capacity(dynamo_factory):
    worker = dynamo_factory(dp=16, gpus_per_rank=1, place_ranks=False)
    admin = DynamoElasticEpAdmin(worker.url)
    assert await admin.joined_gpus() == 16
    worker.join("10.0.0.7", 4.0)
    assert await admin.joined_gpus() == 20


async def test_the_engines_own_size_is_read_from_ep_capacity(dynamo_factory):
    """Without followers the controller cannot derive the size; Dynamo's worker reports it."""
    worker = dynamo_factory(dp=24, place_ranks=False)
    ctl = controller(worker.url)

    assert await ctl.current_dp() == 24  # not elastic_ep_min_dp (16)
    assert (await ctl.resize(24)).outcome is ResizeOutcome.UNCHANGED
    assert worker.scale_calls() == []
