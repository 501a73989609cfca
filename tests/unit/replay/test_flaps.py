"""A flap is a reversal of a role's desired replicas within a wall-clock window (600 s by
default), the same for every policy whatever its own interval."""

from __future__ import annotations

from disagg_planner.replay.policies import PolicyStep
from disagg_planner.replay.runner import ClusterSetup, run_policy
from disagg_planner.replay.session import WorkloadSpec, load_requests
from disagg_planner.replay.summary import FLAP_WINDOW_S, ScaleLog
from disagg_planner.simulator import engine_spec
from disagg_planner.simulator.cluster import Cluster

ENGINE = "sim:llama-3.1-8b-fp8@h200_sxm:tp1"


def _reversing_log(n: int, every_s: float) -> ScaleLog:
    log = ScaleLog()
    replicas = 2
    for i in range(n + 1):
        after = 3 if replicas == 2 else 2
        log.add(60.0 + i * every_s, "prefill", replicas, after)
        replicas = after
    return log


def test_reversals_every_three_minutes_all_count() -> None:
    log = _reversing_log(20, 180.0)
    assert FLAP_WINDOW_S == 600.0
    assert log.flaps() == {"prefill": 20}
    # what "two of a 60 s policy's intervals" used to count
    assert log.flaps(120.0) == {"prefill": 0}


def test_reversals_further_apart_than_the_window_do_not_count() -> None:
    assert _reversing_log(5, 601.0).flaps() == {"prefill": 0}
    assert _reversing_log(5, 600.0).flaps() == {"prefill": 5}


def test_steps_in_one_direction_are_not_flaps() -> None:
    log = ScaleLog()
    for i in range(5):
        log.add(60.0 * i, "decode", 1 + i, 2 + i)
    log.add(400.0, "decode", 6, 6)  # no change: not an action
    assert log.actions() == {"decode": 5}
    assert log.flaps() == {"decode": 0}


class Reverser:
    """Wakes every 60 s and reverses prefill between 1 and 2 replicas every 3 minutes."""

    def __init__(self) -> None:
        self.name = "reverser"
        self._next = 60.0

    def next_wakeup_s(self) -> float:
        return self._next

    def wake(self, cluster: Cluster) -> PolicyStep:
        now = cluster.now
        self._next = now + 60.0
        if round(now) % 180 != 0:
            return PolicyStep(now, None, "hold")
        target = 2 if cluster.desired_replicas("prefill") == 1 else 1
        return PolicyStep(now, {"prefill": target}, "reverse")


def test_a_60s_policy_reversing_every_3_minutes_counts_every_reversal() -> None:
    spec = engine_spec.parse(ENGINE)
    setup = ClusterSetup(
        mode="disagg",
        specs={"prefill": spec, "decode": spec},
        initial_replicas={"prefill": 1, "decode": 1},
        startup_delay_s=30.0,
        seed=0,
    )
    requests = load_requests(
        WorkloadSpec(workload="poisson:rate=1,isl=500,osl=20,duration=3700", seed=1)
    )
    result = run_policy(Reverser(), setup=setup, requests=requests, ttft_slo_ms=500, itl_slo_ms=30)
    s = result.summary
    # changes at 180, 360, ..., 3600 s: 20 actions, each after the first reverses the last
    assert s.scale_actions["prefill"] == 20
    assert s.flaps == {"prefill": 19, "decode": 0}
    assert s.flap_window_s == 600.0
