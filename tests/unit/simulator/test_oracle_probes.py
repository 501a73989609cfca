"""The probes the clairvoyant searches simulate with: a fork of a cluster runs on exactly as
the original would, without touching it; a watched run stops when its judge says so."""

from __future__ import annotations

import math
from collections.abc import Sequence

from disagg_planner.simulator.cluster import Cluster
from disagg_planner.simulator.oracle import fork, meets_slo, rejected_on_arrival, run_watched
from disagg_planner.simulator.request import RequestRecord
from disagg_planner.simulator.workloads import parse_workload

SPEC = "sim:llama-3.1-8b-fp8@h200_sxm:tp1"
LOAD = "poisson:rate=20,isl=lognormal:2000:0.6,osl=exponential:150,duration=60"


def cluster() -> Cluster:
    c = Cluster(
        engines={"prefill": SPEC, "decode": SPEC},
        replicas={"prefill": 2, "decode": 1},
        router="least_loaded",
        startup_delay_s=30,
    )
    c.submit(list(parse_workload(LOAD, seed=4)))  # a generator could not be forked
    return c


def test_a_fork_runs_on_exactly_as_the_original() -> None:
    original = cluster()
    original.run_until(20.0)
    copy = fork(original)
    for c in (original, copy):
        c.set_replicas("prefill", 3)  # a replica starting mid-run, ready at 50 s
        c.run_until(math.inf)
    assert copy.records == original.records
    assert copy.gpu_seconds == original.gpu_seconds
    assert len(original.records) == original.submitted > 1000


def test_a_fork_leaves_the_original_alone() -> None:
    original = cluster()
    original.run_until(20.0)
    before = (original.now, len(original.records), original.desired_replicas("decode"))
    copy = fork(original)
    copy.set_replicas("decode", 3)
    copy.run_until(math.inf)
    assert (original.now, len(original.records), original.desired_replicas("decode")) == before
    assert copy.records[: before[1]] == original.records
    original.run_until(math.inf)
    # the fork had more decode replicas: not the same run
    assert copy.records != original.records


def test_a_watched_run_stops_when_the_judge_says_so() -> None:
    seen: list[RequestRecord] = []

    def judge(records: Sequence[RequestRecord]) -> bool:
        seen.extend(records)
        return len(seen) >= 100

    c = cluster()
    assert run_watched(c, math.inf, judge, step_s=2.0)
    assert 100 <= len(seen) == len(c.records) < c.submitted
    assert c.now < 60.0
    # never stopped: it runs to the end, every finished request seen once
    seen.clear()
    other = cluster()

    def never(records: Sequence[RequestRecord]) -> bool:
        seen.extend(records)
        return False

    assert not run_watched(other, math.inf, never, step_s=2.0)
    assert other.idle and len(seen) == other.submitted
    assert [r.request_id for r in seen] == [r.request_id for r in other.records]


def test_a_watched_run_to_a_time_stops_there() -> None:
    c = cluster()
    assert not run_watched(c, 25.0, lambda _r: False, step_s=4.0)
    assert c.now == 25.0 and not c.idle


def test_slo_verdicts() -> None:
    def record(**kw: object) -> RequestRecord:
        base: dict[str, object] = dict(
            request_id=0,
            arrival_s=1.0,
            isl=10,
            osl=5,
            first_token_s=1.1,
            finish_s=1.2,
            ttft_ms=100.0,
            itl_ms=10.0,
            ok=True,
        )
        base.update(kw)
        return RequestRecord(**base)  # type: ignore[arg-type]

    assert meets_slo(record(), ttft_ms=100, itl_ms=10)
    assert not meets_slo(record(ttft_ms=101.0), ttft_ms=100, itl_ms=10)
    assert not meets_slo(record(itl_ms=10.5), ttft_ms=100, itl_ms=10)
    assert meets_slo(record(itl_ms=None, osl=1), ttft_ms=100, itl_ms=10)
    failed = record(ok=False, ttft_ms=None, itl_ms=None, first_token_s=None, finish_s=1.0)
    assert not meets_slo(failed, ttft_ms=100, itl_ms=10)
    assert rejected_on_arrival(failed)
    assert not rejected_on_arrival(record(ttft_ms=500.0))
    assert not rejected_on_arrival(record(ok=False, finish_s=30.0))  # failed later: a miss
