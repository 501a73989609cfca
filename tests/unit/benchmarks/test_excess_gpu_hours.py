"""benchmarks/excess_gpu_hours.py: the cause the scorecard prints beside a missed
"GPU-hours <= best-static" target. On a real replay the excess less the saving is the run's
GPU-hours less the fixed count's over the same span (the timeline meters both alike), and
each named decision is a tick that raised the role above the fixed count; on a timeline
written out here, the excess lands on the decision that ordered it."""

from __future__ import annotations

import pytest

from disagg_planner.config import PlannerConfig
from disagg_planner.replay.session import WorkloadSpec, prepare
from disagg_planner.replay.summary import TimelineRow
from tests.unit.benchmarks.scripts import load_script
from tests.unit.replay.test_timeline import run_named

excess = load_script("excess_gpu_hours")


def _row(
    t: float, replicas: dict[str, int], *, decision: str = "", message: str = ""
) -> TimelineRow:
    return TimelineRow(
        t_s=t,
        desired=dict(replicas),
        ready=dict(replicas),
        gpus_in_use=sum(replicas.values()),
        decision=decision,
        reason="scale" if decision else "no_change",
        message=message,
        replicas=dict(replicas),
        event="tick" if t > 0 else "start",
    )


def test_the_excess_lands_on_the_decision_that_ordered_it() -> None:
    grow = "throughput: scale: forecast 10 req; prefill: 40000 tok/s -> 3, after guards 3"
    timeline = [
        _row(0, {"prefill": 2, "decode": 1}),  # one prefill above 1/1 from the start
        _row(600, {"prefill": 3, "decode": 1}, decision="prefill=3,decode=1", message=grow),
        _row(1800, {"prefill": 1, "decode": 1}, decision="prefill=1,decode=1", message="cut"),
        _row(3600, {"prefill": 1, "decode": 1}),
    ]
    found = excess.over_static(timeline, {"prefill": 1, "decode": 1}, {"prefill": 2, "decode": 1})
    # 2 GPUs over 600 s, then 4 over 1200 s: 1/3 + 4/3 GPU-h
    assert found.over_gpu_hours == pytest.approx(2 * 600 / 3600 + 4 * 1200 / 3600)
    assert found.under_gpu_hours == 0.0
    assert [(d.role, d.t_s, d.to) for d in found.decisions] == [
        ("prefill", 600.0, 3),
        ("prefill", 0.0, 2),
    ]
    assert found.decisions[0].gpu_hours == pytest.approx(4 * 1200 / 3600)
    text = found.text()
    assert "above best-static's 1/1 for 1.67 GPU-h" in text
    assert 'prefill to 3 at 600 s held 1.33 GPU-h ("prefill: 40000 tok/s -> 3' in text
    assert "prefill to 2 at 0 s held 0.33 GPU-h" in text


def test_replicas_under_the_fixed_count_are_the_saving() -> None:
    timeline = [
        _row(0, {"prefill": 1, "decode": 2}),
        _row(900, {"prefill": 1, "decode": 1}, decision="prefill=1,decode=1", message="cut"),
        _row(1800, {"prefill": 1, "decode": 1}),
    ]
    found = excess.over_static(timeline, {"prefill": 1, "decode": 2}, {"prefill": 1, "decode": 1})
    assert found.over_gpu_hours == 0.0
    assert found.under_gpu_hours == pytest.approx(0.25)
    assert found.decisions == []


def test_the_clauses_quoted_are_those_that_sized_the_role() -> None:
    message = (
        "throughput: scale: fast check: SLO at risk: TTFT tail 716 ms > 500 ms; no backlog; "
        "forecast 4764.0 req, ISL 2000, OSL 200; prefill: 79673 tok/s -> 2, after guards 3; "
        "decode: 5459 tok/s -> 1, after guards 1; rate rising 4.2 -> 4.4 req/s: sized for 4.6"
    )
    quoted = excess.reason_clauses(message, "prefill")
    assert quoted == (
        "fast check: SLO at risk: TTFT tail 716 ms > 500 ms; prefill: 79673 tok/s -> 2, "
        "after guards 3; rate rising 4.2 -> 4.4 req/s: sized for 4.6"
    )


@pytest.mark.slow
def test_on_a_replay_the_excess_less_the_saving_is_the_gpu_hours_over_the_fixed_count() -> None:
    config = PlannerConfig(
        profile="h200_sxm/vllm/llama-3.1-8b-fp8/tp1",
        max_gpu_budget=-1,
        ttft_ms=500,
        itl_ms=30,
        throughput_adjustment_interval_seconds=60,
        load_predictor="constant",
    )
    workload = WorkloadSpec(workload="step:rates=5/40,at=120,duration=600,isl=2000,osl=100")
    plan = prepare(config, workload, startup_delay_s=30)
    result = run_named(plan, "planner")
    static = {"prefill": 1, "decode": 1}
    found = excess.over_static(result.timeline, static, {"prefill": 1, "decode": 1})
    span_h = (result.timeline[-1].t_s - result.timeline[0].t_s) / 3600.0
    assert found.over_gpu_hours - found.under_gpu_hours == pytest.approx(
        result.summary.gpu_hours - 2 * span_h, abs=1e-6
    )
    assert found.over_gpu_hours > 0  # the step to 40 req/s needs more than one prefill
    raised = {
        (row.t_s, role)
        for row in result.timeline
        if row.event == "tick" and row.decision
        for role in static
        if row.desired.get(role, 0) > static[role]
    }
    assert found.decisions
    assert all((d.t_s, d.role) in raised for d in found.decisions if d.message != "the start")
    assert sum(d.gpu_hours for d in found.decisions) <= found.over_gpu_hours + 1e-9
