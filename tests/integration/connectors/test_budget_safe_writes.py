"""Issue 19, problem 4: a rebalance (one role down, another up) never holds more GPUs than
the budget, counting the engines still terminating, on the adapters' ``/scale`` path and on
the DGD patch path (SimulatedDynamo plays the Dynamo operator with pods)."""

from __future__ import annotations

import datetime
import itertools
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from disagg_planner.config.schema import PlannerConfig
from disagg_planner.connectors.kubernetes import KubernetesConnector
from disagg_planner.core.fleet import GrantReason
from disagg_planner.core.planner import Observation, PlannerCore
from disagg_planner.errors import ConnectorError
from disagg_planner.operator.pool import PooledConnector, PoolMember, tick_pool
from disagg_planner.predictors import make_predictors
from disagg_planner.profiles import load_profile
from tests.integration.connectors.conftest import (
    DGD_NAME,
    DGD_PLURAL,
    DGDSA_PLURAL,
    Cluster,
    FakeTime,
    frontend,
    k8s_settings,
    replicas_patch,
    worker,
)
from tests.unit.core.conftest import write_h200_like_profile
from tests.unit.core.test_fast_path import SLOW_TTFT, recent

pytestmark = pytest.mark.filterwarnings("ignore:read_binary is deprecated:DeprecationWarning")

PREFILL, DECODE = "prefill-pool", "decode-pool"
MAX_WAIT_S = 10.0
EXAMPLES = itertools.count()


def services(prefill: int, decode: int, *, gpus: tuple[int, int]) -> dict[str, Any]:
    return {
        "Frontend": frontend(),
        PREFILL: worker("prefill", prefill, gpu_limit=str(gpus[0])),
        DECODE: worker("decode", decode, gpu_limit=str(gpus[1])),
    }


def deploy(
    cluster: Cluster,
    start: tuple[int, int],
    *,
    gpus: tuple[int, int],
    adapters: tuple[bool, bool],
    name: str = DGD_NAME,
) -> None:
    """The DGD ``name`` at ``start`` replicas, with a scaling adapter for the roles chosen."""
    cluster.add_dgd(services(*start, gpus=gpus), name=name)
    for service, replicas, wanted in zip((PREFILL, DECODE), start, adapters, strict=True):
        if wanted:
            cluster.add_adapter(service, replicas, dgd=name)


def connector(api_client: Any, time: FakeTime, name: str = DGD_NAME) -> KubernetesConnector:
    return KubernetesConnector(
        k8s_settings(scaling_max_wait_seconds=MAX_WAIT_S, dgd_name=name),
        api_client=api_client,
        clock=time.clock,
        sleep=time.sleep,
    )


@pytest.mark.parametrize("adapters", [(True, True), (False, False)], ids=["scale", "patch"])
async def test_rebalance_lowers_first_and_raises_once_the_engines_are_gone(
    cluster, api_client, adapters
):
    # The numbers: 4 GPUs per engine, a budget of 48, prefill 4 -> 5, decode 8 -> 7.
    time = FakeTime()
    deploy(cluster, (4, 8), gpus=(4, 4), adapters=adapters)
    dynamo = cluster.simulate_dynamo(time, grace_s=3.0)

    outcome = await connector(api_client, time).set_replicas({"prefill": 5, "decode": 7})

    assert outcome.applied == {"prefill": 5, "decode": 7}
    assert max(dynamo.gpus_in_use({PREFILL: 4, DECODE: 4})) <= 48
    assert sum(time.sleeps) >= 3.0  # the increase waited for the decode engine to leave
    if adapters[0]:
        writes = [r.name for r in cluster.requests("PATCH", DGDSA_PLURAL, "scale")]
        assert writes == ["graph-decode-pool", "graph-prefill-pool"]
    else:
        writes = [replicas_patch(r) for r in cluster.requests("PATCH", DGD_PLURAL)]
        assert writes == [
            {"spec": {"services": {DECODE: {"replicas": 7}}}},
            {"spec": {"services": {PREFILL: {"replicas": 5}}}},
        ]


async def test_increase_is_not_written_while_the_lowered_role_still_terminates(cluster, api_client):
    time = FakeTime()
    deploy(cluster, (4, 8), gpus=(4, 4), adapters=(False, False))
    dynamo = cluster.simulate_dynamo(time, grace_s=MAX_WAIT_S + 5)
    conn = connector(api_client, time)

    with pytest.raises(ConnectorError, match=r"decode .* 1 terminating.*not written"):
        await conn.set_replicas({"prefill": 5, "decode": 7})
    assert cluster.dgd()["spec"]["services"][PREFILL]["replicas"] == 4
    # A later tick asking for the increase alone waits for the same engine.
    time.now += 5
    assert (await conn.set_replicas({"prefill": 5, "decode": 7})).applied == {"prefill": 5}
    assert max(dynamo.gpus_in_use({PREFILL: 4, DECODE: 4})) <= 48


@st.composite
def scenarios(draw: st.DrawFn) -> dict[str, Any]:
    gpus = (draw(st.integers(1, 4)), draw(st.integers(1, 4)))
    budget = draw(st.integers(max(gpus) * 2, 32))

    def targets() -> tuple[int, int]:
        prefill = draw(st.integers(0, (budget - gpus[1]) // gpus[0]))
        decode = draw(st.integers(0, (budget - prefill * gpus[0]) // gpus[1]))
        return prefill, decode

    return {
        "gpus": gpus,
        "budget": budget,
        "adapters": (draw(st.booleans()), draw(st.booleans())),
        "grace_s": draw(st.sampled_from([0.0, 1.0, 4.0, MAX_WAIT_S + 5])),
        "start": targets(),
        "steps": [targets() for _ in range(draw(st.integers(1, 5)))],
    }


@settings(
    max_examples=40,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(scenario=scenarios())
async def test_gpus_in_use_never_exceed_the_budget(cluster, api_client, scenario):
    """Any sequence of targets within the budget, on either write path, with engines that
    take any time to terminate: the GPUs held (terminating engines included) stay within the
    budget at every change, and a call that returns has written its targets."""
    cluster.forget_requests()
    time = FakeTime()
    name = f"graph-{next(EXAMPLES)}"  # each example its own DGD: nothing left from another
    deploy(
        cluster, scenario["start"], gpus=scenario["gpus"], adapters=scenario["adapters"], name=name
    )
    dynamo = cluster.simulate_dynamo(time, grace_s=scenario["grace_s"], name=name)
    conn = connector(api_client, time, name)
    for prefill, decode in scenario["steps"]:
        try:
            await conn.set_replicas({"prefill": prefill, "decode": decode})
        except ConnectorError:
            pass  # the lowered role did not let go in time; the next tick plans again
        else:
            spec = cluster.dgd(name)["spec"]["services"]
            assert (spec[PREFILL]["replicas"], spec[DECODE]["replicas"]) == (prefill, decode)
        time.now += 1.0  # between two ticks
    in_use = dynamo.gpus_in_use(dict(zip((PREFILL, DECODE), scenario["gpus"], strict=True)))
    assert max(in_use) <= scenario["budget"], (in_use, dynamo.snapshots)


async def test_a_pooled_deployment_holds_the_gpus_of_its_terminating_engines(
    cluster, api_client, tmp_path
):
    """Issue 30: a pool grants another member only GPUs that are free. A member that scaled
    down holds the GPUs of its engines still terminating until their pods are gone."""
    time = FakeTime()
    deploy(cluster, (2, 8), gpus=(1, 4), adapters=(False, False))
    dynamo = cluster.simulate_dynamo(time, grace_s=30.0)
    inner = connector(api_client, time)
    await inner.validate()
    await inner.set_replicas({"decode": 6})
    config = PlannerConfig(
        dgd_name=DGD_NAME,
        backend="vllm",
        profile_results_dir=str(write_h200_like_profile(tmp_path)),
    )
    pooled = PooledConnector(inner, config)

    status = await pooled.status()
    assert (status.roles["decode"].desired, status.roles["decode"].terminating) == (6, 2)
    assert (
        status.gpus_in_use
        == 2 * 1 + (6 + 2) * 4
        == max(dynamo.gpus_in_use({PREFILL: 1, DECODE: 4}))
    )
    proposal = PoolMember(DGD_NAME, config, pooled, status).proposal()
    assert proposal is not None and proposal.held_gpus == 34

    time.now += 31.0  # the grace passed: the pods are gone, their GPUs free
    dynamo.reconcile()
    assert await pooled.releasing_replicas() == {"prefill": 0, "decode": 0}
    status = await pooled.status()
    assert status.gpus_in_use == 2 * 1 + 6 * 4
    proposal = PoolMember(DGD_NAME, config, pooled, status).proposal()
    assert proposal is not None and proposal.held_gpus == 26


async def test_a_pooled_member_whose_fast_check_scaled_up_is_served_as_a_breach(
    cluster, api_client, tmp_path
):
    """Issue 30: the operator proposes each member's urgency by the core's one definition
    (``core.fleet.member_urgency``). Two members of one priority read the same deployment
    and want the same 8 GPUs; the planner of one has just scaled up on its fast check (the
    TTFT tail over its SLO): an observed breach, served first, while the other's shortfall
    is only forecast. The pool's status says why; one interval later both are forecasts."""
    time = FakeTime()
    deploy(cluster, (1, 1), gpus=(1, 1), adapters=(False, False))
    cluster.simulate_dynamo(time, grace_s=30.0)
    inner = connector(api_client, time)
    await inner.validate()
    config = PlannerConfig(
        dgd_name=DGD_NAME,
        backend="vllm",
        profile_results_dir=str(write_h200_like_profile(tmp_path)),
        throughput_adjustment_interval_seconds=60,
        itl_ms=30,
        pool="gpus",
        pool_floor_gpus=2,
    )
    status = await inner.status()
    core = PlannerCore(
        config=config,
        start_s=0.0,
        profile=load_profile(config.profile_results_dir),
        predictor_factory=lambda series: make_predictors("constant", series),
    )
    assert core.due(15.0) is not None  # the first fast check
    effects = core.tick(15.0, Observation(status=status, recent=recent(80.0, SLOW_TTFT)))
    assert effects.scale_to == {"prefill": 7, "decode": 1} and core.fast_scale_up_s == 15.0

    def members(now_s: float) -> list[PoolMember]:
        # as the operator's app reads each loop: its core's need and fast scale-up, its clock
        return [
            PoolMember(
                name,
                config,
                PooledConnector(inner, config),
                status,
                throughput_need=dict(core.throughput_floor),
                fast_scale_up_s=scaled_at,
                now_s=now_s,
            )
            for name, scaled_at in (("breaching", core.fast_scale_up_s), ("forecast", None))
        ]

    spec = {"maxTotalGpus": 10, "stabilizationSeconds": 0}
    now = datetime.datetime(2026, 1, 1, tzinfo=datetime.UTC)
    tick = tick_pool(spec, {}, members(20.0), now)
    assert tick.arbitration is not None
    grants = tick.arbitration.grants
    assert (grants["breaching"].gpus, grants["forecast"].gpus) == (8, 2)
    assert grants["forecast"].reason == GrantReason.HIGHER_PRIORITY_FIRST
    said = {n: m["message"] for n, m in tick.status["members"].items()}
    assert "observed SLO breach: its fast check scaled up at 15 s" in said["breaching"]
    assert "forecast shortfall: its planner needs 8 GPUs, it holds 2" in said["forecast"]

    later = tick_pool(spec, {}, members(75.0), now)  # 60 s after the scale-up
    assert later.arbitration is not None
    assert {n: g.gpus for n, g in later.arbitration.grants.items()} == {
        "breaching": 5,
        "forecast": 5,
    }
