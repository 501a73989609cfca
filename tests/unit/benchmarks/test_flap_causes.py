"""benchmarks/flap_causes.py: the cause the scorecard prints beside a missed "flaps <= 2 per
hour" target. Each flap the summary counts is told as its two decisions: the counts they went
between and the clauses of their reasons that sized the role."""

from __future__ import annotations

import pytest

from disagg_planner.config import PlannerConfig
from disagg_planner.replay.session import WorkloadSpec, prepare
from disagg_planner.replay.summary import FLAP_WINDOW_S, ScaleLog, TimelineRow
from tests.unit.benchmarks.scripts import load_script
from tests.unit.replay.test_timeline import run_named

flaps = load_script("flap_causes")


def _tick(t: float, decode: int, message: str) -> TimelineRow:
    return TimelineRow(
        t_s=t,
        desired={"prefill": 1, "decode": decode},
        ready={"prefill": 1, "decode": decode},
        gpus_in_use=1 + decode,
        decision=f"prefill=1,decode={decode}",
        reason="scale",
        message=message,
        replicas={"prefill": 1, "decode": decode},
    )


def test_a_cut_reversed_within_the_window_is_told_with_both_reasons() -> None:
    log = ScaleLog()
    log.add(600, "decode", 2, 1)
    log.add(900, "decode", 1, 2)  # 300 s later: a flap
    log.add(1800, "decode", 2, 1)  # 900 s later: past the window, not one
    reversals = log.reversals()
    assert [(r.role, r.first_s, r.first_by, r.second_s, r.second_by) for r in reversals] == [
        ("decode", 600.0, -1, 900.0, 1)
    ]
    assert log.flaps() == {"decode": 1}
    timeline = [
        _tick(600, 1, "throughput: scale: decode: 14838 tok/s / 19353 tok/s/GPU -> 1"),
        _tick(900, 2, "throughput: scale: decode: 20591 tok/s / 22779 tok/s/GPU -> 2"),
        _tick(1800, 1, "throughput: scale: decode: 9000 tok/s / 22779 tok/s/GPU -> 1"),
    ]
    assert flaps.flap_cause(timeline, reversals) == (
        'decode 2 -> 1 at 600 s ("decode: 14838 tok/s / 19353 tok/s/GPU -> 1"), then -> 2 at '
        '900 s ("decode: 20591 tok/s / 22779 tok/s/GPU -> 2")'
    )
    assert flaps.flap_cause(timeline, []) == ""


def test_changes_in_one_direction_are_no_flap() -> None:
    log = ScaleLog()
    log.add(60, "prefill", 1, 2)
    log.add(120, "prefill", 2, 4)
    log.add(180, "decode", 1, 1)  # no change: not logged
    assert log.reversals() == []
    assert log.flaps() == {"prefill": 0}


@pytest.mark.slow
def test_on_a_replay_every_flap_counted_is_told_from_its_decisions() -> None:
    # hpa follows a fast sinusoid up and down: reversals within the flap window
    config = PlannerConfig(
        profile="h200_sxm/vllm/llama-3.1-8b-fp8/tp1",
        max_gpu_budget=-1,
        ttft_ms=500,
        itl_ms=20,
    )
    workload = WorkloadSpec(
        workload="sinusoid:min=5,max=45,period=600,duration=1800,isl=3000,osl=300"
    )
    plan = prepare(config, workload, startup_delay_s=30)
    result = run_named(plan, "hpa")
    counted = sum(result.summary.flaps.values())
    assert counted > 0
    assert len(result.reversals) == counted
    decided = {
        (row.t_s, role)
        for row in result.timeline
        if row.event == "tick" and row.decision
        for role in row.desired
    }
    for r in result.reversals:
        assert (r.first_s, r.role) in decided and (r.second_s, r.role) in decided
        assert 0 < r.second_s - r.first_s <= FLAP_WINDOW_S
        assert (r.first_by > 0) != (r.second_by > 0)
    text = flaps.flap_cause(result.timeline, result.reversals)
    assert text.count(" -> ") == 2 * counted
    first = result.reversals[0]
    assert f"{first.role} " in text and f"at {first.first_s:.0f} s" in text
