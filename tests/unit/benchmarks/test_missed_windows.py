"""benchmarks/missed_windows.py: requests scored by arrival in 60 s windows, as the run's own
attainment scores them; the speed sweep's first breach and recovery, and the account of
where a missed attainment target's requests arrived that the scorecard prints as its cause."""

from __future__ import annotations

from dataclasses import replace

import pytest

from disagg_planner.config import PlannerConfig
from disagg_planner.replay.session import WorkloadSpec, prepare
from disagg_planner.replay.summary import TimelineRow
from disagg_planner.simulator.request import RequestRecord
from tests.unit.benchmarks.scripts import load_script
from tests.unit.replay.test_timeline import run_named

windows = load_script("missed_windows")


def _record(i: int, arrival: float, ttft_ms: float) -> RequestRecord:
    first = arrival + ttft_ms / 1000.0
    return RequestRecord(
        request_id=i,
        arrival_s=arrival,
        isl=1000,
        osl=11,
        first_token_s=first,
        finish_s=first + 0.1,
        ttft_ms=ttft_ms,
        itl_ms=10.0,
        ok=True,
    )


def _row(t: float, prefill: int, ready: int, *, decision: str = "") -> TimelineRow:
    return TimelineRow(
        t_s=t,
        desired={"prefill": prefill, "decode": 1},
        ready={"prefill": ready, "decode": 1},
        gpus_in_use=prefill + 1,
        decision=decision,
        reason="scale" if decision else "no_change",
        replicas={"prefill": prefill, "decode": 1},
        event="tick" if t > 0 else "start",
    )


def test_windows_score_by_arrival_and_an_unfinished_request_misses() -> None:
    # 10 requests a minute for 5 minutes; minutes 1 and 2 breach; one request of minute 4
    # never finished
    arrivals = [m * 60.0 + k * 6.0 for m in range(5) for k in range(10)]
    slow = {m * 10 + k for m in (1, 2) for k in range(5)}  # half of minutes 1 and 2
    records = [
        _record(i, t, 900.0 if i in slow else 100.0) for i, t in enumerate(arrivals) if i != 49
    ]
    scores = windows.window_scores(arrivals, records, ttft_ms=500.0, itl_ms=20.0)
    assert [(w.start_s, w.offered, w.met) for w in scores] == [
        (0.0, 10, 10),
        (60.0, 10, 5),
        (120.0, 10, 5),
        (180.0, 10, 10),
        (240.0, 10, 9),
    ]
    assert windows.breach_and_recovery(scores, target=0.99) == (60.0, 180.0)
    assert windows.breach_and_recovery(scores, target=0.9) == (60.0, 180.0)
    assert windows.breach_and_recovery(scores, target=0.5) == (None, None)
    timeline = [
        _row(0, 1, 1),
        _row(75, 2, 1, decision="prefill=2,decode=1"),
        _row(170, 2, 2),
        _row(240, 2, 2),
    ]
    told = windows.where_missed(scores, timeline, target=0.99)
    # 10 of the 11 misses are minutes 1-2; minute 4's one is a span of its own
    assert told == (
        "91% of the 11 missed requests arrived in 60-180 s (2 span(s) of 60 s windows under "
        "99.00%), at 0.2 req/s after 0.2 in the window before: the first scale-up in it, at "
        "75 s, took prefill 1 -> 2 (ready at 170 s)"
    )
    assert windows.where_missed(scores, timeline[:1], target=0.99).endswith(
        "no scale-up was ordered in it"
    )
    met = [_record(i, t, 100.0) for i, t in enumerate(arrivals)]
    clean = windows.window_scores(arrivals, met, ttft_ms=500.0, itl_ms=20.0)
    assert windows.where_missed(clean, timeline, target=0.99) == ""


@pytest.mark.slow
def test_on_a_step_the_costliest_span_is_the_step_and_its_order() -> None:
    config = PlannerConfig(
        profile="h200_sxm/vllm/llama-3.1-8b-fp8/tp1",
        max_gpu_budget=-1,
        ttft_ms=500,
        itl_ms=30,
    )
    workload = WorkloadSpec(workload="step:rates=5/40,at=300,duration=900,isl=2000,osl=100")
    plan = prepare(config, workload, startup_delay_s=120)
    # the deployment of the first 5 req/s, not the one replay sizes for the whole workload
    start = {"prefill": 1, "decode": 1}
    plan = replace(plan, setup=replace(plan.setup, initial_replicas=start))
    result = run_named(plan, "planner")
    scores = windows.window_scores(
        [r.arrival_s for r in plan.requests], result.records, ttft_ms=500.0, itl_ms=30.0
    )
    missed = sum(w.missed for w in scores)
    # the windows count the misses the run's attainment counts
    attainment = result.summary.slo_attainment.both
    assert missed == round((1.0 - attainment) * len(plan.requests))
    assert missed > 0  # one prefill engine cannot take 40 req/s for a 120 s start-up
    told = windows.where_missed(scores, result.timeline, target=0.99)
    spans = windows.breach_spans(scores, target=0.99)
    worst = max(spans, key=lambda s: s.missed)
    assert worst.start_s == 300.0  # the step
    assert told.startswith(f"{worst.missed / missed:.0%} of the {missed} missed requests")
    assert "the first scale-up in it, at " in told and "prefill 1 -> " in told
