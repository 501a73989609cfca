"""The two-stage elastic-EP flow on Kubernetes: kmock as the API server (the DGD, the follower's
DGDSA), the vLLM-like admin server as the engine, and a task playing the Dynamo operator
(follower pods become ready some time after their replicas are raised)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest

from disagg_planner.connectors.elastic_ep import (
    RECORD_ANNOTATION,
    DynamoElasticEpAdmin,
    ElasticEpController,
    ElasticEpKubernetes,
    FollowersNotReady,
    JoinProbe,
    PartialReconfiguration,
    RayDashboardJoinProbe,
    ResizeOutcome,
    ResizeOutcomeUnknown,
    ResizePhase,
    ResizeRecord,
    ResizeRefused,
    VllmElasticEpAdmin,
)
from disagg_planner.core.types import TrafficObservation
from disagg_planner.errors import DeploymentError
from disagg_planner.profiles import load_profile
from disagg_planner.profiles.registry import resolve_profile
from disagg_planner.runtime.connector_settings import (
    elastic_ep_kubernetes_settings,
    elastic_ep_settings,
)
from disagg_planner.runtime.elastic import ElasticDriver
from disagg_planner.runtime.outcome import ProblemKind
from tests.integration.connectors.conftest import Cluster, frontend, k8s_config, worker
from tests.integration.elastic.conftest import FakeDynamoWorker, FakeVllmEngine

pytestmark = pytest.mark.filterwarnings("ignore:read_binary is deprecated:DeprecationWarning")

FOLLOWER = "decode-elastic"


def services(followers: int) -> dict[str, dict[str, Any]]:
    return {
        "Frontend": frontend(),
        "decode": worker("decode", 1, gpu_limit="16"),
        FOLLOWER: {
            "componentType": "worker",
            "replicas": followers,
            "resources": {"limits": {"gpu": "4"}},
        },
    }


def follower_state(cluster: Cluster) -> tuple[int, int]:
    dgd = cluster.dgd()
    return (
        dgd["spec"]["services"][FOLLOWER]["replicas"],
        dgd["status"]["services"][FOLLOWER]["readyReplicas"],
    )


def record_of(cluster: Cluster) -> str | None:
    annotations = cluster.dgd()["metadata"].get("annotations") or {}
    return annotations.get(RECORD_ANNOTATION)


@pytest.fixture
def cluster(kmock: Any) -> Cluster:
    return Cluster(kmock)


@pytest.fixture
async def operator(cluster: Cluster) -> AsyncIterator[dict[str, float | None]]:
    """Follower pods become ready ``settings["ready_after_s"]`` after their replicas change
    (never when None); fewer replicas are gone at once."""
    settings: dict[str, float | None] = {"ready_after_s": 0.1}
    changed: dict[str, float] = {}

    async def play() -> None:
        while True:
            await asyncio.sleep(0.02)
            try:
                desired, ready = follower_state(cluster)
            except KeyError:  # no DGD yet
                continue
            if desired != ready:
                since = changed.setdefault(f"{desired}", time.monotonic())
                delay = settings["ready_after_s"]
                if desired < ready or (delay is not None and time.monotonic() - since >= delay):
                    cluster.set_ready(FOLLOWER, desired)
                    changed.clear()

    task = asyncio.create_task(play())
    try:
        yield settings
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


def make_controller(
    api_client: Any,
    engine: FakeVllmEngine | FakeDynamoWorker,
    join_probe: JoinProbe | None = None,
    **overrides: Any,
) -> tuple[ElasticEpController, ElasticEpKubernetes]:
    """The two-stage controller of ``engine``: vLLM's route for a :class:`FakeVllmEngine`,
    Dynamo's (which also reports joined GPUs) for a :class:`FakeDynamoWorker`."""
    values: dict[str, Any] = {
        "mode": "agg",
        "elastic_ep": "agg",
        "elastic_ep_min_dp": 16,
        "elastic_ep_max_dp": 24,
        "elastic_ep_dp_step": 4,
        "elastic_ep_follower_service": FOLLOWER,
        "elastic_ep_admin_url": engine.url,
        "elastic_ep_resize_timeout_seconds": 5.0,
        "scaling_max_wait_seconds": 5.0,
        "scaling_check_interval_seconds": 0.05,
        "kubernetes_api_backoff_seconds": 0.05,
        "max_gpu_budget": -1,
    }
    values.update(overrides)
    cfg = k8s_config(**values)
    pool = ElasticEpKubernetes(elastic_ep_kubernetes_settings(cfg), api_client=api_client)
    admin: VllmElasticEpAdmin | DynamoElasticEpAdmin
    if isinstance(engine, FakeDynamoWorker):
        admin = DynamoElasticEpAdmin(engine.url)
        join_probe = join_probe or admin
    else:
        admin = VllmElasticEpAdmin(engine.url)
    ctl = ElasticEpController(
        elastic_ep_settings(cfg),
        admin=admin,
        followers=pool,
        join_probe=join_probe,
        poll_interval_s=0.02,
    )
    return ctl, pool


def watch_scales(
    engine: FakeVllmEngine | FakeDynamoWorker, cluster: Cluster
) -> list[tuple[int, int, int]]:
    """``(new_dp, follower replicas, followers ready)`` when each resize reaches the engine,
    read on the test's event loop (kmock's objects live there)."""
    loop = asyncio.get_running_loop()
    seen: list[tuple[int, int, int]] = []

    def on_scale(new_dp: int) -> None:
        async def read() -> tuple[int, int]:
            return follower_state(cluster)

        desired, ready = asyncio.run_coroutine_threadsafe(read(), loop).result(timeout=5)
        seen.append((new_dp, desired, ready))

    engine.on_scale = on_scale
    return seen


# --- grow and shrink --------------------------------------------------------------------------


@pytest.mark.parametrize("adapter", [True, False])
async def test_grow_raises_followers_waits_until_ready_then_resizes(
    cluster, api_client, engine_factory, operator, adapter
):
    cluster.add_dgd(services(0))
    if adapter:
        cluster.add_adapter(FOLLOWER, 0)
    engine = engine_factory(dp=16)
    seen = watch_scales(engine, cluster)
    ctl, _ = make_controller(api_client, engine)
    assert await ctl.current_dp() == 16

    result = await ctl.resize(20)

    assert (result.outcome, result.from_dp, result.dp) == (ResizeOutcome.RESIZED, 16, 20)
    assert seen == [(20, 1, 1)]  # the new GPUs existed and were ready before the resize
    assert engine.dp == 20
    assert follower_state(cluster) == (1, 1)
    if adapter:
        assert cluster.adapter(f"graph-{FOLLOWER}")["spec"]["replicas"] == 1
    assert record_of(cluster) is None
    assert await ctl.current_dp() == 20


async def test_shrink_resizes_first_then_lowers_followers(
    cluster, api_client, engine_factory, operator
):
    cluster.add_dgd(services(2))
    cluster.add_adapter(FOLLOWER, 2)
    engine = engine_factory(dp=24)
    seen = watch_scales(engine, cluster)
    ctl, _ = make_controller(api_client, engine)
    assert await ctl.current_dp() == 24

    result = await ctl.resize(16)

    assert (result.outcome, result.from_dp, result.dp) == (ResizeOutcome.RESIZED, 24, 16)
    assert seen == [(16, 2, 2)]  # the GPUs were still there while the engine shrank
    assert cluster.adapter(f"graph-{FOLLOWER}")["spec"]["replicas"] == 0
    assert follower_state(cluster)[0] == 0
    assert record_of(cluster) is None


async def test_refused_grow_rolls_the_followers_back(cluster, api_client, engine_factory, operator):
    cluster.add_dgd(services(0))
    engine = engine_factory(dp=16)
    engine.fail_next = ["a worker died"]
    seen = watch_scales(engine, cluster)
    ctl, _ = make_controller(api_client, engine)

    with pytest.raises(ResizeRefused, match="500"):
        await ctl.resize(20)

    assert seen == [(20, 1, 1)]  # the follower was up when the engine failed
    assert engine.dp == 16
    assert follower_state(cluster)[0] == 0
    assert record_of(cluster) is None
    assert await ctl.current_dp() == 16


async def test_followers_not_ready_in_time_are_lowered_and_the_engine_untouched(
    cluster, api_client, engine_factory, operator
):
    operator["ready_after_s"] = None  # e.g. no node with free GPUs
    cluster.add_dgd(services(0))
    engine = engine_factory(dp=16)
    ctl, _ = make_controller(api_client, engine, scaling_max_wait_seconds=0.3)

    with pytest.raises(FollowersNotReady, match=r"1 follower pod\(s\) of DP 20.*stays at DP 16"):
        await ctl.resize(20)

    assert engine.scale_calls() == []
    assert follower_state(cluster)[0] == 0
    assert record_of(cluster) is None


# --- readiness that means joined ----------------------------------------------------------


async def test_dynamo_route_grows_once_the_followers_gpus_joined_ray(
    cluster, api_client, dynamo_factory, operator
):
    """Issue 20, problems 1 and 3: a two-stage grow on Dynamo's route, resized only once the
    follower's GPUs are in the engine's Ray cluster, not when its pod is Ready."""
    cluster.add_dgd(services(0))
    worker = dynamo_factory(dp=16)
    seen_nodes: list[int] = []
    worker.on_scale = lambda _dp: seen_nodes.append(len(worker.nodes))
    ctl, _ = make_controller(api_client, worker, scaling_max_wait_seconds=5.0)

    async def follower_joins_later() -> None:
        await _until(lambda: follower_state(cluster) == (1, 1), timeout_s=5.0)
        await asyncio.sleep(0.3)  # Ready, but the raylet has not registered yet
        worker.join("10.0.0.2", 4.0)

    joiner = asyncio.create_task(follower_joins_later())
    result = await ctl.resize(20)
    await joiner

    assert result.dp == 20 and worker.dp == 20
    assert seen_nodes == [2]  # the resize reached the engine after the join
    assert result.followers_ready_s is not None and result.followers_ready_s >= 0.3
    assert record_of(cluster) is None


async def test_a_follower_that_never_joins_is_rolled_back_on_dynamos_route(
    cluster, api_client, dynamo_factory, operator
):
    cluster.add_dgd(services(0))
    worker = dynamo_factory(dp=16)
    ctl, _ = make_controller(api_client, worker, scaling_max_wait_seconds=0.5)

    with pytest.raises(
        FollowersNotReady, match=r"ready but only 0 of the 4 new ranks of DP 20 fit.*stays at DP 16"
    ):
        await ctl.resize(20)

    assert worker.scale_calls() == []
    assert follower_state(cluster)[0] == 0
    assert record_of(cluster) is None


async def test_a_follower_that_never_joins_is_rolled_back_on_bare_vllm(
    cluster, api_client, engine_factory, ray_factory, operator
):
    cluster.add_dgd(services(0))
    engine = engine_factory(dp=16)
    ray = ray_factory(head_gpus=16.0)
    ray.join("10.0.0.9", 4.0, state="DEAD")  # a previous follower's node, gone
    ctl, _ = make_controller(
        api_client, engine, RayDashboardJoinProbe(ray.url), scaling_max_wait_seconds=0.5
    )

    with pytest.raises(FollowersNotReady, match=r"only 0 of the 4 new ranks.*api/v0/nodes"):
        await ctl.resize(20)
    assert engine.scale_calls() == [] and follower_state(cluster)[0] == 0

    ray.join("10.0.0.2", 4.0)
    assert (await ctl.resize(20)).dp == 20


async def test_an_engine_resized_by_someone_else_is_detected_on_dynamos_route(
    cluster, api_client, dynamo_factory, operator
):
    cluster.add_dgd(services(1))
    worker = dynamo_factory(dp=24)  # one follower makes 20; the engine says 24
    ctl, _ = make_controller(api_client, worker)

    with pytest.raises(DeploymentError, match=r"reports DP 24, but 1 follower\(s\) make DP 20"):
        await ctl.current_dp()
    worker.dp = 20
    assert await ctl.current_dp() == 20


# --- a resize that may have half reconfigured the engine ------------------------------------


async def test_a_408_after_reconfiguration_keeps_followers_and_record(
    cluster, api_client, engine_factory, operator
):
    cluster.add_dgd(services(0))
    engine = engine_factory(dp=16)
    engine.new_engines_start_s = 0.05
    ctl, _ = make_controller(api_client, engine)

    with pytest.raises(PartialReconfiguration, match="408"):
        await ctl.resize(20)

    # the new ranks may live on the follower: it stays; the record says why
    assert follower_state(cluster) == (1, 1)
    record = ResizeRecord.from_json(record_of(cluster) or "", where="test")
    assert record.phase is ResizePhase.RESIZING
    assert record.message.startswith("partial reconfiguration")
    assert await ctl.is_resizing() is True
    reason = await ctl.partial_reconfiguration()
    assert reason is not None and "408" in reason
    calls = len(engine.scale_calls())
    with pytest.raises(PartialReconfiguration, match=r"restart the engine and remove"):
        await ctl.resize(24)
    assert len(engine.scale_calls()) == calls


# --- coexistence with Dynamo's own elastic-EP reconciler ------------------------------------


def elastic_leader() -> dict[str, Any]:
    service = worker("decode", 1, gpu_limit="16")
    service["extraPodSpec"]["mainContainer"]["args"] = [
        "--model",
        "deepseek-ai/DeepSeek-V3",
        "--enable-elastic-ep",
        "--enable-eplb",
        "--data-parallel-backend=ray",
    ]
    return service


async def test_a_dgd_with_dynamos_synthesized_follower_is_claimed(
    cluster, api_client, engine_factory
):
    """Issue 20, problem 2: with Dynamo's follower <leader>-flw the operator's reconciler
    drives the engine; the planner sees it and refuses."""
    cluster.add_dgd({"Frontend": frontend(), "decode": elastic_leader(), FOLLOWER: {}})
    engine = engine_factory(dp=16)
    _, pool = make_controller(api_client, engine)
    await pool.status()
    assert pool.role_services["agg"] == "decode"
    assert await pool.reconciler_claim("agg") is None  # our declared follower only

    cluster.edit_dgd({"status": {"services": {"decode-flw": {"replicas": 0}}}})
    claim = await pool.reconciler_claim("agg")
    assert claim is not None and "decode-flw" in claim and "ElasticEPAutoscale" in claim


async def test_the_record_says_where_a_resize_stands(cluster, api_client, engine_factory, operator):
    cluster.add_dgd(services(0))
    engine = engine_factory(dp=16)
    loop = asyncio.get_running_loop()
    records: list[dict[str, Any]] = []

    def on_scale(new_dp: int) -> None:
        async def read() -> str | None:
            return record_of(cluster)

        text = asyncio.run_coroutine_threadsafe(read(), loop).result(timeout=5)
        records.append(json.loads(text or "null"))

    engine.on_scale = on_scale
    ctl, _ = make_controller(api_client, engine)

    await ctl.resize(20)

    (during,) = records
    assert during["type"] == "ElasticEpResizing" and during["status"] == "True"
    assert during["reason"] == ResizePhase.RESIZING.value
    assert (during["fromDp"], during["toDp"]) == (16, 20)
    assert (during["fromFollowers"], during["toFollowers"]) == (0, 1)


# --- a restarted controller -------------------------------------------------------------------


def seed_record(cluster: Cluster, record: ResizeRecord) -> None:
    cluster.edit_dgd({"metadata": {"annotations": {RECORD_ANNOTATION: record.to_json()}}})


def record(
    phase: ResizePhase, from_dp: int, to_dp: int, *, deadline_in_s: float = 60.0
) -> ResizeRecord:
    now = time.time()
    return ResizeRecord(
        phase=phase,
        from_dp=from_dp,
        to_dp=to_dp,
        from_followers=(from_dp - 16) // 4,
        to_followers=(to_dp - 16) // 4,
        started_s=now - 30,
        deadline_s=now + deadline_in_s,
    )


async def test_restart_during_the_resize_call_waits_and_finishes_it(
    cluster, api_client, engine_factory, operator
):
    cluster.add_dgd(services(1))
    seed_record(cluster, record(ResizePhase.RESIZING, 16, 20))
    engine = engine_factory(dp=16)
    engine.resize_in_background(20, seconds=0.3)  # the call the old controller made
    await asyncio.sleep(0.05)
    ctl, _ = make_controller(api_client, engine)
    assert await ctl.current_dp() == 16  # not confirmed yet
    assert await ctl.is_resizing()

    result = await ctl.recover()

    assert result is not None and (result.outcome, result.dp) == (ResizeOutcome.RESIZED, 20)
    assert [c.body["new_data_parallel_size"] for c in engine.scale_calls()] == [20]  # no-op
    assert record_of(cluster) is None
    assert await ctl.current_dp() == 20
    assert await ctl.recover() is None


async def test_restart_while_adding_followers_past_the_deadline_rolls_back(
    cluster, api_client, engine_factory, operator
):
    operator["ready_after_s"] = None
    cluster.add_dgd(services(1), ready={"Frontend": 1, "decode": 1, FOLLOWER: 0})
    seed_record(cluster, record(ResizePhase.ADDING_FOLLOWERS, 16, 20, deadline_in_s=-1))
    engine = engine_factory(dp=16)
    ctl, _ = make_controller(api_client, engine)

    with pytest.raises(FollowersNotReady):
        await ctl.recover()

    assert follower_state(cluster)[0] == 0
    assert record_of(cluster) is None
    assert engine.scale_calls() == []


async def test_restart_while_adding_followers_in_time_resumes_the_grow(
    cluster, api_client, engine_factory, operator
):
    cluster.add_dgd(services(1), ready={"Frontend": 1, "decode": 1, FOLLOWER: 0})
    seed_record(cluster, record(ResizePhase.ADDING_FOLLOWERS, 16, 20))
    engine = engine_factory(dp=16)
    ctl, _ = make_controller(api_client, engine)

    result = await ctl.resize(20)  # the planner asks again: the recorded grow finishes first

    assert engine.dp == 20 and [c.status for c in engine.scale_calls()] == [200]
    assert result.outcome is ResizeOutcome.UNCHANGED and result.dp == 20
    assert record_of(cluster) is None


async def test_restart_while_removing_followers_finishes_the_shrink(
    cluster, api_client, engine_factory, operator
):
    cluster.add_dgd(services(1))
    seed_record(cluster, record(ResizePhase.REMOVING_FOLLOWERS, 20, 16))
    engine = engine_factory(dp=16)
    ctl, _ = make_controller(api_client, engine)
    assert await ctl.current_dp() == 16  # the engine already shrank

    result = await ctl.recover()

    assert result is not None and result.dp == 16
    assert follower_state(cluster)[0] == 0
    assert engine.scale_calls() == []
    assert record_of(cluster) is None


async def test_unknown_outcome_keeps_the_record_until_a_later_call_resolves_it(
    cluster, api_client, engine_factory, operator
):
    cluster.add_dgd(services(0))
    engine = engine_factory(dp=16, resize_s=1.5)
    ctl, _ = make_controller(api_client, engine, elastic_ep_resize_timeout_seconds=0.3)

    with pytest.raises(ResizeOutcomeUnknown):
        await ctl.resize(20)
    left = json.loads(record_of(cluster) or "{}")
    assert left["reason"] == "Resizing" and "outcome unknown" in left["message"]
    assert follower_state(cluster)[0] == 1  # the new GPUs stay until the outcome is known

    await _until(lambda: not engine.scaling, timeout_s=5)
    result = await ctl.recover()

    assert result is not None and result.dp == 20 and engine.dp == 20
    assert record_of(cluster) is None


async def test_a_malformed_record_is_a_deployment_error_naming_the_annotation(
    cluster, api_client, engine_factory
):
    cluster.add_dgd(services(0))
    cluster.edit_dgd({"metadata": {"annotations": {RECORD_ANNOTATION: '{"reason": "Paused"}'}}})
    engine = engine_factory(dp=16)
    ctl, _ = make_controller(api_client, engine)

    with pytest.raises(DeploymentError, match=rf"{RECORD_ANNOTATION}: reason = 'Paused'"):
        await ctl.resize(20)
    assert engine.calls == []


async def test_missing_follower_service_is_a_deployment_error(cluster, api_client, engine_factory):
    dgd_services = services(0)
    del dgd_services[FOLLOWER]
    cluster.add_dgd(dgd_services)
    engine = engine_factory(dp=16)
    ctl, _ = make_controller(api_client, engine)

    with pytest.raises(DeploymentError, match=f"no service '{FOLLOWER}'"):
        await ctl.current_dp()


async def _until(probe: Callable[[], bool], *, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while not probe():
        if time.monotonic() > deadline:
            raise TimeoutError("condition not reached")
        await asyncio.sleep(0.02)


# --- the live loop's elastic axis (ElasticDriver) on both routes ----------------------------

PROFILE = load_profile(resolve_profile("gb200/vllm/deepseek-v3/tp1-dp16-ep16"))
ISL, OSL, INTERVAL = 9000.0, 2000.0, 60.0


def driver_config(url: str, **overrides: Any) -> Any:
    values: dict[str, Any] = {
        "mode": "agg",
        "decode_engine_num_gpu": 16,
        "ttft_ms": 5000.0,
        "itl_ms": 100.0,
        "max_gpu_budget": -1,
        "elastic_ep": "agg",
        "elastic_ep_mode": "nixl",
        "elastic_ep_min_dp": 16,
        "elastic_ep_max_dp": 20,
        "elastic_ep_dp_step": 4,
        "elastic_ep_follower_service": FOLLOWER,
        "elastic_ep_admin_url": url,
        "elastic_ep_follower_ready_seconds": 200.0,
        "scaling_max_wait_seconds": 5.0,
        "scaling_check_interval_seconds": 0.05,
        "kubernetes_api_backoff_seconds": 0.05,
    }
    values.update(overrides)
    return k8s_config(**values)


def busy_window(end_s: float) -> TrafficObservation:
    """A minute at 30 req/s: far above what 16 ranks of this profile serve."""
    return TrafficObservation(
        end_s=end_s, duration_s=INTERVAL, num_req=30.0 * INTERVAL, ttft_ms=800.0, isl=ISL, osl=OSL
    )


async def test_the_driver_finds_dynamos_route_resizes_and_learns_its_lead_time(
    cluster, api_client, dynamo_factory, operator
):
    cluster.add_dgd(services(0))
    worker = dynamo_factory(dp=16)
    cfg = driver_config(worker.url)  # elastic_ep_api=auto
    pool = ElasticEpKubernetes(elastic_ep_kubernetes_settings(cfg), api_client=api_client)
    driver = ElasticDriver(cfg, profile=PROFILE, connector=pool)

    async def join_when_ready() -> None:
        await _until(lambda: follower_state(cluster) == (1, 1), timeout_s=5.0)
        worker.join("10.0.0.2", 4.0)

    joiner = asyncio.create_task(join_when_ready())
    problems: list[Any] = []
    status = await pool.status()
    first = await driver.tick(INTERVAL, busy_window(INTERVAL), status, problems)
    assert first.started_resize and first.decision is not None
    assert first.decision.diagnostics.lead_s == pytest.approx(200.0 + 92.34 + INTERVAL)
    await driver.wait_idle()
    await joiner
    later = await driver.tick(2 * INTERVAL, busy_window(2 * INTERVAL), status, problems)

    assert problems == []
    assert worker.dp == 20
    assert [c.path for c in worker.scale_calls()] == ["/engine/control/scale_elastic_ep"]
    assert later.decision is not None and later.decision.current_dp == 20
    # the next lead time is what this resize took, not the configured 200 + 92.34 s
    assert driver.planner.follower_ready_s() < 10.0
    assert driver.planner.resize_total_s(grow=True) < 10.0


async def test_the_driver_refuses_a_dgd_dynamos_reconciler_drives(
    cluster, api_client, dynamo_factory
):
    """Issue 20, problem 2: two writers must not drive one engine."""
    cluster.add_dgd({"Frontend": frontend(), "decode": elastic_leader(), "decode-flw": {}})
    worker = dynamo_factory(dp=16)
    cfg = driver_config(
        worker.url, elastic_ep_api="dynamo", elastic_ep_follower_service="decode-flw"
    )
    pool = ElasticEpKubernetes(elastic_ep_kubernetes_settings(cfg), api_client=api_client)
    driver = ElasticDriver(cfg, profile=PROFILE, connector=pool)
    status = await pool.status()

    for tick in (1, 2):
        problems: list[Any] = []
        outcome = await driver.tick(tick * INTERVAL, busy_window(tick * INTERVAL), status, problems)
        assert outcome.decision is None and not outcome.started_resize
        assert [(p.kind, p.reason) for p in problems] == [
            (ProblemKind.DEPLOYMENT_INVALID, "DynamoElasticEpReconciler")
        ]
        assert "ElasticEPAutoscale" in problems[0].detail
    assert worker.calls == []


async def test_the_driver_reports_a_half_reconfigured_engine_every_tick(
    cluster, api_client, engine_factory, operator
):
    cluster.add_dgd(services(0))
    engine = engine_factory(dp=16)
    engine.new_engines_start_s = 0.05  # the 408 of new engines that never start
    cfg = driver_config(engine.url, elastic_ep_api="vllm")
    pool = ElasticEpKubernetes(elastic_ep_kubernetes_settings(cfg), api_client=api_client)
    driver = ElasticDriver(cfg, profile=PROFILE, connector=pool)
    status = await pool.status()

    first = await driver.tick(INTERVAL, busy_window(INTERVAL), status, [])
    assert first.started_resize
    await driver.wait_idle()
    for tick in (2, 3):
        problems: list[Any] = []
        outcome = await driver.tick(tick * INTERVAL, busy_window(tick * INTERVAL), status, problems)
        assert "PartialReconfiguration" in [p.reason for p in problems]
        assert outcome.decision is not None and outcome.decision.target_dp is None
        assert outcome.decision.reason.value == "resize_in_flight"  # the policy holds
    assert len(engine.scale_calls()) == 1


async def test_the_driver_only_raises_followers_when_dynamos_reconciler_drives(
    cluster, api_client, dynamo_factory
):
    """Issue 32, item 3: with elastic_ep_followers_only_when_claimed the planner raises the
    follower replicas a grow needs and calls no resize (Dynamo's reconciler does)."""
    cluster.add_dgd({"Frontend": frontend(), "decode": elastic_leader(), "decode-flw": {}})
    worker = dynamo_factory(dp=16)
    cfg = driver_config(
        worker.url,
        elastic_ep_api="dynamo",
        elastic_ep_follower_service="decode-flw",
        elastic_ep_followers_only_when_claimed=True,
    )
    pool = ElasticEpKubernetes(elastic_ep_kubernetes_settings(cfg), api_client=api_client)
    driver = ElasticDriver(cfg, profile=PROFILE, connector=pool)
    status = await pool.status()
    problems: list[Any] = []

    first = await driver.tick(INTERVAL, busy_window(INTERVAL), status, problems)
    await driver.wait_idle()

    assert first.started_resize and first.decision is not None
    assert first.decision.target_dp == 20
    assert cluster.dgd()["spec"]["services"]["decode-flw"]["replicas"] == 1
    assert worker.scale_calls() == []
    second = await driver.tick(2 * INTERVAL, busy_window(2 * INTERVAL), status, problems)
    assert second.decision is not None and second.decision.reason.value == "resize_in_flight"
    assert problems == []


async def test_the_driver_warns_when_the_measured_pause_contradicts_the_mode(
    cluster, api_client, current_engine_factory, operator
):
    """Issue 32, item 5: a pause far longer than elastic_ep_mode plans is reported, and the
    policy prices the measured pause from then on."""
    cluster.add_dgd(services(0))
    engine = current_engine_factory(dp=16, prepare_s=0.1, commit_s=1.5)
    cfg = driver_config(engine.url, elastic_ep_api="vllm", elastic_ep_timing="1,0.01,1,0.01")
    pool = ElasticEpKubernetes(elastic_ep_kubernetes_settings(cfg), api_client=api_client)
    driver = ElasticDriver(cfg, profile=PROFILE, connector=pool)
    status = await pool.status()

    first = await driver.tick(INTERVAL, busy_window(INTERVAL), status, [])
    assert first.started_resize
    await driver.wait_idle()
    problems: list[Any] = []
    await driver.tick(2 * INTERVAL, busy_window(2 * INTERVAL), status, problems)

    assert engine.dp == 20
    [warning] = [p for p in problems if p.reason == "ElasticEpPauseContradictsMode"]
    assert "a grow paused serving 1." in warning.detail and "plans 0.0 s" in warning.detail
    assert 1.0 <= driver.planner.pause_s(grow=True) < 2.5
