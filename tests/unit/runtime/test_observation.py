"""The observation builder both shells share, and the window the schedule hands them."""

from __future__ import annotations

from typing import Any

import pytest

from disagg_planner.core.load_scaling import EngineKey
from disagg_planner.core.planner import queued_prefill_tokens
from disagg_planner.core.schedule import DueTick, TickSchedule, TrafficWindow
from disagg_planner.core.types import DeploymentStatus, RoleStatus
from disagg_planner.runtime.observation import (
    BUSY_WINDOW_S,
    ObservationBuilder,
    dp_size,
    engine_queues,
)
from disagg_planner.signals.fpm import ForwardPassMetrics
from tests.unit.regression.fpm_factory import fpm
from tests.unit.runtime.fpm_stream import FpmStream

LOAD_TICK = DueTick(at_s=0.0, run_throughput=False, run_load=True)
STATUS = DeploymentStatus({"prefill": RoleStatus(desired=1, ready=1, gpus_per_replica=1)})


class Metered(FpmStream):
    def __init__(self) -> None:
        super().__init__()
        self.busy: dict[EngineKey, float] = {}

    def busy_seconds(self) -> dict[EngineKey, float]:
        return self.busy


class Learner:
    def __init__(self) -> None:
        self.seen: list[tuple[str, int]] = []

    def observe_iteration(self, role: str, report: ForwardPassMetrics) -> None:
        self.seen.append((role, report.counter_id))


def busy_at(builder: ObservationBuilder, t: float) -> Any:
    observation, _ = builder.observation(t, LOAD_TICK, status=STATUS, traffic=None)
    return observation.engine_busy_fraction


def test_dp_size_is_the_widest_worker_and_1_when_nothing_reports() -> None:
    engines = {("w0", 0): fpm(), ("w0", 1): fpm(), ("w1", 0): fpm()}
    assert dp_size(engines) == 2
    assert dp_size({}) == 1


def test_learning_feeds_every_received_iteration_and_sums_its_wall_time() -> None:
    prefill, decode = FpmStream(), FpmStream()
    builder = ObservationBuilder({"prefill": prefill, "decode": decode})
    learner = Learner()
    ticks = int(BUSY_WINDOW_S) // 10 + 1
    for second in range(ticks):  # one report per engine every 10 s
        t = 10.0 * second
        prefill.publish(fpm(worker="p0", counter=1000 + second, wall=2.5))  # 25 % busy
        decode.publish(fpm(worker="d0", counter=2000 + second, wall=5.0))  # 50 % busy
        builder.learn(learner)
        busy = busy_at(builder, t)
    assert len(learner.seen) == 2 * ticks
    # Each role keeps its own engines' history: computing one role's shares must not forget
    # the other's (a shared history pruned by each role's engines gave no share at all).
    assert busy["prefill"][("p0", 0)] == pytest.approx(0.25)
    assert busy["decode"][("d0", 0)] == pytest.approx(0.5)


def test_busy_time_is_measured_over_the_busy_window_and_forgets_gone_engines() -> None:
    source = Metered()
    builder = ObservationBuilder({"prefill": source})
    source.publish(fpm(worker="p0"))
    busy = {}
    for t in range(0, 200, 10):
        # busy all the time until 100 s, idle afterwards
        source.busy[("p0", 0)] = float(min(t, 100))
        busy[t] = busy_at(builder, float(t))["prefill"].get(("p0", 0))
    assert busy[0] is None  # one sample: no share yet
    assert busy[90] == pytest.approx(1.0)
    # the window is BUSY_WINDOW_S long: half of it idle at 130 s, all of it at 160 s
    assert busy[130] == pytest.approx((100 - 130 + BUSY_WINDOW_S) / BUSY_WINDOW_S)
    assert busy[160] == pytest.approx(0.0)
    source.latest.clear()  # the engine went away ...
    busy_at(builder, 200.0)
    source.publish(fpm(worker="p0"))  # ... and came back: it starts afresh
    assert busy_at(builder, 210.0)["prefill"] == {}


def test_a_load_tick_carries_queues_ranks_and_last_seen_and_a_throughput_tick_none() -> None:
    source = FpmStream()
    source.publish(
        fpm(worker="p1", dp_rank=0, queued_prefill_tokens=7),
        fpm(worker="p0", dp_rank=1, queued_prefill_tokens=5),
        fpm(worker="p0", dp_rank=0, queued_prefill_tokens=3),
        t=-2.0,
    )
    builder = ObservationBuilder({"prefill": source})
    observation, engines = builder.observation(0.0, LOAD_TICK, status=STATUS, traffic=None)
    assert observation.dp_size == {"prefill": 2}
    assert observation.engine_last_seen_s == {"prefill": dict.fromkeys(engines["prefill"], -2.0)}
    queues = engine_queues(engines)
    assert [(q.worker_id, q.dp_rank, q.queued_prefill_tokens) for q in queues] == [
        ("p0", 0, 3),
        ("p0", 1, 5),
        ("p1", 0, 7),
    ]
    throughput_only = DueTick(at_s=0.0, run_throughput=True, run_load=False)
    observation, engines = builder.observation(0.0, throughput_only, status=STATUS, traffic=None)
    assert observation.engines is None and engines == {}


def test_the_due_tick_names_the_traffic_window_of_a_throughput_tick() -> None:
    schedule = TickSchedule(start_s=1000.0, throughput_interval_s=60.0, load_interval_s=5.0)
    load_only = schedule.pop_due(1005.0)
    assert load_only is not None and load_only.traffic_window is None
    while schedule.next_at_s < 1060.0:
        schedule.pop_due(schedule.next_at_s)
    both = schedule.pop_due(1059.8)  # within the merge tolerance of 1060
    assert both is not None and both.run_throughput
    assert both.traffic_window == TrafficWindow(end_s=1059.8, duration_s=60.0)
    assert both.traffic_window.start_s == pytest.approx(999.8)


def test_queued_prefill_tokens_are_summed_over_the_roles_asked_for() -> None:
    """The throughput loop reads the prefill engines' queues; the elastic-EP policy its own
    role's (a decode role's engines, not the prefill queue it does not serve)."""
    prefill, decode = FpmStream(), FpmStream()
    prefill.publish(
        fpm(worker="p0", queued_prefill_tokens=4000),
        fpm(worker="p1", queued_prefill_tokens=1000),
        t=-1.0,
    )
    decode.publish(fpm(worker="d0", queued_prefill_tokens=300), t=-1.0)
    builder = ObservationBuilder({"prefill": prefill, "decode": decode})
    observation, _ = builder.observation(0.0, LOAD_TICK, status=STATUS, traffic=None)

    assert queued_prefill_tokens(observation) == 5000.0
    assert queued_prefill_tokens(observation, roles=("decode",)) == 300.0
    assert queued_prefill_tokens(observation, roles=("agg",)) is None  # none reports
