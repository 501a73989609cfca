"""The live loop drives elastic EP: kmock as the Kubernetes API with the real connector, the
canned Prometheus with the real observer, the vLLM-like admin server as the engine."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import pytest

from disagg_planner.core.elastic import ElasticReason
from disagg_planner.runtime.outcome import ProblemKind
from tests.integration.elastic.conftest import FakeVllmEngine
from tests.integration.runtime.conftest import spec_replicas
from tests.unit.observe.canned_prometheus import vector_reply
from tests.unit.runtime.conftest import loop_config, traffic_parts

pytestmark = pytest.mark.filterwarnings("ignore:read_binary is deprecated:DeprecationWarning")

MAX_DP = 16


def elastic_config(engine: FakeVllmEngine, **overrides: Any) -> Any:
    values: dict[str, Any] = {
        "elastic_ep": "decode",
        "elastic_ep_mode": "nixl",
        "elastic_ep_min_dp": 1,
        "elastic_ep_max_dp": MAX_DP,
        "elastic_ep_admin_url": engine.url,
    }
    values.update(overrides)
    return loop_config(**values)


async def run_ramp(h: Any, prometheus: Any, rates: list[float]) -> list[Any]:
    """One throughput tick per rate (req/s over the 60 s window); each tick's background
    resize is let finish before the next tick, as a resize shorter than a tick would."""
    outcomes = []
    for rate in rates:
        prometheus.reply = vector_reply(traffic_parts(rate, 60.0))
        outcome = await h.next_tick()
        assert outcome is not None and outcome.ran_throughput
        outcomes.append(outcome)
        assert h.loop.elastic is not None
        await h.loop.elastic.wait_idle()
    return outcomes


@pytest.fixture
def engine() -> Iterator[FakeVllmEngine]:
    engine = FakeVllmEngine(dp=1, max_dp=MAX_DP)
    engine.start()
    yield engine
    engine.stop()


async def test_rising_traffic_resizes_the_engine_to_the_planned_dp(
    cluster, harness_factory, prometheus, engine
) -> None:
    h = harness_factory(elastic_config(engine))
    await h.start()

    # One decode rank serves ~28 req/s of ISL 3000 / OSL 150 on this profile.
    outcomes = await run_ramp(h, prometheus, [5.0, 40.0, 80.0, 120.0])

    first = outcomes[0]
    assert first.elastic is not None and first.elastic.target_dp is None
    assert first.elastic.reason is ElasticReason.NO_CHANGE
    resizes = [o for o in outcomes if o.elastic is not None and o.elastic.target_dp is not None]
    assert resizes, [o.message for o in outcomes]
    planned = [o.elastic.target_dp for o in resizes]
    assert all(
        o.elastic.reason in (ElasticReason.SCALE_UP, ElasticReason.SCALE_UP_CAPPED) for o in resizes
    )
    # each planned size reached the engine's admin API, in order, and nothing else did
    sent = [c.body["new_data_parallel_size"] for c in engine.scale_calls()]
    assert sent == planned
    assert all(c.status == 200 for c in engine.scale_calls())
    assert engine.dp == planned[-1] > 1
    assert engine.max_active == 1
    # the next tick plans from the size the resize reached
    later = await run_ramp(h, prometheus, [120.0])
    assert later[0].elastic is not None and later[0].elastic.current_dp == engine.dp
    # the elastic role keeps its replicas while the core scales the others
    replicas = spec_replicas(cluster)
    assert replicas["decode"] == 1
    assert replicas["prefill"] > 1
    assert all("decode" not in o.applied for o in outcomes)
    # the decision is reported in the message and the snapshot
    last = resizes[-1]
    assert f"elastic decode: resizing DP {last.elastic.current_dp} -> {planned[-1]}" in (
        last.message
    )
    assert last.snapshot.extra["elastic"]["target_dp"] == planned[-1]
    assert last.snapshot.extra["elastic"]["reason"] == last.elastic.reason.value
    assert all(o.problems == () for o in outcomes + later)


@pytest.mark.parametrize("in_flight", [None, 20_000.0])
async def test_the_frontends_in_flight_count_reaches_the_elastic_policy_as_a_backlog(
    cluster, harness_factory, prometheus, engine, in_flight
) -> None:
    """The live loop hands the elastic policy the traffic window the throughput loop reads,
    in-flight count included: requests waiting beyond what the rate explains grow the engine
    past what the rate alone needs (the same rule and observation as in replay)."""
    h = harness_factory(elastic_config(engine))
    await h.start()
    parts: dict[str, float] = traffic_parts(20.0, 60.0)
    if in_flight is not None:
        parts["in_flight"] = in_flight
    prometheus.reply = vector_reply(parts)

    outcome = await h.next_tick()

    assert outcome is not None and outcome.elastic is not None
    decision = outcome.elastic
    backlog = decision.diagnostics.backlog_requests
    if in_flight is None:
        # one rank carries 20 req/s; no count, no backlog
        assert (decision.reason, decision.target_dp) == (ElasticReason.NO_CHANGE, None)
        assert backlog == 0.0 and "no backlog measured" in decision.message
    else:
        assert backlog is not None and 0 < backlog < in_flight
        assert decision.reason in (ElasticReason.SCALE_UP, ElasticReason.SCALE_UP_CAPPED)
        assert decision.target_dp is not None and decision.target_dp > 1
        assert f"backlog {backlog:.0f} requests ({in_flight:.0f} in flight" in outcome.message
        assert h.loop.elastic is not None
        await h.loop.elastic.wait_idle()
        assert engine.dp == decision.target_dp


async def test_advisory_plans_the_dp_but_never_resizes(
    cluster, harness_factory, prometheus, engine
) -> None:
    h = harness_factory(elastic_config(engine, advisory=True))
    await h.start()

    outcomes = await run_ramp(h, prometheus, [5.0, 40.0, 80.0, 120.0])

    planned = [o for o in outcomes if o.elastic is not None and o.elastic.target_dp is not None]
    assert planned, [o.message for o in outcomes]
    assert "[ADVISORY: not resized]" in planned[-1].message
    assert engine.scale_calls() == []
    assert engine.dp == 1
    assert spec_replicas(cluster) == {"prefill": 1, "decode": 1}


async def test_a_refused_resize_is_a_problem_and_the_loop_goes_on(
    cluster, harness_factory, prometheus, engine
) -> None:
    engine.fail_next = [500]
    h = harness_factory(elastic_config(engine))
    await h.start()

    failed, reported = await run_ramp(h, prometheus, [120.0, 120.0])

    assert failed.elastic is not None and failed.elastic.target_dp is not None
    target = failed.elastic.target_dp
    # the resize ran in the background; its 500 is reported by the next tick
    problem = reported.problem(ProblemKind.CONNECTOR_ERROR)
    assert problem is not None and problem.source == "elastic"
    assert "500" in problem.detail and "keeps its size" in problem.detail
    # the same tick planned again from the size the engine kept, and the retry went through
    assert reported.elastic is not None and reported.elastic.current_dp == 1
    assert reported.elastic.target_dp == target
    assert [c.status for c in engine.scale_calls()] == [500, 200]
    assert engine.dp == target
    (after,) = await run_ramp(h, prometheus, [120.0])
    assert after.problems == ()
    assert after.elastic is not None and after.elastic.current_dp == target


async def test_an_unreachable_engine_is_a_problem_and_the_next_tick_runs(
    cluster, harness_factory, prometheus, engine
) -> None:
    config = elastic_config(engine)
    engine.stop()
    h = harness_factory(config)
    await h.start()

    first = await h.next_tick()
    second = await h.next_tick()

    for outcome in (first, second):
        assert outcome is not None and outcome.ran_throughput
        assert outcome.elastic is None
        problem = outcome.problem(ProblemKind.CONNECTOR_ERROR)
        assert problem is not None and problem.source == "elastic"
        assert "cannot reach the engine" in problem.detail
        assert outcome.status is not None  # the rest of the tick ran
    assert second.t_s > first.t_s


async def test_make_connector_scales_followers_on_kubernetes(engine, api_client) -> None:
    from disagg_planner.connectors.elastic_ep import ElasticEpKubernetes
    from disagg_planner.connectors.kubernetes import KubernetesConnector
    from disagg_planner.runtime.clock import WallClock
    from disagg_planner.runtime.service import make_connector

    clock = WallClock()
    with_followers = elastic_config(engine, elastic_ep_follower_service="decode-elastic")
    two_stage = make_connector(with_followers, clock=clock, api_client=api_client)
    assert isinstance(two_stage, ElasticEpKubernetes)
    plain = make_connector(elastic_config(engine), clock=clock, api_client=api_client)
    assert isinstance(plain, KubernetesConnector)
    assert not isinstance(plain, ElasticEpKubernetes)


async def test_the_driver_scales_the_followers_the_connector_answers_pooled_or_not(
    engine, api_client, profile
) -> None:
    # The driver asks the connector protocol (elastic_followers) instead of naming the
    # Kubernetes class, so that a connector wrapped in a GPU pool's grant keeps its followers.
    from disagg_planner.operator.pool import PooledConnector
    from disagg_planner.runtime.clock import WallClock
    from disagg_planner.runtime.elastic import ElasticDriver
    from disagg_planner.runtime.service import make_connector

    clock = WallClock()
    with_followers = elastic_config(
        engine, elastic_ep_follower_service="decode-elastic", elastic_ep_api="vllm"
    )
    two_stage = make_connector(with_followers, clock=clock, api_client=api_client)
    pooled = PooledConnector(two_stage, with_followers)
    for connector in (two_stage, pooled):
        driver = ElasticDriver(with_followers, profile=profile, connector=connector)
        assert driver.followers is two_stage
    plain_config = elastic_config(engine, elastic_ep_api="vllm")
    plain = make_connector(plain_config, clock=clock, api_client=api_client)
    for connector in (plain, PooledConnector(plain, plain_config)):
        assert ElasticDriver(plain_config, profile=profile, connector=connector).followers is None


async def test_on_kubernetes_followers_are_ready_before_the_grow_reaches_the_engine(
    cluster, harness_factory, prometheus, engine, api_client
) -> None:
    from disagg_planner.connectors.elastic_ep import RECORD_ANNOTATION, ElasticEpKubernetes
    from disagg_planner.runtime.connector_settings import elastic_ep_kubernetes_settings
    from tests.integration.connectors.conftest import frontend, worker
    from tests.integration.elastic.test_two_stage import FOLLOWER, follower_state, watch_scales

    follower = FOLLOWER  # watch_scales reads this service
    cluster.add_dgd(
        {
            "Frontend": frontend(),
            "prefill": worker("prefill", 1),
            "decode": worker("decode", 1),
            follower: {"componentType": "worker", "replicas": 0},
        }
    )
    config = elastic_config(
        engine,
        elastic_ep_dp_step=2,
        elastic_ep_max_dp=9,
        elastic_ep_follower_service=follower,
        scaling_check_interval_seconds=0.02,
    )
    h = harness_factory(config)
    h.loop.connector = ElasticEpKubernetes(
        elastic_ep_kubernetes_settings(config),
        api_client=api_client,
        clock=h.clock.now,
        sleep=h.clock.sleep,
    )

    async def operator() -> None:  # follower pods become ready as soon as they are asked for
        while True:
            await asyncio.sleep(0.01)
            desired, ready = follower_state(cluster)
            if desired != ready:
                cluster.set_ready(follower, desired)

    seen = watch_scales(engine, cluster)
    playing = asyncio.create_task(operator())
    try:
        await h.start()
        (grow,) = await run_ramp(h, prometheus, [120.0])
    finally:
        playing.cancel()
        await asyncio.gather(playing, return_exceptions=True)

    assert grow.elastic is not None and grow.elastic.target_dp is not None
    target = grow.elastic.target_dp
    followers = (target - 1) // 2
    # stage one raised the followers and waited for them; stage two resized the engine
    assert seen == [(target, followers, followers)]
    assert engine.dp == target
    assert follower_state(cluster) == (followers, followers)
    assert RECORD_ANNOTATION not in (cluster.dgd()["metadata"].get("annotations") or {})
