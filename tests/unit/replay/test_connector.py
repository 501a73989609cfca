"""Replay's connector and sources: the simulated cluster behind the live loop's protocols."""

from __future__ import annotations

import asyncio

import pytest

from disagg_planner.config import PlannerConfig
from disagg_planner.connectors.base import Connector
from disagg_planner.core.types import MissingObservation, TrafficObservation
from disagg_planner.replay.connector import (
    SimulatedConnector,
    SimulatedEngines,
    SimulatedTraffic,
    run_now,
)
from disagg_planner.replay.policies import PlannerPolicy
from disagg_planner.runtime.loop import DeploymentLoop
from disagg_planner.runtime.observation import BusyMeter
from disagg_planner.simulator.cluster import Cluster
from disagg_planner.simulator.workloads import parse_workload

ENGINE = "sim:llama-3.1-8b-fp8@h200_sxm:tp1"


def cluster(rate: float = 4.0) -> Cluster:
    c = Cluster(
        engines={"prefill": ENGINE, "decode": ENGINE},
        replicas={"prefill": 1, "decode": 1},
        startup_delay_s=30.0,
        model_label="Llama",
    )
    c.submit(parse_workload(f"poisson:rate={rate},isl=1000,osl=50,duration=120", seed=1))
    return c


def test_the_connector_scales_the_cluster_and_reports_every_change() -> None:
    c = cluster()
    changes: list[tuple[float, str, int, int]] = []
    connector = SimulatedConnector(c, on_scale=lambda *change: changes.append(change))
    assert isinstance(connector, Connector)
    assert connector.model_name == "llama"  # the frontend lower-cases it, as Dynamo's
    run_now(connector.validate())
    c.run_until(10.0)

    outcome = run_now(connector.set_replicas({"prefill": 3, "decode": 1}))

    assert dict(outcome.applied) == {"prefill": 3} and outcome.unchanged == ("decode",)
    assert outcome.ready is None  # non-blocking
    assert changes == [(10.0, "prefill", 1, 3)]
    status = run_now(connector.status())
    assert (status.desired("prefill"), status.ready("prefill")) == (3, 1)  # still starting
    assert run_now(connector.set_replicas({"prefill": 3}, blocking=True)).ready is False
    assert connector.holds() == {}
    with pytest.raises(ValueError, match="agg"):
        run_now(connector.set_replicas({"agg": 1}))


def test_run_now_refuses_a_coroutine_that_waits() -> None:
    async def waits() -> None:
        await asyncio.sleep(0)

    with pytest.raises(RuntimeError, match="suspended"):
        run_now(waits())


def test_the_engine_source_samples_each_iteration_once_and_meters_busy_time() -> None:
    c = cluster()
    source = SimulatedEngines(c, "prefill")
    assert isinstance(source, BusyMeter)
    c.run_until(30.0)
    source.sample()
    source.sample()  # nothing new since
    samples = source.drain_samples()
    assert [(f.worker_id, f.dp_rank) for f in samples] == list(source.snapshot())
    assert source.drain_samples() == []
    assert source.last_seen() == dict.fromkeys(source.snapshot(), 30.0)  # never stale
    (busy,) = source.busy_seconds().values()
    assert 0.0 < busy < 30.0


def test_the_traffic_source_reads_the_window_it_is_given() -> None:
    c = cluster(rate=4.0)
    c.run_until(30.0)
    traffic = SimulatedTraffic(c)  # first scrape at 30 s
    c.run_until(60.0)
    before_first = traffic.observe(end_s=60.0, duration_s=60.0)
    assert isinstance(before_first, MissingObservation)
    assert before_first.reason == "not_collected"
    c.run_until(90.0)
    window = traffic.observe(end_s=90.0, duration_s=30.0)  # from the scrape at 60 s
    assert isinstance(window, TrafficObservation)
    assert (window.end_s, window.duration_s) == (90.0, 30.0)
    assert window.num_req == pytest.approx(4.0 * 30.0, rel=0.3)
    with pytest.raises(ValueError, match="ends now"):
        traffic.observe(end_s=100.0, duration_s=60.0)


def test_replay_runs_the_live_loop() -> None:
    config = PlannerConfig(
        profile="h200_sxm/vllm/llama-3.1-8b-fp8/tp1",
        max_gpu_budget=-1,
        load_predictor="constant",
        throughput_adjustment_interval_seconds=60,
    )
    c = cluster()
    policy = PlannerPolicy(name="planner", config=config, profile=None)
    policy.start(c, SimulatedConnector(c))
    assert isinstance(policy.loop, DeploymentLoop)
    # the fast path checks every 15 s between the throughput ticks (one interval apart)
    wakeups: list[float] = []
    while not wakeups or wakeups[-1] < 60.0:
        wakeups.append(policy.next_wakeup_s())
        c.run_until(wakeups[-1])
        step = policy.wake(c)
    assert wakeups == [15.0, 30.0, 45.0, 60.0]
    assert step.acted  # the loop applied its decision through the connector itself
    assert step.effects is not None and step.effects.throughput is not None
    assert step.reason == step.effects.throughput.reason.value
    assert policy.loop.ticks == 4  # every wake-up, fast checks included, is a loop tick
    policy.close()
